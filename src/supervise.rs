//! Runs the child while the slot is held, whatever the backend. One event
//! loop on the main thread takes what the backend, the signal handler and the
//! child's waiter report, in the order it happens.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt as _;
use std::process::ExitStatus;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use signal_hook::consts::signal::{
    SIGALRM, SIGCONT, SIGHUP, SIGINT, SIGKILL, SIGPROF, SIGQUIT, SIGSTOP, SIGTERM, SIGTSTP,
    SIGTTIN, SIGTTOU, SIGUSR1, SIGUSR2, SIGVTALRM, SIGWINCH, SIGXCPU, SIGXFSZ,
};
use signal_hook::iterator::Signals;

use crate::progress::ProgressLine;
use crate::store::{Contend, Notify, Released, SlotBackend, SlotEvent, StoreError};
use crate::watchdog::Watchdog;
use crate::{report, sys};

/// Signals that end a wait, and are passed on to the child once it runs:
/// every signal whose default is to end a process, but SIGPIPE (Rust's
/// runtime ignores it before consem starts) and SIGUSR1/SIGUSR2.
const SHUTDOWN_SIGNALS: [i32; 9] = [
    SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGALRM, SIGXCPU, SIGXFSZ, SIGVTALRM, SIGPROF,
];

/// Signals consem handles. SIGUSR1/2 are passed on to the child (and ignored
/// while waiting); SIGTSTP stops the child with consem (job control);
/// SIGWINCH redraws the waiting line, and reaches a child that does not own
/// the terminal.
const HANDLED_SIGNALS: [i32; 13] = [
    SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGALRM, SIGXCPU, SIGXFSZ, SIGVTALRM, SIGPROF, SIGUSR1,
    SIGUSR2, SIGTSTP, SIGWINCH,
];

/// Time for leaving the semaphore after an interrupted wait: the user asked
/// to stop, so consem exits within about a second even if Consul stalls (the
/// session then expires by itself).
const RELEASE_BUDGET_WAITING: Duration = Duration::from_secs(1);

/// Time for leaving the semaphore after the child ends.
const RELEASE_BUDGET_DONE: Duration = Duration::from_secs(10);

/// How often to look whether the child stopped: the kernel may drop a stop
/// report (a stop and a continue racing), and a stopped command whose stop
/// goes unseen would keep its slot forever.
const STOP_POLL: Duration = Duration::from_millis(250);

/// How often the waiting line's clock moves.
const PROGRESS_TICK: Duration = Duration::from_secs(1);

/// How long the first attempt may take to answer, counted from the start,
/// even past a shorter `--timeout`: a timeout bounds the wait for a slot,
/// it does not forbid taking a free one.
const FIRST_ATTEMPT_BUDGET: Duration = Duration::from_secs(2);

/// How long to wait for a SIGKILLed child to be reaped.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// How often to look whether the command's process group is empty, once
/// the command itself has exited.
const GROUP_POLL: Duration = Duration::from_millis(20);

/// What to run and how to wait for the slot.
#[derive(Debug, Clone)]
pub struct Plan {
    pub command: Vec<OsString>,
    pub mode: Contend,
    pub timeout: Option<Duration>,
    pub kill_grace: Duration,
    /// Keep the slot until every process in the command's group has exited,
    /// rather than stopping them when the command exits.
    pub wait_group: bool,
    /// Draw a status line while waiting (stderr is a terminal), naming this.
    pub progress_line: Option<String>,
}

/// How a run ended; `main` maps each to an exit code.
#[derive(Debug)]
pub enum Outcome {
    /// The child ran and ended by itself (or by a signal passed on to it).
    ChildExited(ExitStatus),
    /// No slot within the timeout, or none free for `--try`.
    NoSlot,
    /// A signal ended the wait.
    Interrupted(i32),
    /// The slot was lost while the child ran; the child was stopped.
    SlotLost,
    Failed(StoreError),
    /// The command could not be started.
    SpawnFailed(std::io::Error),
}

enum Event {
    Slot(SlotEvent),
    Signal(i32),
    /// The child stopped, by this signal.
    ChildStopped(i32),
    ChildExited(ExitStatus),
    /// The watchdog ended (killed by hand, or done).
    WatchdogEnded,
}

/// Acquires a slot, runs the command while it is held, and leaves the
/// semaphore on every way out.
pub fn run(backend: Arc<dyn SlotBackend>, plan: &Plan) -> Outcome {
    let (events, inbox) = mpsc::channel();
    // Handlers go in before the first request, so that no signal is missed.
    sys::set_signal_dispositions();
    // What the parent left ignored stays ignored, for consem and the
    // command (`nohup`, a shell's background jobs, `trap ''`).
    let ignored = sys::ignored_at_start(&HANDLED_SIGNALS);
    let handled = HANDLED_SIGNALS.iter().filter(|s| !ignored.contains(s));
    let signals = Signals::new(handled).expect("cannot install signal handlers");
    let started = Instant::now();
    let notify: Notify = {
        let events = events.clone();
        Arc::new(move |event| {
            let _ = events.send(Event::Slot(event));
        })
    };
    Arc::clone(&backend).contend(plan.mode, notify);
    // The handlers keep what arrives until this thread reads it: starting it
    // after the backend's lets the first request go out sooner.
    forward_signals(signals, events.clone());
    // Started now, while the store works, so that a handoff does not wait
    // for it.
    let watchdog = match start_watchdog(&*backend, plan, &events) {
        Ok(watchdog) => watchdog,
        Err(error) => {
            leave(&*backend, RELEASE_BUDGET_WAITING);
            return Outcome::Failed(StoreError::Unavailable(format!(
                "cannot start the watchdog that stops the command if consem cannot: {error}"
            )));
        }
    };

    // A deadline too far to represent is no deadline.
    let deadline = plan.timeout.and_then(|t| started.checked_add(t));
    let mut line = plan.progress_line.as_deref().map(ProgressLine::new);
    let waited = wait_for_slot(&inbox, deadline, line.as_mut());
    if let Some(line) = &mut line {
        line.erase();
    }
    let mut lease = Lease {
        until: None,
        grace: plan.kill_grace,
    };
    let granted = waited.and_then(|until| {
        lease.until = until;
        confirm_lease(&inbox, &mut lease)
    });
    if let Err(outcome) = granted {
        watchdog.finish();
        leave(&*backend, RELEASE_BUDGET_WAITING);
        return outcome;
    }
    let (outcome, watchdog) = run_child(&*backend, plan, watchdog, lease, events, &inbox);
    // The group is gone: the next holder need not wait for the watchdog.
    let taken_before = leave(&*backend, RELEASE_BUDGET_DONE);
    watchdog.finish();
    match (outcome, taken_before) {
        // The loss and the command's end crossed: the command may have run
        // on without the slot.
        (Outcome::ChildExited(status), Some(reason)) => {
            report::error(&format!(
                "slot lost while the command ran: {reason}; its exit ({status}) is not reported as its own"
            ));
            Outcome::SlotLost
        }
        (outcome, _) => outcome,
    }
}

/// Forks the watchdog: it stops the command's group at the lease's end, or
/// when consem dies (at once where the slot is free the moment consem
/// dies, else within the kill grace).
fn start_watchdog(
    backend: &dyn SlotBackend,
    plan: &Plan,
    events: &Sender<Event>,
) -> std::io::Result<Watchdog> {
    Watchdog::start(
        plan.kill_grace,
        orphan_grace(backend, plan),
        tell_watchdog_ended(events),
    )
}

/// What a watchdog calls once it has ended: the event loop replaces one
/// that ended while the group lives.
fn tell_watchdog_ended(events: &Sender<Event>) -> impl FnOnce() + Send + 'static {
    let events = events.clone();
    move || {
        let _ = events.send(Event::WatchdogEnded);
    }
}

/// What the watchdog allows the command once consem is gone.
fn orphan_grace(backend: &dyn SlotBackend, plan: &Plan) -> Duration {
    if backend.frees_slot_at_death() {
        Duration::ZERO
    } else {
        plan.kill_grace
    }
}

fn forward_signals(mut signals: Signals, events: Sender<Event>) {
    thread::Builder::new()
        .name("consem-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                if events.send(Event::Signal(signal)).is_err() {
                    break;
                }
            }
        })
        .expect("cannot start the signal thread");
}

/// Waits for the backend to hold a slot, and returns the slot's lease (see
/// [`SlotEvent::Acquired`]). Any other end is the outcome.
fn wait_for_slot(
    inbox: &Receiver<Event>,
    deadline: Option<Instant>,
    mut line: Option<&mut ProgressLine>,
) -> Result<Option<Instant>, Outcome> {
    let started = Instant::now();
    let mut answered = false;
    loop {
        // A line that is up is redrawn every second, for its clock.
        let tick = line.as_ref().filter(|l| l.shown()).map(|_| PROGRESS_TICK);
        let left = wait_deadline(deadline, started, answered)
            .map(|d| d.saturating_duration_since(Instant::now()));
        if left.is_some_and(|left| left.is_zero()) {
            report::event("timed-out", &[]);
            return Err(Outcome::NoSlot);
        }
        let event = match (left, tick) {
            (None, None) => inbox.recv().map_err(|_| RecvTimeoutError::Disconnected),
            (Some(t), None) | (None, Some(t)) => inbox.recv_timeout(t),
            (Some(a), Some(b)) => inbox.recv_timeout(a.min(b)),
        };
        match event {
            Ok(Event::Slot(SlotEvent::Acquired { lease, .. })) => return Ok(lease),
            Ok(Event::Slot(SlotEvent::Leased { .. })) => {}
            Ok(Event::Slot(SlotEvent::NoSlot)) => return Err(Outcome::NoSlot),
            Ok(Event::Slot(SlotEvent::Failed(error))) => return Err(Outcome::Failed(error)),
            Ok(Event::Slot(SlotEvent::Lost(reason))) => {
                return Err(Outcome::Failed(StoreError::Unavailable(reason)))
            }
            Ok(Event::Signal(signal)) if SHUTDOWN_SIGNALS.contains(&signal) => {
                report::event("interrupted", &[("signal", &signal)]);
                return Err(Outcome::Interrupted(signal));
            }
            Ok(Event::Signal(SIGTSTP)) => {
                // The line (and the ^Z the terminal echoed) go with the job.
                if let Some(line) = line.as_mut() {
                    line.erase();
                }
                sys::stop_self();
                if let Some(line) = line.as_mut() {
                    line.redraw(started.elapsed());
                }
            }
            Ok(Event::Signal(SIGWINCH)) => {
                if let Some(line) = line.as_mut() {
                    line.redraw(started.elapsed());
                }
            }
            Ok(Event::Signal(signal)) => report::event("signal-ignored", &[("signal", &signal)]),
            Ok(Event::Slot(SlotEvent::Waiting(progress))) => {
                answered = true;
                if let Some(line) = line.as_mut() {
                    line.update(progress, started.elapsed());
                }
            }
            // A watchdog that ended while consem waits is replaced once
            // the command runs.
            Ok(Event::ChildStopped(..) | Event::ChildExited(_) | Event::WatchdogEnded) => {}
            // The deadline passed (the loop's top decides), or the clock ticks.
            Err(RecvTimeoutError::Timeout) => {
                if let Some(line) = line.as_mut() {
                    line.redraw(started.elapsed());
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                unreachable!("the event loop holds a sender")
            }
        }
    }
}

/// When the wait for a slot ends: at `--timeout`, but not before the
/// store's first answer (that every slot is taken) or the first attempt's
/// budget, so that a short timeout still takes a free slot.
fn wait_deadline(timeout: Option<Instant>, started: Instant, answered: bool) -> Option<Instant> {
    match timeout {
        Some(at) if !answered => Some(at.max(started + FIRST_ATTEMPT_BUDGET)),
        other => other,
    }
}

/// The slot's lease, as the store last confirmed it: `None` while the slot
/// lasts as long as consem lives.
struct Lease {
    until: Option<Instant>,
    grace: Duration,
}

impl Lease {
    /// The moment the command must be told to stop (SIGTERM), so that it
    /// is gone (SIGKILL) when the lease ends.
    fn stop_at(&self) -> Option<Instant> {
        self.until
            .map(|until| until.checked_sub(self.grace).unwrap_or(until))
    }

    fn running_out(&self) -> bool {
        self.stop_at().is_some_and(|at| Instant::now() >= at)
    }

    fn ended(&self) -> bool {
        self.until.is_some_and(|until| Instant::now() >= until)
    }

    /// Takes a newer lease, unless the current one already reached its stop
    /// point: the watchdog, which had that deadline, may have stopped the
    /// command, so a renewal confirmed after that does not give the slot
    /// back; `Err` says why the slot counts as lost.
    fn renewed(&mut self, until: Instant, watchdog: &mut Watchdog) -> Result<(), String> {
        if self.running_out() {
            return Err(self.why());
        }
        self.until = Some(until);
        watchdog.set_deadline(self.until);
        Ok(())
    }

    /// Why the slot can no longer be counted on.
    fn why(&self) -> String {
        let left = self
            .until
            .map(|until| until.saturating_duration_since(Instant::now()))
            .unwrap_or_default();
        if left.is_zero() {
            "its lease ran out before a renewal was confirmed (was consem stopped or starved?)"
                .to_string()
        } else {
            format!(
                "no renewal of its lease was confirmed in time (it ends in {}; -v shows the renewals' errors)",
                crate::duration::measured(left)
            )
        }
    }
}

/// A grant whose lease has reached its stop point (the answer that granted
/// it came late: a store that stalled, a slow network) may already have
/// been given to another contender; the command starts only once a
/// renewal confirms the slot with room for the kill grace. A slot found
/// gone meanwhile ends the run as a loss (76), the command never started:
/// its place in the queue is gone too, and a scheduler that retries on 76
/// retries it.
fn confirm_lease(inbox: &Receiver<Event>, lease: &mut Lease) -> Result<(), Outcome> {
    if !lease.running_out() {
        return Ok(());
    }
    let past_stop = lease
        .stop_at()
        .map(|at| Instant::now().saturating_duration_since(at))
        .unwrap_or_default();
    report::event(
        "grant-late",
        &[("past_stop", &crate::duration::measured(past_stop))],
    );
    loop {
        // The store renews at once, or reports the slot gone; it bounds
        // the wait with its own calls' budgets.
        match inbox.recv() {
            Ok(Event::Slot(SlotEvent::Leased { until })) => {
                lease.until = Some(until);
                if !lease.running_out() {
                    report::event("lease-confirmed", &[]);
                    return Ok(());
                }
            }
            Ok(Event::Slot(SlotEvent::Lost(reason))) => {
                report::error(&format!(
                    "slot lost before the command started: the grant arrived after its lease had run out, and {reason}; the command did not run"
                ));
                return Err(Outcome::SlotLost);
            }
            Ok(Event::Slot(SlotEvent::Failed(error))) => return Err(Outcome::Failed(error)),
            Ok(Event::Signal(signal)) if SHUTDOWN_SIGNALS.contains(&signal) => {
                report::event("interrupted", &[("signal", &signal)]);
                return Err(Outcome::Interrupted(signal));
            }
            Ok(Event::Signal(SIGTSTP)) => sys::stop_self(),
            Ok(_) => {}
            Err(_) => unreachable!("the event loop holds a sender"),
        }
    }
}

fn run_child(
    backend: &dyn SlotBackend,
    plan: &Plan,
    mut watchdog: Watchdog,
    mut lease: Lease,
    events: Sender<Event>,
    inbox: &Receiver<Event>,
) -> (Outcome, Watchdog) {
    // The watchdog holds the lease from the command's first instant.
    watchdog.set_deadline(lease.until);
    // The command gets the terminal the way a shell would give it: at once
    // when consem is a job of its own; when consem shares its group (a
    // pipeline, a script run without job control), only once the command
    // stops to read from the terminal or set it up (SIGTTIN, SIGTTOU), so
    // that a pager beside consem keeps it and Ctrl-C reaches the shell too.
    let mut take_terminal = sys::we_own_the_terminal() && sys::alone_in_group();
    let terminal = sys::terminal().filter(|_| take_terminal);
    let spawned = sys::spawn_child(&plan.command, &backend.child_env(), terminal);
    backend.command_started();
    let group = match spawned {
        Ok(pid) => pid,
        Err(error) => {
            // The child may have taken the terminal before exec failed.
            if take_terminal {
                sys::take_terminal_back();
            }
            return (Outcome::SpawnFailed(error), watchdog);
        }
    };
    watchdog.guard(group);
    if take_terminal {
        // The child does the same before exec; doing it here too closes the
        // race where it reads the terminal before it is the foreground.
        sys::give_terminal_to(group);
    }
    report::event("started", &[("pid", &group)]);
    watch_child(group, events.clone());
    let mut lost: Option<String> = None;
    let status = loop {
        let tick = match lease.stop_at() {
            Some(at) => STOP_POLL.min(at.saturating_duration_since(Instant::now())),
            None => STOP_POLL,
        };
        // A watchdog ends by itself once the group is gone (the command
        // exited and its exit is on its way here): only one gone while the
        // group lives was killed.
        if !watchdog.alive() && sys::group_exists(group) {
            // Killed (by hand, the OOM killer): without it, a frozen or
            // killed consem would leave the command running past the lease.
            match Watchdog::start_guarding(
                plan.kill_grace,
                orphan_grace(backend, plan),
                group,
                lease.until,
                tell_watchdog_ended(&events),
            ) {
                Ok(fresh) => {
                    report::warning("the watchdog that guards the lease was gone; started another");
                    watchdog = fresh;
                }
                Err(error) => {
                    lost = Some(format!(
                        "the watchdog that guards the lease is gone and cannot be started again ({error})"
                    ));
                    break None;
                }
            }
        }
        let event = match inbox.recv_timeout(tick) {
            Err(RecvTimeoutError::Timeout) if lease.running_out() => {
                Ok(Event::Slot(SlotEvent::Lost(lease.why())))
            }
            Err(RecvTimeoutError::Timeout) if sys::is_stopped(group) => {
                Ok(Event::ChildStopped(SIGSTOP))
            }
            Err(RecvTimeoutError::Timeout) => continue,
            other => other,
        };
        match event {
            Ok(Event::ChildExited(status)) => {
                report::event("exited", &[("status", &status)]);
                break Some(status);
            }
            Ok(Event::Slot(SlotEvent::Leased { until })) => {
                if let Err(why) = lease.renewed(until, &mut watchdog) {
                    lost = Some(why);
                    break None;
                }
            }
            // A stop report can come late, after consem continued the child
            // (or not at all, the kernel may drop it): only a child that is
            // stopped now is news.
            Ok(Event::ChildStopped(_)) if !sys::is_stopped(group) => {}
            Ok(Event::ChildStopped(SIGTTIN | SIGTTOU))
                if !take_terminal && sys::we_own_the_terminal() =>
            {
                report::event("terminal-to-command", &[("pid", &group)]);
                take_terminal = true;
                sys::give_terminal_to(group);
                sys::signal_group(group, SIGCONT);
            }
            Ok(Event::ChildStopped(signal)) => {
                // The command stopped (Ctrl-Z on its terminal, a read from a
                // terminal it does not own): stop with it so that the shell
                // sees the job stop, and carry on together when continued,
                // if the slot is still ours.
                report::event("stopped", &[("pid", &group), ("signal", &signal)]);
                if take_terminal {
                    sys::take_terminal_back();
                }
                sys::stop_self();
                if lease.running_out() {
                    lost = Some(lease.why());
                    break None;
                }
                take_terminal = sys::we_own_the_terminal();
                if take_terminal {
                    sys::give_terminal_to(group);
                }
                report::event("continued", &[("pid", &group)]);
                sys::signal_group(group, SIGCONT);
            }
            Ok(Event::Signal(SIGTSTP)) => {
                // Ctrl-Z reached consem, not the command: stop the command
                // first (SIGSTOP, which it cannot ignore), so that it never
                // runs on while consem, and its session renewal, are stopped;
                // continue it only if the slot is still ours.
                report::event("stopped", &[("pid", &group), ("signal", &SIGTSTP)]);
                sys::signal_group(group, SIGSTOP);
                sys::stop_self();
                if lease.running_out() {
                    lost = Some(lease.why());
                    break None;
                }
                report::event("continued", &[("pid", &group)]);
                sys::signal_group(group, SIGCONT);
            }
            // A child that owns the terminal has it from the terminal.
            Ok(Event::Signal(SIGWINCH)) if take_terminal => {}
            Ok(Event::Signal(signal)) => {
                report::event("forwarded", &[("signal", &signal), ("pid", &group)]);
                sys::signal_group(group, signal);
            }
            Ok(Event::Slot(SlotEvent::Lost(reason))) => {
                lost = Some(reason);
                break None;
            }
            Ok(Event::Slot(SlotEvent::Failed(error))) => {
                lost = Some(error.to_string());
                break None;
            }
            Ok(Event::Slot(_)) => {}
            // The loop's top replaces it if the group lives.
            Ok(Event::WatchdogEnded) => {}
            Err(RecvTimeoutError::Disconnected) => unreachable!("the event loop holds a sender"),
            Err(RecvTimeoutError::Timeout) => unreachable!("handled above"),
        }
    };
    if take_terminal {
        sys::take_terminal_back();
    }
    let outcome = match (status, lost) {
        (_, Some(reason)) => {
            report::error(&format!("slot lost: {reason}; stopping the command"));
            if lease.ended() {
                // Past its lease the command may not run a moment more (a
                // stopped one is killed as it is, never continued).
                sys::signal_group(group, SIGKILL);
            }
            stop_child(group, plan.kill_grace, inbox);
            Outcome::SlotLost
        }
        (Some(status), None) => end_group(group, plan, &mut lease, &mut watchdog, inbox, status),
        (None, None) => unreachable!("the loop ends with a status or a loss"),
    };
    (outcome, watchdog)
}

/// The command exited by itself. The slot covers its whole process group:
/// what it left running in the group is stopped (or, with `--wait-group`,
/// waited for) before the slot is released; and a slot that turned out to
/// be lost meanwhile is no success, whatever the command's status.
fn end_group(
    group: u32,
    plan: &Plan,
    lease: &mut Lease,
    watchdog: &mut Watchdog,
    inbox: &Receiver<Event>,
    status: ExitStatus,
) -> Outcome {
    let mut lost = None;
    if sys::group_exists(group) {
        if plan.wait_group {
            report::event("waiting-for-group", &[("pid", &group)]);
            lost = wait_for_group(group, lease, watchdog, inbox);
        } else {
            report::event("stopping-group", &[("pid", &group), ("signal", &SIGTERM)]);
        }
        // Renewals go on while the leftovers have their grace; taken only
        // afterwards, one confirmed in time would find the lease it
        // replaces past its stop point.
        stop_group(group, plan.kill_grace, |within| {
            if let Ok(event) = inbox.recv_timeout(within) {
                note_slot_event(event, lease, watchdog, &mut lost);
            }
        });
    }
    // What arrived while the command was ending: a loss means the command
    // may have run without the slot.
    while let Ok(event) = inbox.try_recv() {
        note_slot_event(event, lease, watchdog, &mut lost);
    }
    // Past the lease's stop point the watchdog may have stopped the
    // command: its status is not its own.
    if lost.is_none() && lease.running_out() {
        lost = Some(lease.why());
    }
    match lost {
        Some(reason) => {
            report::error(&format!(
                "slot lost while the command ran: {reason}; its exit ({status}) is not reported as its own"
            ));
            Outcome::SlotLost
        }
        None => Outcome::ChildExited(status),
    }
}

/// Takes what the store said while the command's group was ending; the
/// first reason the slot was lost is kept.
fn note_slot_event(
    event: Event,
    lease: &mut Lease,
    watchdog: &mut Watchdog,
    lost: &mut Option<String>,
) {
    let why = match event {
        Event::Slot(SlotEvent::Lost(reason)) => Some(reason),
        Event::Slot(SlotEvent::Failed(error)) => Some(error.to_string()),
        Event::Slot(SlotEvent::Leased { until }) => lease.renewed(until, watchdog).err(),
        _ => None,
    };
    if lost.is_none() {
        *lost = why;
    }
}

/// `--wait-group`: keeps the slot, and watches it, until the group is
/// empty. Returns why the slot was lost, if it was.
fn wait_for_group(
    group: u32,
    lease: &mut Lease,
    watchdog: &mut Watchdog,
    inbox: &Receiver<Event>,
) -> Option<String> {
    while sys::group_exists(group) {
        if lease.running_out() {
            return Some(lease.why());
        }
        match inbox.recv_timeout(GROUP_POLL) {
            Ok(Event::Slot(SlotEvent::Lost(reason))) => return Some(reason),
            Ok(Event::Slot(SlotEvent::Failed(error))) => return Some(error.to_string()),
            Ok(Event::Slot(SlotEvent::Leased { until })) => {
                if let Err(why) = lease.renewed(until, watchdog) {
                    return Some(why);
                }
            }
            Ok(Event::Signal(signal)) if signal != SIGTSTP => {
                sys::signal_group(group, signal);
            }
            _ => {}
        }
    }
    None
}

/// Stops what is left of a group whose leader has exited: SIGTERM, then
/// SIGKILL after the grace period. `pause` waits up to the given time
/// between looks (and takes what arrives meanwhile).
fn stop_group(group: u32, grace: Duration, mut pause: impl FnMut(Duration)) {
    let mut gone_within = |within: Duration| {
        let until = Instant::now() + within;
        while sys::group_exists(group) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            pause(GROUP_POLL.min(left));
        }
        true
    };
    if !sys::group_exists(group) {
        return;
    }
    sys::signal_group(group, SIGTERM);
    sys::signal_group(group, SIGCONT);
    if !gone_within(grace) {
        report::event("stopping-group", &[("pid", &group), ("signal", &SIGKILL)]);
        sys::signal_group(group, SIGKILL);
        if !gone_within(KILL_WAIT) {
            report::warning(&format!(
                "processes of the command's group {group} are still there after SIGKILL (zombies that nobody reaps?)"
            ));
        }
    }
}

/// Reports the child's stops and its end. std's `wait` reports only the end;
/// a stop must be seen too, or a stopped command would keep its slot forever.
fn watch_child(pid: u32, events: Sender<Event>) {
    thread::Builder::new()
        .name("consem-child".into())
        .spawn(move || loop {
            let event = match sys::wait_child(pid) {
                Ok(sys::ChildChange::Stopped(signal)) => Event::ChildStopped(signal),
                Ok(sys::ChildChange::Ended(status)) => Event::ChildExited(status),
                Err(error) => {
                    // Only if something else reaped our child; its status is
                    // unknown.
                    report::error(&format!("lost track of the command: {error}"));
                    Event::ChildExited(ExitStatus::from_raw(1 << 8))
                }
            };
            let ended = matches!(event, Event::ChildExited(_));
            if events.send(event).is_err() || ended {
                break;
            }
        })
        .expect("cannot start the child waiter thread");
}

/// Stops the child's whole process group: SIGTERM, then SIGKILL after the
/// grace period. Whatever the child left behind in its group is killed too,
/// since the slot it ran under is gone.
fn stop_child(group: u32, grace: Duration, inbox: &Receiver<Event>) {
    sys::signal_group(group, SIGTERM);
    // A stopped command could not act on SIGTERM.
    sys::signal_group(group, SIGCONT);
    report::event("stopping", &[("pid", &group), ("signal", &SIGTERM)]);
    if !wait_for_exit(inbox, grace) {
        report::event("stopping", &[("pid", &group), ("signal", &SIGKILL)]);
        sys::signal_group(group, SIGKILL);
        wait_for_exit(inbox, KILL_WAIT);
    }
    sys::signal_group(group, SIGKILL);
}

fn wait_for_exit(inbox: &Receiver<Event>, within: Duration) -> bool {
    let start = Instant::now();
    loop {
        let left = within.saturating_sub(start.elapsed());
        match inbox.recv_timeout(left) {
            Ok(Event::ChildExited(_)) => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
}

/// Releases the slot; why it was gone before, if the store says so.
fn leave(backend: &dyn SlotBackend, budget: Duration) -> Option<String> {
    match backend.release(budget) {
        Ok(Released::Left) => None,
        Ok(Released::TakenBefore(reason)) => Some(reason),
        Err(problems) => {
            report::warning(&format!("could not clean up completely: {problems}"));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_timeout_still_waits_for_the_first_answer() {
        let started = Instant::now();
        let short = Some(started + Duration::from_millis(1));
        assert_eq!(
            wait_deadline(short, started, false),
            Some(started + FIRST_ATTEMPT_BUDGET)
        );
        // Once every slot is known to be taken, the timeout counts as given.
        assert_eq!(wait_deadline(short, started, true), short);
        // A timeout longer than the first attempt's budget is kept as it is.
        let long = Some(started + Duration::from_secs(60));
        assert_eq!(wait_deadline(long, started, false), long);
        assert_eq!(wait_deadline(None, started, false), None);
    }
}
