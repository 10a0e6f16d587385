//! The semaphore recipe run against Consul: a session renewed in the
//! background, a contender key, `.lock` written with CAS, blocking queries to
//! wait and to watch, and a release that leaves nothing behind.
//!
//! Threads: the contender (acquire, then watch) and the renewer are helpers;
//! `release` runs on the caller's thread. Helpers make every write through
//! [`ConsulSemaphore::guarded`], which refuses once release has begun and lets
//! release wait for a write in flight, so a CAS won while shutting down is
//! seen and undone.

use std::sync::{Arc, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use crate::report;
use crate::store::consul::client::{
    Client, Consistency, ConsulError, Listing, Renewal, SessionSpec,
};
use crate::store::consul::contender::{
    Answer, Call, Contender, Note, Step, WaitPicture, Watched, Watcher, UNMATCHED_CAS,
};
use crate::store::consul::semaphore::{self, Loss, ReleaseStep, Snapshot, SEMAPHORE_FLAGS};
use crate::store::driver::{self, Failures, Gate, Grant, Guarded, Recipe, Stop};
use crate::store::lease::{self, lease_end};
use crate::store::outage::{Backoff, Outage};
use crate::store::{
    Contend, ContenderInfo, Holder, Notify, Progress, ReleaseError, Released, SlotBackend,
    SlotEvent, StoreError, Unfinished,
};

/// How long one blocking query may wait on the server. The caller's deadline
/// and signals do not depend on it (release wakes the query by writing).
const BLOCKING_WAIT: Duration = Duration::from_secs(60);

/// Pause between renewal attempts after a failed one.
const RENEW_RETRY: Duration = Duration::from_secs(1);

/// Attempts at the `.lock` CAS when releasing, against concurrent writers.
const RELEASE_CAS_ATTEMPTS: u32 = 8;

/// What a run asks of the semaphore.
#[derive(Debug, Clone)]
pub struct Settings {
    pub prefix: String,
    pub limit: u32,
    pub ttl: Duration,
    pub session_name: String,
    /// Describes this contender to operators (host, pid, command, start).
    pub contender_value: Vec<u8>,
    /// Failed attempts in a row to reach Consul a holder bears; `None`:
    /// as many as fit in its lease.
    pub monitor_retry: Option<u32>,
}

/// What the helper threads share with `release`, beside the [`Gate`]'s
/// own (release began; the writes in flight; the command has started).
#[derive(Default)]
pub struct Shared {
    session: Option<String>,
    /// When the request that created the current session, or its last
    /// renewal that Consul confirmed, was sent: the lease runs from there.
    lease_from: Option<Instant>,
    holding: bool,
    fence: Option<u64>,
    /// The listing that confirmed our slot: the hand-off decides on it.
    confirmed_on: Option<Snapshot>,
    renewer_started: bool,
    /// Consul denied us and the run ends on it: release's own denials are
    /// that same news, not worth a second message.
    denied: bool,
    /// A session create went out and got no answer: it may have created a
    /// session that nobody renews or destroys.
    create_unanswered: bool,
}

/// A semaphore on one Consul prefix, for one run.
pub struct ConsulSemaphore {
    client: Client,
    settings: Settings,
    gate: Gate<Shared>,
}

/// What holding needs from acquiring: where the watches start (the fence
/// for `.lock`, our key's index for our key), and whether a waiter behind
/// is owed the relay write.
pub struct Held {
    fence: u64,
    key_index: u64,
    relay: bool,
}

/// How a hand-off decided on the listing that confirmed the slot went.
enum Known {
    Handed(String),
    /// A call failed, or `.lock` kept changing: release goes on without
    /// a hand-off (step 3 hands the slot on).
    NotHanded,
    /// That listing cannot tell: a fresh one decides.
    NeedsListing,
}

/// A release under way, once the helpers are stopped and a session is
/// known.
struct Leaving {
    session: String,
    deadline: Instant,
    /// Consul denied us and the run ended on it: its denials now repeat
    /// that news.
    denied: bool,
    unfinished: Vec<Unfinished>,
}

impl Leaving {
    /// What is left of the budget, for one call: 100 ms at least.
    fn remaining(&self) -> Duration {
        self.deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100))
    }

    /// `step` failed with `error`: said, unless it repeats the denial
    /// that ended the run.
    fn failed(&mut self, step: Unfinished, error: ConsulError) {
        if !(self.denied && matches!(error, ConsulError::Denied(_))) {
            self.unfinished.push(step.because(error));
        }
    }
}

impl ConsulSemaphore {
    pub fn new(client: Client, settings: Settings) -> ConsulSemaphore {
        ConsulSemaphore {
            client,
            settings,
            gate: Gate::default(),
        }
    }

    fn shared(&self) -> MutexGuard<'_, Guarded<Shared>> {
        self.gate.lock()
    }

    fn closing(&self) -> bool {
        self.gate.closing()
    }

    fn key(&self, name: &str) -> String {
        format!("{}/{name}", self.settings.prefix)
    }

    /// Runs a write unless release has begun; `record` stores what it
    /// created while release still waits for it.
    fn guarded<T>(
        &self,
        write: impl FnOnce() -> T,
        record: impl FnOnce(&mut Shared, &T),
    ) -> Option<T> {
        self.gate.write(|_| {}, write, record)
    }

    // ---- acquiring ------------------------------------------------------

    /// Takes a slot on a lease with room for the command to start: a slot
    /// won on a session that Consul no longer knows is joined again.
    fn acquire_with_room(self: &Arc<Self>, mode: Contend) -> Result<Grant<Held>, Stop> {
        let (fence, key_index, relay) = loop {
            match self.take_slot(mode) {
                Ok(_) if !self.lease_has_room() => report::event(
                    "rejoining",
                    &[
                        ("prefix", &self.settings.prefix),
                        (
                            "reason",
                            &"our session expired before the command could start",
                        ),
                    ],
                ),
                other => break other?,
            }
        };
        // Only now may the renewer report a loss or a lease: one reported
        // before `Acquired` would reach a supervisor still waiting.
        let lease_from = {
            let mut shared = self.shared();
            shared.fence = Some(fence);
            shared.holding = true;
            shared.lease_from
        };
        Ok(Grant {
            fence,
            lease: lease_from.map(|sent| lease_end(sent, self.settings.ttl)),
            held: Held {
                fence,
                key_index,
                relay,
            },
        })
    }

    /// Watches the slot (our key on a thread of its own, `.lock` on this
    /// one) once the command has started, after the relay write if one is
    /// owed; returns why the slot is lost, or `None` once release began.
    fn watch_slot(self: &Arc<Self>, held: Held) -> Option<String> {
        let session = self.shared().session.clone()?;
        // Starting the command comes first: the watches and the relay wait
        // for it, so as not to compete with it.
        self.gate
            .wait_for_command(lease::renew_period(self.settings.ttl));
        let (limit, retry) = (self.settings.limit, self.settings.monitor_retry);
        let key = Watcher::new(&session, limit, Watched::Key, held.key_index, retry);
        let this = Arc::clone(self);
        let notify = self.gate.notifier().expect("contend says where events go");
        driver::spawn("consem-watch-key", notify, move |_| {
            if let Some(reason) = this.watch_until_lost(key) {
                this.gate.lost(reason);
            }
        });
        if held.relay {
            self.relay(&session, held.fence, held.key_index);
        }
        self.watch_until_lost(Watcher::new(
            &session,
            limit,
            Watched::Lock,
            held.fence,
            retry,
        ))
    }

    /// Whether the lease leaves the command room to start. A waiter that
    /// was stopped or starved past its renewals can win a slot (one handed
    /// to it needs a single read) on a lease that is about to end: then it
    /// renews first, so that the command does not start only to be stopped.
    /// `false` when Consul no longer knows the session, whose key (and so
    /// the slot) went with it.
    fn lease_has_room(&self) -> bool {
        let ttl = self.settings.ttl;
        let period = lease::renew_period(ttl);
        let (session, from) = {
            let shared = self.shared();
            (shared.session.clone(), shared.lease_from)
        };
        let Some(session) = session else {
            return true;
        };
        if from.is_some_and(|sent| lease_end(sent, ttl) > Instant::now() + period) {
            return true;
        }
        // A failed renewal leaves the lease as it stands to decide; the
        // supervisor enforces it.
        !matches!(self.renew(&session), Ok(None))
    }

    /// Renews `session` once, within one renewal period (the lease counts
    /// from when a renewal was sent, so a later answer is of no use), and
    /// moves the lease's start on. `Ok(None)` when Consul no longer knows
    /// the session.
    fn renew(&self, session: &str) -> Result<Option<Instant>, ConsulError> {
        let sent = Instant::now();
        let period = lease::renew_period(self.settings.ttl);
        match self
            .client
            .with_call_timeout(period)
            .renew_session(session)?
        {
            Renewal::Renewed => {
                self.shared().lease_from = Some(sent);
                Ok(Some(sent))
            }
            Renewal::Gone => Ok(None),
        }
    }

    /// The relay write of [`Step::Acquired`]: until it lands, the waiter
    /// behind sleeps, so a failure is retried, while the slot lasts or
    /// `--monitor-retry` times. A CAS that finds our key changed is the
    /// watch's news, not ours.
    fn relay(&self, session: &str, fence: u64, key_index: u64) {
        let value = semaphore::holding_value(&self.settings.contender_value, fence);
        let mut backoff = Backoff::default();
        let mut failures = 0;
        loop {
            match self.rewrite_own_key(session, value.clone(), key_index) {
                None | Some(Ok(_)) => return,
                Some(Err(error)) => {
                    failures += 1;
                    if self
                        .settings
                        .monitor_retry
                        .is_some_and(|bearable| failures > bearable)
                    {
                        return;
                    }
                    report::event("relay-retry", &[("error", &error)]);
                    if self.gate.pause(backoff.next_pause()) {
                        return;
                    }
                }
            }
        }
    }

    /// Runs the [`Contender`] until a slot is ours. Returns the fence (where
    /// watching `.lock` starts), our key's index (where watching it starts)
    /// and whether a waiter behind is owed the relay write.
    fn take_slot(self: &Arc<Self>, mode: Contend) -> Result<(u64, u64, bool), Stop> {
        let mut contender = Contender::new(self.settings.limit, mode);
        let mut outage = Outage::new(self.settings.ttl);
        let mut call = contender.start();
        loop {
            if self.closing() {
                return Err(Stop::Closing);
            }
            let answer = match self.execute(&call).ok_or(Stop::Closing)? {
                Ok(answer) => {
                    outage.recovered();
                    answer
                }
                Err(error) => {
                    on_failure(&mut outage, self, error)?;
                    call = contender.after_failure();
                    continue;
                }
            };
            let step = contender.on_answer(answer);
            for note in contender.take_notes() {
                match note {
                    Note::Waiting(picture) => self
                        .gate
                        .waiting(&self.settings.prefix, self.progress(&picture)),
                    // While leaving, our key goes because we destroyed
                    // the session: nothing to tell.
                    Note::Rejoining if self.closing() => {}
                    Note::Rejoining => report::event(
                        "rejoining",
                        &[
                            ("prefix", &self.settings.prefix),
                            ("reason", &"our contender key is gone"),
                        ],
                    ),
                }
            }
            call = match step {
                Step::Call(next) => next,
                Step::Acquired {
                    fence,
                    key_index,
                    relay,
                } => {
                    self.shared().confirmed_on = contender.take_confirmed_on();
                    return Ok((fence, key_index, relay));
                }
                Step::NoSlot(picture) => return Err(Stop::NoSlot(self.progress(&picture))),
                Step::Conflict(conflict) => {
                    return Err(Stop::Failed(StoreError::conflict(format!(
                        "{}/.lock {conflict}; {}",
                        self.settings.prefix,
                        conflict.remedy()
                    ))))
                }
                Step::Hidden { session } => {
                    self.shared().denied = true;
                    return Err(Stop::Failed(StoreError::denied(format!(
                        "permission denied: {}",
                        crate::store::consul::client::hidden_holder(
                            &self.settings.prefix,
                            &session
                        )
                    ))));
                }
                Step::KeyTaken { session } => {
                    return Err(Stop::Failed(StoreError::conflict(format!(
                        "the contender key {} is held by another session; use another --prefix",
                        self.key(&session)
                    ))))
                }
            };
        }
    }

    /// Describes the holders we wait for from their contender keys' values.
    fn progress(&self, picture: &WaitPicture) -> Progress {
        let holders = picture
            .holders
            .iter()
            .map(|entry| Holder::from(&ContenderInfo::parse(&entry.value)))
            .collect();
        Progress {
            limit: self.settings.limit,
            holders,
            ahead: picture.ahead,
        }
    }

    /// Makes one call for the contender. Writes go through [`Self::guarded`];
    /// `None` when release has begun.
    fn execute(self: &Arc<Self>, call: &Call) -> Option<Result<Answer, ConsulError>> {
        match call {
            Call::CreateSession => self.create_session().map(|r| r.map(Answer::SessionCreated)),
            Call::AcquireKey { session } => self
                .guarded(
                    || {
                        self.client.acquire(
                            &self.key(session),
                            session,
                            self.settings.contender_value.clone(),
                            SEMAPHORE_FLAGS,
                        )
                    },
                    |_, _| {},
                )
                .map(|r| r.map(Answer::KeyAcquired)),
            Call::List { .. } => Some(self.read(call).map(Answer::Listing)),
            Call::CheckHolder { name } => Some(
                match self
                    .client
                    .get(&self.settings.prefix, name, Consistency::Default, None)
                {
                    Ok(read) => Ok(Answer::HolderKey(Some(read))),
                    Err(ConsulError::Denied(_)) => Ok(Answer::HolderKey(None)),
                    Err(other) => Err(other),
                },
            ),
            Call::Get { .. } => Some(self.read(call).map(Answer::Key)),
            Call::Wake { session, mark, cas } => {
                let value = semaphore::woken_value(&self.settings.contender_value, *mark);
                self.rewrite_own_key(session, value, *cas)
                    .map(|r| r.map(|_| Answer::Woken))
            }
            Call::ProbeLock { value } => {
                let key = self.key(semaphore::LOCK_KEY_NAME);
                self.guarded(
                    || {
                        self.client
                            .put_cas(&key, value.clone(), UNMATCHED_CAS, SEMAPHORE_FLAGS)
                    },
                    |_, _| {},
                )
                .map(|r| match r {
                    Err(ConsulError::Denied(why)) => Err(ConsulError::Denied(why)),
                    // A proxy that refuses the index, or a failure now: the
                    // slot's own writes will tell.
                    Ok(_) | Err(_) => Ok(Answer::LockProbed),
                })
            }
            Call::PutLock { value, cas } => {
                let key = self.key(semaphore::LOCK_KEY_NAME);
                self.guarded(
                    || {
                        self.client
                            .put_cas(&key, value.clone(), *cas, SEMAPHORE_FLAGS)
                    },
                    |_, _| {},
                )
                .map(|r| r.map(Answer::LockWritten))
            }
        }
    }

    /// A CAS on our contender key as a read showed it: it keeps the key's
    /// session, and fails if the key changed since.
    fn rewrite_own_key(
        &self,
        session: &str,
        value: Vec<u8>,
        cas: u64,
    ) -> Option<Result<bool, ConsulError>> {
        self.guarded(
            || {
                self.client
                    .put_cas(&self.key(session), value, cas, SEMAPHORE_FLAGS)
            },
            |_, _| {},
        )
    }

    /// Makes a [`Call::List`] or a [`Call::Get`].
    fn read(&self, call: &Call) -> Result<Listing, ConsulError> {
        let block = |index: u64| (index > 0).then_some((index, BLOCKING_WAIT));
        let prefix = &self.settings.prefix;
        match call {
            Call::List {
                consistency,
                block_on,
            } => self.client.list(prefix, *consistency, block(*block_on)),
            Call::Get {
                name,
                consistency,
                block_on,
            } => self
                .client
                .get(prefix, name, *consistency, block(*block_on)),
            other => unreachable!("read() takes only reads, not {other:?}"),
        }
    }

    fn create_session(self: &Arc<Self>) -> Option<Result<String, ConsulError>> {
        let spec = SessionSpec {
            name: self.settings.session_name.clone(),
            ttl: self.settings.ttl,
        };
        let sent = Instant::now();
        let created = self.guarded(
            || self.client.create_session(&spec),
            |shared, created| match created {
                Ok(id) => {
                    shared.session = Some(id.clone());
                    shared.lease_from = Some(sent);
                }
                Err(ConsulError::Unanswered(_)) => shared.create_unanswered = true,
                Err(_) => {}
            },
        )?;
        if let Ok(id) = &created {
            if self.closing() {
                // Release began while the session was being created and may
                // have given up waiting for it: do not leave it.
                let _ = self.client.destroy_session(id);
                return None;
            }
            report::event(
                "session-created",
                &[("session", id), ("ttl", &crate::duration::human(spec.ttl))],
            );
            self.start_renewer();
        }
        Some(created)
    }

    // ---- holding --------------------------------------------------------

    /// Runs a [`Watcher`] while the command runs; returns why the slot is
    /// lost, or `None` if release began.
    fn watch_until_lost(&self, mut watcher: Watcher) -> Option<String> {
        let mut backoff = Backoff::default();
        loop {
            if self.closing() {
                return None;
            }
            match self.read(&watcher.call()) {
                Ok(read) => {
                    backoff = Backoff::default();
                    if let Err(loss) = watcher.on_read(read) {
                        if self.closing() {
                            return None;
                        }
                        // A deleted key says nothing of who deleted it:
                        // Consul with our session, or someone by hand.
                        let session = self.shared().session.clone().unwrap_or_default();
                        let alive = match loss {
                            Loss::KeyDeleted => self
                                .client
                                .session_info(&session)
                                .ok()
                                .map(|info| info.is_some()),
                            _ => None,
                        };
                        return Some(loss.explain_deleted_key(alive).to_string());
                    }
                }
                Err(ConsulError::Denied(why)) => {
                    self.shared().denied = true;
                    return Some(format!("permission denied: {why}"));
                }
                Err(error) => match watcher.on_failure() {
                    Err(failures) => {
                        let gave_up = lease::AfterFailure::TooMany {
                            failures,
                            bearable: self.settings.monitor_retry.unwrap_or_default(),
                        };
                        return Some(format!("cannot watch the slot: {error} ({gave_up})"));
                    }
                    Ok(failures) => {
                        report::event("watch-retry", &[("failures", &failures), ("error", &error)]);
                        if self.gate.pause(backoff.next_pause()) {
                            return None;
                        }
                    }
                },
            }
        }
    }

    /// Starts the renewer once a session exists. It renews at TTL/2 whatever
    /// the other threads are blocked on, and stops when release begins.
    fn start_renewer(self: &Arc<Self>) {
        {
            let mut shared = self.shared();
            if shared.renewer_started {
                return;
            }
            shared.renewer_started = true;
        }
        let this = Arc::clone(self);
        thread::Builder::new()
            .name("consem-renew".into())
            .spawn(move || this.renew_loop())
            .expect("cannot start the session renewal thread");
    }

    /// Renews the session every TTL/3 and reports each confirmed renewal
    /// as the slot's new lease. A renewal that fails is retried every
    /// second; the supervisor stops the command when the lease runs out.
    fn renew_loop(&self) {
        let ttl = self.settings.ttl;
        let period = lease::renew_period(ttl);
        let mut next_pause = period;
        let mut failures = Failures::new(self.settings.monitor_retry);
        while !self.gate.pause(next_pause) {
            let Some(session) = self.shared().session.clone() else {
                continue;
            };
            match self.renew(&session) {
                Ok(Some(sent)) => {
                    failures.reset();
                    next_pause = period;
                    if self.holding() {
                        self.gate.notify(SlotEvent::Leased {
                            until: lease_end(sent, ttl),
                        });
                    }
                }
                Ok(None) => {
                    self.report_loss_if_holding(
                        "Consul invalidated our session (renewal answered 404)",
                    );
                    next_pause = period;
                }
                Err(error) => {
                    let until = self
                        .shared()
                        .lease_from
                        .map_or_else(Instant::now, |sent| lease_end(sent, ttl));
                    report::event("renew-retry", &[("error", &error)]);
                    next_pause = match failures.failed(until) {
                        lease::AfterFailure::RetryIn(pause) => pause,
                        // A holder's slot ends here; a waiter's session is
                        // looked after by its waiting (the outage rule).
                        gave_up => {
                            self.report_loss_if_holding(&format!(
                                "cannot renew our session: {error} ({gave_up})"
                            ));
                            RENEW_RETRY
                        }
                    };
                }
            }
        }
    }

    /// Step 1 of release: a holder writes `.lock` with the first consem
    /// waiter in its place, and wakes the waiter behind that heir. A third
    /// of the budget at most: destroying the session matters more. The
    /// heir, once `.lock` names it. It decides on the listing that
    /// confirmed our slot, with `.lock` and the heir's key read afresh
    /// (their size does not grow with the crowd); on a new listing only
    /// when that one has no waiter left or shows a `consul lock` contender.
    fn hand_off(&self, leaving: &Leaving, confirmed_on: Option<Snapshot>) -> Option<String> {
        let client = self.client.with_call_timeout(leaving.remaining() / 3);
        if let Some(known) = confirmed_on {
            let until = Instant::now() + leaving.remaining() / 3;
            match self.hand_off_known(&client, &leaving.session, known, until) {
                Known::Handed(heir) => return Some(heir),
                Known::NotHanded => return None,
                Known::NeedsListing => {}
            }
        }
        let snapshot = self.leaving_snapshot(&client, &leaving.session).ok()?;
        let ReleaseStep::Rewrite {
            value,
            cas,
            heir: Some(heir),
        } = semaphore::plan_release(&snapshot, &leaving.session, self.settings.limit)
        else {
            return None;
        };
        let lock_key = self.key(semaphore::LOCK_KEY_NAME);
        if let Ok(true) = client.put_cas(&lock_key, value, cas, SEMAPHORE_FLAGS) {
            self.wake_behind_heir(&client, &snapshot, &heir, cas);
            return Some(heir);
        }
        None
    }

    /// The hand-off decided on `known` (see [`semaphore::known_with_lock`]):
    /// `.lock` read afresh, the holders it names that `known` does not show
    /// read directly, and the heir's key read directly, so that a waiter
    /// that left since is skipped; a lost CAS reads `.lock` again, until
    /// `until` (a third of the release's budget: the session's end matters
    /// more).
    fn hand_off_known(
        &self,
        client: &Client,
        session: &str,
        known: Snapshot,
        until: Instant,
    ) -> Known {
        let prefix = &self.settings.prefix;
        let limit = self.settings.limit;
        for _ in 0..RELEASE_CAS_ATTEMPTS {
            if Instant::now() >= until {
                return Known::NotHanded;
            }
            let Ok(read) = client.get(
                prefix,
                semaphore::LOCK_KEY_NAME,
                Consistency::Consistent,
                None,
            ) else {
                return Known::NotHanded;
            };
            let Some(lock) = read.entries.into_iter().next() else {
                return Known::NotHanded;
            };
            // A `.lock` that is not ours to write: the listing path says so.
            let Ok(mut others) = semaphore::lock_record(&lock, limit) else {
                return Known::NeedsListing;
            };
            others.holders.retain(|h| h != session);
            let Some(mut snapshot) = semaphore::known_with_lock(&known, lock, limit) else {
                return Known::NeedsListing;
            };
            if client
                .reveal_hidden(prefix, &others, &mut snapshot)
                .is_err()
            {
                return Known::NotHanded;
            }
            let ReleaseStep::Rewrite {
                value,
                cas,
                heir: Some(heir),
            } = semaphore::plan_release(&snapshot, session, limit)
            else {
                return Known::NeedsListing;
            };
            // The heir must still wait: a waiter that left since would be
            // handed a slot nobody uses. Its key's index is the one the
            // rewrite that wakes the waiter behind it needs.
            let Ok(read) = client.get(prefix, &heir, Consistency::Consistent, None) else {
                return Known::NotHanded;
            };
            let entry = read.entries.into_iter().find(|e| e.name == heir);
            match entry {
                Some(entry) if semaphore::check_key(Some(&entry), &heir).is_ok() => {
                    snapshot.contenders.insert(heir.clone(), entry);
                }
                // The listing is out of date: the queue moved on since.
                // Skipping its waiters one read at a time cost a holder
                // that had held long some 8 × (limit + 1) reads, and the
                // hand-off when the attempts ran out; one listing decides.
                _ => return Known::NeedsListing,
            }
            let lock_key = self.key(semaphore::LOCK_KEY_NAME);
            match client.put_cas(&lock_key, value, cas, SEMAPHORE_FLAGS) {
                Ok(true) => {
                    self.wake_behind_heir(client, &snapshot, &heir, cas);
                    return Known::Handed(heir);
                }
                Ok(false) => continue,
                Err(_) => return Known::NotHanded,
            }
        }
        // `.lock` kept changing under us: as with a stale listing, a
        // fresh one decides, rather than no hand-off at all.
        Known::NeedsListing
    }

    /// Step 3 of release: writes `.lock` without us (pruning the dead, and
    /// handing the slot on), or deletes it if nobody else is left; with
    /// CAS, tried again against concurrent writers.
    fn leave_lock(&self, leaving: &mut Leaving) {
        let lock_key = self.key(semaphore::LOCK_KEY_NAME);
        for attempt in 1..=RELEASE_CAS_ATTEMPTS {
            let client = self.client.with_call_timeout(leaving.remaining());
            let snapshot = match self.leaving_snapshot(&client, &leaving.session) {
                Ok(snapshot) => snapshot,
                Err(error) => {
                    let step = Unfinished::step(format!("reading {}", self.settings.prefix));
                    return leaving.failed(step, error);
                }
            };
            let written =
                match semaphore::plan_release(&snapshot, &leaving.session, self.settings.limit) {
                    ReleaseStep::Nothing => return,
                    ReleaseStep::Rewrite { value, cas, heir } => {
                        let written = client.put_cas(&lock_key, value, cas, SEMAPHORE_FLAGS);
                        if let (Ok(true), Some(heir)) = (&written, heir) {
                            self.wake_behind_heir(&client, &snapshot, &heir, cas);
                        }
                        written
                    }
                    ReleaseStep::Delete { cas } => client.delete(&lock_key, Some(cas)),
                };
            match written {
                Ok(true) => return,
                Ok(false)
                    if attempt < RELEASE_CAS_ATTEMPTS && Instant::now() < leaving.deadline =>
                {
                    continue
                }
                Ok(false) => {
                    let step = Unfinished::step(format!("{lock_key} kept changing"))
                        .cleanup("the next contender prunes us");
                    return leaving.unfinished.push(step);
                }
                Err(error) => {
                    let step = Unfinished::step(format!("updating {lock_key}"));
                    return leaving.failed(step, error);
                }
            }
        }
    }

    /// What release decides on: the prefix as the token sees it, with the
    /// holders it cannot see marked hidden, so that they are neither pruned
    /// from `.lock` nor deleted with it. Holders the listing shows as dead
    /// are read directly first: an ACL may hide them. When Consul refuses
    /// the listing because the token cannot read all of it, `.lock` alone,
    /// every other holder in it kept.
    fn leaving_snapshot(&self, client: &Client, session: &str) -> Result<Snapshot, ConsulError> {
        let prefix = &self.settings.prefix;
        let (entries, partial) = match client.list(prefix, Consistency::Consistent, None) {
            Ok(listing) => (listing.entries, false),
            Err(ConsulError::Denied(_)) => {
                let lock = client.get(
                    prefix,
                    semaphore::LOCK_KEY_NAME,
                    Consistency::Consistent,
                    None,
                )?;
                (lock.entries, true)
            }
            Err(other) => return Err(other),
        };
        let mut snapshot = Snapshot::from_entries(entries);
        if let Ok(Some(record)) = snapshot.lock_record(self.settings.limit) {
            if partial {
                let others = record.holders.iter().filter(|h| *h != session).cloned();
                snapshot.hidden.extend(others);
            } else {
                // Our own key is gone once the session is: no need to read it.
                let mut others = record;
                others.holders.retain(|h| h != session);
                client.reveal_hidden(prefix, &others, &mut snapshot)?;
            }
        }
        Ok(snapshot)
    }

    /// Once `.lock` names `heir` in our place (a CAS on `handed_at`,
    /// decided on `snapshot`), rewrites the heir's key
    /// ([`semaphore::wake_behind_heir`]). Should that fail, the waiter
    /// behind the heir wakes when the heir relays or leaves, or its session
    /// ends.
    fn wake_behind_heir(&self, client: &Client, snapshot: &Snapshot, heir: &str, handed_at: u64) {
        if let Some(wake) = semaphore::wake_behind_heir(snapshot, heir, handed_at) {
            let key = self.key(&wake.name);
            let _ = client.put_cas(&key, wake.value, wake.cas, SEMAPHORE_FLAGS);
        }
    }

    /// The slot is ours, and release has not begun: the renewer reports
    /// on it.
    fn holding(&self) -> bool {
        let shared = self.shared();
        shared.holding && !shared.closing()
    }

    fn report_loss_if_holding(&self, reason: &str) {
        if self.holding() {
            self.gate.notify(SlotEvent::Lost(reason.to_string()));
        }
    }
}

/// Waits before the next attempt after a failure while joining or
/// waiting, or ends the run.
fn on_failure(
    outage: &mut Outage,
    semaphore: &ConsulSemaphore,
    error: ConsulError,
) -> Result<(), Stop> {
    let give_up = |e: ConsulError| match e {
        ConsulError::Denied(ref why) => Stop::Failed(
            StoreError::denied(format!(
                "permission denied: {why}; see docs/security.md for the policy consem needs"
            ))
            .caused_by(e),
        ),
        other => Stop::Failed(StoreError::unavailable(other.to_string()).caused_by(other)),
    };
    if let ConsulError::Denied(_) = error {
        semaphore.shared().denied = true;
    }
    let retryable = matches!(
        error,
        ConsulError::Transient(_) | ConsulError::Unanswered(_)
    );
    let Some(pause) = outage.retry_after().filter(|_| retryable) else {
        return Err(give_up(error));
    };
    report::event("retry", &[("error", &error)]);
    if semaphore.gate.pause(pause) {
        return Err(Stop::Closing);
    }
    Ok(())
}

impl Recipe for ConsulSemaphore {
    type Shared = Shared;
    type Held = Held;

    fn gate(&self) -> &Gate<Shared> {
        &self.gate
    }

    fn prefix(&self) -> &str {
        &self.settings.prefix
    }

    fn acquire(self: &Arc<Self>, mode: Contend) -> Result<Grant<Held>, Stop> {
        self.acquire_with_room(mode)
    }

    fn hold(self: &Arc<Self>, held: Held) -> Option<String> {
        self.watch_slot(held)
    }
}

impl SlotBackend for ConsulSemaphore {
    fn contend(self: Arc<Self>, mode: Contend, notify: Notify) {
        driver::contend(self, mode, notify);
    }

    fn release(&self, budget: Duration) -> Result<Released, ReleaseError> {
        let deadline = Instant::now() + budget;
        // Stop the helpers' writes and let one in flight land, so that what
        // it created is known.
        let (session, write_unsettled, denied, held, confirmed_on) = {
            let (mut shared, in_flight) = self.gate.stop(budget / 2);
            shared.holding = false;
            (
                shared.session.take(),
                in_flight || shared.create_unanswered,
                shared.denied,
                shared.fence.is_some(),
                shared.confirmed_on.take(),
            )
        };
        let mut unfinished = Vec::new();
        if write_unsettled {
            // Even before an answer names a session: what it creates stays
            // until its TTL runs out, unrenewed.
            unfinished.push(
                Unfinished::step("a request that may create a session or write a key was still in flight, or got no answer")
                    .cleanup(format!(
                        "what it leaves behind, Consul removes within {} (the session expires and takes its key), and the next contender prunes it from .lock",
                        crate::duration::human(self.settings.ttl * 2)
                    )),
            );
        }
        let Some(session) = session else {
            return ReleaseError::or_left(unfinished);
        };
        let mut leaving = Leaving {
            session,
            deadline,
            denied,
            unfinished,
        };

        // 1. A holder hands its slot to the first consem waiter while its
        // session still holds it: once our key goes, `consul lock` waiters
        // prune us and race for the slot (see `semaphore::heir`). Only a
        // hand-off, and the heir's key that wakes the waiter behind it, are
        // written before the session goes; a rewrite without an heir waits
        // for step 3, so that of several holders leaving at once the last
        // deletes `.lock`. The CAS names us `false` in `.lock`
        // (`semaphore::plan_release`), so that a holder leaving before step
        // 2 does not take our live key for a waiter's and hand the slot
        // back to a session about to end.
        let handed_to = if held {
            self.hand_off(&leaving, confirmed_on)
        } else {
            None
        };

        // 2. Destroy the session: its `delete` behaviour removes our
        // contender key in the same write. The key goes before `.lock` is
        // read again, so that whoever of several leaving holders reads
        // `.lock` last sees no other contender key and deletes `.lock`: an
        // idle prefix ends empty. (We are releasing: that others may prune us
        // from this moment is what we want.)
        let client = self.client.with_call_timeout(leaving.remaining());
        if let Err(error) = client.destroy_session(&leaving.session) {
            let step = Unfinished::step(format!("destroying session {}", leaving.session)).cleanup(
                format!(
                    "Consul drops it and its key {} within {}",
                    self.key(&leaving.session),
                    crate::duration::human(self.settings.ttl * 2)
                ),
            );
            leaving.failed(step, error);
        }
        // Told once the session is gone, with the rest of the release.
        if let Some(heir) = &handed_to {
            report::event(
                "handed-over",
                &[("prefix", &self.settings.prefix), ("to", heir)],
            );
        }

        // 3. Leave `.lock`: take ourselves out (handing the slot on), or
        // delete it if we are the last.
        if handed_to.is_none() {
            self.leave_lock(&mut leaving);
        }

        report::event(
            driver::leaving_event(held),
            &[
                ("prefix", &self.settings.prefix),
                ("session", &leaving.session),
            ],
        );
        ReleaseError::or_left(leaving.unfinished)
    }

    fn frees_slot_at_death(&self) -> bool {
        super::STORE.frees_slot_at_death
    }

    fn command_started(&self) {
        self.gate.command_started();
    }

    fn own_child_env(&self) -> Vec<(String, String)> {
        let shared = self.shared();
        vec![
            (
                "CONSEM_SESSION".into(),
                shared.session.clone().unwrap_or_default(),
            ),
            // For scripts written for `consul lock`.
            ("CONSUL_LOCK_HELD".into(), "true".into()),
        ]
    }
}

/// The value of our contender key: who we are, for operators reading the KV
/// store (`consem status` shows it), and the promise to relay.
pub fn contender_value(info: &ContenderInfo) -> Vec<u8> {
    let mut value = info.to_json();
    value.insert(
        semaphore::RELAYS_FIELD.into(),
        serde_json::Value::Bool(true),
    );
    serde_json::to_vec(&value).expect("a JSON value always encodes")
}
