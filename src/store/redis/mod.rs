//! The Redis store: a counting semaphore on a Redis sorted set, in the
//! layout the common sorted-set semaphores use (`semaphore:<prefix>`:
//! permit id -> expiry in Unix seconds), so that their permits count
//! against consem's limit and consem's against theirs. Beside it, under the
//! same prefix: the queue of waiters (FIFO by ticket), the fence counter,
//! the limit record, and per contender its description, its liveness key
//! while it waits, and the list it is woken through.
//!
//! Every decision is one Lua script, with the server's clock. Waiters sleep
//! in `BLPOP` on their own list, pushed by the departure that may serve
//! them, with a look again every TTL/3 that also keeps their place alive.

mod tls;

use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use redis::{RedisError, Script, Value};

use super::driver::{self, Failures, Gate, Grant, Recipe, Stop};
use super::kind::{Lease, Store, StoreSettings};
use super::lease;
use super::outage::Outage;
use super::{
    Admin, Contend, ContenderInfo, ContenderStatus, ErrorKind, Holder, Notify, Progress,
    ReleaseError, Released, ResetOutcome, SlotBackend, SlotEvent, Status, StoreError, Summary,
    Unfinished,
};
use crate::report;
pub use link::CrossSlot;
use link::Link;
pub use tls::{ClientTls, ClientTlsError, TlsFiles};

mod link;

/// Permits may have TTLs of 2 s to 24 h.
pub const STORE: Store = Store {
    name: "redis",
    title: "Redis",
    schemes: &[
        "redis://",
        "rediss://",
        "redis+sentinel://",
        "rediss+sentinel://",
    ],
    largest_limit: 1024,
    lease: Some(Lease {
        shortest: Duration::from_secs(2),
        longest: Duration::from_secs(86_400),
        default_ttl: Duration::from_secs(15),
    }),
    frees_slot_at_death: false,
};

/// Budget of one command (a `BLPOP` gets its own wait on top).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a holder renews its permit (or every TTL/3 if that is
/// sooner): a permit that vanished (FLUSHALL, an eviction, a restart
/// without data) is noticed within this, which bounds the overlap a wipe
/// allows, and the lease stays fresh for outages. One script call.
const RENEW_EVERY: Duration = Duration::from_secs(1);

/// How long `WAIT` may wait for the replicas to acknowledge a grant or a
/// renewal (`--redis-wait-replicas`): a second, or TTL/6 if that is
/// shorter, so that an unconfirmed renewal leaves the lease room for
/// retries, and a grant confirmed late still leaves the command most of it.
fn wait_timeout(ttl: Duration) -> Duration {
    Duration::from_millis(RENEW_EVERY.min(ttl / 6).as_millis() as u64)
}

/// What a run on Redis needs beyond the store-neutral options.
#[derive(Debug, Clone)]
pub struct Settings {
    pub servers: Servers,
    /// `host:port/db`, `host:port,host:port` for a cluster's nodes, or
    /// `<primary> via Sentinel host:port,...`, for messages: never the
    /// password.
    pub shown: String,
    pub ttl: Duration,
    /// Failed attempts in a row a holder bears; `None`: as many as fit in
    /// its lease.
    pub monitor_retry: Option<u32>,
    /// Run even on a server whose eviction policy may evict the
    /// semaphore's keys.
    pub allow_eviction: bool,
    /// Use a grant, and count a renewal, only once this many replicas
    /// acknowledged it (`WAIT`).
    pub wait_replicas: Option<u32>,
    /// Client certificate and CA for `rediss://` (`--cert`, `--key`,
    /// `--cacert`), read already, for whichever way we connect.
    pub tls: Option<ClientTls>,
}

/// Where the semaphore's Redis is.
#[derive(Debug, Clone)]
pub enum Servers {
    /// One server, or the nodes of a Redis Cluster (at least one), the
    /// first of which the rest is learnt from.
    Nodes(Vec<redis::ConnectionInfo>),
    /// The primary that these Sentinels monitor under the name `primary`,
    /// reached with `connection`'s credentials and database.
    Sentinel {
        sentinels: Vec<redis::ConnectionInfo>,
        primary: String,
        connection: redis::RedisConnectionInfo,
    },
}

impl Servers {
    /// The first server the URL names: a node, or a Sentinel.
    fn first(&self) -> &redis::ConnectionInfo {
        match self {
            Servers::Nodes(nodes) => &nodes[0],
            Servers::Sentinel { sentinels, .. } => &sentinels[0],
        }
    }

    /// Whether the URL says TLS (`rediss://`, `rediss+sentinel://`).
    pub fn tls(&self) -> bool {
        matches!(self.first().addr(), redis::ConnectionAddr::TcpTls { .. })
    }
}

impl Settings {
    /// Whether Sentinels say which server is the primary.
    fn sentinel(&self) -> bool {
        matches!(self.servers, Servers::Sentinel { .. })
    }

    /// The host the URL names first, which the server's certificate must
    /// be for.
    fn host(&self) -> String {
        match self.servers.first().addr() {
            redis::ConnectionAddr::Tcp(host, _) => host.clone(),
            redis::ConnectionAddr::TcpTls { host, .. } => host.clone(),
            other => other.to_string(),
        }
    }

    pub fn new(
        servers: Servers,
        ttl: Duration,
        monitor_retry: Option<u32>,
        allow_eviction: bool,
        wait_replicas: Option<u32>,
        tls: Option<ClientTls>,
    ) -> Settings {
        let addresses = |nodes: &[redis::ConnectionInfo]| {
            nodes
                .iter()
                .map(|node| node.addr().to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let shown = match &servers {
            Servers::Nodes(nodes) => match nodes.as_slice() {
                [one] => format!("{}/{}", one.addr(), one.redis_settings().db()),
                many => addresses(many),
            },
            Servers::Sentinel {
                sentinels,
                primary,
                connection,
            } => format!(
                "{primary}/{} via Sentinel {}",
                connection.db(),
                addresses(sentinels)
            ),
        };
        Settings {
            servers,
            shown,
            ttl,
            monitor_retry,
            allow_eviction,
            wait_replicas,
            tls,
        }
    }
}

impl StoreSettings for Settings {
    fn open_run(
        &self,
        prefix: &str,
        limit: u32,
        info: ContenderInfo,
    ) -> Result<Arc<dyn SlotBackend>, StoreError> {
        Ok(Arc::new(RedisSemaphore::new(
            self.clone(),
            prefix,
            limit,
            &info,
        )))
    }

    fn open_admin(&self, prefix: &str) -> Result<Box<dyn Admin>, StoreError> {
        Ok(Box::new(RedisAdmin::new(self.clone(), prefix)))
    }
}

/// The keys of one prefix. On Redis Cluster they must hash to one slot:
/// the prefix in braces (`--prefix '{jobs/nightly}'`), [`link::hash_tag`].
#[derive(Debug, Clone)]
struct Keys {
    holders: String,
    queue: String,
    tickets: String,
    fence: String,
    limit: String,
    /// Waiters, scored by when their liveness runs out.
    alive: String,
    /// When the semaphore's keys were made: another value than a
    /// contender saw means they were lost meanwhile.
    epoch: String,
    /// While it lives, no slot is granted (after the keys were lost).
    lock_delay: String,
    /// Per contender: `<base>info:<id>`, `fence:`, `wake:`.
    base: String,
}

impl Keys {
    fn new(prefix: &str) -> Keys {
        let holders = format!("semaphore:{prefix}");
        Keys {
            queue: format!("{holders}:queue"),
            tickets: format!("{holders}:tickets"),
            fence: format!("{holders}:fence"),
            limit: format!("{holders}:limit"),
            alive: format!("{holders}:alive"),
            epoch: format!("{holders}:epoch"),
            lock_delay: format!("{holders}:lock-delay"),
            base: format!("{holders}:"),
            holders,
        }
    }

    fn wake(&self, id: &str) -> String {
        format!("{}wake:{id}", self.base)
    }

    fn info(&self, id: &str) -> String {
        format!("{}info:{id}", self.base)
    }
}

fn acquire_script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(include_str!("acquire.lua")))
}

fn renew_script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(include_str!("renew.lua")))
}

fn release_script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(include_str!("release.lua")))
}

/// How a call to Redis failed, sorted by what can be done about it.
enum Failure {
    /// No answer, a lost connection, a server loading or busy: worth
    /// trying again.
    Transient(String),
    /// A failure retrying will not mend.
    Final(StoreError),
}

impl Failure {
    /// The failure as it ends a run: one worth retrying, once retrying
    /// is over, as the store being unavailable.
    fn into_error(self) -> StoreError {
        match self {
            Failure::Transient(why) => StoreError::unavailable(why),
            Failure::Final(error) => error,
        }
    }
}

fn classify(error: RedisError, settings: &Settings, prefix: &str) -> Failure {
    let shown = &settings.shown;
    if let Some(why) = tls::explain(&error, shown, &settings.host(), settings.tls.as_ref()) {
        return Failure::Final(StoreError::unavailable(format!(
            "cannot talk to Redis at {shown} over TLS: {why}"
        )));
    }
    let code = error.code().map(str::to_string);
    let detail = error.detail().unwrap_or_default().to_string();
    match code.as_deref() {
        Some("CROSSSLOT") => Failure::Final(cross_slot(prefix)),
        // What the cluster client still sees after its own retries: a slot
        // on its way to another node.
        Some("MOVED") | Some("ASK") => Failure::Transient(format!(
            "the Redis Cluster at {shown} is moving the prefix's slot ({detail})"
        )),
        _ if detail.contains("SELECT is not allowed in cluster mode") => {
            Failure::Final(StoreError::usage(format!(
                "Redis at {shown} is a Redis Cluster node, and a cluster has database 0 only: drop the database from the URL"
            )))
        }
        Some("CLUSTERDOWN") => Failure::Transient(format!(
            "the Redis Cluster at {shown} is down ({detail}): it serves again once its nodes cover every slot"
        )),
        Some("NOAUTH") | Some("WRONGPASS") => Failure::Final(StoreError::denied(format!(
            "permission denied: Redis at {shown} refused the credentials ({detail}): give the password in the URL or in REDISCLI_AUTH"
        ))),
        Some("NOPERM") => Failure::Final(StoreError::denied(format!(
            "permission denied: the Redis user may not do what consem needs ({detail}); it needs INFO, EVAL, EVALSHA, SCRIPT, BLPOP, GET, ZRANGE on the keys semaphore:<prefix>*, and WAIT with --redis-wait-replicas"
        ))),
        // The primary the Sentinels named has become a replica since: the
        // next connection asks them again.
        Some("READONLY") if settings.sentinel() => Failure::Transient(format!(
            "Redis at {shown} has become a replica ({detail})"
        )),
        Some("READONLY") => Failure::Final(StoreError::unavailable(format!(
            "Redis at {shown} is a read-only replica: point --store at the primary"
        ))),
        Some("LOADING") | Some("BUSY") | Some("TRYAGAIN") | Some("MASTERDOWN") => {
            Failure::Transient(format!("Redis at {shown} is not ready ({detail})"))
        }
        // A primary that became a replica ends its blocked commands: the
        // next call finds the new primary.
        Some("UNBLOCKED") => Failure::Transient(format!(
            "Redis at {shown} stopped being the primary ({detail})"
        )),
        // `min-replicas-to-write` on the server: writes wait for replicas.
        Some("NOREPLICAS") => Failure::Transient(format!(
            "Redis at {shown} refuses writes until enough replicas are in step (min-replicas-to-write): reconnect its replicas (INFO replication lists them)"
        )),
        // `stop-writes-on-bgsave-error`: the last snapshot failed.
        Some("MISCONF") => Failure::Transient(format!(
            "Redis at {shown} refuses writes because its last snapshot to disk failed (MISCONF): see its log, free disk space, or fix the dump's directory"
        )),
        _ if detail.contains("max number of clients reached") => Failure::Transient(format!(
            "Redis at {shown} has as many clients as it takes (maxclients): raise maxclients, or fewer contenders per server"
        )),
        // Full with noeviction: a write is refused until memory is freed.
        Some("OOM") => Failure::Transient(format!(
            "Redis at {shown} is out of memory and refuses writes (used memory over maxmemory, with noeviction): free memory or raise maxmemory"
        )),
        _ if error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::MasterDown) => {
            Failure::Transient(format!(
                "Redis at {shown}: the server the Sentinels name as the primary does not answer as one ({detail}); a failover is under way, or the primary is down"
            ))
        }
        // Also while a failover is under way: the server the Sentinels
        // name does not say it is the primary yet.
        _ if error.kind() == redis::ErrorKind::MasterNameNotFoundBySentinel => {
            Failure::Transient(match &settings.servers {
                Servers::Sentinel {
                    sentinels, primary, ..
                } => format!(
                    "the Sentinels at {} name no primary named '{primary}' that answers as one (the name in the URL, or a failover under way)",
                    sentinels
                        .iter()
                        .map(|s| s.addr().to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                ),
                Servers::Nodes(_) => error.to_string(),
            })
        }
        _ if error.kind() == redis::ErrorKind::AuthenticationFailed => {
            Failure::Final(StoreError::denied(format!(
                "permission denied: Redis at {shown} refused the credentials: give the password in the URL or in REDISCLI_AUTH"
            )))
        }
        _ if error.is_io_error() || error.is_timeout() || error.is_connection_refusal() => {
            let hint = if settings.servers.tls() {
                "is redis-server running, with TLS on that port? for one without TLS, use redis://"
            } else {
                "is redis-server running? check --store"
            };
            Failure::Transient(format!(
                "cannot reach Redis at {shown}: {} ({hint})",
                crate::store::network_cause(&error.to_string())
            ))
        }
        _ => Failure::Final(StoreError::unavailable(format!(
            "Redis at {shown} answered an error: {error}"
        ))),
    }
}

/// The usage error of a prefix whose keys would not share a slot of Redis
/// Cluster.
fn cross_slot(prefix: &str) -> StoreError {
    let why = CrossSlot {
        prefix: prefix.to_string(),
    };
    StoreError::usage(why.to_string()).caused_by(why)
}

/// Connects, and on one server says PING, so that a server that wants a
/// password says so (NOAUTH) before anything else is sent (a cluster
/// client has asked a node for the slot map by then).
fn connect(settings: &Settings, read_timeout: Duration) -> Result<Link, RedisError> {
    let mut link = Link::open(
        &settings.servers,
        settings.tls.as_ref(),
        read_timeout,
        CALL_TIMEOUT,
    )?;
    if !link.is_cluster() {
        redis::cmd("PING").query::<String>(&mut link)?;
    }
    Ok(link)
}

/// What a script says of the semaphore's keys as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Epoch {
    /// Made with the keys: another one means they were lost meanwhile.
    id: String,
    /// The longest TTL in use lately, which a lock delay must cover.
    longest_ttl: Duration,
}

/// What the acquire script answered.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Acquired {
        fence: u64,
        epoch: Epoch,
    },
    Wait {
        held: usize,
        ahead: usize,
        epoch: Epoch,
        /// What is left of a lock delay (the keys were lost).
        lock_delay: Duration,
    },
    /// Every slot is taken (with `--try`).
    Full {
        held: usize,
        ahead: usize,
    },
    Conflict(String),
    /// A key of the semaphore's holds what is not consem's: (key, what).
    Foreign(String, String),
}

fn text(value: &Value) -> String {
    match value {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(s) => s.clone(),
        other => format!("{other:?}"),
    }
}

/// An answer the scripts never give (another program's script under the
/// same SHA, a proxy in between), as Redis sent it.
#[derive(Debug, PartialEq, Eq)]
struct Unexpected(String);

impl std::fmt::Display for Unexpected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "an unexpected answer: {}", self.0)
    }
}

impl std::error::Error for Unexpected {}

fn number(value: Option<&Value>) -> Result<i64, Unexpected> {
    match value {
        Some(Value::Int(n)) => Ok(*n),
        other => Err(Unexpected(format!("{other:?}"))),
    }
}

fn read_answer(value: Value) -> Result<Answer, Unexpected> {
    let Value::Array(items) = value else {
        return Err(Unexpected(format!("{value:?}")));
    };
    let count = |v: Option<&Value>| number(v).map(|n| n.max(0) as usize);
    match items.first().map(text).as_deref() {
        Some("acquired") => Ok(Answer::Acquired {
            fence: number(items.get(1))? as u64,
            epoch: read_epoch(&items, 2)?,
        }),
        Some("wait") => Ok(Answer::Wait {
            held: count(items.get(1))?,
            ahead: count(items.get(2))?,
            lock_delay: Duration::from_millis(count(items.get(3))? as u64),
            epoch: read_epoch(&items, 4)?,
        }),
        Some("full") => Ok(Answer::Full {
            held: count(items.get(1))?,
            ahead: count(items.get(2))?,
        }),
        Some("conflict") => Ok(Answer::Conflict(items.get(1).map(text).unwrap_or_default())),
        Some("foreign") => Ok(Answer::Foreign(
            items.get(1).map(text).unwrap_or_default(),
            items.get(2).map(text).unwrap_or_default(),
        )),
        other => Err(Unexpected(format!("{other:?}"))),
    }
}

/// The epoch in a script's answer: its id at `at`, the longest TTL in
/// use (ms) after it.
fn read_epoch(items: &[Value], at: usize) -> Result<Epoch, Unexpected> {
    Ok(Epoch {
        id: items.get(at).map(text).unwrap_or_default(),
        longest_ttl: Duration::from_millis(number(items.get(at + 1))?.max(0) as u64),
    })
}

/// What the renew script answered.
#[derive(Debug, PartialEq, Eq)]
enum Renewal {
    Held,
    Gone,
    /// Gone with the semaphore's keys (a wipe, an eviction), or with the
    /// data going back (a restart from an older snapshot).
    Lost,
}

fn read_renewal(value: Value) -> Result<(Renewal, Epoch), Unexpected> {
    let Value::Array(items) = value else {
        return Err(Unexpected(format!("{value:?}")));
    };
    let renewal = match number(items.first())? {
        1 => Renewal::Held,
        0 => Renewal::Gone,
        _ => Renewal::Lost,
    };
    Ok((renewal, read_epoch(&items, 1)?))
}

/// How a server's `INFO memory` says it evicts keys: `Some(policy)` when
/// its policy may evict keys without a TTL (the permits) once its memory
/// is full; `None` when it never evicts them (`noeviction`, a `volatile-*`
/// policy, or no `maxmemory`).
fn evicting_policy(info: &str) -> Option<String> {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let policy = field("maxmemory_policy")?;
    let limited = field("maxmemory").is_some_and(|bytes| bytes != "0");
    (limited && policy.starts_with("allkeys-")).then(|| policy.to_string())
}

/// What the helper threads share with `release`, beside the [`Gate`]'s
/// own (a script that writes may be under way: release waits for it).
#[derive(Default)]
pub struct Shared {
    fence: Option<u64>,
    /// A script that writes was sent: release has something to undo.
    written: bool,
    /// The semaphore's epoch as we last saw it.
    epoch: Option<Epoch>,
}

/// A semaphore at one prefix on Redis, for one run.
pub struct RedisSemaphore {
    settings: Settings,
    prefix: String,
    limit: u32,
    keys: Keys,
    /// Our permit's id: random, so that no two contenders share one.
    id: String,
    info: String,
    gate: Gate<Shared>,
}

impl RedisSemaphore {
    pub fn new(
        settings: Settings,
        prefix: &str,
        limit: u32,
        info: &ContenderInfo,
    ) -> RedisSemaphore {
        RedisSemaphore {
            keys: Keys::new(prefix),
            id: crate::sys::random_uuid(),
            info: serde_json::to_string(info).expect("a description always encodes"),
            prefix: prefix.to_string(),
            limit,
            settings,
            gate: Gate::default(),
        }
    }

    /// Runs the acquire script unless release began (marking the write
    /// under way, so that release waits for it and then undoes it).
    fn acquire_once(
        &self,
        connection: &mut Link,
        mode: Contend,
    ) -> Option<Result<Value, RedisError>> {
        let ttl_ms = self.settings.ttl.as_millis() as u64;
        let script = || {
            let (seen, delay_if_lost) = self.epoch_seen();
            acquire_script()
                .key(&self.keys.holders)
                .key(&self.keys.queue)
                .key(&self.keys.tickets)
                .key(&self.keys.fence)
                .key(&self.keys.limit)
                .key(&self.keys.alive)
                .key(&self.keys.epoch)
                .key(&self.keys.lock_delay)
                .arg(&self.id)
                .arg(self.limit)
                .arg(ttl_ms)
                .arg(&self.keys.base)
                .arg(&self.info)
                .arg(if mode == Contend::Try { "try" } else { "wait" })
                .arg(seen)
                .arg(delay_if_lost.as_millis() as u64)
                .invoke::<Value>(connection)
        };
        self.gate
            .write(|shared| shared.written = true, script, |_, _| {})
    }

    /// The fence once the slot is ours, and when the call that won it was
    /// sent.
    fn take_slot(&self, mode: Contend) -> Result<(u64, Instant), Stop> {
        let shown = &self.settings.shown;
        let ttl = self.settings.ttl;
        let period = lease::renew_period(ttl);
        let mut outage = Outage::new(ttl);
        // The list we are woken through; a BLPOP waits at most a period.
        let mut connection = loop {
            let error = match connect(&self.settings, period + CALL_TIMEOUT) {
                Ok(link) => break link,
                Err(error) => error,
            };
            // Sentinels that answered, naming a primary that does not
            // answer as one: a failover under way, retried for a TTL.
            let failing_over =
                error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::MasterDown);
            match classify(error, &self.settings, &self.prefix) {
                Failure::Transient(why) if failing_over => {
                    let Some(pause) = outage.retry_slow() else {
                        return Err(StoreError::unavailable(why).into());
                    };
                    report::event("retry", &[("error", &why)]);
                    thread::sleep(pause);
                }
                failure => return Err(failure.into_error().into()),
            }
        };
        self.refuse_eviction(&mut connection)?;
        // Redis answered: from here a failure is an outage (a cluster's
        // primary that died, a failover), retried within a TTL.
        outage.recovered();
        let mut last_picture: Option<Progress> = None;
        loop {
            let sent = Instant::now();
            let Some(answer) = self.acquire_once(&mut connection, mode) else {
                return Err(Stop::Closing);
            };
            let answer = match answer {
                Ok(value) => read_answer(value).map_err(|why| {
                    StoreError::unavailable(format!("Redis at {shown} gave {why}")).caused_by(why)
                })?,
                Err(error) => match classify(error, &self.settings, &self.prefix) {
                    Failure::Final(error) => {
                        // A script refused for want of permission, or
                        // for keys in several slots of a cluster, never
                        // ran: release has nothing to undo.
                        if matches!(error.kind, ErrorKind::Denied | ErrorKind::Usage) {
                            self.gate.lock().written = false;
                        }
                        return Err(error.into());
                    }
                    Failure::Transient(why) => {
                        self.pause_to_retry(&mut outage, why, &mut connection, false)?;
                        continue;
                    }
                },
            };
            if !matches!(answer, Answer::Acquired { .. }) {
                outage.recovered();
            }
            match answer {
                Answer::Acquired { fence, epoch } => {
                    self.note_epoch(epoch);
                    match self.replicated(&mut connection, "our slot", "it was given back unused") {
                        Ok(()) => {
                            outage.recovered();
                            self.gate.lock().fence = Some(fence);
                            return Ok((fence, sent));
                        }
                        // Not used: given back at once, so that it holds
                        // nobody back, then asked for again as after an
                        // outage (the replicas may be catching up).
                        Err(failure) => {
                            let _ = self.give_back(&mut connection);
                            if self.gate.closing() {
                                return Err(Stop::Closing);
                            }
                            match failure {
                                Failure::Final(error) => return Err(error.into()),
                                Failure::Transient(why) => {
                                    self.pause_to_retry(&mut outage, why, &mut connection, true)?;
                                    continue;
                                }
                            }
                        }
                    }
                }
                Answer::Foreign(key, what) => {
                    // Refused before anything was written.
                    self.gate.lock().written = false;
                    return Err(StoreError::conflict(format!(
                        "{key} {what}: it is not consem's, and consem leaves it untouched; use another --prefix, or delete the key if it is stale"
                    )).into());
                }
                Answer::Conflict(why) => {
                    return Err(StoreError::conflict(format!(
                        "{} {why} but --limit is {}: every contender on a prefix must use the same limit (consem reset --store redis://… --prefix {} once it is idle); a key that is not consem's is left untouched",
                        self.keys.holders, self.limit, self.prefix
                    )).into())
                }
                Answer::Full { held, ahead } => {
                    return Err(Stop::NoSlot(Progress {
                        limit: self.limit,
                        holders: vec![Holder { host: None, pid: None, since: None }; held],
                        ahead,
                    }))
                }
                Answer::Wait {
                    held,
                    ahead,
                    epoch,
                    lock_delay,
                } => {
                    self.note_epoch(epoch);
                    if !lock_delay.is_zero() {
                        report::event(
                            "lock-delay",
                            &[("left", &crate::duration::human(lock_delay))],
                        );
                    }
                    let picture = Progress {
                        limit: self.limit,
                        holders: vec![Holder { host: None, pid: None, since: None }; held],
                        ahead,
                    };
                    self.gate
                        .waiting_if_changed(&self.prefix, picture, &mut last_picture);
                    // Woken by the departure that may serve us, or after a
                    // period (or the lock delay's end): the next look also
                    // keeps our place alive.
                    let nap = if lock_delay.is_zero() {
                        period
                    } else {
                        period.min(lock_delay)
                    };
                    let _: Result<Value, RedisError> = redis::cmd("BLPOP")
                        .arg(self.keys.wake(&self.id))
                        .arg(nap.as_secs_f64())
                        .query(&mut connection);
                }
            }
        }
    }

    /// Pauses before the next attempt to take a slot after a failure
    /// worth retrying, and connects afresh; gives up once retrying is over
    /// (`took`: Redis took the call, and may be retried for a TTL even
    /// before it ever answered, see [`Outage::retry_slow`]).
    fn pause_to_retry(
        &self,
        outage: &mut Outage,
        why: String,
        connection: &mut Link,
        took: bool,
    ) -> Result<(), Stop> {
        let pause = if took {
            outage.retry_slow()
        } else {
            outage.retry_after()
        };
        let Some(pause) = pause else {
            return Err(StoreError::unavailable(why).into());
        };
        report::event("retry", &[("error", &why)]);
        thread::sleep(pause);
        let period = lease::renew_period(self.settings.ttl);
        if let Ok(fresh) = connect(&self.settings, period + CALL_TIMEOUT) {
            *connection = fresh;
        }
        Ok(())
    }

    /// Leaves: our permit, our place in the queue and our keys go, and the
    /// waiter first in line is woken.
    fn give_back(&self, connection: &mut Link) -> Result<(), RedisError> {
        release_script()
            .key(&self.keys.holders)
            .key(&self.keys.queue)
            .key(&self.keys.limit)
            .key(&self.keys.alive)
            .arg(&self.id)
            .arg(&self.keys.base)
            .invoke::<i64>(connection)
            .map(drop)
    }

    /// With `--redis-wait-replicas N`: whether N replicas acknowledged
    /// every write sent on `connection` so far (`WAIT N timeout`), `what`
    /// (our slot, our renewal) with them; `unconfirmed` says what becomes
    /// of it otherwise. Unconfirmed is worth trying again: a replica may
    /// be catching up or restarting.
    fn replicated(
        &self,
        connection: &mut Link,
        what: &str,
        unconfirmed: &str,
    ) -> Result<(), Failure> {
        let Some(wanted) = self.settings.wait_replicas else {
            return Ok(());
        };
        let timeout = wait_timeout(self.settings.ttl);
        // To the server that took the writes: on a cluster, the primary of
        // the prefix's slot (the cluster client would ask every node).
        let mut wait = redis::cmd("WAIT");
        wait.arg(wanted).arg(timeout.as_millis() as u64);
        let acknowledged: i64 = connection
            .query_beside(&wait, &self.keys.holders)
            .map_err(|error| classify(error, &self.settings, &self.prefix))?;
        if acknowledged >= i64::from(wanted) {
            return Ok(());
        }
        Err(Failure::Transient(format!(
            "{acknowledged} replicas of Redis at {} acknowledged {what} within {}, and --redis-wait-replicas asks for {wanted}, so {unconfirmed}: start or reconnect its replicas (INFO replication lists them), or lower --redis-wait-replicas",
            self.settings.shown,
            crate::duration::human(timeout)
        )))
    }

    /// Learns the semaphore's epoch from an answer; another than the one
    /// seen before means its keys were lost meanwhile (the script has set
    /// the lock delay).
    fn note_epoch(&self, epoch: Epoch) {
        let mut shared = self.gate.lock();
        if shared
            .epoch
            .as_ref()
            .is_some_and(|seen| seen.id != epoch.id)
        {
            report::event("keys-lost", &[("key", &self.keys.holders)]);
        }
        shared.epoch = Some(epoch);
    }

    /// The epoch id we saw last ('' before the first answer), and the lock
    /// delay a script sets should it find the keys lost since: a TTL, ours
    /// or the longest in use when we last looked, whichever is longer.
    fn epoch_seen(&self) -> (String, Duration) {
        match &self.gate.lock().epoch {
            Some(epoch) => (epoch.id.clone(), epoch.longest_ttl.max(self.settings.ttl)),
            None => (String::new(), self.settings.ttl),
        }
    }

    /// Refuses a server whose eviction policy may evict the permits, unless
    /// told to run there all the same.
    fn refuse_eviction(&self, connection: &mut Link) -> Result<(), StoreError> {
        if self.settings.allow_eviction {
            return Ok(());
        }
        // Asked of the server that holds the prefix's keys: on a cluster
        // node named alone, the key's redirect makes the link a cluster
        // client, which sends the pair again to the slot's primary.
        let (_, info): (i64, String) = redis::pipe()
            .cmd("EXISTS")
            .arg(&self.keys.holders)
            .cmd("INFO")
            .arg("memory")
            .query(connection)
            .map_err(|error| match classify(error, &self.settings, &self.prefix).into_error() {
                denied if denied.kind == ErrorKind::Denied => StoreError::denied(
                    "permission denied: the Redis user may not do what consem needs (INFO, which tells whether Redis may evict the semaphore's keys): allow it +info, or pass --redis-allow-eviction if this server never evicts",
                ),
                other => other,
            })?;
        match evicting_policy(&info) {
            None => Ok(()),
            Some(policy) => Err(StoreError::config(format!(
                "Redis at {} evicts any key when its memory is full (maxmemory-policy {policy}), the semaphore's permits too, which would let more than --limit run: set maxmemory-policy noeviction (or a volatile-* policy), or pass --redis-allow-eviction to accept the risk",
                self.settings.shown
            ))),
        }
    }

    /// Renews the permit every second (or every TTL/3 if that is sooner),
    /// at once when an operator wakes us, and retries what fails while the
    /// lease granted until `lease_end` lasts. Renewing this often keeps the
    /// lease fresh, so that an outage that starts at any moment is ridden
    /// out for as long as the lease can cover, and a permit that vanished
    /// (a wipe, an eviction) is noticed within a second. Returns why the
    /// slot is lost, or `None` once release began.
    fn renew_until_lost(&self, mut lease_end: Instant) -> Option<String> {
        let ttl = self.settings.ttl;
        let every = RENEW_EVERY.min(lease::renew_period(ttl));
        let fence = self.gate.lock().fence.unwrap_or_default();
        let mut failures = Failures::new(self.settings.monitor_retry);
        let mut connection: Option<Link> = None;
        // When the last confirmed renewal was sent; `None` renews at once
        // (the first round, and after a failure).
        let mut renewed: Option<Instant> = None;
        loop {
            if self.gate.closing() {
                return None;
            }
            let attempt = match connection.as_mut() {
                Some(con) => Ok(con),
                None => connect(&self.settings, every + CALL_TIMEOUT)
                    .map(|fresh| connection.insert(fresh)),
            };
            let result = attempt.and_then(|con| {
                if let Some(at) = renewed {
                    // The next renewal, or a push from `consem release`.
                    let nap = (at + every).saturating_duration_since(Instant::now());
                    if !nap.is_zero() {
                        redis::cmd("BLPOP")
                            .arg(self.keys.wake(&self.id))
                            .arg(nap.as_secs_f64())
                            .query::<Value>(con)?;
                    }
                }
                let sent = Instant::now();
                let (seen, delay_if_lost) = self.epoch_seen();
                renew_script()
                    .key(&self.keys.holders)
                    .key(&self.keys.epoch)
                    .key(&self.keys.lock_delay)
                    .key(&self.keys.fence)
                    .arg(&self.id)
                    .arg(ttl.as_millis() as u64)
                    .arg(&self.keys.base)
                    .arg(seen)
                    .arg(fence)
                    .arg(delay_if_lost.as_millis() as u64)
                    .invoke::<Value>(con)
                    .map(|answer| (answer, sent))
            });
            if self.gate.closing() {
                return None;
            }
            let why = match result {
                Ok((answer, sent)) => match read_renewal(answer) {
                    Ok((Renewal::Held, epoch)) => {
                        self.note_epoch(epoch);
                        let con = connection.as_mut().expect("a renewal answered on it");
                        // Unconfirmed, it is a failed renewal: the lease
                        // stays as the last confirmed one left it.
                        match self.replicated(con, "our renewal", "it does not count") {
                            Ok(()) => {}
                            Err(Failure::Final(error)) => return Some(error.to_string()),
                            Err(Failure::Transient(why)) => {
                                connection = None;
                                renewed = None;
                                if let Err(end) = failures.retry(&self.gate, lease_end, "", &why) {
                                    return end;
                                }
                                continue;
                            }
                        }
                        failures.reset();
                        renewed = Some(sent);
                        lease_end = lease::lease_end(sent, ttl);
                        self.gate.notify(SlotEvent::Leased { until: lease_end });
                        continue;
                    }
                    Ok((Renewal::Gone, _)) => {
                        return Some(format!(
                            "our permit is gone from {} (expired, or taken out by consem release or reset)",
                            self.keys.holders
                        ))
                    }
                    Ok((Renewal::Lost, _)) => {
                        return Some(format!(
                            "Redis lost the semaphore's keys, our permit in {} with them (FLUSHALL, an eviction, a restart without its data or from an older snapshot, a failover); no slot is granted on the prefix until every lease granted before could have ended",
                            self.keys.holders
                        ))
                    }
                    Err(why) => format!("Redis at {} gave {why}", self.settings.shown),
                },
                Err(error) => match classify(error, &self.settings, &self.prefix) {
                    Failure::Final(error) => return Some(error.to_string()),
                    Failure::Transient(why) => why,
                },
            };
            connection = None;
            renewed = None;
            if let Err(end) = failures.retry(&self.gate, lease_end, "", &why) {
                return end;
            }
        }
    }
}

impl Recipe for RedisSemaphore {
    type Shared = Shared;
    /// When the lease granted with the slot ends.
    type Held = Instant;

    fn gate(&self) -> &Gate<Shared> {
        &self.gate
    }

    fn prefix(&self) -> &str {
        &self.prefix
    }

    fn acquire(self: &Arc<Self>, mode: Contend) -> Result<Grant<Instant>, Stop> {
        let (fence, sent) = self.take_slot(mode)?;
        // The permit's expiry was set by the script that gave us the slot:
        // the lease counts from then, so that a first renewal that never
        // gets through is still bounded.
        let lease_end = lease::lease_end(sent, self.settings.ttl);
        Ok(Grant {
            fence,
            lease: Some(lease_end),
            held: lease_end,
        })
    }

    fn hold(self: &Arc<Self>, lease_end: Instant) -> Option<String> {
        self.renew_until_lost(lease_end)
    }
}

impl SlotBackend for RedisSemaphore {
    fn contend(self: Arc<Self>, mode: Contend, notify: Notify) {
        driver::contend(self, mode, notify);
    }

    fn release(&self, budget: Duration) -> Result<Released, ReleaseError> {
        let deadline = Instant::now() + budget;
        // A holder pausing between retries stops at once.
        let held = {
            let (shared, _) = self.gate.stop(budget / 2);
            if !shared.written {
                return Ok(Released::Left);
            }
            shared.fence.is_some()
        };
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        let released = connect(&self.settings, left)
            .and_then(|mut connection| self.give_back(&mut connection));
        report::event(driver::leaving_event(held), &[("prefix", &self.prefix)]);
        released.map(|_| Released::Left).map_err(|error| {
            ReleaseError(vec![Unfinished::step(format!(
                "leaving {}",
                self.keys.holders
            ))
            .because(crate::store::network_cause(&error.to_string()))
            .cleanup(format!(
                "our permit expires by itself within {}",
                crate::duration::human(self.settings.ttl)
            ))])
        })
    }

    fn frees_slot_at_death(&self) -> bool {
        STORE.frees_slot_at_death
    }
}

/// The operators' commands on one Redis prefix.
pub struct RedisAdmin {
    settings: Settings,
    prefix: String,
    keys: Keys,
}

impl RedisAdmin {
    pub fn new(settings: Settings, prefix: &str) -> RedisAdmin {
        RedisAdmin {
            keys: Keys::new(prefix),
            prefix: prefix.to_string(),
            settings,
        }
    }

    fn connection(&self) -> Result<Link, StoreError> {
        connect(&self.settings, CALL_TIMEOUT).map_err(|e| self.failure(e))
    }

    fn failure(&self, error: RedisError) -> StoreError {
        classify(error, &self.settings, &self.prefix).into_error()
    }

    fn now(&self, connection: &mut Link) -> Result<f64, StoreError> {
        let (seconds, micros): (u64, u64) = redis::cmd("TIME")
            .query(connection)
            .map_err(|e| self.failure(e))?;
        Ok(seconds as f64 + micros as f64 / 1e6)
    }

    /// The limit record; one that is not a limit is reported, not read.
    fn limit(&self, connection: &mut Link) -> Result<Option<u32>, StoreError> {
        let kind: String = redis::cmd("TYPE")
            .arg(&self.keys.limit)
            .query(connection)
            .map_err(|e| self.failure(e))?;
        if kind == "none" {
            return Ok(None);
        }
        let recorded: Option<String> = if kind == "string" {
            redis::cmd("GET")
                .arg(&self.keys.limit)
                .query(connection)
                .map_err(|e| self.failure(e))?
        } else {
            None
        };
        match recorded.as_deref().map(str::parse::<u32>) {
            Some(Ok(limit)) => Ok(Some(limit)),
            _ => Err(StoreError::conflict(format!(
                "{} is not a limit record consem can read (a {kind}{}); consem leaves it untouched: delete it if it is stale",
                self.keys.limit,
                recorded.map(|r| format!(" holding '{}'", report::abbreviated(&r))).unwrap_or_default()
            ))),
        }
    }

    /// Live holders (expiry still ahead) and dead ones, in expiry order.
    fn holders(&self, connection: &mut Link) -> Result<(Vec<String>, Vec<String>), StoreError> {
        let kind: String = redis::cmd("TYPE")
            .arg(&self.keys.holders)
            .query(connection)
            .map_err(|e| self.failure(e))?;
        if kind != "zset" && kind != "none" {
            return Err(StoreError::conflict(format!(
                "{} is a {kind}, not a sorted set of permits; consem leaves it untouched",
                self.keys.holders
            )));
        }
        let now = self.now(connection)?;
        let permits: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(&self.keys.holders)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(connection)
            .map_err(|e| self.failure(e))?;
        Ok(permits.into_iter().fold(
            (Vec::new(), Vec::new()),
            |(mut live, mut dead), (id, expiry)| {
                if expiry > now {
                    live.push(id);
                } else {
                    dead.push(id);
                }
                (live, dead)
            },
        ))
    }

    fn describe(
        &self,
        connection: &mut Link,
        id: &str,
        index: u64,
    ) -> Result<ContenderStatus, StoreError> {
        let info: Option<String> = redis::cmd("GET")
            .arg(self.keys.info(id))
            .query(connection)
            .map_err(|e| self.failure(e))?;
        let info = info
            .map(|i| ContenderInfo::parse(i.as_bytes()))
            .unwrap_or_default();
        Ok(ContenderStatus::new(id.to_string(), info, index))
    }

    fn wake(&self, connection: &mut Link, id: &str) -> Result<(), StoreError> {
        let key = self.keys.wake(id);
        redis::pipe()
            .cmd("LPUSH")
            .arg(&key)
            .arg("1")
            .ignore()
            .cmd("PEXPIRE")
            .arg(&key)
            .arg(60_000)
            .ignore()
            .query::<()>(connection)
            .map_err(|e| self.failure(e))
    }
}

impl Admin for RedisAdmin {
    fn status(&self) -> Result<Status, StoreError> {
        let mut connection = self.connection()?;
        let (live, dead) = self.holders(&mut connection)?;
        let limit = self.limit(&mut connection)?;
        let queue: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(&self.keys.queue)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(&mut connection)
            .map_err(|e| self.failure(e))?;
        let mut holders = Vec::new();
        for (index, id) in live.iter().enumerate() {
            holders.push(self.describe(&mut connection, id, index as u64)?);
        }
        let now = self.now(&mut connection)?;
        let mut waiters = Vec::new();
        let mut stale = Vec::new();
        for (id, ticket) in queue {
            let until: Option<f64> = redis::cmd("ZSCORE")
                .arg(&self.keys.alive)
                .arg(&id)
                .query(&mut connection)
                .map_err(|e| self.failure(e))?;
            if until.is_some_and(|until| until > now) {
                waiters.push(self.describe(&mut connection, &id, ticket as u64)?);
            } else {
                stale.push(format!(
                    "waiter {id} in {}, which stopped looking: the next contender drops it",
                    self.keys.queue
                ));
            }
        }
        if let Some(limit) = limit.filter(|_| holders.is_empty() && waiters.is_empty()) {
            stale.push(format!(
                "{} (limit {limit}) with no live holder or waiter: the next contender replaces it, or consem reset removes it",
                self.keys.limit
            ));
        }
        let lock_delay: i64 = redis::cmd("PTTL")
            .arg(&self.keys.lock_delay)
            .query(&mut connection)
            .map_err(|e| self.failure(e))?;
        Ok(Status {
            prefix: self.prefix.clone(),
            limit,
            layout: None,
            holders,
            waiters,
            dead_holders: dead,
            store: "redis",
            conflict: None,
            stale,
            lock_delay_ms: u64::try_from(lock_delay).ok(),
        })
    }

    fn release(&self, session: &str) -> Result<(), StoreError> {
        let mut connection = self.connection()?;
        let _: i64 = redis::cmd("ZREM")
            .arg(&self.keys.holders)
            .arg(session)
            .query(&mut connection)
            .map_err(|e| self.failure(e))?;
        self.wake(&mut connection, session)?;
        // The waiter first in line may take the freed slot.
        let first: Vec<String> = redis::cmd("ZRANGE")
            .arg(&self.keys.queue)
            .arg(0)
            .arg(0)
            .query(&mut connection)
            .map_err(|e| self.failure(e))?;
        if let Some(first) = first.first() {
            self.wake(&mut connection, first)?;
        }
        Ok(())
    }

    fn reset(&self, force: bool) -> Result<ResetOutcome, StoreError> {
        let mut connection = self.connection()?;
        let limit = self.limit(&mut connection)?;
        let (live, _) = self.holders(&mut connection)?;
        if limit.is_none() && live.is_empty() {
            return Ok(ResetOutcome::Nothing);
        }
        if !live.is_empty() && !force {
            return Ok(ResetOutcome::LiveHolders(live));
        }
        let _: () = redis::cmd("DEL")
            .arg(&self.keys.holders)
            .arg(&self.keys.limit)
            .query(&mut connection)
            .map_err(|e| self.failure(e))?;
        // Waiters that died in the queue go too (the next contender would
        // drop them): a reset prefix keeps only the two counters.
        let now = self.now(&mut connection)?;
        let queue: Vec<String> = redis::cmd("ZRANGE")
            .arg(&self.keys.queue)
            .arg(0)
            .arg(-1)
            .query(&mut connection)
            .map_err(|e| self.failure(e))?;
        for id in queue {
            let until: Option<f64> = redis::cmd("ZSCORE")
                .arg(&self.keys.alive)
                .arg(&id)
                .query(&mut connection)
                .map_err(|e| self.failure(e))?;
            if until.is_none_or(|until| until <= now) {
                let _: () = redis::pipe()
                    .cmd("ZREM")
                    .arg(&self.keys.queue)
                    .arg(&id)
                    .ignore()
                    .cmd("ZREM")
                    .arg(&self.keys.alive)
                    .arg(&id)
                    .ignore()
                    .cmd("DEL")
                    .arg(self.keys.info(&id))
                    .arg(self.keys.wake(&id))
                    .ignore()
                    .query(&mut connection)
                    .map_err(|e| self.failure(e))?;
            }
        }
        for id in &live {
            self.wake(&mut connection, id)?;
        }
        Ok(ResetOutcome::Reset {
            limit,
            evicted: live.len(),
        })
    }

    /// A `SCAN` for the limit records (on a cluster, of every primary),
    /// then per semaphore one pipeline of reads and one `MGET` of its
    /// holders' descriptions. On Redis Cluster the braces of a prefix's
    /// hash tag do not count against the root: `{jobs/a}` is under
    /// `jobs`.
    fn list(&self) -> Result<Vec<Summary>, StoreError> {
        let mut connection = self.connection()?;
        let records = connection
            .scan("semaphore:*:limit")
            .map_err(|e| self.failure(e))?;
        let mut prefixes: Vec<&str> = records
            .iter()
            .filter_map(|key| key.strip_prefix("semaphore:")?.strip_suffix(":limit"))
            .filter(|prefix| {
                super::is_under(prefix, &self.prefix)
                    || super::is_under(&prefix.replace(['{', '}'], ""), &self.prefix)
            })
            .collect();
        prefixes.sort_unstable();
        prefixes.dedup();
        let now = self.now(&mut connection)?;
        let mut semaphores = Vec::new();
        for prefix in prefixes {
            let keys = Keys::new(prefix);
            // Each read alone: a key of another type is read as absent,
            // not as a failure of the whole listing.
            let replies: Vec<redis::RedisResult<Value>> = redis::pipe()
                .ignore_errors()
                .cmd("GET")
                .arg(&keys.limit)
                .cmd("ZRANGE")
                .arg(&keys.holders)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .cmd("ZRANGE")
                .arg(&keys.queue)
                .arg(0)
                .arg(-1)
                .cmd("ZRANGE")
                .arg(&keys.alive)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query(&mut connection)
                .map_err(|e| self.failure(e))?;
            let mut replies = replies.into_iter();
            let mut next = || replies.next().and_then(Result::ok).unwrap_or(Value::Nil);
            let limit = redis::from_redis_value::<Option<String>>(next())
                .ok()
                .flatten()
                .and_then(|limit| limit.parse::<u32>().ok());
            let live_in = |value: Value| -> Vec<String> {
                redis::from_redis_value::<Vec<(String, f64)>>(value)
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|(_, until)| *until > now)
                    .map(|(id, _)| id)
                    .collect()
            };
            let holders = live_in(next());
            let queue: Vec<String> = redis::from_redis_value(next()).unwrap_or_default();
            let alive = live_in(next());
            let waiting = queue.iter().filter(|id| alive.contains(id)).count();
            let infos: Vec<Option<String>> = if holders.is_empty() {
                Vec::new()
            } else {
                redis::cmd("MGET")
                    .arg(holders.iter().map(|id| keys.info(id)).collect::<Vec<_>>())
                    .query(&mut connection)
                    .map_err(|e| self.failure(e))?
            };
            let holders = holders
                .into_iter()
                .zip(infos.into_iter().chain(std::iter::repeat(None)))
                .enumerate()
                .map(|(index, (id, info))| {
                    let info = info
                        .map(|i| ContenderInfo::parse(i.as_bytes()))
                        .unwrap_or_default();
                    ContenderStatus::new(id, info, index as u64)
                })
                .collect();
            semaphores.push(Summary::new(prefix.to_string(), limit, holders, waiting));
        }
        Ok(semaphores)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(reply: &str) -> RedisError {
        redis::parse_redis_value(format!("-{reply}\r\n").as_bytes())
            .unwrap()
            .extract_error()
            .unwrap_err()
    }

    fn settings(servers: Servers) -> Settings {
        Settings::new(servers, Duration::from_secs(15), None, false, None, None)
    }

    #[test]
    fn redis_errors_are_told_in_words_with_their_fix() {
        let one = settings(Servers::Nodes(vec![
            redis::IntoConnectionInfo::into_connection_info("redis://h:1").unwrap(),
        ]));
        let said =
            |reply: &str, settings: &Settings| match classify(server_error(reply), settings, "p") {
                Failure::Transient(why) => (true, why),
                Failure::Final(error) => (false, error.to_string()),
            };
        for (reply, transient, words) in [
            (
                "NOREPLICAS Not enough good replicas to write.",
                true,
                "min-replicas-to-write",
            ),
            (
                "MISCONF Redis is configured to save RDB snapshots",
                true,
                "snapshot to disk failed",
            ),
            (
                "ERR max number of clients reached",
                true,
                "raise maxclients",
            ),
            (
                "UNBLOCKED force unblock from blocking operation",
                true,
                "stopped being the primary",
            ),
            (
                "READONLY You can't write against a read only replica.",
                false,
                "point --store at the primary",
            ),
            (
                "CROSSSLOT Keys in request don't hash to the same slot",
                false,
                "--prefix '{p}'",
            ),
            ("CLUSTERDOWN The cluster is down", true, "cover every slot"),
        ] {
            let (was_transient, why) = said(reply, &one);
            assert_eq!(was_transient, transient, "{reply}: {why}");
            assert!(why.contains(words), "{reply}: {why}");
        }
        // Through Sentinel a replica's READONLY means the primary moved.
        let sentinel = settings(Servers::Sentinel {
            sentinels: vec![
                redis::IntoConnectionInfo::into_connection_info("redis://s:26379").unwrap(),
            ],
            primary: "jobs".into(),
            connection: Default::default(),
        });
        let (transient, why) = said(
            "READONLY You can't write against a read only replica.",
            &sentinel,
        );
        assert!(transient, "{why}");
        assert!(why.contains("has become a replica"), "{why}");
    }

    #[test]
    fn only_a_policy_that_may_evict_keys_without_a_ttl_is_refused() {
        let info = |max: &str, policy: &str| {
            format!("# Memory\r\nused_memory:1000\r\nmaxmemory:{max}\r\nmaxmemory_human:1M\r\nmaxmemory_policy:{policy}\r\n")
        };
        for policy in ["allkeys-lru", "allkeys-lfu", "allkeys-random"] {
            assert_eq!(
                evicting_policy(&info("1048576", policy)),
                Some(policy.to_string())
            );
            // Without maxmemory, Redis never evicts.
            assert_eq!(evicting_policy(&info("0", policy)), None);
        }
        for policy in [
            "noeviction",
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
        ] {
            assert_eq!(evicting_policy(&info("1048576", policy)), None);
        }
        // `maxmemory_human` is not `maxmemory`.
        assert_eq!(
            evicting_policy("maxmemory_human:1M\r\nmaxmemory_policy:allkeys-lru\r\n"),
            None
        );
        assert_eq!(evicting_policy(""), None);
    }

    #[test]
    fn answers_carry_the_epoch_and_the_lock_delay() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let epoch = |id: &str, ms: u64| Epoch {
            id: id.to_string(),
            longest_ttl: Duration::from_millis(ms),
        };
        assert_eq!(
            read_answer(Value::Array(vec![
                bulk("wait"),
                Value::Int(2),
                Value::Int(1),
                Value::Int(1500),
                bulk("1700000000000001"),
                Value::Int(30_000),
            ])),
            Ok(Answer::Wait {
                held: 2,
                ahead: 1,
                lock_delay: Duration::from_millis(1500),
                epoch: epoch("1700000000000001", 30_000),
            })
        );
        assert_eq!(
            read_answer(Value::Array(vec![
                bulk("acquired"),
                Value::Int(7),
                bulk("e"),
                Value::Int(6000)
            ])),
            Ok(Answer::Acquired {
                fence: 7,
                epoch: epoch("e", 6000)
            })
        );
        for (code, renewal) in [(1, Renewal::Held), (0, Renewal::Gone), (-1, Renewal::Lost)] {
            assert_eq!(
                read_renewal(Value::Array(vec![
                    Value::Int(code),
                    bulk("e"),
                    Value::Int(4000)
                ])),
                Ok((renewal, epoch("e", 4000)))
            );
        }
        assert!(read_renewal(Value::Int(1)).is_err());
        assert!(read_renewal(Value::Array(vec![Value::Int(1), bulk("e")])).is_err());
    }
}
