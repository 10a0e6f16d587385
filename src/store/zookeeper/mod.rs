//! The ZooKeeper store: N slots in the layout of Apache Curator's
//! `InterProcessSemaphoreV2`, so that consem and JVM services using it
//! share one limit on one path. A contender takes the mutex under
//! `<path>/locks` (Curator's `InterProcessMutex`: protected
//! ephemeral-sequential `_c_<uuid>-lock-` nodes, the lowest holds it, each
//! other watches the one just before it); holding the mutex, it creates
//! its lease node `<path>/leases/_c_<uuid>-lease-` (ephemeral-sequential)
//! and reads the leases with a watch: at most the limit, it holds a slot
//! and lets the mutex go; more, it waits for the leases to change, keeping
//! the mutex, so that only the head of the line watches the leases.
//!
//! The session is the lease: the server deletes a dead consem's nodes
//! once it has heard nothing for the session timeout (`--ttl`, bounded by
//! the server), and a holder counts its lease from the last request the
//! server answered. Spoken to over ZooKeeper's own protocol (`client`).

pub mod admin;
pub mod client;
pub mod tls;

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use client::{Session, ZkError};

use super::driver::{self, Gate, Grant, Recipe, Stop};
use super::kind::{Lease, Store, StoreSettings};
use super::lease;
use super::{
    Admin, Contend, ContenderInfo, ErrorKind, Holder, Notify, Progress, ReleaseError, Released,
    SlotBackend, SlotEvent, StoreError, Unfinished,
};
use crate::report;

pub use admin::ZkAdmin;

/// Session timeouts of 2 s to an hour; the server bounds them further (by
/// default 2 to 20 ticks of 2 s): less than `--ttl` is refused, more
/// (its minimum) is what consem counts with.
pub const STORE: Store = Store {
    name: "zookeeper",
    title: "ZooKeeper",
    schemes: &["zk://", "zks://"],
    largest_limit: 1024,
    lease: Some(Lease {
        shortest: Duration::from_secs(2),
        longest: Duration::from_secs(3600),
        default_ttl: Duration::from_secs(15),
    }),
    frees_slot_at_death: false,
};

/// Curator's names below the semaphore's path.
pub const LOCKS: &str = "locks";
pub const LEASES: &str = "leases";
const LOCK_NAME: &str = "lock-";
const LEASE_NAME: &str = "lease-";
/// What Curator's protected mode puts before a node's name: the creator
/// finds its node again by the UUID after a lost connection.
pub const PROTECTED: &str = "_c_";

/// What the ZooKeeper store needs beyond the store-neutral options.
#[derive(Debug, Clone)]
pub struct Settings {
    pub connection: client::Connection,
    pub ttl: Duration,
}

impl StoreSettings for Settings {
    fn open_run(
        &self,
        prefix: &str,
        limit: u32,
        info: ContenderInfo,
    ) -> Result<Arc<dyn SlotBackend>, StoreError> {
        Ok(Arc::new(ZkSemaphore::new(
            self.clone(),
            prefix,
            limit,
            &info,
        )?))
    }

    fn open_admin(&self, prefix: &str) -> Result<Box<dyn Admin>, StoreError> {
        Ok(Box::new(ZkAdmin::new(self.clone(), prefix)))
    }
}

/// The semaphore's path for a prefix: Curator's paths are absolute.
pub fn semaphore_path(prefix: &str) -> String {
    format!("/{}", prefix.trim_start_matches('/'))
}

/// A node's sequence number: the digits after `name` in it, as Curator
/// sorts them.
pub fn sequence(node: &str, name: &str) -> Option<u64> {
    let at = node.rfind(name)?;
    node[at + name.len()..].parse().ok()
}

/// The limit consem records in the data of `<path>/leases` (Curator's
/// semaphore records none: its `maxLeases` is its users' convention, and
/// it leaves the node's data empty). `Err` with the data where it is not
/// a limit.
pub fn recorded_limit(data: &[u8]) -> Result<Option<u32>, String> {
    if data.is_empty() {
        return Ok(None);
    }
    std::str::from_utf8(data)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .map(Some)
        .ok_or_else(|| String::from_utf8_lossy(data).into_owned())
}

/// What the server refused, as a failure of the run or an operator's
/// command: a missing right or refused credentials are denials (77).
fn failure(error: ZkError) -> StoreError {
    let (kind, message) = match &error {
        ZkError::NoAuth { user: Some(user), right, .. } => (
            ErrorKind::Denied,
            format!(
                "ZooKeeper refused: {error}: give the credentials of the user that created the node (zk://USER:PASSWORD@... or --user), or have its ACL grant {user} {right} (setAcl)"
            ),
        ),
        ZkError::NoAuth { .. } => (
            ErrorKind::Denied,
            format!(
                "ZooKeeper refused: {error}: sign in as the user that created the node (zk://USER:PASSWORD@... or --user USER:PASSWORD), or use a path open to all"
            ),
        ),
        ZkError::AuthFailed => (
            ErrorKind::Denied,
            format!("{error}: check the user and password (zk://USER:PASSWORD@... or --user)"),
        ),
        _ => (ErrorKind::Unavailable, format!("ZooKeeper: {error}")),
    };
    StoreError::new(kind, message).caused_by(error)
}

/// What the helper threads share with `release`, beside the gate's own.
#[derive(Default)]
pub struct Shared {
    /// Our lease node's creation zxid: the fence.
    fence: Option<i64>,
    /// Our lease node counted among the limit: a slot was held.
    held: bool,
    /// The session was lost (expired) before release: the slot was gone.
    lost: Option<String>,
}

/// A semaphore at one path on ZooKeeper, for one run.
pub struct ZkSemaphore {
    settings: Settings,
    prefix: String,
    limit: u32,
    locks: String,
    leases: String,
    info: Vec<u8>,
    /// Ours, for the names of our nodes.
    uuid: String,
    /// The session, once open; `None` again once release closed it.
    session: Mutex<Option<Session>>,
    /// A pipe: release writes to it to end the helper's wait on the
    /// session at once.
    wake: (OwnedFd, OwnedFd),
    gate: Gate<Shared>,
}

/// What holding needs: our lease node.
pub struct Held {
    lease_node: String,
}

impl ZkSemaphore {
    pub fn new(
        settings: Settings,
        prefix: &str,
        limit: u32,
        info: &ContenderInfo,
    ) -> Result<ZkSemaphore, StoreError> {
        let path = semaphore_path(prefix);
        Ok(ZkSemaphore {
            locks: format!("{path}/{LOCKS}"),
            leases: format!("{path}/{LEASES}"),
            info: serde_json::to_vec(info).expect("a description always encodes"),
            uuid: crate::sys::random_uuid(),
            prefix: prefix.to_string(),
            limit,
            settings,
            session: Mutex::new(None),
            wake: pipe()?,
            gate: Gate::default(),
        })
    }

    /// Runs `call` on the session; a broken connection is resumed on the
    /// ensemble's servers until the session could have expired, and the
    /// call made again. `Closing` once release took the session.
    fn call<T>(
        &self,
        mut call: impl FnMut(&mut Session) -> Result<T, ZkError>,
    ) -> Result<T, CallError> {
        loop {
            let mut slot = self.session.lock().unwrap_or_else(|e| e.into_inner());
            let Some(session) = slot.as_mut() else {
                return Err(CallError::Closing);
            };
            match call(session) {
                Err(ZkError::Connection(why)) => {
                    report::event("retry", &[("error", &why)]);
                    self.resume(session, &why)?;
                }
                Err(ZkError::Expired) => return Err(CallError::Expired),
                other => return other.map_err(CallError::Refused),
            }
        }
    }

    /// Resumes the session after a broken connection, until the server
    /// may have ended it (a session timeout since it last heard from us).
    fn resume(&self, session: &mut Session, why: &str) -> Result<(), CallError> {
        let gone = session.heard() + session.timeout();
        let mut pause = Duration::from_millis(100);
        loop {
            if self.gate.closing() {
                return Err(CallError::Closing);
            }
            match session.resume() {
                Ok(()) => return Ok(()),
                Err(ZkError::Expired) => return Err(CallError::Expired),
                Err(refused @ ZkError::AuthFailed) => return Err(CallError::Refused(refused)),
                Err(error) if Instant::now() >= gone => {
                    return Err(CallError::Unreachable(format!(
                        "{why}; no server answered again within the session timeout: {error}"
                    )))
                }
                Err(_) => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    /// Waits for a watch to fire, pinging meanwhile, until `until`, a
    /// ping's answer, or release wakes us (it needs the session). A broken
    /// connection is resumed, and says so: the watches set before are gone
    /// with it, and the caller reads and watches again.
    fn next_event(&self, until: Instant) -> Result<Woke, CallError> {
        let mut slot = self.session.lock().unwrap_or_else(|e| e.into_inner());
        let Some(session) = slot.as_mut() else {
            return Err(CallError::Closing);
        };
        match session.next_event(until, Some(self.wake.0.as_fd())) {
            Ok(Some(event)) => Ok(Woke::Event(event)),
            Ok(None) => Ok(Woke::Quiet),
            Err(ZkError::Connection(why)) => {
                report::event("retry", &[("error", &why)]);
                self.resume(session, &why)?;
                Ok(Woke::Resumed)
            }
            Err(ZkError::Expired) => Err(CallError::Expired),
            Err(error) => Err(CallError::Refused(error)),
        }
    }

    /// Creates our protected ephemeral-sequential node `name` under
    /// `parent`, or finds it if an attempt whose answer was lost made it.
    fn create_ours(&self, parent: &str, name: &str) -> Result<(String, client::Stat), CallError> {
        let protected = format!("{PROTECTED}{}-", self.uuid);
        let path = format!("{parent}/{protected}{name}");
        let mut tried = false;
        self.call(|session| {
            if tried {
                let children = session.children(parent, false)?;
                if let Some(found) = children.iter().find(|c| c.starts_with(&protected)) {
                    let found = format!("{parent}/{found}");
                    if let Some(stat) = session.exists(&found, false)? {
                        return Ok((found, stat));
                    }
                }
            }
            tried = true;
            session.create(&path, &self.info, client::EPHEMERAL_SEQUENTIAL)
        })
    }

    /// Who holds the leases, as their nodes describe them.
    fn progress(&self, leases: &[String], ahead: usize) -> Result<Progress, CallError> {
        let mut holders = Vec::new();
        for node in leases {
            let path = format!("{}/{node}", self.leases);
            match self.call(|session| session.get_data(&path)) {
                Ok((data, _)) => holders.push(Holder::from(&ContenderInfo::parse(&data))),
                Err(CallError::Refused(ZkError::Code(client::NO_NODE))) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(Progress {
            limit: self.limit,
            holders,
            ahead,
        })
    }

    /// Takes the mutex: our lock node is the lowest. `None` with `--try`
    /// when the leases are full meanwhile.
    fn take_mutex(
        &self,
        mode: Contend,
        told: &mut Option<Progress>,
    ) -> Result<Option<String>, CallError> {
        let (lock_node, _) = self.create_ours(&self.locks, LOCK_NAME)?;
        let ours = lock_node.rsplit('/').next().unwrap_or_default().to_string();
        loop {
            let mut queue = self.call(|session| session.children(&self.locks, false))?;
            queue.sort_by_key(|node| sequence(node, LOCK_NAME).unwrap_or(u64::MAX));
            let Some(place) = queue.iter().position(|node| *node == ours) else {
                return Err(CallError::Refused(ZkError::Code(client::NO_NODE)));
            };
            if place == 0 {
                return Ok(Some(lock_node));
            }
            let leases = self.call(|session| session.children(&self.leases, false))?;
            if mode == Contend::Try && leases.len() >= self.limit as usize {
                let _ = self.call(|session| session.delete(&lock_node));
                return Ok(None);
            }
            let before = format!("{}/{}", self.locks, queue[place - 1]);
            if self
                .call(|session| session.exists(&before, true))?
                .is_none()
            {
                continue;
            }
            let picture = self.progress(&leases, place)?;
            self.gate.waiting_if_changed(&self.prefix, picture, told);
            self.wait_for(&before)?;
        }
    }

    /// Holding the mutex: records our limit where none is, or where
    /// nobody holds a lease; a lease held under another limit is a
    /// conflict. Under the mutex, no consem can record another meanwhile.
    fn record_limit(&self) -> Result<(), Stop> {
        loop {
            let (data, stat) = self
                .call(|session| session.get_data(&self.leases))
                .map_err(CallError::into_stop)?;
            let recorded = recorded_limit(&data);
            if recorded == Ok(Some(self.limit)) {
                return Ok(());
            }
            let held = self
                .call(|session| session.children(&self.leases, false))
                .map_err(CallError::into_stop)?;
            let what = match &recorded {
                // Curator's users keep no record: ours is the first.
                Ok(None) => None,
                Ok(Some(limit)) => Some(format!("is in use with a limit of {limit}")),
                Err(data) => Some(format!(
                    "holds '{data}' in {}, not a limit consem can read",
                    self.leases
                )),
            };
            if let (false, Some(what)) = (held.is_empty(), what) {
                return Err(Stop::Failed(StoreError::conflict(format!(
                    "{} {what}, but --limit is {}: use the same limit, or another prefix; consem reset clears the record once nobody holds",
                    self.prefix, self.limit
                ))));
            }
            let written = self.call(|session| {
                session.set_data(
                    &self.leases,
                    self.limit.to_string().as_bytes(),
                    stat.version,
                )
            });
            match written {
                Ok(()) => return Ok(()),
                Err(CallError::Refused(ZkError::Code(client::BAD_VERSION))) => {}
                Err(error) => return Err(error.into_stop()),
            }
        }
    }

    /// Waits until a watch on `path` (or on its children) fires, or the
    /// connection was resumed (the watch is gone: read and watch again).
    fn wait_for(&self, path: &str) -> Result<(), CallError> {
        loop {
            if self.gate.closing() {
                return Err(CallError::Closing);
            }
            let far = Instant::now() + Duration::from_secs(3600);
            match self.next_event(far)? {
                Woke::Event(event) if event.path == path => return Ok(()),
                Woke::Resumed => return Ok(()),
                Woke::Event(_) | Woke::Quiet => {}
            }
        }
    }
}

/// What ended a wait on the session.
enum Woke {
    Event(client::WatchEvent),
    /// Nothing: a ping was answered, the time came, or release woke us.
    Quiet,
    /// The connection broke and the session was resumed on a new one.
    Resumed,
}

/// Why a call on the session did not give an answer.
#[derive(Debug)]
enum CallError {
    Closing,
    Expired,
    Unreachable(String),
    Refused(ZkError),
}

impl CallError {
    fn into_stop(self) -> Stop {
        match self {
            CallError::Closing => Stop::Closing,
            CallError::Expired => Stop::Failed(StoreError::unavailable(
                "the ZooKeeper session expired while we waited",
            )),
            CallError::Unreachable(why) => {
                Stop::Failed(StoreError::unavailable(format!("ZooKeeper: {why}")))
            }
            CallError::Refused(error) => Stop::Failed(failure(error)),
        }
    }

    /// Why a held slot is lost, or `None` once release began.
    fn loss(self) -> Option<String> {
        match self {
            CallError::Closing => None,
            CallError::Expired => Some("the ZooKeeper session expired".into()),
            CallError::Unreachable(why) => Some(format!("ZooKeeper: {why}")),
            CallError::Refused(error) => Some(format!("ZooKeeper: {error}")),
        }
    }
}

impl Recipe for ZkSemaphore {
    type Shared = Shared;
    type Held = Held;

    fn gate(&self) -> &Gate<Shared> {
        &self.gate
    }

    fn prefix(&self) -> &str {
        &self.prefix
    }

    fn acquire(self: &Arc<Self>, mode: Contend) -> Result<Grant<Held>, Stop> {
        // The first contact fails at once: a wrong address should say so.
        let mut session =
            Session::open(&self.settings.connection, self.settings.ttl).map_err(failure)?;
        // The supervisor fitted --kill-grace into --ttl: a shorter session
        // would leave the command no time at all.
        if session.timeout() < self.settings.ttl {
            let granted = session.timeout();
            let _ = session.close();
            return Err(Stop::Failed(StoreError::config(format!(
                "ZooKeeper grants sessions of {} at most (its maxSessionTimeout), less than --ttl {}: give --ttl {} or less, or raise maxSessionTimeout",
                crate::duration::human(granted),
                crate::duration::human(self.settings.ttl),
                crate::duration::human(granted)
            ))));
        }
        {
            let mut slot = self.session.lock().unwrap_or_else(|e| e.into_inner());
            if self.gate.closing() {
                let _ = session.close();
                return Err(Stop::Closing);
            }
            *slot = Some(session);
        }
        // Looked for first: a create that fails on a node that exists is
        // a write all the same, agreed on by the ensemble's quorum, where
        // a look is a read the server answers alone; after its first run,
        // a prefix has both.
        self.call(|session| {
            for parent in [&self.locks, &self.leases] {
                if session.exists(parent, false)?.is_none() {
                    session.create_parents(parent)?;
                }
            }
            Ok(())
        })
        .map_err(CallError::into_stop)?;
        let mut told = None;
        if mode == Contend::Try {
            let leases = self
                .call(|session| session.children(&self.leases, false))
                .map_err(CallError::into_stop)?;
            if leases.len() >= self.limit as usize {
                return Err(Stop::NoSlot(
                    self.progress(&leases, 0).map_err(CallError::into_stop)?,
                ));
            }
        }
        let Some(lock_node) = self
            .take_mutex(mode, &mut told)
            .map_err(CallError::into_stop)?
        else {
            let leases = self
                .call(|session| session.children(&self.leases, false))
                .map_err(CallError::into_stop)?;
            return Err(Stop::NoSlot(
                self.progress(&leases, 0).map_err(CallError::into_stop)?,
            ));
        };
        self.record_limit()?;
        // Holding the mutex, as Curator does: our lease node, then the
        // leases read with a watch until they are at most the limit.
        let (lease_node, stat) = self
            .create_ours(&self.leases, LEASE_NAME)
            .map_err(CallError::into_stop)?;
        let ours = lease_node
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        self.gate.lock().fence = Some(stat.czxid);
        loop {
            let leases = self
                .call(|session| session.children(&self.leases, true))
                .map_err(CallError::into_stop)?;
            if !leases.contains(&ours) {
                return Err(Stop::Failed(StoreError::unavailable(format!(
                    "our lease node {lease_node} was deleted while we waited (consem release, or by hand)"
                ))));
            }
            if leases.len() <= self.limit as usize {
                let heard = {
                    let slot = self.session.lock().unwrap_or_else(|e| e.into_inner());
                    slot.as_ref().map(|s| (s.heard(), s.timeout()))
                };
                let Some((heard, timeout)) = heard else {
                    return Err(Stop::Closing);
                };
                self.gate.lock().held = true;
                // The mutex goes; were this lost, the session's end takes
                // the node along.
                let _ = self.call(|session| session.delete(&lock_node));
                return Ok(Grant {
                    fence: stat.czxid as u64,
                    lease: Some(lease::lease_end(heard, timeout)),
                    held: Held { lease_node },
                });
            }
            if mode == Contend::Try {
                let _ = self.call(|session| {
                    session.delete(&lease_node)?;
                    session.delete(&lock_node)
                });
                let others: Vec<String> = leases.into_iter().filter(|l| *l != ours).collect();
                return Err(Stop::NoSlot(
                    self.progress(&others, 0).map_err(CallError::into_stop)?,
                ));
            }
            let others: Vec<String> = leases.iter().filter(|l| **l != ours).cloned().collect();
            let picture = self.progress(&others, 0).map_err(CallError::into_stop)?;
            self.gate
                .waiting_if_changed(&self.prefix, picture, &mut told);
            self.wait_for(&self.leases).map_err(CallError::into_stop)?;
        }
    }

    fn hold(self: &Arc<Self>, held: Held) -> Option<String> {
        let reason = self.watch_lease(&held.lease_node)?;
        self.gate.lock().lost = Some(reason.clone());
        Some(reason)
    }
}

impl ZkSemaphore {
    /// Pings and watches our lease node while the command runs, telling
    /// the supervisor of each confirmed ping's lease; why the slot was
    /// lost, or `None` once release began.
    fn watch_lease(&self, lease_node: &str) -> Option<String> {
        let mut told_until = None;
        let mut watching = false;
        loop {
            if self.gate.closing() {
                return None;
            }
            if !watching {
                match self.call(|session| session.exists(lease_node, true)) {
                    Ok(Some(_)) => watching = true,
                    Ok(None) => {
                        return Some(format!(
                            "our lease node {lease_node} was deleted (consem release, or by hand)"
                        ))
                    }
                    Err(error) => return error.loss(),
                }
            }
            let far = Instant::now() + Duration::from_secs(3600);
            match self.next_event(far) {
                Ok(Woke::Event(event)) if event.path == *lease_node => {
                    if event.kind == client::NODE_DELETED {
                        return Some(format!(
                            "our lease node {lease_node} was deleted (consem release, or by hand)"
                        ));
                    }
                    watching = false;
                }
                Ok(Woke::Resumed) => watching = false,
                Ok(Woke::Event(_) | Woke::Quiet) => {}
                Err(error) => return error.loss(),
            }
            let heard = {
                let slot = self.session.lock().unwrap_or_else(|e| e.into_inner());
                slot.as_ref().map(|s| (s.heard(), s.timeout()))
            };
            if let Some((heard, timeout)) = heard {
                if told_until != Some(heard) {
                    told_until = Some(heard);
                    self.gate.notify(SlotEvent::Leased {
                        until: lease::lease_end(heard, timeout),
                    });
                }
            }
        }
    }
}

impl SlotBackend for ZkSemaphore {
    fn contend(self: Arc<Self>, mode: Contend, notify: Notify) {
        driver::contend(self, mode, notify);
    }

    fn release(&self, budget: Duration) -> Result<Released, ReleaseError> {
        let (held, lost) = {
            let (shared, _) = self.gate.stop(budget / 2);
            (shared.held, shared.lost.clone())
        };
        // SAFETY: one byte from a valid buffer to the pipe we own; a full
        // pipe (an earlier release) has woken the helper already.
        let _ = unsafe { libc::write(self.wake.1.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
        let session = self
            .session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let Some(mut session) = session else {
            return Ok(Released::Left);
        };
        // Closing the session deletes its nodes, the lease and any lock
        // node, in one step on the server.
        let closed = session.close();
        report::event(driver::leaving_event(held), &[("prefix", &self.prefix)]);
        match closed {
            Ok(()) => Ok(lost.map_or(Released::Left, Released::TakenBefore)),
            Err(ZkError::Expired) => Ok(Released::TakenBefore(
                "our ZooKeeper session had expired before we left".into(),
            )),
            Err(error) => Err(ReleaseError(vec![Unfinished::step(format!(
                "closing our ZooKeeper session for {}",
                self.prefix
            ))
            .because(failure(error))
            .cleanup(format!(
                "ZooKeeper deletes our nodes by itself when the session expires, within {} of the last word from us",
                crate::duration::human(session.timeout())
            ))])),
        }
    }

    fn frees_slot_at_death(&self) -> bool {
        STORE.frees_slot_at_death
    }

    fn command_started(&self) {
        self.gate.command_started();
    }
}

/// A pipe (read end, write end), both ends non-blocking and closed on exec.
fn pipe() -> Result<(OwnedFd, OwnedFd), StoreError> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors, which we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        let error = std::io::Error::last_os_error();
        return Err(
            StoreError::unavailable(format!("cannot make a pipe: {error}")).caused_by(error),
        );
    }
    // SAFETY: both are fresh descriptors owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_sort_by_the_sequence_after_their_name_as_curator_sorts_them() {
        assert_eq!(sequence("_c_0f1e-aa-lock-0000000012", LOCK_NAME), Some(12));
        assert_eq!(sequence("lease-0000000003", LEASE_NAME), Some(3));
        assert_eq!(sequence("other", LEASE_NAME), None);
        assert_eq!(semaphore_path("a/b"), "/a/b");
        assert_eq!(semaphore_path("/a/b"), "/a/b");
    }
}
