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

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, RedisError, Script, Value};

use super::lease;
use super::{
    Admin, Contend, ContenderInfo, ContenderStatus, Holder, Notify, Progress, Released,
    ResetOutcome, SlotBackend, SlotEvent, Status, StoreError,
};
use crate::report;

/// The highest `--limit`.
pub const MAX_LIMIT: u32 = 1024;

/// TTLs a permit may have.
const TTL_RANGE: (Duration, Duration) = (Duration::from_secs(2), Duration::from_secs(86_400));
const DEFAULT_TTL: Duration = Duration::from_secs(15);

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Budget of one command (a `BLPOP` gets its own wait on top).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// What a run on Redis needs beyond the store-neutral options.
#[derive(Debug, Clone)]
pub struct Settings {
    pub connection: redis::ConnectionInfo,
    /// `host:port/db`, for messages: never the password.
    pub shown: String,
    pub ttl: Duration,
    pub monitor_retry: u32,
}

impl Settings {
    /// Whether the store was given as `rediss://`.
    fn tls(&self) -> bool {
        matches!(self.connection.addr(), redis::ConnectionAddr::TcpTls { .. })
    }

    /// Reads `redis://[user[:password]@]host[:port][/db]`, or `rediss://`
    /// for TLS (the server's certificate checked against the system's
    /// roots, or the file `SSL_CERT_FILE` names, as OpenSSL has it); the
    /// password may come from `REDISCLI_AUTH`, as redis-cli reads it.
    pub fn new(
        url: &str,
        env: impl Fn(&str) -> Option<String>,
        limit: u32,
        ttl: Option<Duration>,
        monitor_retry: Option<u32>,
    ) -> Result<Settings, String> {
        let mut connection: redis::ConnectionInfo = redis::IntoConnectionInfo::into_connection_info(url)
            .map_err(|e| format!("--store: {} is not a Redis URL ({}); write redis://[user[:password]@]host[:port][/db]", crate::store::without_credentials(url), e.detail().unwrap_or("unreadable")))?;
        if connection.redis_settings().password().is_none() {
            if let Some(password) = env("REDISCLI_AUTH").filter(|p| !p.is_empty()) {
                let settings = connection.redis_settings().clone().set_password(password);
                connection = connection.set_redis_settings(settings);
            }
        }
        if limit > MAX_LIMIT {
            return Err(format!(
                "--limit {limit} is more than the Redis store keeps: use 1 to {MAX_LIMIT}"
            ));
        }
        let ttl = ttl.unwrap_or(DEFAULT_TTL);
        if ttl < TTL_RANGE.0 || ttl > TTL_RANGE.1 {
            return Err(format!(
                "--ttl {} is outside what the Redis store takes: use 2s to 24h",
                crate::duration::human(ttl)
            ));
        }
        let shown = format!("{}/{}", connection.addr(), connection.redis_settings().db());
        Ok(Settings {
            connection,
            shown,
            ttl,
            monitor_retry: monitor_retry.unwrap_or(3),
        })
    }
}

/// The keys of one prefix. On Redis Cluster they must hash to one slot:
/// put the prefix in braces (`--prefix '{jobs/nightly}'`).
#[derive(Debug, Clone)]
struct Keys {
    holders: String,
    queue: String,
    tickets: String,
    fence: String,
    limit: String,
    /// Waiters, scored by when their liveness runs out.
    alive: String,
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

fn classify(error: RedisError, settings: &Settings) -> Failure {
    let shown = &settings.shown;
    let code = error.code().map(str::to_string);
    let detail = error.detail().unwrap_or_default().to_string();
    match code.as_deref() {
        Some("NOAUTH") | Some("WRONGPASS") => Failure::Final(StoreError::Denied(format!(
            "permission denied: Redis at {shown} refused the credentials ({detail}): give the password in the URL or in REDISCLI_AUTH"
        ))),
        Some("NOPERM") => Failure::Final(StoreError::Denied(format!(
            "permission denied: the Redis user may not do what consem needs ({detail}); it needs EVAL, EVALSHA, SCRIPT, BLPOP, GET, ZRANGE on the keys semaphore:<prefix>*"
        ))),
        Some("READONLY") => Failure::Final(StoreError::Unavailable(format!(
            "Redis at {shown} is a read-only replica: point --store at the primary"
        ))),
        Some("LOADING") | Some("BUSY") | Some("TRYAGAIN") | Some("MASTERDOWN") => {
            Failure::Transient(format!("Redis at {shown} is not ready ({detail})"))
        }
        _ if error.kind() == redis::ErrorKind::AuthenticationFailed => {
            Failure::Final(StoreError::Denied(format!(
                "permission denied: Redis at {shown} refused the credentials: give the password in the URL or in REDISCLI_AUTH"
            )))
        }
        _ if error.to_string().contains("certificate") => {
            Failure::Final(StoreError::Unavailable(format!(
                "cannot talk to Redis at {shown} over TLS: {error} (point SSL_CERT_FILE at the CA that signs the server's certificate)"
            )))
        }
        _ if error.is_io_error() || error.is_timeout() || error.is_connection_refusal() => {
            let hint = if settings.tls() {
                "is redis-server running, with TLS on that port? for one without TLS, use redis://"
            } else {
                "is redis-server running? check --store"
            };
            Failure::Transient(format!(
                "cannot reach Redis at {shown}: {} ({hint})",
                crate::store::network_cause(&error.to_string())
            ))
        }
        _ => Failure::Final(StoreError::Unavailable(format!(
            "Redis at {shown} answered an error: {error}"
        ))),
    }
}

/// Connects, and says PING, so that a server that wants a password says
/// so (NOAUTH) before anything else is sent.
fn connect(settings: &Settings, read_timeout: Duration) -> Result<Connection, RedisError> {
    let client = redis::Client::open(settings.connection.clone())?;
    let mut connection = client.get_connection_with_timeout(CONNECT_TIMEOUT)?;
    connection.set_read_timeout(Some(read_timeout))?;
    connection.set_write_timeout(Some(CALL_TIMEOUT))?;
    redis::cmd("PING").query::<String>(&mut connection)?;
    Ok(connection)
}

/// What the acquire script answered.
enum Answer {
    Acquired {
        fence: u64,
    },
    Wait {
        held: usize,
        ahead: usize,
    },
    Full,
    Conflict(String),
    /// A key of the semaphore's holds what is not consem's: (key, what).
    Foreign(String, String),
}

fn read_answer(value: Value) -> Result<Answer, String> {
    let Value::Array(items) = value else {
        return Err(format!("an unexpected answer: {value:?}"));
    };
    let text = |v: &Value| match v {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(s) => s.clone(),
        other => format!("{other:?}"),
    };
    let number = |v: Option<&Value>| match v {
        Some(Value::Int(n)) => Ok(*n as u64),
        other => Err(format!("an unexpected answer: {other:?}")),
    };
    match items.first().map(text).as_deref() {
        Some("acquired") => Ok(Answer::Acquired {
            fence: number(items.get(1))?,
        }),
        Some("wait") => Ok(Answer::Wait {
            held: number(items.get(1))? as usize,
            ahead: number(items.get(2))? as usize,
        }),
        Some("full") => Ok(Answer::Full),
        Some("conflict") => Ok(Answer::Conflict(items.get(1).map(text).unwrap_or_default())),
        Some("foreign") => Ok(Answer::Foreign(
            items.get(1).map(text).unwrap_or_default(),
            items.get(2).map(text).unwrap_or_default(),
        )),
        other => Err(format!("an unexpected answer: {other:?}")),
    }
}

#[derive(Default)]
struct Shared {
    closing: bool,
    holding: bool,
    fence: Option<u64>,
    /// A script that writes may be under way: release waits for it.
    writing: bool,
    /// A script that writes was sent: release has something to undo.
    written: bool,
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
    shared: Mutex<Shared>,
    changed: std::sync::Condvar,
    notify: OnceLock<Notify>,
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
            id: random_id(),
            info: serde_json::to_string(info).expect("a description always encodes"),
            prefix: prefix.to_string(),
            limit,
            settings,
            shared: Mutex::new(Shared::default()),
            changed: std::sync::Condvar::new(),
            notify: OnceLock::new(),
        }
    }

    fn shared(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs the acquire script unless release began (marking the write
    /// under way, so that release waits for it and then undoes it).
    fn acquire_once(
        &self,
        connection: &mut Connection,
        mode: Contend,
    ) -> Option<Result<Value, RedisError>> {
        {
            let mut shared = self.shared();
            if shared.closing {
                return None;
            }
            shared.writing = true;
            shared.written = true;
        }
        let ttl_ms = self.settings.ttl.as_millis() as u64;
        let answer = acquire_script()
            .key(&self.keys.holders)
            .key(&self.keys.queue)
            .key(&self.keys.tickets)
            .key(&self.keys.fence)
            .key(&self.keys.limit)
            .key(&self.keys.alive)
            .arg(&self.id)
            .arg(self.limit)
            .arg(ttl_ms)
            .arg(&self.keys.base)
            .arg(&self.info)
            .arg(if mode == Contend::Try { "try" } else { "wait" })
            .invoke::<Value>(connection);
        let mut shared = self.shared();
        shared.writing = false;
        self.changed.notify_all();
        Some(answer)
    }

    fn contend_thread(self: Arc<Self>, mode: Contend, notify: Notify) {
        match self.acquire(mode) {
            Ok(Some((fence, sent))) => {
                report::event("acquired", &[("prefix", &self.prefix), ("fence", &fence)]);
                // The permit's expiry was set by the script that gave us
                // the slot: the lease counts from then, so that a first
                // renewal that never gets through is still bounded.
                notify(SlotEvent::Acquired {
                    fence,
                    lease: Some(lease::lease_end(sent, self.settings.ttl)),
                });
                if let Some(reason) = self.hold(&notify) {
                    if !self.shared().closing {
                        notify(SlotEvent::Lost(reason));
                    }
                }
            }
            Ok(None) => {}
            Err(error) => notify(SlotEvent::Failed(error)),
        }
    }

    /// The fence once the slot is ours, and when the call that won it was
    /// sent; `None` if release began or `--try` found no slot (reported
    /// here).
    fn acquire(&self, mode: Contend) -> Result<Option<(u64, Instant)>, StoreError> {
        let shown = &self.settings.shown;
        let ttl = self.settings.ttl;
        let period = lease::renew_period(ttl);
        // The list we are woken through; a BLPOP waits at most a period.
        let mut connection = connect(&self.settings, period + CALL_TIMEOUT).map_err(|e| {
            match classify(e, &self.settings) {
                Failure::Transient(why) | Failure::Final(StoreError::Unavailable(why)) => {
                    StoreError::Unavailable(why)
                }
                Failure::Final(other) => other,
            }
        })?;
        let mut reached = false;
        let mut outage: Option<Instant> = None;
        let mut backoff = FIRST_BACKOFF;
        let mut last_picture: Option<Progress> = None;
        loop {
            let sent = Instant::now();
            let Some(answer) = self.acquire_once(&mut connection, mode) else {
                return Ok(None);
            };
            let answer = match answer {
                Ok(value) => {
                    reached = true;
                    outage = None;
                    backoff = FIRST_BACKOFF;
                    read_answer(value).map_err(|why| {
                        StoreError::Unavailable(format!("Redis at {shown} gave {why}"))
                    })?
                }
                Err(error) => match classify(error, &self.settings) {
                    Failure::Final(error) => {
                        // A script refused for want of permission never
                        // ran: release has nothing to undo.
                        if matches!(error, StoreError::Denied(_)) {
                            self.shared().written = false;
                        }
                        return Err(error);
                    }
                    Failure::Transient(why) => {
                        let since = *outage.get_or_insert_with(Instant::now);
                        if !reached || since.elapsed() > ttl {
                            return Err(StoreError::Unavailable(why));
                        }
                        report::event("retry", &[("error", &why)]);
                        thread::sleep(backoff);
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        if let Ok(fresh) = connect(&self.settings, period + CALL_TIMEOUT) {
                            connection = fresh;
                        }
                        continue;
                    }
                },
            };
            match answer {
                Answer::Acquired { fence } => {
                    let mut shared = self.shared();
                    shared.fence = Some(fence);
                    shared.holding = true;
                    return Ok(Some((fence, sent)));
                }
                Answer::Foreign(key, what) => {
                    // Refused before anything was written.
                    self.shared().written = false;
                    return Err(StoreError::Conflict(format!(
                        "{key} {what}: it is not consem's, and consem leaves it untouched; use another --prefix, or delete the key if it is stale"
                    )));
                }
                Answer::Conflict(why) => {
                    return Err(StoreError::Conflict(format!(
                        "{} {why} but --limit is {}: every contender on a prefix must use the same limit (consem reset --store redis://… --prefix {} once it is idle); a key that is not consem's is left untouched",
                        self.keys.holders, self.limit, self.prefix
                    )))
                }
                Answer::Full => {
                    if let Some(notify) = self.notify.get() {
                        notify(SlotEvent::NoSlot);
                    }
                    return Ok(None);
                }
                Answer::Wait { held, ahead } => {
                    let picture = Progress {
                        limit: self.limit,
                        holders: vec![Holder { host: None, pid: None, since: None }; held],
                        ahead,
                    };
                    if last_picture.as_ref() != Some(&picture) {
                        report::event(
                            "waiting",
                            &[("prefix", &self.prefix), ("held", &format!("{held}/{}", self.limit)), ("ahead", &ahead)],
                        );
                        if let Some(notify) = self.notify.get() {
                            notify(SlotEvent::Waiting(picture.clone()));
                        }
                        last_picture = Some(picture);
                    }
                    // Woken by the departure that may serve us, or after a
                    // period: the next look also keeps our place alive.
                    let _: Result<Value, RedisError> = redis::cmd("BLPOP")
                        .arg(self.keys.wake(&self.id))
                        .arg(period.as_secs_f64())
                        .query(&mut connection);
                }
            }
        }
    }

    /// Renews the permit every TTL/3, or at once when an operator wakes us;
    /// returns why the slot is lost, or `None` once release began.
    fn hold(&self, notify: &Notify) -> Option<String> {
        let shown = &self.settings.shown;
        let ttl = self.settings.ttl;
        let period = lease::renew_period(ttl);
        let mut failures = 0;
        let mut connection: Option<Connection> = None;
        // At once on the first round, and after a failure: a renewal that
        // failed is retried now, not a period later.
        let mut renew_now = true;
        loop {
            if self.shared().closing {
                return None;
            }
            if connection.is_none() {
                connection = connect(&self.settings, period + CALL_TIMEOUT).ok();
            }
            let Some(con) = connection.as_mut() else {
                failures += 1;
                if failures > self.settings.monitor_retry {
                    return Some(format!("cannot reach Redis at {shown} ({failures} failures in a row, --monitor-retry is {})", self.settings.monitor_retry));
                }
                thread::sleep(FIRST_BACKOFF);
                continue;
            };
            if !renew_now {
                // A period, or a push from `consem release`.
                let _: Result<Value, RedisError> = redis::cmd("BLPOP")
                    .arg(self.keys.wake(&self.id))
                    .arg(period.as_secs_f64())
                    .query(con);
                if self.shared().closing {
                    return None;
                }
            }
            renew_now = false;
            let sent = Instant::now();
            let renewed: Result<i64, RedisError> = renew_script()
                .key(&self.keys.holders)
                .arg(&self.id)
                .arg(ttl.as_millis() as u64)
                .arg(&self.keys.base)
                .invoke(con);
            match renewed {
                Ok(1) => {
                    failures = 0;
                    notify(SlotEvent::Leased {
                        until: lease::lease_end(sent, ttl),
                    });
                }
                Ok(_) => {
                    return Some(format!(
                    "our permit is gone from {} (expired, or taken out by consem release or reset)",
                    self.keys.holders
                ))
                }
                Err(error) => match classify(error, &self.settings) {
                    Failure::Final(error) => return Some(error.to_string()),
                    Failure::Transient(why) => {
                        failures += 1;
                        connection = None;
                        renew_now = true;
                        if failures > self.settings.monitor_retry {
                            return Some(format!(
                                "{why} ({failures} failures in a row, --monitor-retry is {})",
                                self.settings.monitor_retry
                            ));
                        }
                        report::event("watch-retry", &[("failures", &failures), ("error", &why)]);
                        thread::sleep(FIRST_BACKOFF);
                    }
                },
            }
        }
    }
}

impl SlotBackend for RedisSemaphore {
    fn contend(self: Arc<Self>, mode: Contend, notify: Notify) {
        let _ = self.notify.set(Arc::clone(&notify));
        thread::Builder::new()
            .name("consem-contend".into())
            .spawn(move || self.contend_thread(mode, notify))
            .expect("cannot start the semaphore thread");
    }

    fn release(&self, budget: Duration) -> Result<Released, String> {
        let deadline = Instant::now() + budget;
        {
            let mut shared = self.shared();
            shared.closing = true;
            shared.holding = false;
            let (shared, _) = self
                .changed
                .wait_timeout_while(shared, budget / 2, |s| s.writing)
                .unwrap_or_else(|e| e.into_inner());
            if !shared.written {
                return Ok(Released::Left);
            }
        }
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        let released = connect(&self.settings, left).and_then(|mut connection| {
            release_script()
                .key(&self.keys.holders)
                .key(&self.keys.queue)
                .key(&self.keys.limit)
                .key(&self.keys.alive)
                .arg(&self.id)
                .arg(&self.keys.base)
                .invoke::<i64>(&mut connection)
        });
        report::event("released", &[("prefix", &self.prefix)]);
        released.map(|_| Released::Left).map_err(|error| {
            format!(
                "leaving {}: {}; our permit expires by itself within {}",
                self.keys.holders,
                crate::store::network_cause(&error.to_string()),
                crate::duration::human(self.settings.ttl)
            )
        })
    }

    fn child_env(&self) -> Vec<(String, String)> {
        let shared = self.shared();
        vec![
            ("CONSEM_PREFIX".into(), self.prefix.clone()),
            ("CONSEM_LIMIT".into(), self.limit.to_string()),
            (
                "CONSEM_FENCE".into(),
                shared.fence.unwrap_or_default().to_string(),
            ),
        ]
    }

    fn frees_slot_at_death(&self) -> bool {
        false
    }
}

/// A random permit id, as the common clients use (a UUID's form).
fn random_id() -> String {
    let mut bytes = [0u8; 16];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .is_err()
    {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
            ^ u128::from(std::process::id());
        bytes = seed.to_le_bytes();
    }
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        hex[0..4].concat(),
        hex[4..6].concat(),
        hex[6..8].concat(),
        hex[8..10].concat(),
        hex[10..16].concat()
    )
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

    fn connection(&self) -> Result<Connection, StoreError> {
        connect(&self.settings, CALL_TIMEOUT).map_err(|e| self.failure(e))
    }

    fn failure(&self, error: RedisError) -> StoreError {
        match classify(error, &self.settings) {
            Failure::Transient(why) => StoreError::Unavailable(why),
            Failure::Final(error) => error,
        }
    }

    fn now(&self, connection: &mut Connection) -> Result<f64, StoreError> {
        let (seconds, micros): (u64, u64) = redis::cmd("TIME")
            .query(connection)
            .map_err(|e| self.failure(e))?;
        Ok(seconds as f64 + micros as f64 / 1e6)
    }

    /// The limit record; one that is not a limit is reported, not read.
    fn limit(&self, connection: &mut Connection) -> Result<Option<u32>, StoreError> {
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
            _ => Err(StoreError::Conflict(format!(
                "{} is not a limit record consem can read (a {kind}{}); consem leaves it untouched: delete it if it is stale",
                self.keys.limit,
                recorded.map(|r| format!(" holding '{}'", report::abbreviated(&r))).unwrap_or_default()
            ))),
        }
    }

    /// Live holders (expiry still ahead) and dead ones, in expiry order.
    fn holders(
        &self,
        connection: &mut Connection,
    ) -> Result<(Vec<String>, Vec<String>), StoreError> {
        let kind: String = redis::cmd("TYPE")
            .arg(&self.keys.holders)
            .query(connection)
            .map_err(|e| self.failure(e))?;
        if kind != "zset" && kind != "none" {
            return Err(StoreError::Conflict(format!(
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
        connection: &mut Connection,
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

    fn wake(&self, connection: &mut Connection, id: &str) -> Result<(), StoreError> {
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
        for (id, ticket) in queue {
            let until: Option<f64> = redis::cmd("ZSCORE")
                .arg(&self.keys.alive)
                .arg(&id)
                .query(&mut connection)
                .map_err(|e| self.failure(e))?;
            if until.is_some_and(|until| until > now) {
                waiters.push(self.describe(&mut connection, &id, ticket as u64)?);
            }
        }
        Ok(Status {
            prefix: self.prefix.clone(),
            limit,
            layout: None,
            holders,
            waiters,
            dead_holders: dead,
            store: "redis",
            conflict: None,
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
}
