//! What every store's run repeats, written once: the contender thread
//! (acquire, tell the supervisor, hold, tell it of a loss), the state the
//! helper threads share with `release` (whether release began, writes in
//! flight, whether the command has started), pausing, the waiting and
//! acquired events, and a holder's failures against its lease. A store
//! writes only what is its own: [`Recipe::acquire`] (join, wait, take) and
//! [`Recipe::hold`] (renew, watch), and its `release` (leave).

use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use super::lease::{self, AfterFailure};
use super::{Contend, Notify, Progress, SlotEvent, StoreError};
use crate::report;

/// A store's recipe, as the contender thread runs it.
pub trait Recipe: Send + Sync + Sized + 'static {
    /// What the helper threads and `release` share, beside [`Gate`]'s own.
    type Shared: Send;
    /// What holding needs from acquiring.
    type Held: Send;

    fn gate(&self) -> &Gate<Self::Shared>;

    /// The prefix, for events.
    fn prefix(&self) -> &str;

    /// Joins and waits until a slot is ours, or says why not.
    fn acquire(self: &Arc<Self>, mode: Contend) -> Result<Grant<Self::Held>, Stop>;

    /// Watches (and renews) the slot while the command runs; returns why
    /// it was lost, or `None` once release began.
    fn hold(self: &Arc<Self>, held: Self::Held) -> Option<String>;
}

/// A slot won.
pub struct Grant<H> {
    pub fence: u64,
    /// The lease as of the call that won it (see [`SlotEvent::Acquired`]).
    pub lease: Option<Instant>,
    pub held: H,
}

/// Why contending stopped without a slot.
#[derive(Debug)]
pub enum Stop {
    /// `--try` found no free slot; this is who held them.
    NoSlot(Progress),
    /// Release began: nothing more to report.
    Closing,
    Failed(StoreError),
}

impl From<StoreError> for Stop {
    fn from(error: StoreError) -> Stop {
        Stop::Failed(error)
    }
}

/// Starts the contender thread of `recipe`: what [`super::SlotBackend::contend`]
/// does for every store.
pub fn contend<R: Recipe>(recipe: Arc<R>, mode: Contend, notify: Notify) {
    let _ = recipe.gate().notify.set(Arc::clone(&notify));
    spawn("consem-contend", notify, move |notify| {
        match recipe.acquire(mode) {
            Ok(grant) => {
                report::event(
                    "acquired",
                    &[("prefix", &recipe.prefix()), ("fence", &grant.fence)],
                );
                notify(SlotEvent::Acquired {
                    fence: grant.fence,
                    lease: grant.lease,
                });
                if let Some(reason) = recipe.hold(grant.held) {
                    recipe.gate().lost(reason);
                }
            }
            Err(Stop::NoSlot(picture)) => notify(SlotEvent::NoSlot(picture)),
            Err(Stop::Closing) => {}
            Err(Stop::Failed(error)) => notify(SlotEvent::Failed(error)),
        }
    });
}

/// The `-v` event for leaving the semaphore: `released` only where a slot
/// was held; a run that waited, or looked with `--try`, left its place in
/// the queue and held nothing.
pub fn leaving_event(held: bool) -> &'static str {
    if held {
        "released"
    } else {
        "left-queue"
    }
}

/// Starts a helper thread; one that panics is reported as a failure, so
/// that the supervisor never waits forever for an event that will not come.
pub fn spawn(name: &str, notify: Notify, body: impl FnOnce(&Notify) + Send + 'static) {
    thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let guard = PanicReport(notify);
            body(&guard.0);
        })
        .expect("cannot start the semaphore thread");
}

struct PanicReport(Notify);

impl Drop for PanicReport {
    fn drop(&mut self) {
        if thread::panicking() {
            (self.0)(SlotEvent::Failed(StoreError::unavailable(
                "internal error: the semaphore thread failed",
            )));
        }
    }
}

/// What a store's helper threads share with `release`: the store's own
/// state `S`, and under the same lock whether release began, the writes in
/// flight and whether the command has started; and where events go.
pub struct Gate<S> {
    shared: Mutex<Guarded<S>>,
    /// Signalled when release begins, a write lands or the command starts.
    changed: Condvar,
    notify: OnceLock<Notify>,
}

/// The state under a [`Gate`]'s lock; reads as the store's own `S`.
pub struct Guarded<S> {
    closing: bool,
    writes_in_flight: u32,
    command_started: bool,
    store: S,
}

impl<S> Guarded<S> {
    /// Release began.
    pub fn closing(&self) -> bool {
        self.closing
    }
}

impl<S> std::ops::Deref for Guarded<S> {
    type Target = S;
    fn deref(&self) -> &S {
        &self.store
    }
}

impl<S> std::ops::DerefMut for Guarded<S> {
    fn deref_mut(&mut self) -> &mut S {
        &mut self.store
    }
}

impl<S: Default> Default for Gate<S> {
    fn default() -> Gate<S> {
        Gate {
            shared: Mutex::new(Guarded {
                closing: false,
                writes_in_flight: 0,
                command_started: false,
                store: S::default(),
            }),
            changed: Condvar::new(),
            notify: OnceLock::new(),
        }
    }
}

impl<S> Gate<S> {
    pub fn lock(&self) -> MutexGuard<'_, Guarded<S>> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Release began.
    pub fn closing(&self) -> bool {
        self.lock().closing
    }

    /// Sleeps for `pause`, or less if release begins. True if it did.
    pub fn pause(&self, pause: Duration) -> bool {
        let (shared, _) = self
            .changed
            .wait_timeout_while(self.lock(), pause, |s| !s.closing)
            .unwrap_or_else(|e| e.into_inner());
        shared.closing
    }

    /// Runs `write` unless release has begun (`None`); release waits for
    /// it to land, so that what it created is known and undone. `start`
    /// runs under the lock as it is let through, `record` under the lock
    /// once it landed, before release may look.
    pub fn write<T>(
        &self,
        start: impl FnOnce(&mut S),
        write: impl FnOnce() -> T,
        record: impl FnOnce(&mut S, &T),
    ) -> Option<T> {
        {
            let mut shared = self.lock();
            if shared.closing {
                return None;
            }
            shared.writes_in_flight += 1;
            start(&mut shared.store);
        }
        let outcome = write();
        let mut shared = self.lock();
        record(&mut shared.store, &outcome);
        shared.writes_in_flight -= 1;
        self.changed.notify_all();
        Some(outcome)
    }

    /// Release begins: the helpers' writes are refused from now on, their
    /// pauses end, and a write in flight is waited for, `wait` at most.
    /// Returns the state, and whether a write was still in flight.
    pub fn stop(&self, wait: Duration) -> (MutexGuard<'_, Guarded<S>>, bool) {
        let mut shared = self.lock();
        shared.closing = true;
        self.changed.notify_all();
        let (shared, waited) = self
            .changed
            .wait_timeout_while(shared, wait, |s| s.writes_in_flight > 0)
            .unwrap_or_else(|e| e.into_inner());
        (shared, waited.timed_out())
    }

    /// The command has started (or could not be).
    pub fn command_started(&self) {
        self.lock().command_started = true;
        self.changed.notify_all();
    }

    /// Waits until the command has started, `at_most`, or release begins:
    /// a holder's first requests wait for it, so as not to compete with
    /// the start for the CPU.
    pub fn wait_for_command(&self, at_most: Duration) {
        let _ = self
            .changed
            .wait_timeout_while(self.lock(), at_most, |s| !s.command_started && !s.closing);
    }

    /// Sends `event` to the supervisor, once `contend` has said where.
    pub fn notify(&self, event: SlotEvent) {
        if let Some(notify) = self.notify.get() {
            notify(event);
        }
    }

    /// Where events go, once `contend` has said.
    pub fn notifier(&self) -> Option<Notify> {
        self.notify.get().cloned()
    }

    /// Reports the loss of the slot, unless release began (our own
    /// release takes it away).
    pub fn lost(&self, reason: String) {
        if !self.closing() {
            self.notify(SlotEvent::Lost(reason));
        }
    }

    /// Tells that every slot is taken, and by whom: to the log, then to
    /// the supervisor.
    pub fn waiting(&self, prefix: &str, picture: Progress) {
        report::event(
            "waiting",
            &[
                ("prefix", &prefix),
                (
                    "held",
                    &format!("{}/{}", picture.holders.len(), picture.limit),
                ),
                ("ahead", &picture.ahead),
            ],
        );
        self.notify(SlotEvent::Waiting(picture));
    }

    /// [`Gate::waiting`], unless `picture` is the one `told` last.
    pub fn waiting_if_changed(&self, prefix: &str, picture: Progress, told: &mut Option<Progress>) {
        if told.as_ref() != Some(&picture) {
            *told = Some(picture.clone());
            self.waiting(prefix, picture);
        }
    }
}

/// A holder's failed attempts in a row to reach the store (a renewal, a
/// watch), against its lease and `--monitor-retry`.
pub struct Failures {
    in_a_row: u32,
    bearable: Option<u32>,
}

impl Failures {
    pub fn new(monitor_retry: Option<u32>) -> Failures {
        Failures {
            in_a_row: 0,
            bearable: monitor_retry,
        }
    }

    /// The store answered.
    pub fn reset(&mut self) {
        self.in_a_row = 0;
    }

    /// One more failure, for a lease that ends at `lease_end`: what to do.
    pub fn failed(&mut self, lease_end: Instant) -> AfterFailure {
        self.in_a_row += 1;
        lease::after_failure(self.in_a_row, self.bearable, lease_end, Instant::now())
    }

    /// One more failure of `error`: pauses before the next attempt and
    /// returns `Ok`, or returns why the slot is lost (`{doing}{error}` and
    /// what gave up), or `Err(None)` once release began.
    pub fn retry<S>(
        &mut self,
        gate: &Gate<S>,
        lease_end: Instant,
        doing: &str,
        error: &dyn std::fmt::Display,
    ) -> Result<(), Option<String>> {
        match self.failed(lease_end) {
            AfterFailure::RetryIn(pause) => {
                report::event(
                    "watch-retry",
                    &[("failures", &self.in_a_row), ("error", error)],
                );
                if gate.pause(pause) {
                    return Err(None);
                }
                Ok(())
            }
            gave_up => Err(Some(format!("{doing}{error} ({gave_up})"))),
        }
    }
}
