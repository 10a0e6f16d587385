//! The ZooKeeper store's settings: the servers and chroot of `--store
//! zk://host:port[,host:port...][/chroot]`.

use std::time::Duration;

use super::{OptionsError, StoreFlags};
use crate::store::kind::StoreSettings;
use crate::store::zookeeper::{self, client::Connection};

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
    Ok(Box::new(zookeeper::Settings {
        connection: connection(flags.text, flags.source, ttl)?,
        ttl,
    }))
}

/// Reads `zk://host:port[,host:port...][/chroot]`, as ZooKeeper's own
/// connect strings are written after the scheme.
fn connection(
    store: &str,
    source: &'static str,
    ttl: Duration,
) -> Result<Connection, ZkFlagsError> {
    let rest = store.strip_prefix("zk://").unwrap_or("");
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
            store: store.to_string(),
        });
    }
    Ok(Connection {
        servers,
        chroot: chroot.to_string(),
        // A server that does not answer within a third of the session is
        // left for the next one, while the session still lasts.
        request_timeout: (ttl / 3).clamp(Duration::from_millis(500), Duration::from_secs(5)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
