//! Runs the child while the slot is held, whatever the store. One event
//! loop on the main thread takes what the store, the signal handler and the
//! child's waiter report, in the order it happens.
//!
//! A run goes through the states of docs/design.md ("States of a run"),
//! one function each: waiting for a slot (`wait_for_slot`), confirming a
//! grant that came late (`confirm_lease`), running the command
//! (`Run::hold`), ending its group when it exits (`Run::end_group`) or
//! stopping it when the slot is lost (`Run::stop_after_loss`), and leaving
//! the semaphore (`leave`). What an event means in each state is decided
//! in `decide`, without I/O.

mod decide;
mod no_slot;
#[cfg(test)]
mod tests;

pub use no_slot::NoSlot;

use std::ffi::OsString;
use std::io;
use std::os::unix::process::ExitStatusExt as _;
use std::process::ExitStatus;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use signal_hook::consts::signal::{
    SIGALRM, SIGCONT, SIGHUP, SIGINT, SIGKILL, SIGPROF, SIGQUIT, SIGSTOP, SIGTERM, SIGTSTP,
    SIGUSR1, SIGUSR2, SIGVTALRM, SIGWINCH, SIGXCPU, SIGXFSZ,
};
use signal_hook::iterator::Signals;

use crate::progress::ProgressLine;
use crate::store::{Contend, Notify, Progress, Released, SlotBackend, SlotEvent, StoreError};
use crate::watchdog::Watchdog;
use crate::{report, sys};
use decide::{Confirming, Ending, Grant, Lease, OnChildStop, Running, Waiting};

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
    /// The semaphore's prefix and limit, for the command's `CONSEM_PREFIX`
    /// and `CONSEM_LIMIT`.
    pub prefix: String,
    pub limit: u32,
    pub mode: Contend,
    pub timeout: Option<Duration>,
    pub kill_grace: Duration,
    /// Keep the slot until every process in the command's group has exited,
    /// rather than stopping them when the command exits.
    pub wait_group: bool,
    /// Draw a status line while waiting (stderr is a terminal), naming this.
    pub progress_line: Option<String>,
}

/// How a run ended; `crate::exit` maps each to an exit code.
#[derive(Debug)]
pub enum Outcome {
    /// The child ran and ended by itself (or by a signal passed on to it).
    ChildExited(ExitStatus),
    /// No slot within the timeout, or none free for `--try`.
    NoSlot(NoSlot),
    /// A signal ended the wait.
    Interrupted(i32),
    /// The slot was lost while the child ran (the child was stopped), or
    /// a grant that came late was found gone (the child never started).
    SlotLost,
}

/// Why a run could not go on; `crate::exit` maps each to an exit code.
#[derive(Debug)]
pub enum SuperviseError {
    /// The store cannot go on, before the command started.
    Store(StoreError),
    /// The command could not be started.
    Spawn { program: String, error: io::Error },
    /// The command is a script whose `#!` line names an interpreter that
    /// cannot run.
    Interpreter {
        program: String,
        interpreter: String,
        error: io::Error,
    },
    /// The watchdog, which stops the command when consem cannot, could not
    /// be started: the command does not run unguarded.
    Watchdog(io::Error),
}

impl std::fmt::Display for SuperviseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SuperviseError::Store(error) => error.fmt(f),
            SuperviseError::Spawn { program, error } => {
                let hint = if error.kind() == io::ErrorKind::NotFound {
                    "check its name and PATH"
                } else {
                    "check that it is an executable file"
                };
                write!(f, "cannot run '{program}': {error}; {hint}")
            }
            SuperviseError::Interpreter {
                program,
                interpreter,
                error,
            } => write!(
                f,
                "cannot run '{program}': the interpreter its #! line names, {interpreter}, cannot run: {error}; check that line"
            ),
            SuperviseError::Watchdog(error) => write!(
                f,
                "cannot start the watchdog that stops the command if consem cannot: {error}"
            ),
        }
    }
}

impl std::error::Error for SuperviseError {}

/// How a run ends: as an outcome, or with an error.
pub type Ended = Result<Outcome, SuperviseError>;

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
pub fn run(backend: Arc<dyn SlotBackend>, plan: &Plan) -> Ended {
    let (events, inbox) = mpsc::channel();
    // Handlers go in before the first request, so that no signal is missed.
    sys::set_signal_dispositions();
    // What the parent left ignored stays ignored, for consem and the
    // command (`nohup`, a shell's background jobs, `trap ''`).
    let ignored = sys::ignored_at_start(&HANDLED_SIGNALS);
    let handled = HANDLED_SIGNALS.iter().filter(|s| !ignored.contains(s));
    let signals = Signals::new(handled).expect("cannot install signal handlers");
    // A command that cannot run is refused before a slot is asked for.
    if let Err(not_runnable) =
        sys::find_program(&plan.command[0], std::env::var_os("PATH").as_deref())
    {
        let program = plan.command[0].to_string_lossy().into_owned();
        return Err(match not_runnable {
            sys::NotRunnable::Program(error) => SuperviseError::Spawn { program, error },
            sys::NotRunnable::Interpreter { interpreter, error } => SuperviseError::Interpreter {
                program,
                interpreter,
                error,
            },
        });
    }
    let started = Instant::now();
    contend(&backend, plan, &events);
    // The handlers keep what arrives until this thread reads it: starting it
    // after the store's lets the first request go out sooner.
    forward_signals(signals, events.clone());
    supervise(&*backend, plan, started, events, &inbox)
}

/// Has the store contend for a slot on its threads, reporting to `events`.
fn contend(backend: &Arc<dyn SlotBackend>, plan: &Plan, events: &Sender<Event>) {
    let notify: Notify = {
        let events = events.clone();
        Arc::new(move |event| {
            let _ = events.send(Event::Slot(event));
        })
    };
    Arc::clone(backend).contend(plan.mode, notify);
}

/// The run once the store contends (from `started`): every state, and
/// leaving the semaphore on every way out.
fn supervise(
    backend: &dyn SlotBackend,
    plan: &Plan,
    started: Instant,
    events: Sender<Event>,
    inbox: &Receiver<Event>,
) -> Ended {
    // Started now, while the store works, so that a handoff does not wait
    // for it.
    let watchdog = match start_watchdog(backend, plan, &events) {
        Ok(watchdog) => watchdog,
        Err(error) => {
            leave(backend, RELEASE_BUDGET_WAITING);
            return Err(SuperviseError::Watchdog(error));
        }
    };
    let granted = wait_and_confirm(plan, started, inbox);
    let (grant, lease) = match granted {
        Ok(granted) => granted,
        Err(ended) => {
            watchdog.finish();
            leave(backend, RELEASE_BUDGET_WAITING);
            return ended;
        }
    };
    let (ended, watchdog) = run_child(backend, plan, watchdog, grant, lease, events, inbox);
    // The group is gone: the next holder need not wait for the watchdog.
    let taken_before = leave(backend, RELEASE_BUDGET_DONE);
    watchdog.finish();
    match (ended, taken_before) {
        // The loss and the command's end crossed: the command may have run
        // on without the slot.
        (Ok(Outcome::ChildExited(status)), Some(reason)) => Ok(lost_after_exit(&reason, status)),
        (ended, _) => ended,
    }
}

/// Waits for a slot, then for a renewal if its grant came late: the slot
/// and its lease, once the command may start.
fn wait_and_confirm(
    plan: &Plan,
    started: Instant,
    inbox: &Receiver<Event>,
) -> Result<(Grant, Lease), Ended> {
    // A deadline too far to represent is no deadline.
    let deadline = plan.timeout.and_then(|t| started.checked_add(t));
    let mut line = plan.progress_line.as_deref().map(ProgressLine::new);
    let waited = wait_for_slot(inbox, plan.timeout, deadline, line.as_mut());
    if let Some(line) = &mut line {
        line.erase();
    }
    let grant = waited?;
    let mut lease = Lease {
        until: grant.lease,
        grace: plan.kill_grace,
    };
    confirm_lease(inbox, &mut lease)?;
    Ok((grant, lease))
}

/// Forks the watchdog: it stops the command's group at the lease's end, or
/// when consem dies (at once where the slot is free the moment consem
/// dies, else within the kill grace).
fn start_watchdog(
    backend: &dyn SlotBackend,
    plan: &Plan,
    events: &Sender<Event>,
) -> io::Result<Watchdog> {
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

/// Waits for the store to grant a slot, until `deadline` (of `timeout`).
/// Any other end is how the run ends.
fn wait_for_slot(
    inbox: &Receiver<Event>,
    timeout: Option<Duration>,
    deadline: Option<Instant>,
    mut line: Option<&mut ProgressLine>,
) -> Result<Grant, Ended> {
    let started = Instant::now();
    let mut answered = false;
    // Who holds the slots, for the line that says why a timeout ran out.
    let mut seen: Option<Progress> = None;
    loop {
        // A line that is up is redrawn every second, for its clock.
        let tick = line.as_ref().filter(|l| l.shown()).map(|_| PROGRESS_TICK);
        let left = decide::wait_deadline(deadline, started, answered)
            .map(|d| d.saturating_duration_since(Instant::now()));
        if left.is_some_and(|left| left.is_zero()) {
            report::event("timed-out", &[]);
            return Err(Ok(Outcome::NoSlot(NoSlot { timeout, seen })));
        }
        let Some(event) = receive_within(inbox, left, tick) else {
            // The deadline passed (the loop's top decides), or the clock ticks.
            if let Some(line) = line.as_mut() {
                line.redraw(started.elapsed());
            }
            continue;
        };
        match decide::waiting(event) {
            Waiting::Granted(grant) => return Ok(grant),
            Waiting::Interrupted(signal) => {
                report::event("interrupted", &[("signal", &signal)]);
                return Err(Ok(Outcome::Interrupted(signal)));
            }
            Waiting::Ended(ended) => return Err(ended),
            Waiting::Progress(progress) => {
                answered = true;
                seen = Some(progress.clone());
                if let Some(line) = line.as_mut() {
                    line.update(progress, started.elapsed());
                }
            }
            Waiting::StopSelf => {
                // The line (and the ^Z the terminal echoed) go with the job.
                if let Some(line) = line.as_mut() {
                    line.erase();
                }
                sys::stop_self();
                if let Some(line) = line.as_mut() {
                    line.redraw(started.elapsed());
                }
            }
            Waiting::Redraw => {
                if let Some(line) = line.as_mut() {
                    line.redraw(started.elapsed());
                }
            }
            Waiting::Ignored(signal) => report::event("signal-ignored", &[("signal", &signal)]),
            Waiting::Nothing => {}
        }
    }
}

/// The next event within the shorter of two waits (`None`: no limit);
/// `None` once that passed.
fn receive_within(
    inbox: &Receiver<Event>,
    left: Option<Duration>,
    tick: Option<Duration>,
) -> Option<Event> {
    let received = match (left, tick) {
        (None, None) => inbox.recv().map_err(|_| RecvTimeoutError::Disconnected),
        (Some(t), None) | (None, Some(t)) => inbox.recv_timeout(t),
        (Some(a), Some(b)) => inbox.recv_timeout(a.min(b)),
    };
    match received {
        Ok(event) => Some(event),
        Err(RecvTimeoutError::Timeout) => None,
        Err(RecvTimeoutError::Disconnected) => unreachable!("the event loop holds a sender"),
    }
}

/// A grant whose lease has reached its stop point (the answer that granted
/// it came late: a store that stalled, a slow network) may already have
/// been given to another contender; the command starts only once a
/// renewal confirms the slot with room for the kill grace. A slot found
/// gone meanwhile ends the run as a loss (76), the command never started:
/// its place in the queue is gone too, and a scheduler that retries on 76
/// retries it.
fn confirm_lease(inbox: &Receiver<Event>, lease: &mut Lease) -> Result<(), Ended> {
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
        let event = inbox.recv().expect("the event loop holds a sender");
        match decide::confirming(event) {
            Confirming::Renewed(until) => {
                lease.until = Some(until);
                if !lease.running_out() {
                    report::event("lease-confirmed", &[]);
                    return Ok(());
                }
            }
            Confirming::Lost(reason) => {
                report::error(&format!(
                    "slot lost before the command started: the grant arrived after its lease had run out, and {reason}; the command did not run"
                ));
                return Err(Ok(Outcome::SlotLost));
            }
            Confirming::Failed(error) => return Err(Err(SuperviseError::Store(error))),
            Confirming::Interrupted(signal) => {
                report::event("interrupted", &[("signal", &signal)]);
                return Err(Ok(Outcome::Interrupted(signal)));
            }
            Confirming::StopSelf => sys::stop_self(),
            Confirming::Nothing => {}
        }
    }
}

/// Starts the command and supervises it until its group is gone; returns
/// how the run ended, and the watchdog (replaced if it died).
fn run_child(
    backend: &dyn SlotBackend,
    plan: &Plan,
    mut watchdog: Watchdog,
    grant: Grant,
    lease: Lease,
    events: Sender<Event>,
    inbox: &Receiver<Event>,
) -> (Ended, Watchdog) {
    // The watchdog holds the lease from the command's first instant.
    watchdog.set_deadline(lease.until);
    // The command gets the terminal the way a shell would give it: at once
    // when consem is a job of its own; when consem shares its group (a
    // pipeline, a script run without job control), only once the command
    // stops to read from the terminal or set it up (SIGTTIN, SIGTTOU), so
    // that a pager beside consem keeps it and Ctrl-C reaches the shell too.
    let child_has_terminal = sys::we_own_the_terminal() && sys::alone_in_group();
    let terminal = sys::terminal().filter(|_| child_has_terminal);
    let env = child_env(plan, grant.fence, backend.own_child_env());
    let spawned = sys::spawn_child(&plan.command, &env, terminal);
    backend.command_started();
    let group = match spawned {
        Ok(pid) => pid,
        Err(error) => {
            // The child may have taken the terminal before exec failed.
            if child_has_terminal {
                sys::take_terminal_back();
            }
            let program = plan.command[0].to_string_lossy().into_owned();
            return (Err(SuperviseError::Spawn { program, error }), watchdog);
        }
    };
    watchdog.guard(group);
    if child_has_terminal {
        // The child does the same before exec; doing it here too closes the
        // race where it reads the terminal before it is the foreground.
        sys::give_terminal_to(group);
    }
    report::event("started", &[("pid", &group)]);
    watch_child(group, events.clone());
    let mut run = Run {
        backend,
        plan,
        watchdog,
        lease,
        events,
        inbox,
        group,
        child_has_terminal,
    };
    let held = run.hold();
    if run.child_has_terminal {
        sys::take_terminal_back();
    }
    let outcome = match held {
        Ok(status) => run.end_group(status),
        Err(reason) => run.stop_after_loss(&reason),
    };
    (Ok(outcome), run.watchdog)
}

/// What the command is told of its slot: the plan's prefix and limit, the
/// grant's fence, and what the store adds of its own.
fn child_env(plan: &Plan, fence: u64, own: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut env = vec![
        ("CONSEM_PREFIX".to_string(), plan.prefix.clone()),
        ("CONSEM_LIMIT".to_string(), plan.limit.to_string()),
        ("CONSEM_FENCE".to_string(), fence.to_string()),
    ];
    env.extend(own);
    env
}

/// The command's run, from its start until its group is gone.
struct Run<'a> {
    backend: &'a dyn SlotBackend,
    plan: &'a Plan,
    watchdog: Watchdog,
    lease: Lease,
    /// For a watchdog started again, to say when it ends.
    events: Sender<Event>,
    inbox: &'a Receiver<Event>,
    /// The command's process group (its pid).
    group: u32,
    /// The command's group is the terminal's foreground group.
    child_has_terminal: bool,
}

impl Run<'_> {
    /// Supervises the running command until it exits (its status) or the
    /// slot is lost (why).
    fn hold(&mut self) -> Result<ExitStatus, String> {
        loop {
            self.keep_watchdog()?;
            let Some(event) = self.next_event() else {
                continue;
            };
            match decide::running(event, self.child_has_terminal) {
                Running::Exited(status) => {
                    match (status.code(), status.signal()) {
                        (Some(code), _) => report::event("exited", &[("code", &code)]),
                        // As `interrupted` and `forwarded` give it.
                        (None, Some(signal)) => report::event("exited", &[("signal", &signal)]),
                        (None, None) => report::event("exited", &[]),
                    }
                    return Ok(status);
                }
                Running::Renewed(until) => self.renew(until)?,
                Running::ChildStopped(signal) => self.child_stopped(signal)?,
                Running::StopTogether => self.stop_together()?,
                Running::Forward(signal) => {
                    report::event("forwarded", &[("signal", &signal), ("pid", &self.group)]);
                    sys::signal_group(self.group, signal);
                }
                Running::Lost(reason) => return Err(reason),
                Running::Nothing => {}
            }
        }
    }

    /// The next event, or what the clock tells: the lease reaching its
    /// stop point, or a stop of the command the kernel did not report.
    /// `None`: nothing happened within a look's period.
    fn next_event(&self) -> Option<Event> {
        let tick = match self.lease.stop_at() {
            Some(at) => STOP_POLL.min(at.saturating_duration_since(Instant::now())),
            None => STOP_POLL,
        };
        match self.inbox.recv_timeout(tick) {
            Ok(event) => Some(event),
            Err(RecvTimeoutError::Timeout) if self.lease.running_out() => {
                Some(Event::Slot(SlotEvent::Lost(self.lease.why())))
            }
            Err(RecvTimeoutError::Timeout) if sys::is_stopped(self.group) => {
                Some(Event::ChildStopped(SIGSTOP))
            }
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => unreachable!("the event loop holds a sender"),
        }
    }

    /// A watchdog ends by itself once the group is gone (the command exited
    /// and its exit is on its way here): one gone while the group lives was
    /// killed (by hand, the OOM killer), and without it a frozen or killed
    /// consem would leave the command running past the lease. It is
    /// started again, or the slot counts as lost.
    fn keep_watchdog(&mut self) -> Result<(), String> {
        if self.watchdog.alive() || !sys::group_exists(self.group) {
            return Ok(());
        }
        match Watchdog::start_guarding(
            self.plan.kill_grace,
            orphan_grace(self.backend, self.plan),
            self.group,
            self.lease.until,
            tell_watchdog_ended(&self.events),
        ) {
            Ok(fresh) => {
                report::warning("the watchdog that guards the lease was gone; started another");
                self.watchdog = fresh;
                Ok(())
            }
            Err(error) => Err(format!(
                "the watchdog that guards the lease is gone and cannot be started again ({error})"
            )),
        }
    }

    /// Takes a renewal, and tells the watchdog; `Err`: why the slot counts
    /// as lost.
    fn renew(&mut self, until: Instant) -> Result<(), String> {
        self.lease.renew(until)?;
        self.watchdog.set_deadline(self.lease.until);
        Ok(())
    }

    /// The command reported a stop.
    fn child_stopped(&mut self, signal: i32) -> Result<(), String> {
        match decide::on_child_stop(
            signal,
            sys::is_stopped(self.group),
            self.child_has_terminal,
            sys::we_own_the_terminal(),
        ) {
            OnChildStop::Stale => Ok(()),
            OnChildStop::GiveTerminal => {
                report::event("terminal-to-command", &[("pid", &self.group)]);
                self.child_has_terminal = true;
                sys::give_terminal_to(self.group);
                sys::signal_group(self.group, SIGCONT);
                Ok(())
            }
            OnChildStop::StopWithIt => self.stop_with_child(signal),
        }
    }

    /// The command stopped (Ctrl-Z on its terminal, a read from a terminal
    /// it does not own): stop with it so that the shell sees the job stop,
    /// and carry on together when continued, if the slot is still ours.
    fn stop_with_child(&mut self, signal: i32) -> Result<(), String> {
        report::event("stopped", &[("pid", &self.group), ("signal", &signal)]);
        if self.child_has_terminal {
            sys::take_terminal_back();
        }
        sys::stop_self();
        if self.lease.running_out() {
            return Err(self.lease.why());
        }
        self.child_has_terminal = sys::we_own_the_terminal();
        if self.child_has_terminal {
            sys::give_terminal_to(self.group);
        }
        report::event("continued", &[("pid", &self.group)]);
        sys::signal_group(self.group, SIGCONT);
        Ok(())
    }

    /// Ctrl-Z reached consem, not the command: stop the command first
    /// (SIGSTOP, which it cannot ignore), so that it never runs on while
    /// consem, and its session renewal, are stopped; continue it only if
    /// the slot is still ours.
    fn stop_together(&mut self) -> Result<(), String> {
        report::event("stopped", &[("pid", &self.group), ("signal", &SIGTSTP)]);
        sys::signal_group(self.group, SIGSTOP);
        sys::stop_self();
        if self.lease.running_out() {
            return Err(self.lease.why());
        }
        report::event("continued", &[("pid", &self.group)]);
        sys::signal_group(self.group, SIGCONT);
        Ok(())
    }

    /// The slot was lost while the command ran: stop its whole group.
    fn stop_after_loss(&self, reason: &str) -> Outcome {
        report::error(&format!("slot lost: {reason}; stopping the command"));
        if self.lease.ended() {
            // Past its lease the command may not run a moment more (a
            // stopped one is killed as it is, never continued).
            sys::signal_group(self.group, SIGKILL);
        }
        stop_child(self.group, self.plan.kill_grace, self.inbox);
        Outcome::SlotLost
    }

    /// The command exited by itself. The slot covers its whole process
    /// group: what it left running in the group is stopped (or, with
    /// `--wait-group`, waited for) before the slot is released; and a slot
    /// that turned out to be lost meanwhile is no success, whatever the
    /// command's status.
    fn end_group(&mut self, status: ExitStatus) -> Outcome {
        let mut lost = None;
        if sys::group_exists(self.group) {
            if self.plan.wait_group {
                report::event("waiting-for-group", &[("pid", &self.group)]);
                lost = self.wait_for_group();
            } else {
                report::event(
                    "stopping-group",
                    &[("pid", &self.group), ("signal", &SIGTERM)],
                );
            }
            // Renewals go on while the leftovers have their grace; taken only
            // afterwards, one confirmed in time would find the lease it
            // replaces past its stop point.
            stop_group(self.group, self.plan.kill_grace, |within| {
                if let Ok(event) = self.inbox.recv_timeout(within) {
                    self.note_slot_event(event, &mut lost);
                }
            });
        }
        // What arrived while the command was ending: a loss means the command
        // may have run without the slot.
        while let Ok(event) = self.inbox.try_recv() {
            self.note_slot_event(event, &mut lost);
        }
        // Past the lease's stop point the watchdog may have stopped the
        // command: its status is not its own.
        if lost.is_none() && self.lease.running_out() {
            lost = Some(self.lease.why());
        }
        match lost {
            Some(reason) => lost_after_exit(&reason, status),
            None => Outcome::ChildExited(status),
        }
    }

    /// Takes what the store said while the command's group was ending; the
    /// first reason the slot was lost is kept.
    fn note_slot_event(&mut self, event: Event, lost: &mut Option<String>) {
        let why = match decide::ending(event) {
            Ending::Lost(reason) => Some(reason),
            Ending::Renewed(until) => self.renew(until).err(),
            Ending::Forward(_) | Ending::Nothing => None,
        };
        if lost.is_none() {
            *lost = why;
        }
    }

    /// `--wait-group`: keeps the slot, and watches it, until the group is
    /// empty. Returns why the slot was lost, if it was.
    fn wait_for_group(&mut self) -> Option<String> {
        while sys::group_exists(self.group) {
            if self.lease.running_out() {
                return Some(self.lease.why());
            }
            let Ok(event) = self.inbox.recv_timeout(GROUP_POLL) else {
                continue;
            };
            match decide::ending(event) {
                Ending::Lost(reason) => return Some(reason),
                Ending::Renewed(until) => {
                    if let Err(why) = self.renew(until) {
                        return Some(why);
                    }
                }
                Ending::Forward(signal) => {
                    sys::signal_group(self.group, signal);
                }
                Ending::Nothing => {}
            }
        }
        None
    }
}

/// The command exited, but the slot was lost meanwhile: it may have run
/// without the slot, so its status is not reported as its own.
fn lost_after_exit(reason: &str, status: ExitStatus) -> Outcome {
    report::error(&format!(
        "slot lost while the command ran: {reason}; its exit ({status}) is not reported as its own"
    ));
    Outcome::SlotLost
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
