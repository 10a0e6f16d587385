//! A connection to the semaphore's Redis: one server, Redis Cluster, or
//! the primary that Redis Sentinel names.
//!
//! Given several nodes, consem talks to a cluster from the start (the
//! `redis` crate's cluster client: it reads the slot map, follows `MOVED`
//! and `ASK`, and reads the map again after a failover). Given one node,
//! it talks to that server alone, and becomes a cluster client the first
//! time the server redirects a command: a Redis that is not a cluster
//! costs nothing more, and a cluster node named alone works for every
//! prefix, whichever node its slot lives on.

use std::time::Duration;

use redis::cluster::{ClusterClientBuilder, ClusterConnection};
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr,
};
use redis::{
    Cmd, Connection, ConnectionInfo, ConnectionLike, ErrorKind, RedisError, RedisResult,
    ServerErrorKind, Value,
};

use super::{ClientTls, Servers};

/// How long a connection may take to be made.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The cluster client's own retries of a redirected or refused command
/// before the error reaches the store, which retries within the lease.
const CLUSTER_RETRIES: u32 = 3;

/// How many keys a `SCAN` looks at per call: few calls, each short.
const SCAN_COUNT: u32 = 1000;

pub enum Link {
    /// One server: one named alone, which may yet turn out to be a
    /// cluster's node, or the primary that Sentinels named.
    Single {
        connection: Connection,
        /// The node named alone, which becomes the cluster client's first
        /// node if it redirects; `None` for a Sentinel's primary.
        node: Option<ConnectionInfo>,
        tls: Option<ClientTls>,
        read_timeout: Duration,
        write_timeout: Duration,
    },
    Cluster(ClusterConnection),
}

impl Link {
    /// Connects to `servers`: one server, a cluster given several nodes,
    /// or the primary that the Sentinels name now (which they have checked
    /// says it is a primary).
    pub fn open(
        servers: &Servers,
        tls: Option<&ClientTls>,
        read_timeout: Duration,
        write_timeout: Duration,
    ) -> RedisResult<Link> {
        let (connection, node) = match servers {
            Servers::Nodes(nodes) if nodes.len() > 1 => {
                return cluster(nodes.to_vec(), tls, read_timeout, write_timeout)
                    .map(Link::Cluster);
            }
            Servers::Nodes(nodes) => {
                let client = match tls {
                    Some(tls) => {
                        redis::Client::build_with_tls(nodes[0].clone(), tls.certificates())?
                    }
                    None => redis::Client::open(nodes[0].clone())?,
                };
                let connection = client.get_connection_with_timeout(CONNECT_TIMEOUT)?;
                (connection, Some(nodes[0].clone()))
            }
            Servers::Sentinel {
                sentinels,
                primary,
                connection,
            } => {
                let connection = sentinel_primary(sentinels, primary, connection, tls)?;
                (connection, None)
            }
        };
        connection.set_read_timeout(Some(read_timeout))?;
        connection.set_write_timeout(Some(write_timeout))?;
        Ok(Link::Single {
            connection,
            node,
            tls: tls.cloned(),
            read_timeout,
            write_timeout,
        })
    }

    /// Whether this link talks to a cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Link::Cluster(_))
    }

    /// Sends a command that names no key to the server that serves `key`:
    /// on a cluster the cluster client would send it to every node.
    pub fn query_beside<T: redis::FromRedisValue>(
        &mut self,
        cmd: &Cmd,
        key: &str,
    ) -> RedisResult<T> {
        match self {
            Link::Single { connection, .. } => cmd.query(connection),
            Link::Cluster(cluster) => {
                let route = Route::with_slot(Slot::for_key(key), SlotAddr::Master);
                let value = cluster.route_command(
                    cmd,
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                )?;
                Ok(redis::from_redis_value(value)?)
            }
        }
    }

    /// Every key that matches `pattern`, by `SCAN` (`KEYS` would hold the
    /// server up): on a cluster, on every primary, each to its end. A node
    /// named alone that turns out to be a cluster's makes this a cluster
    /// client first, as a redirect would. A key may come more than once.
    pub fn scan(&mut self, pattern: &str) -> RedisResult<Vec<String>> {
        let scan = |cursor: &str| {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            cmd
        };
        if let Link::Single {
            connection,
            node: Some(_),
            ..
        } = self
        {
            let info: String = redis::cmd("INFO").arg("cluster").query(connection)?;
            if info.lines().any(|line| line.trim() == "cluster_enabled:1") {
                self.become_cluster()?;
            }
        }
        let mut keys = Vec::new();
        match self {
            Link::Single { connection, .. } => {
                let mut cursor = "0".to_string();
                loop {
                    let (next, found): (String, Vec<String>) = scan(&cursor).query(connection)?;
                    keys.extend(found);
                    if next == "0" {
                        return Ok(keys);
                    }
                    cursor = next;
                }
            }
            Link::Cluster(cluster) => {
                // The first page from every primary at once, named by its
                // address; the rest from each in turn.
                let first = cluster.route_command(
                    &scan("0"),
                    RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
                )?;
                let pages: Vec<(String, (String, Vec<String>))> = redis::from_redis_value(first)?;
                for (address, (mut cursor, found)) in pages {
                    keys.extend(found);
                    let (host, port) = address
                        .rsplit_once(':')
                        .and_then(|(host, port)| Some((host, port.parse().ok()?)))
                        .ok_or_else(|| {
                            RedisError::from((
                                ErrorKind::Client,
                                "the cluster client named a node without a port",
                                address.clone(),
                            ))
                        })?;
                    while cursor != "0" {
                        let node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: String::from(host),
                            port,
                        });
                        let page = cluster.route_command(&scan(&cursor), node)?;
                        let (next, found): (String, Vec<String>) = redis::from_redis_value(page)?;
                        keys.extend(found);
                        cursor = next;
                    }
                }
                Ok(keys)
            }
        }
    }

    /// Becomes a cluster client seeded with the server it talked to.
    fn become_cluster(&mut self) -> RedisResult<&mut ClusterConnection> {
        if let Link::Single {
            node,
            tls,
            read_timeout,
            write_timeout,
            ..
        } = self
        {
            let Some(node) = node else {
                return Err(RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "the primary that the Sentinels named redirects like a Redis Cluster node; name the cluster's nodes instead",
                )));
            };
            *self = Link::Cluster(cluster(
                vec![node.clone()],
                tls.as_ref(),
                *read_timeout,
                *write_timeout,
            )?);
        }
        match self {
            Link::Cluster(cluster) => Ok(cluster),
            Link::Single { .. } => unreachable!("a single link was just replaced"),
        }
    }
}

/// One server, with the TLS files given, connected within
/// [`CONNECT_TIMEOUT`] and answering within it.
fn connect_to(node: &ConnectionInfo, tls: Option<&ClientTls>) -> RedisResult<Connection> {
    let client = match tls {
        Some(tls) => redis::Client::build_with_tls(node.clone(), tls.certificates())?,
        None => redis::Client::open(node.clone())?,
    };
    let connection = client.get_connection_with_timeout(CONNECT_TIMEOUT)?;
    connection.set_read_timeout(Some(CONNECT_TIMEOUT))?;
    connection.set_write_timeout(Some(CONNECT_TIMEOUT))?;
    Ok(connection)
}

/// The primary that the Sentinels name `primary`, which must say so
/// itself (`ROLE`). Done here rather than by the `redis` crate's Sentinel
/// client, which connects to the Sentinels and to the primary with no
/// timeout: one frozen Sentinel or primary would hang consem for good.
/// Each Sentinel is asked in turn; one that is down or frozen costs
/// [`CONNECT_TIMEOUT`] at most.
fn sentinel_primary(
    sentinels: &[ConnectionInfo],
    primary: &str,
    credentials: &redis::RedisConnectionInfo,
    tls: Option<&ClientTls>,
) -> RedisResult<Connection> {
    let mut failure = None;
    for sentinel in sentinels {
        let named = connect_to(sentinel, tls).and_then(|mut asked| {
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(primary)
                .query::<Option<(String, u16)>>(&mut asked)
        });
        let (host, port) = match named {
            Ok(Some(address)) => address,
            // This Sentinel does not monitor it.
            Ok(None) => continue,
            Err(error) => {
                failure = Some(error);
                continue;
            }
        };
        let scheme = match sentinel.addr() {
            redis::ConnectionAddr::TcpTls { .. } => "rediss",
            _ => "redis",
        };
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        let node =
            redis::IntoConnectionInfo::into_connection_info(format!("{scheme}://{host}:{port}"))?
                .set_redis_settings(credentials.clone());
        // Down, frozen or a replica: a failover under way, the Sentinels
        // have not named the new primary yet.
        let primary_down = |why: String| {
            RedisError::from((
                ErrorKind::Server(ServerErrorKind::MasterDown),
                "the server the Sentinels name as the primary does not answer as one",
                why,
            ))
        };
        let mut connection = connect_to(&node, tls)
            .map_err(|error| primary_down(format!("{host}:{port}: {error}")))?;
        let role: Vec<Value> = redis::cmd("ROLE")
            .query(&mut connection)
            .map_err(|error| primary_down(format!("{host}:{port}: {error}")))?;
        if matches!(role.first(), Some(Value::BulkString(name)) if name == b"master") {
            return Ok(connection);
        }
        return Err(primary_down(format!("{host}:{port} is a replica now")));
    }
    Err(failure.unwrap_or_else(|| {
        RedisError::from((
            ErrorKind::MasterNameNotFoundBySentinel,
            "no Sentinel names a primary by that name",
        ))
    }))
}

fn cluster(
    nodes: Vec<ConnectionInfo>,
    tls: Option<&ClientTls>,
    read_timeout: Duration,
    write_timeout: Duration,
) -> RedisResult<ClusterConnection> {
    let mut builder = ClusterClientBuilder::new(nodes)
        .connection_timeout(CONNECT_TIMEOUT)
        .retries(CLUSTER_RETRIES);
    if let Some(tls) = tls {
        builder = builder.certs(tls.certificates());
    }
    let client = builder.build()?;
    let connection = client.get_connection()?;
    connection.set_read_timeout(Some(read_timeout))?;
    connection.set_write_timeout(Some(write_timeout))?;
    Ok(connection)
}

/// Whether a server answered that the key lives on another node.
fn redirects(value: &Value) -> bool {
    matches!(
        value,
        Value::ServerError(error)
            if matches!(error.kind(), Some(ServerErrorKind::Moved | ServerErrorKind::Ask))
    )
}

impl ConnectionLike for Link {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        if let Link::Single { connection, .. } = self {
            let value = connection.req_packed_command(cmd)?;
            if !redirects(&value) {
                return Ok(value);
            }
        }
        self.become_cluster()?.req_packed_command(cmd)
    }

    fn req_command(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        if let Link::Single { connection, .. } = self {
            let value = connection.req_command(cmd)?;
            if !redirects(&value) {
                return Ok(value);
            }
        }
        self.become_cluster()?.req_command(cmd)
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        if let Link::Single { connection, .. } = self {
            match connection.req_packed_commands(cmd, offset, count) {
                Ok(values) if !values.iter().any(redirects) => return Ok(values),
                Ok(_) => {}
                // A transaction whose commands were redirected is aborted.
                Err(error) if error.redirect_node().is_some() => {}
                Err(error) => return Err(error),
            }
        }
        self.become_cluster()?
            .req_packed_commands(cmd, offset, count)
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::Single { connection, .. } => connection.get_db(),
            Link::Cluster(cluster) => cluster.get_db(),
        }
    }

    /// On a cluster too: the cluster client sends a pipeline to the node
    /// of its first key, and every pipeline consem sends names the keys of
    /// one prefix, which share a slot.
    fn supports_pipelining(&self) -> bool {
        true
    }

    fn check_connection(&mut self) -> bool {
        match self {
            Link::Single { connection, .. } => connection.check_connection(),
            Link::Cluster(cluster) => cluster.check_connection(),
        }
    }

    fn is_open(&self) -> bool {
        match self {
            Link::Single { connection, .. } => connection.is_open(),
            Link::Cluster(cluster) => cluster.is_open(),
        }
    }
}

/// The hash tag of a Redis Cluster key: the text between its first `{` and
/// the first `}` after it, when not empty. Keys with the same tag share a
/// slot; a key without one is placed by all of it.
pub fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let rest = &key[open + 1..];
    let close = rest.find('}')?;
    (close > 0).then(|| &rest[..close])
}

/// Whether every key of `prefix` (`semaphore:<prefix>`, with or without a
/// suffix) shares one slot of Redis Cluster: the prefix has a hash tag of
/// its own.
pub fn keys_share_a_slot(prefix: &str) -> bool {
    hash_tag(prefix).is_some()
}

/// The `--prefix` to give instead of `prefix` on Redis Cluster: the same
/// name in braces, without braces of its own.
pub fn prefix_for_cluster(prefix: &str) -> String {
    let bare: String = prefix.chars().filter(|c| *c != '{' && *c != '}').collect();
    format!("{{{bare}}}")
}

/// A prefix whose keys would fall in several slots of Redis Cluster, where
/// a script may only touch the keys of one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrossSlot {
    pub prefix: String,
}

impl CrossSlot {
    /// `Err` for a prefix whose keys would not share a slot.
    pub fn check(prefix: &str) -> Result<(), CrossSlot> {
        if keys_share_a_slot(prefix) {
            Ok(())
        } else {
            Err(CrossSlot {
                prefix: prefix.to_string(),
            })
        }
    }
}

impl std::fmt::Display for CrossSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "on Redis Cluster every key of a semaphore must hash to one slot, and the keys of --prefix '{}' do not: put the prefix in braces, --prefix '{}'",
            self.prefix,
            prefix_for_cluster(&self.prefix)
        )
    }
}

impl std::error::Error for CrossSlot {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_tag_is_the_first_braced_text_that_is_not_empty() {
        assert_eq!(hash_tag("semaphore:{jobs/a}:queue"), Some("jobs/a"));
        assert_eq!(hash_tag("semaphore:jobs/a"), None);
        assert_eq!(hash_tag("semaphore:{}jobs{a}"), None);
        assert_eq!(hash_tag("semaphore:{a{b}c}"), Some("a{b"));
        assert_eq!(hash_tag("semaphore:{open"), None);
        assert_eq!(hash_tag("semaphore:}x{y}"), Some("y"));
    }

    #[test]
    fn the_suggested_prefix_is_the_name_in_braces() {
        assert_eq!(prefix_for_cluster("jobs/a"), "{jobs/a}");
        assert_eq!(prefix_for_cluster("{}jobs"), "{jobs}");
        assert!(keys_share_a_slot(&prefix_for_cluster("a{}b")));
        assert!(!keys_share_a_slot("jobs/a"));
    }

    proptest! {
        /// A prefix judged to share a slot gives every key of the
        /// semaphore the same tag, the one inside the prefix.
        #[test]
        fn a_shared_slot_is_the_same_tag_on_every_key(prefix in "[a-z{}/]{0,12}") {
            prop_assume!(prefix.chars().any(|c| c != '{' && c != '}'));
            let keys = ["", ":queue", ":tickets", ":info:0a1b"].map(|s| format!("semaphore:{prefix}{s}"));
            if keys_share_a_slot(&prefix) {
                let tag = hash_tag(&prefix);
                for key in &keys {
                    prop_assert_eq!(hash_tag(key), tag);
                }
            }
            prop_assert!(keys_share_a_slot(&prefix_for_cluster(&prefix)));
        }
    }
}
