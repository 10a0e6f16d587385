//! The supervisor's decisions, without I/O: what an event means in each
//! state of a run (waiting, confirming a late grant, running, ending the
//! group), when the wait ends, and the lease's arithmetic.

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use signal_hook::consts::signal::{SIGTSTP, SIGTTIN, SIGTTOU, SIGWINCH};

use super::{
    Ended, Event, NoSlot, Outcome, SuperviseError, FIRST_ATTEMPT_BUDGET, SHUTDOWN_SIGNALS,
};
use crate::store::{Progress, SlotEvent, StoreError};

/// A slot the store granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Grant {
    /// For the command's `CONSEM_FENCE`.
    pub fence: u64,
    /// See [`SlotEvent::Acquired`].
    pub lease: Option<Instant>,
}

/// What an event means while consem waits for a slot.
#[derive(Debug)]
pub(super) enum Waiting {
    Granted(Grant),
    /// A signal ended the wait.
    Interrupted(i32),
    /// The wait ends without a slot.
    Ended(Ended),
    /// Every slot is taken; this is who holds them.
    Progress(Progress),
    /// Ctrl-Z reached consem: stop with the job.
    StopSelf,
    /// The terminal changed size: redraw the waiting line.
    Redraw,
    /// A signal that does not end a wait (SIGUSR1, SIGUSR2).
    Ignored(i32),
    Nothing,
}

pub(super) fn waiting(event: Event) -> Waiting {
    match event {
        Event::Slot(SlotEvent::Acquired { fence, lease }) => {
            Waiting::Granted(Grant { fence, lease })
        }
        Event::Slot(SlotEvent::Waiting(progress)) => Waiting::Progress(progress),
        Event::Slot(SlotEvent::NoSlot(seen)) => Waiting::Ended(Ok(Outcome::NoSlot(NoSlot {
            timeout: None,
            seen: Some(seen),
        }))),
        Event::Slot(SlotEvent::Failed(error)) => Waiting::Ended(Err(SuperviseError::Store(error))),
        // No slot was held: the store lost the place in its queue.
        Event::Slot(SlotEvent::Lost(reason)) => {
            Waiting::Ended(Err(SuperviseError::Store(StoreError::unavailable(reason))))
        }
        Event::Slot(SlotEvent::Leased { .. }) => Waiting::Nothing,
        Event::Signal(signal) if SHUTDOWN_SIGNALS.contains(&signal) => Waiting::Interrupted(signal),
        Event::Signal(SIGTSTP) => Waiting::StopSelf,
        Event::Signal(SIGWINCH) => Waiting::Redraw,
        Event::Signal(signal) => Waiting::Ignored(signal),
        // A watchdog that ended while consem waits is replaced once the
        // command runs.
        Event::ChildStopped(_) | Event::ChildExited(_) | Event::WatchdogEnded => Waiting::Nothing,
    }
}

/// What an event means while a grant that came late waits for a renewal.
#[derive(Debug)]
pub(super) enum Confirming {
    Renewed(Instant),
    /// The store found the slot gone.
    Lost(String),
    Failed(StoreError),
    Interrupted(i32),
    StopSelf,
    Nothing,
}

pub(super) fn confirming(event: Event) -> Confirming {
    match event {
        Event::Slot(SlotEvent::Leased { until }) => Confirming::Renewed(until),
        Event::Slot(SlotEvent::Lost(reason)) => Confirming::Lost(reason),
        Event::Slot(SlotEvent::Failed(error)) => Confirming::Failed(error),
        Event::Signal(signal) if SHUTDOWN_SIGNALS.contains(&signal) => {
            Confirming::Interrupted(signal)
        }
        Event::Signal(SIGTSTP) => Confirming::StopSelf,
        _ => Confirming::Nothing,
    }
}

/// What an event means while the command runs.
#[derive(Debug)]
pub(super) enum Running {
    Exited(ExitStatus),
    Renewed(Instant),
    /// The slot is gone (lost, or the store cannot go on).
    Lost(String),
    /// The command reported a stop, by this signal.
    ChildStopped(i32),
    /// Ctrl-Z reached consem, not the command.
    StopTogether,
    /// Passed on to the command's group.
    Forward(i32),
    Nothing,
}

/// `child_has_terminal`: the command's group is the terminal's foreground.
pub(super) fn running(event: Event, child_has_terminal: bool) -> Running {
    match event {
        Event::ChildExited(status) => Running::Exited(status),
        Event::Slot(SlotEvent::Leased { until }) => Running::Renewed(until),
        Event::Slot(SlotEvent::Lost(reason)) => Running::Lost(reason),
        Event::Slot(SlotEvent::Failed(error)) => Running::Lost(error.to_string()),
        Event::Slot(_) => Running::Nothing,
        Event::ChildStopped(signal) => Running::ChildStopped(signal),
        Event::Signal(SIGTSTP) => Running::StopTogether,
        // A child that owns the terminal has it from the terminal.
        Event::Signal(SIGWINCH) if child_has_terminal => Running::Nothing,
        Event::Signal(signal) => Running::Forward(signal),
        // The run's loop replaces it if the group lives.
        Event::WatchdogEnded => Running::Nothing,
    }
}

/// What to do about a stop the command reported.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum OnChildStop {
    /// It is not stopped now: the report came late, after consem continued
    /// it (the kernel may also drop one).
    Stale,
    /// It stopped to read from the terminal or set it up, which consem's
    /// group owns: hand the terminal over, and continue it.
    GiveTerminal,
    /// Stop with it, so that the shell sees the job stop.
    StopWithIt,
}

pub(super) fn on_child_stop(
    signal: i32,
    stopped_now: bool,
    child_has_terminal: bool,
    we_own_the_terminal: bool,
) -> OnChildStop {
    if !stopped_now {
        OnChildStop::Stale
    } else if matches!(signal, SIGTTIN | SIGTTOU) && !child_has_terminal && we_own_the_terminal {
        OnChildStop::GiveTerminal
    } else {
        OnChildStop::StopWithIt
    }
}

/// What an event means once the command has exited and its group ends.
#[derive(Debug)]
pub(super) enum Ending {
    Renewed(Instant),
    Lost(String),
    /// Passed on to what is left of the group, while `--wait-group` waits.
    Forward(i32),
    Nothing,
}

pub(super) fn ending(event: Event) -> Ending {
    match event {
        Event::Slot(SlotEvent::Leased { until }) => Ending::Renewed(until),
        Event::Slot(SlotEvent::Lost(reason)) => Ending::Lost(reason),
        Event::Slot(SlotEvent::Failed(error)) => Ending::Lost(error.to_string()),
        Event::Signal(signal) if signal != SIGTSTP => Ending::Forward(signal),
        _ => Ending::Nothing,
    }
}

/// When the wait for a slot ends: at `--timeout`, but not before the
/// store's first answer (that every slot is taken) or the first attempt's
/// budget, so that a short timeout still takes a free slot.
pub(super) fn wait_deadline(
    timeout: Option<Instant>,
    started: Instant,
    answered: bool,
) -> Option<Instant> {
    match timeout {
        Some(at) if !answered => Some(at.max(started + FIRST_ATTEMPT_BUDGET)),
        other => other,
    }
}

/// The slot's lease, as the store last confirmed it: `until` is `None`
/// while the slot lasts as long as consem lives.
#[derive(Debug)]
pub(super) struct Lease {
    pub until: Option<Instant>,
    pub grace: Duration,
}

impl Lease {
    /// The moment the command must be told to stop (SIGTERM), so that it
    /// is gone (SIGKILL) when the lease ends.
    pub fn stop_at(&self) -> Option<Instant> {
        self.until
            .map(|until| until.checked_sub(self.grace).unwrap_or(until))
    }

    pub fn running_out(&self) -> bool {
        self.stop_at().is_some_and(|at| Instant::now() >= at)
    }

    pub fn ended(&self) -> bool {
        self.until.is_some_and(|until| Instant::now() >= until)
    }

    /// Takes a newer lease, unless the current one already reached its stop
    /// point: the watchdog, which had that deadline, may have stopped the
    /// command, so a renewal confirmed after that does not give the slot
    /// back; `Err` says why the slot counts as lost.
    pub fn renew(&mut self, until: Instant) -> Result<(), String> {
        if self.running_out() {
            return Err(self.why());
        }
        self.until = Some(until);
        Ok(())
    }

    /// Why the slot can no longer be counted on.
    pub fn why(&self) -> String {
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

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt as _;

    use crate::store::ErrorKind;

    use signal_hook::consts::signal::{SIGINT, SIGSTOP, SIGTERM, SIGUSR1};

    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    fn lease(until: Option<Instant>, grace: Duration) -> Lease {
        Lease { until, grace }
    }

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
        let long = Some(started + MINUTE);
        assert_eq!(wait_deadline(long, started, false), long);
        assert_eq!(wait_deadline(None, started, false), None);
    }

    #[test]
    fn a_wait_ends_on_a_grant_a_shutdown_signal_or_the_store_giving_up() {
        let at = Instant::now();
        let acquired = SlotEvent::Acquired {
            fence: 7,
            lease: Some(at),
        };
        assert!(matches!(
            waiting(Event::Slot(acquired)),
            Waiting::Granted(Grant { fence: 7, lease: Some(lease) }) if lease == at
        ));
        assert!(matches!(
            waiting(Event::Signal(SIGINT)),
            Waiting::Interrupted(SIGINT)
        ));
        let full = Progress {
            limit: 1,
            holders: Vec::new(),
            ahead: 2,
        };
        assert!(matches!(
            waiting(Event::Slot(SlotEvent::NoSlot(full.clone()))),
            Waiting::Ended(Ok(Outcome::NoSlot(NoSlot { timeout: None, seen: Some(seen) }))) if seen == full
        ));
        let denied = StoreError::denied("no");
        assert!(matches!(
            waiting(Event::Slot(SlotEvent::Failed(denied))),
            Waiting::Ended(Err(SuperviseError::Store(e))) if e.kind == ErrorKind::Denied
        ));
        // A place in the queue that is gone is the store failing, not a
        // lost slot: no slot was held.
        assert!(matches!(
            waiting(Event::Slot(SlotEvent::Lost("gone".into()))),
            Waiting::Ended(Err(SuperviseError::Store(e))) if e.kind == ErrorKind::Unavailable
        ));
    }

    #[test]
    fn a_wait_goes_on_through_other_signals_and_events() {
        assert!(matches!(
            waiting(Event::Signal(SIGUSR1)),
            Waiting::Ignored(SIGUSR1)
        ));
        assert!(matches!(waiting(Event::Signal(SIGTSTP)), Waiting::StopSelf));
        assert!(matches!(waiting(Event::Signal(SIGWINCH)), Waiting::Redraw));
        assert!(matches!(waiting(Event::WatchdogEnded), Waiting::Nothing));
        let leased = SlotEvent::Leased {
            until: Instant::now(),
        };
        assert!(matches!(waiting(Event::Slot(leased)), Waiting::Nothing));
    }

    #[test]
    fn a_late_grant_waits_for_a_renewal_a_loss_or_a_shutdown() {
        let until = Instant::now() + MINUTE;
        assert!(matches!(
            confirming(Event::Slot(SlotEvent::Leased { until })),
            Confirming::Renewed(at) if at == until
        ));
        assert!(matches!(
            confirming(Event::Slot(SlotEvent::Lost("gone".into()))),
            Confirming::Lost(_)
        ));
        assert!(matches!(
            confirming(Event::Signal(SIGTERM)),
            Confirming::Interrupted(SIGTERM)
        ));
        assert!(matches!(
            confirming(Event::Signal(SIGUSR1)),
            Confirming::Nothing
        ));
    }

    #[test]
    fn signals_reach_the_running_command_but_a_redraw_it_has_from_its_terminal() {
        assert!(matches!(
            running(Event::Signal(SIGINT), false),
            Running::Forward(SIGINT)
        ));
        assert!(matches!(
            running(Event::Signal(SIGUSR1), true),
            Running::Forward(SIGUSR1)
        ));
        assert!(matches!(
            running(Event::Signal(SIGWINCH), false),
            Running::Forward(SIGWINCH)
        ));
        assert!(matches!(
            running(Event::Signal(SIGWINCH), true),
            Running::Nothing
        ));
        assert!(matches!(
            running(Event::Signal(SIGTSTP), false),
            Running::StopTogether
        ));
    }

    #[test]
    fn a_store_failure_while_the_command_runs_is_a_lost_slot() {
        let failed = SlotEvent::Failed(StoreError::unavailable("down"));
        assert!(matches!(
            running(Event::Slot(failed), false),
            Running::Lost(reason) if reason == "down"
        ));
        assert!(matches!(
            running(Event::ChildExited(ExitStatus::from_raw(0)), false),
            Running::Exited(_)
        ));
        // A second grant means nothing to a run that holds its slot.
        let acquired = SlotEvent::Acquired {
            fence: 1,
            lease: None,
        };
        assert!(matches!(
            running(Event::Slot(acquired), false),
            Running::Nothing
        ));
    }

    #[test]
    fn a_stop_hands_over_the_terminal_only_when_consem_has_it_to_give() {
        assert_eq!(
            on_child_stop(SIGTTIN, false, false, true),
            OnChildStop::Stale
        );
        assert_eq!(
            on_child_stop(SIGTTIN, true, false, true),
            OnChildStop::GiveTerminal
        );
        assert_eq!(
            on_child_stop(SIGTTOU, true, false, true),
            OnChildStop::GiveTerminal
        );
        // The terminal is not consem's to give, or the command has it.
        assert_eq!(
            on_child_stop(SIGTTIN, true, false, false),
            OnChildStop::StopWithIt
        );
        assert_eq!(
            on_child_stop(SIGTTOU, true, true, true),
            OnChildStop::StopWithIt
        );
        assert_eq!(
            on_child_stop(SIGTSTP, true, false, true),
            OnChildStop::StopWithIt
        );
        assert_eq!(
            on_child_stop(SIGSTOP, true, true, true),
            OnChildStop::StopWithIt
        );
    }

    #[test]
    fn an_ending_group_takes_renewals_and_losses_and_passes_signals_on() {
        let until = Instant::now() + MINUTE;
        assert!(matches!(
            ending(Event::Slot(SlotEvent::Leased { until })),
            Ending::Renewed(at) if at == until
        ));
        assert!(matches!(
            ending(Event::Slot(SlotEvent::Lost("gone".into()))),
            Ending::Lost(_)
        ));
        assert!(matches!(
            ending(Event::Signal(SIGTERM)),
            Ending::Forward(SIGTERM)
        ));
        assert!(matches!(ending(Event::Signal(SIGTSTP)), Ending::Nothing));
    }

    #[test]
    fn the_command_is_told_to_stop_one_grace_before_the_lease_ends() {
        let now = Instant::now();
        let grace = Duration::from_secs(5);
        let held = lease(Some(now + MINUTE), grace);
        assert_eq!(held.stop_at(), Some(now + MINUTE - grace));
        assert!(!held.running_out());
        assert!(!held.ended());
        // Within the grace: running out, not yet ended.
        let within = lease(Some(now + Duration::from_secs(2)), grace);
        assert!(within.running_out());
        assert!(!within.ended());
        assert!(within
            .why()
            .starts_with("no renewal of its lease was confirmed in time"));
        // A slot that lasts as long as consem lives never runs out.
        let forever = lease(None, grace);
        assert_eq!(forever.stop_at(), None);
        assert!(!forever.running_out() && !forever.ended());
    }

    #[test]
    fn a_renewal_after_the_stop_point_does_not_give_the_slot_back() {
        let now = Instant::now();
        let grace = Duration::from_secs(5);
        let mut held = lease(Some(now + MINUTE), grace);
        assert_eq!(held.renew(now + 2 * MINUTE), Ok(()));
        assert_eq!(held.until, Some(now + 2 * MINUTE));
        let Some(past) = now.checked_sub(Duration::from_secs(1)) else {
            return;
        };
        let mut late = lease(Some(past), grace);
        let why = late.renew(now + MINUTE).unwrap_err();
        assert!(why.starts_with("its lease ran out"), "{why}");
        assert_eq!(late.until, Some(past));
    }
}
