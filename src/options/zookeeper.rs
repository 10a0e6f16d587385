//! The ZooKeeper store's settings: the servers and chroot of `--store
//! zk://[user:password@]host:port[,host:port...][/chroot]` (`zks://` for
//! TLS, with the files of `--cacert`, `--cert` and `--key`), and the digest
//! credentials (zkCli's `addauth digest user:password`) of the URL or of
//! `--user` and `--password`.

use std::time::Duration;

use super::{OptionsError, StoreFlags};
use crate::cli::EtcdArgs;
use crate::store::kind::StoreSettings;
use crate::store::without_credentials;
use crate::store::zookeeper::{
    self,
    client::{Connection, Digest},
    tls::{TlsFiles, ZkTls},
};

/// The server of `--store zookeeper`.
const DEFAULT_SERVER: &str = "127.0.0.1:2181";

#[derive(Debug, PartialEq, Eq)]
enum ZkFlagsError {
    NoServer {
        source: &'static str,
        store: String,
    },
    NotHostPort {
        source: &'static str,
        item: String,
    },
    BadChroot {
        source: &'static str,
        chroot: String,
    },
    /// A user (of the URL or `--user`) without a password anywhere.
    NoPassword {
        user: String,
    },
    NoUserName {
        source: &'static str,
    },
    /// `--password` with no user to go with it.
    PasswordWithoutUser,
    /// A user in the URL and in `--user`.
    TwoUsers {
        source: &'static str,
    },
    /// A `%` in the URL's credentials that is not followed by two hex
    /// digits, or an escape that is not UTF-8.
    BadEscape {
        source: &'static str,
    },
}

impl std::fmt::Display for ZkFlagsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ZkFlagsError::NoServer { source, store } => write!(
                f,
                "{source} '{store}' names no server: write zk://host:port[,host:port...][/chroot]"
            ),
            ZkFlagsError::NotHostPort { source, item } => write!(
                f,
                "{source}: '{item}' is not host:port (a port is 1 to 65535): write zk://host:port[,host:port...][/chroot]"
            ),
            ZkFlagsError::BadChroot { source, chroot } => write!(
                f,
                "{source}: the chroot '{chroot}' has an empty, '.' or '..' segment or ends in '/'"
            ),
            ZkFlagsError::NoPassword { user } => write!(
                f,
                "the ZooKeeper user {user} has no password: write zk://{user}:PASSWORD@host:port, --user {user}:PASSWORD or --password PASSWORD"
            ),
            ZkFlagsError::NoUserName { source } => write!(
                f,
                "{source} names no user before its password: write zk://USER:PASSWORD@host:port or --user USER:PASSWORD"
            ),
            ZkFlagsError::PasswordWithoutUser => f.write_str(
                "--password needs a user: write --user USER, or zk://USER@host:port",
            ),
            ZkFlagsError::TwoUsers { source } => write!(
                f,
                "{source} names a user and so does --user: give the credentials once"
            ),
            ZkFlagsError::BadEscape { source } => write!(
                f,
                "{source}: the credentials have a '%' that is not a %XX escape of UTF-8: write '%' itself as %25"
            ),
        }
    }
}

impl std::error::Error for ZkFlagsError {}

impl From<ZkFlagsError> for OptionsError {
    fn from(error: ZkFlagsError) -> OptionsError {
        OptionsError::StoreFlags(Box::new(error))
    }
}

pub fn configure(flags: &StoreFlags<'_>) -> Result<Box<dyn StoreSettings>, OptionsError> {
    let ttl = flags.lease_ttl();
    let mut connection = connection(flags.text, flags.source, &flags.args.etcd, ttl)?;
    let files = TlsFiles {
        cacert: flags.args.tls.cacert.as_deref(),
        cert: flags.args.tls.cert.as_deref(),
        key: flags.args.tls.key.as_deref(),
    };
    connection.tls = ZkTls::load(&files, flags.text.starts_with("zks://"))
        .map_err(|error| OptionsError::StoreFlags(Box::new(error)))?;
    Ok(Box::new(zookeeper::Settings { connection, ttl }))
}

/// Reads `zk://[user[:password]@]host:port[,host:port...][/chroot]`, as
/// ZooKeeper's own connect strings are written after the scheme, and the
/// credentials of `--user` and `--password`.
fn connection(
    store: &str,
    source: &'static str,
    args: &EtcdArgs,
    ttl: Duration,
) -> Result<Connection, ZkFlagsError> {
    // `zookeeper` alone: the server zkCli.sh reaches without -server.
    let rest = match store {
        "zookeeper" => DEFAULT_SERVER,
        _ => store
            .strip_prefix("zk://")
            .or_else(|| store.strip_prefix("zks://"))
            .unwrap_or(""),
    };
    // Credentials end at the last '@' before the path: a '/' in them is
    // written %2F, as in any URL.
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (credentials, rest) = match rest[..authority_end].rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let digest = digest(credentials, source, args)?;
    let (hosts, chroot) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, ""),
    };
    if !chroot.is_empty()
        && (chroot == "/"
            || chroot[1..]
                .split('/')
                .any(|s| s.is_empty() || s == "." || s == ".."))
    {
        return Err(ZkFlagsError::BadChroot {
            source,
            chroot: chroot.to_string(),
        });
    }
    let mut servers = Vec::new();
    for item in hosts.split(',').filter(|s| !s.is_empty()) {
        let ok = item.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
        if !ok {
            return Err(ZkFlagsError::NotHostPort {
                source,
                item: item.to_string(),
            });
        }
        servers.push(item.to_string());
    }
    if servers.is_empty() {
        return Err(ZkFlagsError::NoServer {
            source,
            store: without_credentials(store),
        });
    }
    Ok(Connection {
        servers,
        chroot: chroot.to_string(),
        // A server that does not answer within a third of the session is
        // left for the next one, while the session still lasts.
        request_timeout: (ttl / 3).clamp(Duration::from_millis(500), Duration::from_secs(5)),
        digest,
        tls: None,
    })
}

/// The digest credentials of the URL's `user[:password]` (percent-escaped)
/// or of `--user USER[:PASSWORD]`, the password also from `--password`.
fn digest(
    credentials: Option<&str>,
    source: &'static str,
    args: &EtcdArgs,
) -> Result<Option<Digest>, ZkFlagsError> {
    let (given, from) = match (credentials, &args.user) {
        (Some(_), Some(_)) => return Err(ZkFlagsError::TwoUsers { source }),
        (Some(text), None) => {
            let (user, password) = match text.split_once(':') {
                Some((user, password)) => (user, Some(password)),
                None => (text, None),
            };
            let decode = |text: &str| unescape(text).ok_or(ZkFlagsError::BadEscape { source });
            ((decode(user)?, password.map(decode).transpose()?), source)
        }
        (None, Some(text)) => {
            let (user, password) = match text.split_once(':') {
                Some((user, password)) => (user.to_string(), Some(password.to_string())),
                None => (text.clone(), None),
            };
            ((user, password), "--user")
        }
        (None, None) if args.password.is_some() => return Err(ZkFlagsError::PasswordWithoutUser),
        (None, None) => return Ok(None),
    };
    let (user, password) = given;
    if user.is_empty() {
        return Err(ZkFlagsError::NoUserName { source: from });
    }
    let password = password
        .or_else(|| args.password.clone())
        .ok_or_else(|| ZkFlagsError::NoPassword { user: user.clone() })?;
    Ok(Some(Digest { user, password }))
}

/// `text` with its `%XX` escapes decoded; `None` if one is malformed or
/// the result is not UTF-8.
fn unescape(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let hex = text.get(at + 1..at + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            at += 3;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connection(
        store: &str,
        source: &'static str,
        ttl: Duration,
    ) -> Result<Connection, ZkFlagsError> {
        super::connection(store, source, &EtcdArgs::default(), ttl)
    }

    #[test]
    fn credentials_come_from_the_url_or_user_and_password() {
        let ttl = Duration::from_secs(15);
        let digest = |store: &str, user: Option<&str>, password: Option<&str>| {
            let args = EtcdArgs {
                user: user.map(str::to_string),
                password: password.map(str::to_string),
            };
            super::connection(store, "--store", &args, ttl)
                .map(|c| c.digest.map(|d| (d.user, d.password)))
        };
        let pair = |u: &str, p: &str| Ok(Some((u.to_string(), p.to_string())));
        assert_eq!(digest("zk://a:1", None, None), Ok(None));
        assert_eq!(
            digest("zk://al:s3:cr%40t@a:1/x", None, None),
            pair("al", "s3:cr@t")
        );
        assert_eq!(digest("zk://al@a:1", None, Some("pw")), pair("al", "pw"));
        assert_eq!(digest("zk://a:1", Some("al:pw"), None), pair("al", "pw"));
        assert_eq!(digest("zk://a:1", Some("al"), Some("pw")), pair("al", "pw"));
        assert_eq!(
            digest("zk://a:1", Some("al"), None),
            Err(ZkFlagsError::NoPassword { user: "al".into() })
        );
        assert_eq!(
            digest("zk://:pw@a:1", None, None),
            Err(ZkFlagsError::NoUserName { source: "--store" })
        );
        assert_eq!(
            digest("zk://a:1", None, Some("pw")),
            Err(ZkFlagsError::PasswordWithoutUser)
        );
        assert_eq!(
            digest("zk://al:pw@a:1", Some("al:pw"), None),
            Err(ZkFlagsError::TwoUsers { source: "--store" })
        );
        assert_eq!(
            digest("zk://al:p%4@a:1", None, None),
            Err(ZkFlagsError::BadEscape { source: "--store" })
        );
        let shown = ZkFlagsError::NoServer {
            source: "--store",
            store: without_credentials("zk://al:s3cret@"),
        };
        assert!(!shown.to_string().contains("s3cret"), "{shown}");
    }

    #[test]
    fn a_connect_string_gives_servers_and_a_chroot() {
        let ttl = Duration::from_secs(15);
        let c = connection("zk://a:2181,b:2182/apps/x", "--store", ttl).unwrap();
        assert_eq!(c.servers, ["a:2181", "b:2182"]);
        assert_eq!(c.chroot, "/apps/x");
        assert_eq!(
            connection("zk://a:2181", "--store", ttl).unwrap().chroot,
            ""
        );
        assert_eq!(
            connection("zookeeper", "--store", ttl).unwrap().servers,
            ["127.0.0.1:2181"]
        );
        assert_eq!(
            connection("zks://a:2281/x", "--store", ttl)
                .unwrap()
                .servers,
            ["a:2281"]
        );
        assert!(matches!(
            connection("zk://", "--store", ttl),
            Err(ZkFlagsError::NoServer { .. })
        ));
        assert!(matches!(
            connection("zk://a", "--store", ttl),
            Err(ZkFlagsError::NotHostPort { .. })
        ));
        assert!(matches!(
            connection("zk://a:1/x//y", "--store", ttl),
            Err(ZkFlagsError::BadChroot { .. })
        ));
    }
}
