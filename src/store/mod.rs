//! The store interface: what the command line and child supervision need
//! from a semaphore store, whichever it is. `run` contends for a slot,
//! watches it and releases it ([`SlotBackend`]); `status`, `release` and
//! `reset` look after a semaphore ([`Admin`]). Each store lives in a folder
//! of its own below this one.

pub mod consul;
pub mod driver;
pub mod etcd;
pub mod kind;
pub mod lease;
pub mod local;
pub mod outage;
pub mod postgres;
pub mod redis;
pub mod resolver;
pub mod tls;
pub mod zookeeper;

use std::sync::Arc;

/// What the backend reports from its helper threads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotEvent {
    /// A slot is held; `fence` grows from one acquisition to the next.
    /// `lease` is when the store's guarantee of it ends, counted from the
    /// call that won it, as [`SlotEvent::Leased`] counts a renewal's; `None`
    /// where the slot lasts as long as consem lives. A grant that arrives
    /// after its lease (a stalled store, a slow network) starts nothing
    /// until a renewal confirms the slot.
    Acquired {
        fence: u64,
        lease: Option<std::time::Instant>,
    },
    /// `--try` found every slot taken; this is who held them.
    NoSlot(Progress),
    /// Every slot is taken; this is who holds them (sent when it changes).
    Waiting(Progress),
    /// The store guarantees the held slot until `until` (its lease, less a
    /// margin), as of a renewal it confirmed. Stores whose slots last as
    /// long as consem lives never send it.
    Leased { until: std::time::Instant },
    /// A held slot is no longer ours; the child must stop.
    Lost(String),
    /// The backend cannot go on.
    Failed(StoreError),
}

/// What a waiter can tell about the slots it waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub limit: u32,
    pub holders: Vec<Holder>,
    /// Waiters that arrived before us.
    pub ahead: usize,
}

/// A holder, as far as it describes itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub host: Option<String>,
    pub pid: Option<u64>,
    pub since: Option<std::time::SystemTime>,
}

impl Holder {
    /// `web-3 pid 812, started 4m12s ago`, as far as it describes itself
    /// (`?` for a host it does not name), dated by `now`; printable.
    pub fn describe(&self, now: std::time::SystemTime) -> String {
        use crate::report;
        let host = self.host.as_deref().unwrap_or("?");
        let mut text = report::abbreviated(&report::printable(host)).into_owned();
        if let Some(pid) = self.pid {
            text.push_str(&format!(" pid {pid}"));
        }
        if let Some(ago) = self
            .since
            .and_then(|since| crate::duration::ago(since, now))
        {
            text.push_str(&format!(", started {ago}"));
        }
        text
    }
}

impl From<&ContenderInfo> for Holder {
    fn from(info: &ContenderInfo) -> Holder {
        Holder {
            host: info.host.clone(),
            pid: info.pid,
            since: info
                .started
                .as_deref()
                .and_then(crate::report::parse_timestamp),
        }
    }
}

/// What a contender writes about itself for operators (`consem status`)
/// and for the waiting line of others: every store keeps it beside the
/// contender. On Consul it is the contender key's value, so its fields are
/// spelled as Go's encoder spells them; values from elsewhere may lack any
/// of them (`consul lock` writes nothing), and may carry more.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ContenderInfo {
    #[serde(default, deserialize_with = "lenient")]
    pub host: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub pid: Option<u64>,
    #[serde(default, deserialize_with = "lenient")]
    pub command: Option<String>,
    /// When its consem started, as `2026-11-22T10:04:05.123Z`.
    #[serde(default, deserialize_with = "lenient")]
    pub started: Option<String>,
}

/// A field of the wrong type reads as missing: the value is written by
/// whoever can write the store, and a bad field must not hide the others.
fn lenient<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    let value = <serde_json::Value as serde::Deserialize>::deserialize(deserializer)?;
    Ok(serde_json::from_value(value).ok())
}

/// The longest command shown in a contender's description.
const MAX_COMMAND_SHOWN: usize = 1024;

impl ContenderInfo {
    /// This process, about to run `command`.
    pub fn of_this_process(command: &[String]) -> ContenderInfo {
        let mut shown = command.join(" ");
        if shown.len() > MAX_COMMAND_SHOWN {
            let cut = (0..=MAX_COMMAND_SHOWN)
                .rev()
                .find(|&i| shown.is_char_boundary(i))
                .unwrap_or(0);
            shown.truncate(cut);
        }
        ContenderInfo {
            host: Some(crate::sys::hostname()),
            pid: Some(u64::from(std::process::id())),
            command: Some(shown),
            started: Some(crate::report::timestamp(std::time::SystemTime::now())),
        }
    }

    /// Reads a description; anything that is not a JSON object describes
    /// nobody.
    pub fn parse(value: &[u8]) -> ContenderInfo {
        serde_json::from_slice(value).unwrap_or_default()
    }

    /// The description as a JSON object, for stores to add their fields to.
    pub fn to_json(&self) -> serde_json::Map<String, serde_json::Value> {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => unreachable!("a struct encodes as an object"),
        }
    }
}

/// What kind of failure ends a run or an operator's command: each kind
/// has its own exit code (see `crate::exit_code_of`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The store's settings cannot be used (a bad address, a file that
    /// cannot be read, an option the store does not take).
    Usage,
    /// The semaphore's record disagrees with us or is not a semaphore.
    Conflict,
    /// The store cannot be reached or keeps failing.
    Unavailable,
    /// The store refused us for lack of permission.
    Denied,
    /// The store is set up in a way that breaks the semaphore's promise
    /// (a Redis that may evict its keys); its operator can change that.
    Config,
}

/// A failure of a store: its kind, which the caller decides on, what to
/// tell the user (each store words it, saying what to do), and the
/// client's error that caused it, where there is one.
#[derive(Debug, Clone)]
pub struct StoreError {
    pub kind: ErrorKind,
    message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl StoreError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> StoreError {
        StoreError {
            kind,
            message: message.into(),
            source: None,
        }
    }

    pub fn usage(message: impl Into<String>) -> StoreError {
        StoreError::new(ErrorKind::Usage, message)
    }

    pub fn conflict(message: impl Into<String>) -> StoreError {
        StoreError::new(ErrorKind::Conflict, message)
    }

    pub fn unavailable(message: impl Into<String>) -> StoreError {
        StoreError::new(ErrorKind::Unavailable, message)
    }

    pub fn denied(message: impl Into<String>) -> StoreError {
        StoreError::new(ErrorKind::Denied, message)
    }

    pub fn config(message: impl Into<String>) -> StoreError {
        StoreError::new(ErrorKind::Config, message)
    }

    /// The same failure, caused by the client's `error` (its message
    /// already says what `error` does).
    pub fn caused_by(self, error: impl std::error::Error + Send + Sync + 'static) -> StoreError {
        StoreError {
            source: Some(Arc::new(error)),
            ..self
        }
    }
}

/// Two failures are the same when they say the same: the cause is in the
/// message.
impl PartialEq for StoreError {
    fn eq(&self, other: &StoreError) -> bool {
        self.kind == other.kind && self.message == other.message
    }
}

impl Eq for StoreError {}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|error| error as &(dyn std::error::Error + 'static))
    }
}

/// The cause of a network failure as a user reads it: the layers' prefixes
/// (`io: `) and the errno (` (os error 111)`) carry nothing a user can act
/// on, so they are dropped; what is left starts in lower case.
pub fn network_cause(error: &str) -> String {
    let mut text = error.trim();
    while let Some(rest) = text.strip_prefix("io: ") {
        text = rest;
    }
    if let Some(open) = text.rfind(" (os error ") {
        if text.ends_with(')') {
            text = &text[..open];
        }
    }
    let text = if let Some(why) = text.strip_prefix("failed to lookup address information: ") {
        format!("cannot resolve the host name ({why})")
    } else if text.starts_with("timeout: ")
        // A read timeout on a socket (EAGAIN), as std reports it.
        || text == "Resource temporarily unavailable"
    {
        "no answer in time".to_string()
    } else {
        text.to_string()
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) if !chars.clone().next().is_some_and(char::is_uppercase) => {
            first.to_lowercase().chain(chars).collect()
        }
        _ => text,
    }
}

/// A store's address as it may be shown: a password in it (`user:pass@`,
/// or a `password=` in its query) is replaced by `…`, whatever the scheme,
/// also in one mistyped beyond recognition.
pub fn without_credentials(address: &str) -> String {
    let mut shown = match address.rfind('@') {
        Some(at) => {
            let start = address[..at]
                .find("://")
                .map(|i| i + 3)
                .or_else(|| address[..at].find(':').map(|i| i + 1))
                .unwrap_or(0);
            format!("{}…{}", &address[..start], &address[at..])
        }
        None => address.to_string(),
    };
    for key in ["password=", "pass=", "auth="] {
        let mut from = 0;
        while let Some(i) = shown[from..].find(key).map(|i| i + from + key.len()) {
            let end = shown[i..].find('&').map_or(shown.len(), |e| e + i);
            shown.replace_range(i..end, "…");
            from = i;
        }
    }
    shown
}

/// Where a backend sends its events.
pub type Notify = Arc<dyn Fn(SlotEvent) + Send + Sync>;

/// How long to contend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contend {
    /// Wait until a slot is free (the caller enforces any deadline).
    Wait,
    /// One look: take a free slot or report [`SlotEvent::NoSlot`] (with
    /// who holds them).
    Try,
}

/// What leaving found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Released {
    /// Left; nothing showed the slot gone before.
    Left,
    /// The store had taken the slot away before consem left (an operator,
    /// an expiry), maybe before the command ended: its exit is then not
    /// its own to report.
    TakenBefore(String),
}

/// What leaving could not clean up, step by step; the run's outcome does
/// not change for it.
#[derive(Debug)]
pub struct ReleaseError(pub Vec<Unfinished>);

impl ReleaseError {
    /// Left, unless some step did not finish.
    pub fn or_left(unfinished: Vec<Unfinished>) -> Result<Released, ReleaseError> {
        if unfinished.is_empty() {
            Ok(Released::Left)
        } else {
            Err(ReleaseError(unfinished))
        }
    }
}

impl std::fmt::Display for ReleaseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, unfinished) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{unfinished}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ReleaseError {}

/// A step of leaving that did not finish, and what cleans up after it.
#[derive(Debug)]
pub struct Unfinished {
    /// What was being done (`destroying session …`); `None` where the
    /// cause says it.
    pub step: Option<String>,
    /// Why it did not finish.
    pub cause: Option<Box<dyn std::error::Error + Send + Sync>>,
    /// What removes what it left behind, or what happens meanwhile.
    pub cleanup: Option<String>,
}

impl Unfinished {
    /// `step` did not finish.
    pub fn step(step: impl Into<String>) -> Unfinished {
        Unfinished {
            step: Some(step.into()),
            cause: None,
            cleanup: None,
        }
    }

    /// A step failed, as `cause` says.
    pub fn failed(cause: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Unfinished {
        Unfinished {
            step: None,
            cause: Some(cause.into()),
            cleanup: None,
        }
    }

    pub fn because(self, cause: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Unfinished {
        Unfinished {
            cause: Some(cause.into()),
            ..self
        }
    }

    pub fn cleanup(self, cleanup: impl Into<String>) -> Unfinished {
        Unfinished {
            cleanup: Some(cleanup.into()),
            ..self
        }
    }
}

impl std::fmt::Display for Unfinished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.step, &self.cause) {
            (Some(step), Some(cause)) => write!(f, "{step}: {cause}")?,
            (Some(step), None) => f.write_str(step)?,
            (None, Some(cause)) => write!(f, "{cause}")?,
            (None, None) => {}
        }
        match &self.cleanup {
            Some(cleanup) => write!(f, "; {cleanup}"),
            None => Ok(()),
        }
    }
}

/// A distributed counting semaphore as the supervisor sees it.
pub trait SlotBackend: Send + Sync {
    /// Starts contending for a slot on helper threads and returns at once.
    /// Reports `Acquired` once, then watches the slot and reports `Lost` if
    /// it goes; or reports `NoSlot` or `Failed`.
    fn contend(self: Arc<Self>, mode: Contend, notify: Notify);

    /// Leaves the semaphore: gives up the slot or the place in the queue and
    /// removes every trace. Stops the helpers' writes first, so that a slot
    /// won while shutting down is released too. Idempotent; returns within
    /// `budget` (plus one request's timeout at worst), even if the store is
    /// down, saying what it could not clean up.
    fn release(&self, budget: std::time::Duration) -> Result<Released, ReleaseError>;

    /// Variables of the store's own for the child, as the store's own
    /// tools set them for scripts written for those; the supervisor sets
    /// `CONSEM_PREFIX`, `CONSEM_LIMIT` and `CONSEM_FENCE` itself.
    fn own_child_env(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// The command has started (or could not be): work of the slot that
    /// need not come first (a write for the waiter behind, a watch) waits
    /// for this, so as not to compete with the start for the CPU.
    fn command_started(&self) {}

    /// True if the slot is free the moment consem dies (kernel locks),
    /// false if it outlives consem until a lease runs out: what the
    /// watchdog allows the command once consem is gone.
    fn frees_slot_at_death(&self) -> bool;
}

/// A semaphore as operators see it: `consem status --json` prints this, the
/// same for every store; fields are only ever added, never renamed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Status {
    pub prefix: String,
    /// `None` when the store holds no limit for the prefix.
    pub limit: Option<u32>,
    /// How the store spells its holders record (Consul: `"map"` as `consul
    /// lock` writes it, or `"list"`); `None` where that does not apply.
    pub layout: Option<&'static str>,
    /// Live holders, in the record's order.
    pub holders: Vec<ContenderStatus>,
    /// Live contenders without a slot, in arrival order.
    pub waiters: Vec<ContenderStatus>,
    /// Holders in the record that are gone: the next contender prunes them.
    pub dead_holders: Vec<String>,
    /// Which store: `"consul"`, `"local"`, `"redis"` or `"etcd"`.
    pub store: &'static str,
    /// Why the record cannot be used as it stands (more live holders than
    /// its limit); `run` refuses to join it.
    pub conflict: Option<String>,
    /// What the store keeps that no live contender accounts for (left by
    /// an outage or a crash), each saying what removes it.
    pub stale: Vec<String>,
    /// Milliseconds left of a lock delay: no slot is granted until it
    /// ends (the semaphore's keys were lost, and holders the store forgot
    /// may still be stopping). `None` where there is none.
    pub lock_delay_ms: Option<u64>,
}

impl Status {
    /// The conflict of a record naming more live holders than its limit.
    pub fn over_limit(&self) -> Option<String> {
        let limit = self.limit?;
        (self.holders.len() > limit as usize).then(|| {
            format!(
                "{} has {} live holders but a limit of {limit}: more than the limit hold at once (a hand edit or another tool); release the extra holders with `consem release`, or wait until they leave",
                self.prefix,
                self.holders.len()
            )
        })
    }
}

/// One holder or waiter in a [`Status`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ContenderStatus {
    /// What identifies it in the store (Consul: its session ID; local: its
    /// ticket), and what `consem release --session` takes.
    pub session: String,
    /// From its description ([`ContenderInfo`]).
    pub host: Option<String>,
    pub pid: Option<u64>,
    pub command: Option<String>,
    pub started: Option<String>,
    /// Consul: the session's node and name.
    pub node: Option<String>,
    pub session_name: Option<String>,
    /// Arrival order (Consul: the contender key's CreateIndex; local: the
    /// ticket).
    pub create_index: u64,
}

impl ContenderStatus {
    pub fn new(session: String, info: ContenderInfo, create_index: u64) -> ContenderStatus {
        ContenderStatus {
            session,
            host: info.host,
            pid: info.pid,
            command: info.command,
            started: info.started,
            node: None,
            session_name: None,
            create_index,
        }
    }
}

/// One semaphore of a listing (`consem status` without a prefix, or over a
/// root): `consem status --json` prints these, the same for every store;
/// fields are only ever added, never renamed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Summary {
    pub prefix: String,
    /// `None` when the store holds no limit for the prefix (contenders
    /// still joining, or a record consem cannot read).
    pub limit: Option<u32>,
    /// Live holders.
    pub held: usize,
    /// Live contenders without a slot.
    pub waiting: usize,
    /// The live holder that started first, by what it says of itself; the
    /// first in the record when none says.
    pub oldest_holder: Option<ContenderStatus>,
}

impl Summary {
    /// A semaphore's summary from its holders and its count of waiters.
    pub fn new(
        prefix: String,
        limit: Option<u32>,
        holders: Vec<ContenderStatus>,
        waiting: usize,
    ) -> Summary {
        let held = holders.len();
        // A holder that says nothing of its start comes after those that do.
        let started = |holder: &ContenderStatus| {
            holder
                .started
                .as_deref()
                .and_then(crate::report::parse_timestamp)
                .map_or((1, std::time::UNIX_EPOCH), |at| (0, at))
        };
        let oldest_holder = holders.into_iter().min_by_key(started);
        Summary {
            prefix,
            limit,
            held,
            waiting,
            oldest_holder,
        }
    }

    /// The summary of a semaphore whose whole status was read.
    pub fn of(status: Status) -> Summary {
        Summary::new(
            status.prefix,
            status.limit,
            status.holders,
            status.waiters.len(),
        )
    }
}

/// Whether the semaphore at `prefix` is in a listing of `root`: at it or
/// under it; every semaphore is under the empty root.
pub fn is_under(prefix: &str, root: &str) -> bool {
    root.is_empty()
        || prefix
            .strip_prefix(root)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// What `reset` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResetOutcome {
    /// The limit record is gone; `evicted` live holders were released first.
    Reset { limit: Option<u32>, evicted: usize },
    /// Nothing to reset: the store holds no limit for the prefix.
    Nothing,
    /// Live holders remain (without `--force`).
    LiveHolders(Vec<String>),
    /// New holders took the freed slots after an eviction began.
    NewHolders,
}

/// The operators' side of a store, for one prefix. Every write is made
/// against what was read, so that a concurrent contender is never undone.
pub trait Admin {
    fn status(&self) -> Result<Status, StoreError>;

    /// Frees the slot of the holder `session` (an identifier from
    /// [`Status`]): its consem sees the loss, stops its command and exits 76.
    fn release(&self, session: &str) -> Result<(), StoreError>;

    /// Deletes the limit record once no live holder remains, so that a new
    /// limit can be used; with `force`, releases the live holders first.
    fn reset(&self, force: bool) -> Result<ResetOutcome, StoreError>;

    /// The semaphores at this admin's prefix and under it (every one in the
    /// store when it was opened with the empty prefix), ordered by prefix.
    /// Each store lists in one pass of its own (a listing of keys, a scan,
    /// a directory), and writes nothing.
    fn list(&self) -> Result<Vec<Summary>, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::network_cause;

    #[test]
    fn a_listing_takes_the_root_and_what_is_under_it() {
        use super::is_under;
        assert!(is_under("jobs", "jobs"));
        assert!(is_under("jobs/a/b", "jobs"));
        assert!(!is_under("jobsx", "jobs"));
        assert!(!is_under("job", "jobs"));
        assert!(is_under("anything", ""));
    }

    #[test]
    fn the_oldest_holder_is_the_first_started() {
        use super::{ContenderInfo, ContenderStatus, Summary};
        let holder = |id: &str, started: Option<&str>| {
            ContenderStatus::new(
                id.into(),
                ContenderInfo {
                    started: started.map(String::from),
                    ..ContenderInfo::default()
                },
                0,
            )
        };
        let summary = Summary::new(
            "p".into(),
            Some(3),
            vec![
                holder("silent", None),
                holder("late", Some("2026-11-22T10:04:05.123Z")),
                holder("early", Some("2026-11-22T09:04:05.123Z")),
            ],
            2,
        );
        assert_eq!((summary.held, summary.waiting), (3, 2));
        assert_eq!(summary.oldest_holder.unwrap().session, "early");
        // None says when it started: the first in the record.
        let summary = Summary::new(
            "p".into(),
            Some(2),
            vec![holder("first", None), holder("second", None)],
            0,
        );
        assert_eq!(summary.oldest_holder.unwrap().session, "first");
        assert_eq!(
            Summary::new("p".into(), None, Vec::new(), 1).oldest_holder,
            None
        );
    }

    #[test]
    fn addresses_are_shown_without_their_credentials() {
        use super::without_credentials as shown;
        assert_eq!(
            shown("redis://:S3cret@host:6379/0"),
            "redis://…@host:6379/0"
        );
        assert_eq!(shown("Redis://user:S3cret@host"), "Redis://…@host");
        assert_eq!(shown("redis:/:S3cret@host"), "redis:…@host");
        assert_eq!(shown("rediss//:S3cret@host"), "rediss//:…@host");
        assert_eq!(
            shown("redis://host:1/0?password=S3cret&db=1"),
            "redis://host:1/0?password=…&db=1"
        );
        assert_eq!(shown("consul"), "consul");
    }

    #[test]
    fn a_release_error_says_each_step_its_cause_and_what_cleans_up() {
        use super::{ReleaseError, Released, StoreError, Unfinished};
        assert_eq!(ReleaseError::or_left(Vec::new()).ok(), Some(Released::Left));
        let error = ReleaseError::or_left(vec![
            Unfinished::step("destroying session s")
                .because(StoreError::unavailable("no answer"))
                .cleanup("Consul drops it within 30s"),
            Unfinished::step(".lock kept changing").cleanup("the next contender prunes us"),
            Unfinished::failed(StoreError::usage("cannot lock")),
        ])
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "destroying session s: no answer; Consul drops it within 30s; .lock kept changing; the next contender prunes us; cannot lock"
        );
    }

    #[test]
    fn a_store_error_keeps_its_kind_and_cause_and_says_its_message() {
        use super::{ErrorKind, StoreError};
        use std::error::Error as _;
        let cause = StoreError::unavailable("connection refused");
        let error = StoreError::denied("permission denied: no").caused_by(cause.clone());
        assert_eq!(error.kind, ErrorKind::Denied);
        assert_eq!(error.to_string(), "permission denied: no");
        assert_eq!(
            error.source().map(ToString::to_string),
            Some(cause.to_string())
        );
        assert_eq!(error, StoreError::denied("permission denied: no"));
    }

    #[test]
    fn network_causes_lose_the_layers_noise() {
        assert_eq!(
            network_cause("io: Connection refused (os error 111)"),
            "connection refused"
        );
        assert_eq!(
            network_cause("Connection refused (os error 111)"),
            "connection refused"
        );
        assert_eq!(
            network_cause("io: failed to lookup address information: Name or service not known"),
            "cannot resolve the host name (Name or service not known)"
        );
        // An acronym keeps its case; a message without noise is kept.
        assert_eq!(
            network_cause("TLS handshake failed"),
            "TLS handshake failed"
        );
        assert_eq!(network_cause("timeout: global"), "no answer in time");
        assert_eq!(
            network_cause("Resource temporarily unavailable (os error 11)"),
            "no answer in time"
        );
    }
}
