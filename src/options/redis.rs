//! The Redis store's settings: the URL of `--store` (its password also
//! from `REDISCLI_AUTH`, as redis-cli reads it), with one server, the
//! nodes of a Redis Cluster or the Sentinels of a primary; the TLS files of
//! `--cacert`, `--cert` and `--key` (redis-cli's names; it reads no
//! variable for them, nor does consem), `--redis-allow-eviction` and
//! `--redis-wait-replicas`.

use super::{OptionsError, StoreFlags};
use crate::store::kind::StoreSettings;
use crate::store::{redis, without_credentials};

#[derive(Debug)]
enum RedisFlagsError {
    NotAUrl {
        source: &'static str,
        shown: String,
        detail: String,
    },
    Tls(redis::ClientTlsError),
    NoReplicas,
    /// A cluster's nodes with a database other than 0.
    ClusterDatabase {
        source: &'static str,
        db: i64,
    },
    /// A Sentinel URL without the name of the primary.
    NoPrimaryName {
        source: &'static str,
        shown: String,
    },
}

impl std::fmt::Display for RedisFlagsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RedisFlagsError::NotAUrl {
                source,
                shown,
                detail,
            } => write!(
                f,
                "{source}: {shown} is not a Redis URL ({detail}); write redis://[user[:password]@]host[:port][,host[:port]...][/db]"
            ),
            RedisFlagsError::NoPrimaryName { source, shown } => write!(
                f,
                "{source}: {shown} names no primary: write redis+sentinel://host[:port][,host[:port]...]/<primary name>[/db], with the name the Sentinels monitor it by"
            ),
            RedisFlagsError::ClusterDatabase { source, db } => write!(
                f,
                "{source}: several nodes make a Redis Cluster, which has database 0 only, not {db}: drop /{db} from the URL"
            ),
            RedisFlagsError::Tls(error) => error.fmt(f),
            RedisFlagsError::NoReplicas => f.write_str(
                "--redis-wait-replicas 0 waits for no replica: give how many replicas must acknowledge a slot (1 or more), or drop it",
            ),
        }
    }
}

impl std::error::Error for RedisFlagsError {}

impl From<RedisFlagsError> for OptionsError {
    fn from(error: RedisFlagsError) -> OptionsError {
        OptionsError::StoreFlags(Box::new(error))
    }
}

impl From<redis::CrossSlot> for OptionsError {
    fn from(error: redis::CrossSlot) -> OptionsError {
        OptionsError::StoreFlags(Box::new(error))
    }
}

/// Reads `redis://[user[:password]@]host[:port][/db]`, or `rediss://` for
/// TLS (the server's certificate checked against the system's roots, or
/// the file `SSL_CERT_FILE` names, as OpenSSL has it). Several hosts,
/// comma-separated, are nodes of one Redis Cluster: its keys must then
/// share a slot, which the prefix's braces give.
pub fn configure(flags: &StoreFlags<'_>) -> Result<Box<dyn StoreSettings>, OptionsError> {
    let password = (flags.env)("REDISCLI_AUTH").filter(|p| !p.is_empty());
    let read = |url: &str| {
        let mut node = ::redis::IntoConnectionInfo::into_connection_info(url).map_err(|e| {
            RedisFlagsError::NotAUrl {
                source: flags.source,
                shown: without_credentials(flags.text),
                detail: e.detail().unwrap_or("unreadable").to_string(),
            }
        })?;
        if let Some(password) = password
            .as_ref()
            .filter(|_| node.redis_settings().password().is_none())
        {
            let settings = node.redis_settings().clone().set_password(password);
            node = node.set_redis_settings(settings);
        }
        Ok::<_, RedisFlagsError>(node)
    };
    let wait_replicas = flags.run.and_then(|run| run.redis_wait_replicas);
    if wait_replicas == Some(0) {
        return Err(RedisFlagsError::NoReplicas.into());
    }
    let settings = |servers: redis::Servers| {
        let tls_args = &flags.args.tls;
        let files = redis::TlsFiles {
            cacert: tls_args.cacert.as_deref(),
            cert: tls_args.cert.as_deref(),
            key: tls_args.key.as_deref(),
        };
        let tls = redis::ClientTls::load(&files, servers.tls()).map_err(RedisFlagsError::Tls)?;
        Ok::<_, RedisFlagsError>(Box::new(redis::Settings::new(
            servers,
            flags.lease_ttl(),
            flags.monitor_retry(),
            flags.run.is_some_and(|run| run.redis_allow_eviction),
            wait_replicas,
            tls,
        )))
    };
    if let Some(sentinel) = SentinelUrl::parse(flags.text) {
        let Some(primary) = sentinel.primary else {
            return Err(RedisFlagsError::NoPrimaryName {
                source: flags.source,
                shown: without_credentials(flags.text),
            }
            .into());
        };
        // The Sentinels are read as servers of their own URL (their default
        // port); the credentials and database are the primary's.
        let primary_url = read(&sentinel.primary_url)?;
        let sentinels = sentinel
            .sentinel_urls
            .iter()
            .map(|url| read(url).map(|s| s.set_redis_settings(Default::default())))
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(settings(redis::Servers::Sentinel {
            sentinels,
            primary,
            connection: primary_url.redis_settings().clone(),
        })?);
    }
    let nodes = node_urls(flags.text)
        .iter()
        .map(|url| read(url))
        .collect::<Result<Vec<_>, RedisFlagsError>>()?;
    if nodes.len() > 1 {
        let db = nodes[0].redis_settings().db();
        if db != 0 {
            return Err(RedisFlagsError::ClusterDatabase {
                source: flags.source,
                db,
            }
            .into());
        }
        // A listing names no one semaphore whose keys must share a slot.
        if !flags.prefix.is_empty() {
            redis::CrossSlot::check(flags.prefix)?;
        }
    }
    Ok(settings(redis::Servers::Nodes(nodes))?)
}

/// The Sentinel TCP port, where a Sentinel URL names none.
const SENTINEL_PORT: u16 = 26379;

/// `redis+sentinel://[user[:password]@]host[:port][,host[:port]...]/<primary name>[/db]`
/// (`rediss+sentinel://` for TLS), the form redis-py's and Celery's users
/// know: the Sentinels to ask, and the name they monitor the primary by.
#[derive(Debug, PartialEq, Eq)]
struct SentinelUrl {
    /// A plain URL per Sentinel, its port defaulting to Sentinel's.
    sentinel_urls: Vec<String>,
    primary: Option<String>,
    /// A plain URL with the primary's credentials and database (at the
    /// first Sentinel's address, which is not used).
    primary_url: String,
}

impl SentinelUrl {
    /// `None` when `url` is not a Sentinel URL.
    fn parse(url: &str) -> Option<SentinelUrl> {
        let (scheme, rest) = url.split_once("://")?;
        let plain = match scheme {
            "redis+sentinel" => "redis",
            "rediss+sentinel" => "rediss",
            _ => return None,
        };
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        let (credentials, hosts) = match authority.rfind('@') {
            Some(at) => authority.split_at(at + 1),
            None => ("", authority),
        };
        let with_port = |host: &str| {
            // `[::1]` or `host` without a port; `[::1]:1` or `host:1` with.
            let has_port = match host.rfind(']') {
                Some(close) => host[close..].contains(':'),
                None => host.contains(':'),
            };
            if has_port || host.is_empty() {
                host.to_string()
            } else {
                format!("{host}:{SENTINEL_PORT}")
            }
        };
        let hosts: Vec<String> = hosts.split(',').map(with_port).collect();
        let (path, query) = match tail.find(['?', '#']) {
            Some(at) => tail.split_at(at),
            None => (tail, ""),
        };
        let mut segments = path.trim_start_matches('/').splitn(2, '/');
        let primary = segments
            .next()
            .filter(|name| !name.is_empty())
            .map(str::to_string);
        let db = segments
            .next()
            .map(|db| format!("/{db}"))
            .unwrap_or_default();
        Some(SentinelUrl {
            sentinel_urls: hosts
                .iter()
                .map(|host| format!("{plain}://{host}"))
                .collect(),
            primary,
            primary_url: format!("{plain}://{credentials}{}{db}{query}", hosts[0]),
        })
    }
}

/// One URL per node of `url`, whose host part may name several,
/// comma-separated, each with the URL's scheme, credentials, database and
/// query. An empty node stays, for the URL parser to refuse.
fn node_urls(url: &str) -> Vec<String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return vec![url.to_string()];
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (credentials, hosts) = match authority.rfind('@') {
        Some(at) => authority.split_at(at + 1),
        None => ("", authority),
    };
    if !hosts.contains(',') {
        return vec![url.to_string()];
    }
    hosts
        .split(',')
        .map(|host| format!("{scheme}://{credentials}{host}{tail}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sentinel_url_names_the_sentinels_and_the_primary() {
        assert_eq!(SentinelUrl::parse("redis://h:1"), None);
        assert_eq!(
            SentinelUrl::parse("redis+sentinel://u:pw@a,b:26380,[::1]/jobs/2"),
            Some(SentinelUrl {
                sentinel_urls: vec![
                    "redis://a:26379".into(),
                    "redis://b:26380".into(),
                    "redis://[::1]:26379".into()
                ],
                primary: Some("jobs".into()),
                primary_url: "redis://u:pw@a:26379/2".into(),
            })
        );
        let tls = SentinelUrl::parse("rediss+sentinel://a:1/jobs").unwrap();
        assert_eq!(tls.sentinel_urls, vec!["rediss://a:1"]);
        assert_eq!(tls.primary_url, "rediss://a:1");
        assert_eq!(
            SentinelUrl::parse("redis+sentinel://a/").unwrap().primary,
            None
        );
        assert_eq!(
            SentinelUrl::parse("redis+sentinel://a").unwrap().primary,
            None
        );
    }

    #[test]
    fn several_hosts_are_one_url_each_with_the_rest_of_the_url() {
        assert_eq!(node_urls("redis://h:1"), vec!["redis://h:1"]);
        assert_eq!(
            node_urls("rediss://u:p%40ss@a:1,b:2,[::1]:3/0?protocol=resp3"),
            vec![
                "rediss://u:p%40ss@a:1/0?protocol=resp3",
                "rediss://u:p%40ss@b:2/0?protocol=resp3",
                "rediss://u:p%40ss@[::1]:3/0?protocol=resp3",
            ]
        );
        assert_eq!(
            node_urls("redis://a,,b"),
            vec!["redis://a", "redis://", "redis://b"]
        );
        assert_eq!(
            node_urls("redis://a:1,b:2"),
            vec!["redis://a:1", "redis://b:2"]
        );
    }
}
