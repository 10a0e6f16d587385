//! The supervisor against a store that the test drives: grants, renewals,
//! losses and failures come when the test sends them, signals are put in
//! the event loop as the signal thread would, and the command is a real
//! tiny process (`sh -c`). The supervisor runs on the test's thread (the
//! parent-death signal is tied to the thread that spawns), the store's
//! side on another.

use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use signal_hook::consts::signal::{SIGINT, SIGTERM, SIGUSR1, SIGWINCH};

use super::*;
use crate::exit::{self, Exit};
use crate::store::{ErrorKind, Progress, ReleaseError, StoreError};

/// How long the test waits for what it expects before it fails.
const DEADLINE: Duration = Duration::from_secs(20);

/// What the supervisor asked of the store after it began to contend.
#[derive(Debug, PartialEq, Eq)]
enum Call {
    CommandStarted,
    Release(Duration),
}

/// A store whose events the test sends.
struct FakeStore {
    calls: Mutex<Sender<Call>>,
    notify: Mutex<Option<Notify>>,
    /// What `release` answers.
    released: Released,
    own_env: Vec<(String, String)>,
}

impl SlotBackend for FakeStore {
    fn contend(self: Arc<Self>, _mode: Contend, notify: Notify) {
        *self.notify.lock().unwrap() = Some(notify);
    }

    fn release(&self, budget: Duration) -> Result<Released, ReleaseError> {
        self.call(Call::Release(budget));
        Ok(self.released.clone())
    }

    fn own_child_env(&self) -> Vec<(String, String)> {
        self.own_env.clone()
    }

    fn command_started(&self) {
        self.call(Call::CommandStarted);
    }

    fn frees_slot_at_death(&self) -> bool {
        false
    }
}

impl FakeStore {
    fn call(&self, call: Call) {
        let _ = self.calls.lock().unwrap().send(call);
    }
}

/// The test's side: the store's events, the signals, and what the
/// supervisor asked of the store.
struct Driver {
    notify: Notify,
    events: Sender<Event>,
    calls: Receiver<Call>,
}

impl Driver {
    fn grant(&self, fence: u64, lease: Option<Instant>) {
        (self.notify)(SlotEvent::Acquired { fence, lease });
    }

    fn renew(&self, until: Instant) {
        (self.notify)(SlotEvent::Leased { until });
    }

    fn lose(&self, reason: &str) {
        (self.notify)(SlotEvent::Lost(reason.into()));
    }

    fn fail(&self, error: StoreError) {
        (self.notify)(SlotEvent::Failed(error));
    }

    fn send(&self, event: SlotEvent) {
        (self.notify)(event);
    }

    /// As the signal thread passes a signal on.
    fn signal(&self, signal: i32) {
        self.events.send(Event::Signal(signal)).unwrap();
    }

    /// The next thing the supervisor asked of the store must be `call`.
    fn expect(&self, call: Call) {
        match self.calls.recv_timeout(DEADLINE) {
            Ok(got) => assert_eq!(got, call),
            Err(_) => panic!("the supervisor did not ask for {call:?} within {DEADLINE:?}"),
        }
    }

    /// Waits until the command says it is ready (its file exists).
    fn wait_for(&self, ready: &Path) {
        let until = Instant::now() + DEADLINE;
        while !ready.exists() {
            assert!(Instant::now() < until, "{} never appeared", ready.display());
            thread::sleep(Duration::from_millis(5));
        }
    }
}

fn plan(script: &str) -> Plan {
    Plan {
        command: ["sh", "-c", script].map(OsString::from).to_vec(),
        prefix: "jobs/nightly".into(),
        limit: 3,
        mode: Contend::Wait,
        timeout: None,
        kill_grace: Duration::from_secs(5),
        wait_group: false,
        progress_line: None,
    }
}

fn store() -> FakeStore {
    FakeStore {
        calls: Mutex::new(mpsc::channel().0),
        notify: Mutex::new(None),
        released: Released::Left,
        own_env: Vec::new(),
    }
}

/// Runs the supervisor on this thread while `drive` plays the store and
/// the signals on another; returns how the run ended.
fn supervise_with(
    plan: &Plan,
    store: FakeStore,
    drive: impl FnOnce(Driver) + Send + 'static,
) -> Ended {
    let (calls_tx, calls) = mpsc::channel();
    *store.calls.lock().unwrap() = calls_tx;
    let store = Arc::new(store);
    let backend: Arc<dyn SlotBackend> = store.clone();
    let (events, inbox) = mpsc::channel();
    let started = Instant::now();
    contend(&backend, plan, &events);
    let notify = store.notify.lock().unwrap().clone();
    let driver = Driver {
        notify: notify.expect("contend hands the store its notify"),
        events: events.clone(),
        calls,
    };
    let driving = thread::spawn(move || drive(driver));
    let ended = supervise(&*backend, plan, started, events, &inbox);
    if let Err(panic) = driving.join() {
        std::panic::resume_unwind(panic);
    }
    ended
}

fn exited_with(ended: &Ended) -> Option<i32> {
    match ended {
        Ok(Outcome::ChildExited(status)) => status.code(),
        _ => None,
    }
}

/// A file for the command to create, unique to this test.
fn scratch(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("consem-supervise-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

fn waiting_progress() -> SlotEvent {
    SlotEvent::Waiting(Progress {
        limit: 3,
        holders: Vec::new(),
        ahead: 0,
    })
}

#[test]
fn a_signal_ends_the_wait_and_the_semaphore_is_left_at_once() {
    let ended = supervise_with(&plan("exit 0"), store(), |store| {
        store.send(waiting_progress());
        store.signal(SIGINT);
        // No command started.
        store.expect(Call::Release(RELEASE_BUDGET_WAITING));
    });
    assert!(
        matches!(ended, Ok(Outcome::Interrupted(SIGINT))),
        "{ended:?}"
    );
    assert_eq!(exit::of_run(&ended, 75), Exit::Signal(SIGINT));
}

#[test]
fn other_signals_do_not_end_the_wait() {
    let ended = supervise_with(&plan("exit 3"), store(), |store| {
        store.signal(SIGUSR1);
        store.signal(SIGWINCH);
        store.grant(1, None);
        store.expect(Call::CommandStarted);
        store.expect(Call::Release(RELEASE_BUDGET_DONE));
    });
    assert_eq!(exited_with(&ended), Some(3));
    assert_eq!(exit::of_run(&ended, 75), Exit::Code(3));
}

#[test]
fn a_store_that_fails_while_consem_waits_ends_the_run_with_its_error() {
    let ended = supervise_with(&plan("exit 0"), store(), |store| {
        store.fail(StoreError::denied("no key:write"));
        store.expect(Call::Release(RELEASE_BUDGET_WAITING));
    });
    assert!(
        matches!(&ended, Err(SuperviseError::Store(e)) if e.kind == ErrorKind::Denied),
        "{ended:?}"
    );
    assert_eq!(exit::of_run(&ended, 75), Exit::Code(exit::DENIED));
}

#[test]
fn a_place_lost_while_waiting_is_the_store_failing() {
    let ended = supervise_with(&plan("exit 0"), store(), |store| {
        store.lose("the session was invalidated");
        store.expect(Call::Release(RELEASE_BUDGET_WAITING));
    });
    assert_eq!(exit::of_run(&ended, 75), Exit::Code(exit::UNAVAILABLE));
}

#[test]
fn no_free_slot_ends_with_the_no_slot_code() {
    let mut plan = plan("exit 0");
    plan.mode = Contend::Try;
    let full = Progress {
        limit: 3,
        holders: Vec::new(),
        ahead: 1,
    };
    let told = full.clone();
    let ended = supervise_with(&plan, store(), |store| {
        store.send(SlotEvent::NoSlot(told));
        store.expect(Call::Release(RELEASE_BUDGET_WAITING));
    });
    assert!(
        matches!(&ended, Ok(Outcome::NoSlot(NoSlot { timeout: None, seen: Some(seen) })) if *seen == full),
        "{ended:?}"
    );
    assert_eq!(exit::of_run(&ended, 75), Exit::Code(75));
}

#[test]
fn a_short_timeout_ends_the_wait_once_the_store_said_every_slot_is_taken() {
    let mut plan = plan("exit 0");
    plan.timeout = Some(Duration::from_millis(1));
    let started = Instant::now();
    let ended = supervise_with(&plan, store(), |store| {
        store.send(waiting_progress());
        store.expect(Call::Release(RELEASE_BUDGET_WAITING));
    });
    // What ran out, and who held the slots, for the line that says so.
    let SlotEvent::Waiting(seen) = waiting_progress() else {
        unreachable!()
    };
    assert!(
        matches!(&ended, Ok(Outcome::NoSlot(no_slot)) if *no_slot == NoSlot { timeout: plan.timeout, seen: Some(seen) }),
        "{ended:?}"
    );
    // Not the first attempt's budget: the store had answered.
    assert!(started.elapsed() < FIRST_ATTEMPT_BUDGET);
}

#[test]
fn the_command_is_told_its_slot_and_what_the_store_adds() {
    let mut with_env = store();
    with_env.own_env = vec![("STORE_OWN".into(), "yes".into())];
    let check =
        r#"test "$CONSEM_PREFIX|$CONSEM_LIMIT|$CONSEM_FENCE|$STORE_OWN" = "jobs/nightly|3|7|yes""#;
    let ended = supervise_with(&plan(check), with_env, |store| {
        store.grant(7, None);
        store.expect(Call::CommandStarted);
        store.expect(Call::Release(RELEASE_BUDGET_DONE));
    });
    assert_eq!(exited_with(&ended), Some(0));
}

#[test]
fn the_slots_variables_come_first_and_the_stores_own_after() {
    let own = vec![("ETCD_LOCK_REV".to_string(), "7".to_string())];
    let env = child_env(&plan("exit 0"), 7, own);
    let names: Vec<&str> = env.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            "CONSEM_PREFIX",
            "CONSEM_LIMIT",
            "CONSEM_FENCE",
            "ETCD_LOCK_REV"
        ]
    );
    assert_eq!(env[2].1, "7");
}

/// A lease whose stop point has passed.
fn run_out() -> Option<Instant> {
    Instant::now().checked_sub(Duration::from_secs(1))
}

#[test]
fn a_late_grant_starts_the_command_once_a_renewal_confirms_it() {
    let ended = supervise_with(&plan("exit 0"), store(), |store| {
        store.grant(1, run_out());
        store.renew(Instant::now() + Duration::from_secs(60));
        store.expect(Call::CommandStarted);
        store.expect(Call::Release(RELEASE_BUDGET_DONE));
    });
    assert_eq!(exited_with(&ended), Some(0));
}

#[test]
fn a_late_grant_found_gone_is_a_loss_and_the_command_never_starts() {
    let ended = supervise_with(&plan("exit 0"), store(), |store| {
        store.grant(1, run_out());
        // A renewal that still leaves no room for the grace changes nothing.
        store.renew(Instant::now());
        store.lose("the lease was not found");
        // Release comes first: the command never started.
        store.expect(Call::Release(RELEASE_BUDGET_WAITING));
    });
    assert!(matches!(ended, Ok(Outcome::SlotLost)), "{ended:?}");
    assert_eq!(exit::of_run(&ended, 75), Exit::Code(exit::SLOT_LOST));
}

#[test]
fn a_slot_lost_while_the_command_runs_stops_its_group() {
    let group = scratch("lost-group");
    let script = format!("{} sleep 30 & wait", write_group(&group));
    let started = Instant::now();
    let written = group.clone();
    let ended = supervise_with(&plan(&script), store(), move |store| {
        store.grant(1, None);
        store.expect(Call::CommandStarted);
        store.wait_for(&written);
        store.lose("released by an operator");
        store.expect(Call::Release(RELEASE_BUDGET_DONE));
    });
    assert!(matches!(ended, Ok(Outcome::SlotLost)), "{ended:?}");
    // Stopped by SIGTERM, well within the grace, with all it started.
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_group_gone(&group);
}

/// Shell commands that write the command's group id to `file` (at once
/// whole, for a test that waits for it).
fn write_group(file: &Path) -> String {
    let file = file.display();
    format!("echo $$ > '{file}.new'; mv '{file}.new' '{file}';")
}

/// The group whose id the command wrote to `file` is gone, or goes within
/// a few seconds: what got the last SIGKILL after the command was reaped
/// may still wait for init to reap it.
fn assert_group_gone(file: &Path) {
    let written = std::fs::read_to_string(file).expect("the command wrote its group");
    let _ = std::fs::remove_file(file);
    let group: u32 = written.trim().parse().unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    while sys::group_exists(group) {
        assert!(Instant::now() < until, "group {group} is still there");
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_store_that_fails_while_the_command_runs_loses_the_slot() {
    let ended = supervise_with(&plan("exec sleep 30"), store(), |store| {
        store.grant(1, None);
        store.expect(Call::CommandStarted);
        store.fail(StoreError::unavailable("the store went away"));
        store.expect(Call::Release(RELEASE_BUDGET_DONE));
    });
    assert!(matches!(ended, Ok(Outcome::SlotLost)), "{ended:?}");
}

#[test]
fn a_lease_that_runs_out_stops_the_command() {
    let mut plan = plan("exec sleep 30");
    plan.kill_grace = Duration::from_secs(1);
    let ended = supervise_with(&plan, store(), |store| {
        store.grant(1, Some(Instant::now() + Duration::from_millis(1300)));
        store.expect(Call::CommandStarted);
        // No renewal.
        store.expect(Call::Release(RELEASE_BUDGET_DONE));
    });
    assert!(matches!(ended, Ok(Outcome::SlotLost)), "{ended:?}");
}

#[test]
fn signals_reach_the_running_command() {
    let ready = scratch("trap-set");
    let script = format!(
        r#"trap 'exit 42' USR1; : > '{}'; while :; do sleep 0.01; done"#,
        ready.display()
    );
    let ended = supervise_with(&plan(&script), store(), move |store| {
        store.grant(1, None);
        store.expect(Call::CommandStarted);
        store.wait_for(&ready);
        store.signal(SIGUSR1);
        store.expect(Call::Release(RELEASE_BUDGET_DONE));
        let _ = std::fs::remove_file(&ready);
    });
    assert_eq!(exited_with(&ended), Some(42));
}

#[test]
fn a_command_killed_by_a_passed_on_signal_has_consem_die_of_it() {
    let ended = supervise_with(&plan("exec sleep 30"), store(), |store| {
        store.grant(1, None);
        store.expect(Call::CommandStarted);
        store.signal(SIGTERM);
        store.expect(Call::Release(RELEASE_BUDGET_DONE));
    });
    let Ok(Outcome::ChildExited(status)) = &ended else {
        panic!("{ended:?}");
    };
    assert_eq!(status.signal(), Some(SIGTERM));
    assert_eq!(exit::of_run(&ended, 75), Exit::Signal(SIGTERM));
}

#[test]
fn what_the_command_leaves_in_its_group_is_stopped_before_the_slot_is_released() {
    let group = scratch("leftover-group");
    let script = format!("{} sleep 30 & exit 0", write_group(&group));
    let started = Instant::now();
    let ended = supervise_with(&plan(&script), store(), |store| {
        store.grant(1, None);
        store.expect(Call::CommandStarted);
        store.expect(Call::Release(RELEASE_BUDGET_DONE));
    });
    assert_eq!(exited_with(&ended), Some(0));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_group_gone(&group);
}

#[test]
fn with_wait_group_the_slot_is_kept_until_the_group_is_empty() {
    let done = scratch("leftover-done");
    let mut plan = plan(&format!("(sleep 0.2; : > '{}') & exit 0", done.display()));
    plan.wait_group = true;
    let ended = supervise_with(&plan, store(), |store| {
        store.grant(1, None);
        store.expect(Call::CommandStarted);
        store.expect(Call::Release(RELEASE_BUDGET_DONE));
    });
    assert_eq!(exited_with(&ended), Some(0));
    // The leftover ran to its end before the slot was released.
    assert!(done.exists());
    let _ = std::fs::remove_file(&done);
}

/// Renewals that come while the command's leftovers have their kill grace
/// are taken at once: taken only once the group is gone, a lease renewed
/// on time would look run out.
#[test]
fn renewals_during_the_leftovers_grace_keep_the_slot() {
    let group = scratch("stubborn-group");
    let mut plan = plan(&format!(
        "{} (trap '' TERM; while :; do sleep 0.05; done) & exit 0",
        write_group(&group)
    ));
    plan.kill_grace = Duration::from_millis(1500);
    // Each renewal's stop point is a second ahead: less than the grace.
    let lease = Duration::from_millis(2500);
    let ended = supervise_with(&plan, store(), move |store| {
        store.grant(1, Some(Instant::now() + lease));
        // A renewer: every 100 ms until the supervisor leaves.
        loop {
            match store.calls.recv_timeout(Duration::from_millis(100)) {
                Ok(Call::Release(budget)) => {
                    assert_eq!(budget, RELEASE_BUDGET_DONE);
                    break;
                }
                Ok(Call::CommandStarted) | Err(mpsc::RecvTimeoutError::Timeout) => {
                    store.renew(Instant::now() + lease)
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the store is gone"),
            }
        }
    });
    assert_eq!(exited_with(&ended), Some(0));
    // What ignored SIGTERM got SIGKILL after the grace.
    assert_group_gone(&group);
}

#[test]
fn a_slot_taken_before_release_is_no_success() {
    let mut taken = store();
    taken.released = Released::TakenBefore("the lease had expired".into());
    let ended = supervise_with(&plan("exit 0"), taken, |store| {
        store.grant(1, None);
        store.expect(Call::CommandStarted);
        store.expect(Call::Release(RELEASE_BUDGET_DONE));
    });
    assert!(matches!(ended, Ok(Outcome::SlotLost)), "{ended:?}");
}

#[test]
fn a_command_that_cannot_start_is_an_error_of_its_own() {
    let mut plan = plan("exit 0");
    plan.command = vec![OsString::from("/nonexistent/consem-test-command")];
    let ended = supervise_with(&plan, store(), |store| {
        store.grant(1, None);
        store.expect(Call::CommandStarted);
        store.expect(Call::Release(RELEASE_BUDGET_DONE));
    });
    let Err(error) = &ended else {
        panic!("{ended:?}");
    };
    assert!(
        error
            .to_string()
            .starts_with("cannot run '/nonexistent/consem-test-command': "),
        "{error}"
    );
    assert_eq!(exit::of_run(&ended, 75), Exit::Code(exit::NOT_FOUND));
}

#[test]
fn a_watchdog_that_cannot_start_is_not_a_store_outage() {
    let error = SuperviseError::Watchdog(io::Error::from_raw_os_error(libc::EAGAIN));
    assert!(error
        .to_string()
        .starts_with("cannot start the watchdog that stops the command if consem cannot: "));
}
