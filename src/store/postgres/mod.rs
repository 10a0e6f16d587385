//! The PostgreSQL store: N slots as session-level advisory locks, in order
//! of arrival through the server's own lock queue, gone with the session
//! that held them (see docs/design.md, "The PostgreSQL store", and
//! `keys` for the locks). `link` is the connection, `admin` the operators'
//! side.

pub mod admin;
pub mod keys;
pub mod link;
pub mod tls;

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use self::admin::PostgresAdmin;
use self::keys::{Joined, LockRow, LINE, SESSION_CHECK};
use self::link::{failure, number, Connection, Link, Row, Waited};
use super::driver::{self, Gate, Grant, Recipe, Stop};
use super::kind::{Lease, Store, StoreSettings};
use super::lease;
use super::outage::Outage;
use super::{
    Admin, Contend, ContenderInfo, ErrorKind, Notify, Progress, ReleaseError, Released,
    SlotBackend, SlotEvent, StoreError, Unfinished,
};
use crate::report;

pub const STORE: Store = Store {
    name: "postgres",
    title: "PostgreSQL",
    schemes: &["postgres://", "postgresql://"],
    largest_limit: keys::LARGEST_LIMIT,
    lease: Some(Lease {
        shortest: Duration::from_secs(2),
        longest: Duration::from_secs(86_400),
        default_ttl: Duration::from_secs(15),
    }),
    // The session ends with consem's connection, and its locks with it.
    frees_slot_at_death: true,
};

/// How often the first waiter of a limit above 1 looks at the slots
/// again when no holder said it left: a holder whose session ended
/// without a word (killed, cut off) sends no notification.
const UNANNOUNCED_LOOK: Duration = Duration::from_millis(500);

/// Why an attempt on one session ended without a slot.
enum Attempt {
    Stop(Stop),
    /// The session or its connection ended: a new one may go on.
    SessionLost(StoreError),
}

impl From<Stop> for Attempt {
    fn from(stop: Stop) -> Attempt {
        Attempt::Stop(stop)
    }
}

impl From<StoreError> for Attempt {
    fn from(error: StoreError) -> Attempt {
        Attempt::Stop(Stop::Failed(error))
    }
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub connection: Connection,
    /// The bound on the server's detection of a vanished client, and on
    /// a holder's lease counted from its last confirmed round trip.
    pub ttl: Duration,
}

impl StoreSettings for Settings {
    fn open_run(
        &self,
        prefix: &str,
        limit: u32,
        info: ContenderInfo,
    ) -> Result<Arc<dyn SlotBackend>, StoreError> {
        Ok(Arc::new(PostgresSemaphore::new(
            self.clone(),
            prefix,
            limit,
            info,
        )))
    }

    fn open_admin(&self, prefix: &str) -> Result<Box<dyn Admin>, StoreError> {
        Ok(Box::new(PostgresAdmin::new(self.clone(), prefix)))
    }
}

/// Where a run's contender thread stands, for `release` to wait on.
#[derive(Debug, Default)]
struct Phase {
    /// The contender thread runs (it holds the connection).
    contending: bool,
    /// A slot was ours.
    held: bool,
    /// Why the server ended our session before we left, if it did.
    taken: Option<String>,
    /// The clean leave did not finish: why.
    unfinished: Option<String>,
}

pub struct PostgresSemaphore {
    settings: Settings,
    prefix: String,
    limit: u32,
    info: ContenderInfo,
    key: i32,
    gate: Gate<()>,
    /// Set once release begins: the thread's waits end on it.
    closing: watch::Sender<bool>,
    phase: Mutex<Phase>,
    phase_changed: Condvar,
}

/// A slot won: the connection that holds it, and which.
pub struct Held {
    link: Link,
    slot: u32,
    /// When the last round trip the server answered was sent.
    confirmed: Instant,
}

impl PostgresSemaphore {
    fn new(settings: Settings, prefix: &str, limit: u32, info: ContenderInfo) -> Self {
        PostgresSemaphore {
            settings,
            prefix: prefix.to_string(),
            limit,
            info,
            key: keys::prefix_key(prefix),
            gate: Gate::default(),
            closing: watch::channel(false).0,
            phase: Mutex::new(Phase::default()),
            phase_changed: Condvar::new(),
        }
    }

    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The contender thread is done with the connection.
    fn finished(&self, taken: Option<String>, unfinished: Option<String>) {
        let mut phase = self.phase();
        phase.contending = false;
        phase.taken = phase.taken.take().or(taken);
        phase.unfinished = phase.unfinished.take().or(unfinished);
        self.phase_changed.notify_all();
    }

    /// `statement` with our description, for `status` to read.
    fn sql(&self, statement: &str) -> String {
        keys::described(statement, &self.info, &self.prefix)
    }

    /// A failed statement while contending: a lost session (a restart,
    /// a failover, a network failure) is worth a new one.
    fn failed(&self, doing: &str, error: &tokio_postgres::Error) -> Attempt {
        let failure = failure(&self.settings.connection, doing, error);
        if link::session_lost(error) {
            Attempt::SessionLost(failure)
        } else {
            Attempt::Stop(Stop::Failed(failure))
        }
    }

    /// The server ended our session while we were `doing` something.
    fn ended(&self, doing: &str, why: &str) -> Attempt {
        Attempt::SessionLost(StoreError::unavailable(format!(
            "{}: the server ended our session while {doing}: {why}",
            self.settings.connection.shown
        )))
    }

    /// The prefix's advisory locks, with their sessions.
    fn lock_rows(&self, link: &Link) -> Result<Vec<LockRow>, Attempt> {
        let rows = link
            .run(&self.sql(&admin::lock_rows_query(self.key)))
            .map_err(|e| self.failed("reading pg_locks", &e))?;
        Ok(admin::lock_rows(&rows))
    }

    fn conflict(&self, other: u32) -> StoreError {
        StoreError::conflict(format!(
            "{} is in use with --limit {other}, and --limit is {}: use --limit {other}, or wait until nobody holds or waits there",
            self.prefix, self.limit
        ))
    }

    /// Our statements reached a session other than ours: a pooler shares
    /// server sessions between clients.
    fn pooled(&self) -> StoreError {
        link::pooled(&self.settings.connection)
    }

    /// The answer of a statement of [`keys::guarded`] on our session, or
    /// the error that it ran on another.
    fn on_our_session(&self, link: &Link, rows: &[Row]) -> Result<Option<String>, StoreError> {
        match rows.last() {
            Some(row) if number(row, 0) == Some(i64::from(link.pid)) => {
                Ok(row.get(1).cloned().flatten())
            }
            _ => Err(self.pooled()),
        }
    }

    /// Runs `call` on our session (see [`keys::guarded`]) and returns its
    /// value as text.
    fn call(&self, link: &Link, call: &str, doing: &str) -> Result<Option<String>, Attempt> {
        let rows = link
            .run(&self.sql(&keys::guarded(link.pid, call)))
            .map_err(|e| self.failed(doing, &e))?;
        Ok(self.on_our_session(link, &rows)?)
    }

    /// Runs `call`, which may wait in the server (a lock wait), until it
    /// answers, the connection ends, or release begins (the wait is then
    /// cancelled, so that the session leaves the lock queue at once).
    fn wait_in_server(&self, link: &Link, call: &str, doing: &str) -> Result<(), Attempt> {
        let mut closing = self.closing.subscribe();
        let ended = link.ended();
        let sql = self.sql(&keys::guarded(link.pid, call));
        let rows = link.block_on(async {
            tokio::select! {
                answer = link::rows(link.client(), &sql) => {
                    answer.map_err(|e| self.failed(doing, &e))
                }
                why = ended => Err(self.ended(doing, &why)),
                _ = closing.wait_for(|closing| *closing) => {
                    link.cancel().await;
                    Err(Attempt::Stop(Stop::Closing))
                }
            }
        })?;
        self.on_our_session(link, &rows)?;
        Ok(())
    }

    /// The first round trip (see [`keys::join`]): sets the session up,
    /// checks it, and takes what it can without waiting.
    fn join(&self, link: &mut Link) -> Result<(Joined, Instant), Attempt> {
        let sql = self.sql(&format!(
            "{};\n{SESSION_CHECK};\n{}",
            link::session_setup(self.settings.ttl),
            keys::join(self.key, self.limit)
        ));
        let sent = Instant::now();
        // A join takes no lock it would wait for; one unanswered for a TTL
        // (a pooler waiting to reach a server that restarts) is an
        // outage, and a grant that late would come after its lease.
        let ttl = self.settings.ttl;
        let rows = link
            .block_on(async { tokio::time::timeout(ttl, link::rows(link.client(), &sql)).await })
            .map_err(|_| {
                Attempt::SessionLost(StoreError::unavailable(format!(
                    "{}: no answer to joining within --ttl {}",
                    self.settings.connection.shown,
                    crate::duration::human(ttl)
                )))
            })?
            .map_err(|e| self.failed("joining", &e))?;
        // One row per statement: the setup, the check, the mark, the
        // outcome, the fence, its record, the line let go.
        let [_, check, _, taken, fence, _, _] = rows.as_slice() else {
            return Err(self.pooled().into());
        };
        let connection = &self.settings.connection;
        link.checked(connection, Some(check))?;
        let taken = link::text(taken, 0);
        Joined::read(taken, fence.first().cloned().flatten().as_deref())
            .map(|joined| (joined, sent))
            .ok_or_else(|| self.pooled().into())
    }

    /// Behind a pooler, a lone contender's statements may land on one
    /// server session that the pooler hands to the next client as soon as
    /// each transaction ends (transaction or statement pooling), which
    /// nothing else shows while no one else joins: a second connection
    /// through it, made while ours is idle, is handed that same session
    /// (PgBouncer gives out the one used last), and then we refuse. The
    /// same statement lets our locks go there: closing our connection
    /// would not end that session, which the pooler keeps.
    fn refuse_a_sharing_pooler(&self, link: &Link) -> Result<(), Attempt> {
        let mut probe = Link::connect(&self.settings.connection)?;
        let rows = probe
            .run(&format!(
                "SELECT pg_catalog.pg_backend_pid(), CASE WHEN pg_catalog.pg_backend_pid() = {} \
                 THEN pg_catalog.pg_advisory_unlock_all()::text END",
                link.pid
            ))
            .map_err(|e| self.failed("looking for a pooler", &e));
        probe.close();
        match rows?.first().and_then(|row| number(row, 0)) {
            Some(pid) if pid == i64::from(link.pid) => Err(self.pooled().into()),
            _ => Ok(()),
        }
    }

    /// Joins, waits in line and takes a slot; see docs/design.md. The
    /// outage counts the join's answer as the server reached.
    fn contend_on(
        &self,
        link: &mut Link,
        mode: Contend,
        outage: &mut Outage,
    ) -> Result<(u32, u64, Instant), Attempt> {
        let (p, limit) = (self.key, self.limit);
        // The mark first, then a look: a contender with another limit is
        // seen by us or sees us.
        let joined = self.join(link)?;
        outage.recovered();
        if link.through_a_middleman(&self.settings.connection) {
            self.refuse_a_sharing_pooler(link)?;
        }
        let first = match joined {
            (Joined::Slot { slot, fence }, sent) => return Ok((slot, fence, sent)),
            (Joined::Line, _) => true,
            (Joined::Behind | Joined::OtherLimit, _) => false,
        };
        if !first {
            let seen = keys::contenders(&self.prefix, &self.lock_rows(link)?);
            if let Some(other) = keys::other_limit(&seen, limit, link.pid) {
                return Err(self.conflict(other).into());
            }
            let first = self.call(
                link,
                &format!("pg_try_advisory_lock({p}, {LINE})"),
                "joining the line",
            )?;
            if first.as_deref() != Some("true") {
                let picture = keys::progress(&seen, limit, link.pid);
                if mode == Contend::Try {
                    return Err(Stop::NoSlot(picture).into());
                }
                self.gate.waiting(&self.prefix, picture);
                self.wait_in_server(
                    link,
                    &format!("pg_advisory_lock({p}, {LINE})"),
                    "waiting in line",
                )?;
            }
        }
        // First in line: nobody else takes a slot now, holders only leave.
        let channel = keys::channel(p);
        if limit > 1 {
            link.run(&self.sql(&format!("LISTEN {channel}")))
                .map_err(|e| self.failed("listening", &e))?;
        }
        let mut told: Option<Progress> = None;
        let slot = loop {
            let seen = keys::contenders(&self.prefix, &self.lock_rows(link)?);
            if let Some(other) = keys::other_limit(&seen, limit, link.pid) {
                return Err(self.conflict(other).into());
            }
            link.forget_notes();
            let taken = self.call(
                link,
                &format!(
                    "SELECT k FROM generate_series(0, {}) AS k WHERE pg_try_advisory_lock({p}, k) LIMIT 1",
                    limit - 1
                ),
                "taking a slot",
            )?;
            if let Some(slot) = taken.and_then(|k| k.parse().ok()) {
                break slot;
            }
            let picture = keys::progress(&seen, limit, link.pid);
            if mode == Contend::Try {
                return Err(Stop::NoSlot(picture).into());
            }
            self.gate
                .waiting_if_changed(&self.prefix, picture, &mut told);
            if limit == 1 {
                // One slot: wait for it in the server, woken the moment
                // its holder's session lets it go, however it ends.
                self.wait_in_server(
                    link,
                    &format!("pg_advisory_lock({p}, 0)"),
                    "waiting for the slot",
                )?;
                break 0;
            }
            self.wait_for_a_departure(link)?;
        };
        // The fence, then the line let go (and no more listening), in one
        // message: its statements run in order, on our session.
        let mut sql = format!(
            "{};\n{};\nSELECT {}",
            keys::guarded(link.pid, "txid_current()"),
            keys::guarded(link.pid, &format!("pg_advisory_unlock({p}, {LINE})")),
            keys::FENCE_RECORD
        );
        if limit > 1 {
            sql.push_str(&format!(";\nUNLISTEN {channel}"));
        }
        let sent = Instant::now();
        let rows = link
            .run(&self.sql(&sql))
            .map_err(|e| self.failed("reading the fence and leaving the line", &e))?;
        let [fence, line, _] = rows.as_slice() else {
            return Err(self.pooled().into());
        };
        self.on_our_session(link, std::slice::from_ref(line))?;
        let fence = self
            .on_our_session(link, std::slice::from_ref(fence))?
            .and_then(|f| f.parse().ok())
            .unwrap_or(0);
        Ok((slot, fence, sent))
    }

    /// The first waiter of a limit above 1: sleeps until a holder says it
    /// left (a notification), the connection ends, release begins, or it
    /// is time to look for a slot freed without a word.
    fn wait_for_a_departure(&self, link: &mut Link) -> Result<(), Attempt> {
        match link.wait_for_note(UNANNOUNCED_LOOK, self.closing.subscribe()) {
            Waited::Note | Waited::Timeout => Ok(()),
            Waited::Closing => Err(Stop::Closing.into()),
            Waited::Ended(why) => Err(self.ended("we waited", &why)),
        }
    }

    /// Sleeps `pause` before a new attempt; false if release began.
    fn pause(&self, pause: Duration) -> bool {
        let mut closing = self.closing.subscribe();
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
        else {
            return false;
        };
        runtime.block_on(async {
            tokio::select! {
                _ = tokio::time::sleep(pause) => true,
                _ = closing.wait_for(|closing| *closing) => false,
            }
        })
    }

    /// Holds the slot: a round trip every TTL/3, each confirmed one a
    /// lease of the TTL from its sending; the session's end is a loss at
    /// once. Returns why the slot was lost, or `None` once we left.
    fn hold_on(&self, held: &mut Held) -> Option<String> {
        let ttl = self.settings.ttl;
        let period = lease::renew_period(ttl);
        let shown = self.settings.connection.shown.clone();
        loop {
            let mut closing = self.closing.subscribe();
            let ended = held.link.ended();
            let lease_end = lease::lease_end(held.confirmed, ttl);
            let next = self.sql("SELECT pg_backend_pid()");
            let outcome = held.link.block_on(async {
                tokio::select! {
                    _ = closing.wait_for(|closing| *closing) => Err(None),
                    why = ended => Err(Some(format!("the server ended our session ({why})"))),
                    answer = async {
                        tokio::time::sleep(period).await;
                        let sent = Instant::now();
                        tokio::select! {
                            answer = link::rows(held.link.client(), &next) => Ok(answer.map(|rows| (rows, sent))),
                            _ = tokio::time::sleep_until(lease_end.into()) => Err(()),
                        }
                    } => Ok(answer),
                }
            });
            match outcome {
                Err(None) => return None,
                Err(Some(why)) => return Some(format!("{shown}: {why}; the slot went with it")),
                Ok(Err(())) => {
                    return Some(format!(
                        "{shown} did not answer within the lease (--ttl {}): the server may have dropped our session",
                        crate::duration::human(ttl)
                    ))
                }
                Ok(Ok(Err(error))) => {
                    return Some(format!("{shown}: {error}; the slot went with the session"))
                }
                Ok(Ok(Ok((rows, _)))) if rows.first().and_then(|row| number(row, 0)) != Some(i64::from(held.link.pid)) => {
                    return Some(self.pooled().to_string());
                }
                Ok(Ok(Ok((_, sent)))) => {
                    held.confirmed = sent;
                    self.gate.notify(SlotEvent::Leased {
                        until: lease::lease_end(sent, ttl),
                    });
                }
            }
        }
    }

    /// Lets the slot go (every lock of ours: a pooler in session mode
    /// resets a session it takes back, but we do not count on it) and says
    /// so to the first waiter, then ends the session.
    fn leave(&self, held: &mut Held) -> Option<String> {
        let mut sql = self.sql(&keys::guarded(held.link.pid, "pg_advisory_unlock_all()"));
        if self.limit > 1 {
            // Sent as the statements' implicit transaction commits, after
            // the unlock.
            sql = format!(
                "NOTIFY {}, '{}';\n{sql}",
                keys::channel(self.key),
                held.slot
            );
        }
        let left = held.link.block_on(async {
            tokio::time::timeout(Duration::from_secs(2), link::rows(held.link.client(), &sql)).await
        });
        let unfinished = match left {
            Ok(Ok(rows)) => self
                .on_our_session(&held.link, &rows[..1.min(rows.len())])
                .err()
                .map(|e| e.to_string()),
            Ok(Err(error)) => Some(error.to_string()),
            Err(_) => Some("no answer within 2s".to_string()),
        };
        held.link.close();
        unfinished
    }
}

impl Recipe for PostgresSemaphore {
    type Shared = ();
    type Held = Held;

    fn gate(&self) -> &Gate<()> {
        &self.gate
    }

    fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Contends on a session of its own; a session lost while joining or
    /// waiting (a restart, a failover, a network failure) is replaced, as
    /// on every store, for as long as the outage lasts no longer than the
    /// TTL, and the contender joins again at the end of the line (the
    /// server's lock queue went with the session).
    fn acquire(self: &Arc<Self>, mode: Contend) -> Result<Grant<Held>, Stop> {
        let mut outage = Outage::new(self.settings.ttl);
        let stop = loop {
            if *self.closing.borrow() {
                break Stop::Closing;
            }
            let attempt = Link::connect(&self.settings.connection)
                .map_err(|error| {
                    if error.kind == ErrorKind::Unavailable {
                        Attempt::SessionLost(error)
                    } else {
                        Attempt::Stop(Stop::Failed(error))
                    }
                })
                .and_then(
                    |mut link| match self.contend_on(&mut link, mode, &mut outage) {
                        Ok(won) => Ok((link, won)),
                        Err(attempt) => {
                            link.close();
                            Err(attempt)
                        }
                    },
                );
            match attempt {
                Ok((link, (slot, fence, sent))) => {
                    self.phase().held = true;
                    return Ok(Grant {
                        fence,
                        lease: Some(lease::lease_end(sent, self.settings.ttl)),
                        held: Held {
                            link,
                            slot,
                            confirmed: sent,
                        },
                    });
                }
                Err(Attempt::Stop(stop)) => break stop,
                Err(Attempt::SessionLost(error)) => {
                    let Some(pause) = outage.retry_after() else {
                        break Stop::Failed(error);
                    };
                    report::event("retry", &[("error", &error.to_string())]);
                    if !self.pause(pause) {
                        break Stop::Closing;
                    }
                }
            }
        };
        self.finished(None, None);
        Err(stop)
    }

    fn hold(self: &Arc<Self>, mut held: Held) -> Option<String> {
        report::event("holding", &[("prefix", &self.prefix), ("slot", &held.slot)]);
        match self.hold_on(&mut held) {
            None => {
                let unfinished = self.leave(&mut held);
                self.finished(None, unfinished);
                None
            }
            Some(lost) => {
                held.link.close();
                self.finished(Some(lost.clone()), None);
                Some(lost)
            }
        }
    }
}

impl SlotBackend for PostgresSemaphore {
    fn contend(self: Arc<Self>, mode: Contend, notify: Notify) {
        self.phase().contending = true;
        driver::contend(self, mode, notify);
    }

    fn release(&self, budget: Duration) -> Result<Released, ReleaseError> {
        let _ = self.gate.stop(Duration::ZERO);
        self.closing.send_replace(true);
        let phase = self.phase();
        let (phase, waited) = self
            .phase_changed
            .wait_timeout_while(phase, budget, |phase| phase.contending)
            .unwrap_or_else(|e| e.into_inner());
        report::event(
            driver::leaving_event(phase.held),
            &[("prefix", &self.prefix)],
        );
        if waited.timed_out() {
            return Err(ReleaseError(vec![Unfinished::step(format!(
                "leaving {}",
                self.prefix
            ))
            .cleanup(
                "the server drops our session, and its locks, when consem exits",
            )]));
        }
        if let Some(why) = &phase.unfinished {
            return Err(ReleaseError(vec![Unfinished::step(format!(
                "letting our slot of {} go: {why}",
                self.prefix
            ))
            .cleanup(
                "the server dropped our session, and its locks, as we closed it",
            )]));
        }
        Ok(match &phase.taken {
            Some(why) => Released::TakenBefore(why.clone()),
            None => Released::Left,
        })
    }

    fn frees_slot_at_death(&self) -> bool {
        STORE.frees_slot_at_death
    }
}
