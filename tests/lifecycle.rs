//! `consem run` over its whole life: the child dying with a killed consem,
//! session renewal, the session or the whole agent going away while holding
//! or waiting, failures at first contact, a terminal shared with the child,
//! and signals while waiting. One behaviour per test; deadlines and polling,
//! never sleeps that guess at timing. Tests that need the Consul double's
//! fault injection or its control over time run against the double even
//! when a real agent is given (CONSEM_TEST_CONSUL_ADDR).

use std::os::unix::process::ExitStatusExt as _;
use std::time::{Duration, Instant};

use crate::common::double::{Fault, Match};
use crate::common::pty::spawn_on_terminal;
use crate::common::wait_until;
use crate::common::world::*;

// ---- helpers ------------------------------------------------------------

/// A child for consem that writes its pid to `name` and then becomes
/// `sleep 60` (same pid, so the pid is the process consem started); see
/// `read_pid`.
fn pid_then_sleep(world: &World<TestConsul>, name: &str) -> Vec<String> {
    let script = format!("echo $$ > '{}'; exec sleep 60", world.path(name));
    vec!["sh".into(), "-c".into(), script]
}

/// The session IDs a `.lock` value names as holders, in either Holders
/// form (a name set to `false` is one on its way out).
fn lock_holders(lock: &serde_json::Value) -> Vec<String> {
    match &lock["Holders"] {
        serde_json::Value::Object(map) => map
            .iter()
            .filter(|(_, held)| **held == true)
            .map(|(name, _)| name.clone())
            .collect(),
        serde_json::Value::Array(list) => list
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect(),
        other => panic!("Holders is {other}"),
    }
}

/// A consem that a failing test leaves behind is SIGKILLed (its watchdog
/// takes its command along), rather than left waiting for a file in a
/// directory that goes with the world.
struct KilledIfLeft(Option<std::process::Child>);

impl KilledIfLeft {
    fn finish(mut self) -> std::process::Output {
        finish(self.0.take().unwrap())
    }
}

impl Drop for KilledIfLeft {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

// ---- outages while waiting --------------------------------------------

/// A waiter rides out outages of the store that are each shorter than its
/// TTL, with answers in between, however long ago the first one began:
/// each counts from its own start (a waiter gives up only on one outage
/// longer than its TTL). Two outages of about a second, the second
/// beginning more than a TTL after the first; the waiter then takes its
/// turn and runs, rather than exiting 69.
#[test]
fn a_waiter_rides_out_outages_in_a_row_each_shorter_than_its_ttl() {
    let world = World::on_the_double("outages-in-a-row");
    let double = world.the_double();
    let ttl = Duration::from_secs(10);
    let holder = KilledIfLeft(Some(world.spawn(
        1,
        &["--ttl", "30s", "--kill-grace", "1s"],
        &strs(&world.held_until("ready", "go", 0)),
    )));
    wait_until(PROMPT, "the holder's child to start", || {
        world.exists("ready")
    });
    let mut waiter = spawn_verbose(
        &world,
        1,
        &["--ttl", "10s"],
        &["touch", &world.path("waiter-ran")],
        "waiter.log",
    );
    wait_until(PROMPT, "the waiter to queue", || {
        world.contender_keys() == 2
    });
    let retries = || log_text(&world, "waiter.log").matches(" retry ").count();
    // The store down until the waiter has failed twice, then back until the
    // waiter has had an answer and blocks on the prefix again.
    let outage = |waiter: &mut std::process::Child| {
        let before = retries();
        double.set_down(true);
        wait_until(PROMPT, "the waiter to fail and retry", || {
            retries() >= before + 2 || waiter.try_wait().unwrap().is_some()
        });
        double.set_down(false);
        let back = Instant::now();
        wait_until(PROMPT, "the waiter to be answered again", || {
            waiter.try_wait().unwrap().is_some()
                || double.requests().iter().any(|r| {
                    r.at >= back
                        && r.query.iter().any(|(k, _)| k == "recurse")
                        && r.query.iter().any(|(k, v)| k == "index" && v != "0")
                })
        });
        assert!(
            waiter.try_wait().unwrap().is_none(),
            "the waiter gave up: {}",
            log_text(&world, "waiter.log")
        );
    };
    let first = Instant::now();
    outage(&mut waiter);
    wait_until(ttl * 2, "a TTL since the first outage began", || {
        first.elapsed() > ttl + Duration::from_millis(500)
    });
    outage(&mut waiter);
    world.touch("go");
    assert_eq!(holder.finish().status.code(), Some(0));
    let status = wait_with_deadline(&mut waiter, PROMPT, "the waiter to run");
    assert_eq!(status.code(), Some(0), "{}", log_text(&world, "waiter.log"));
    assert!(world.exists("waiter-ran"));
    world.assert_clean();
}

// ---- a killed consem ----------------------------------------------------

/// SIGKILL gives consem no chance to clean up. Its child must not outlive it
/// (the parent-death signal), and what it leaves in Consul is the session, its
/// contender key and `.lock` naming it. Once the TTL runs out (the double's
/// `expire_sessions_idle_for` stands in for the wait; against a real agent the
/// session is destroyed instead) the session's `delete` behaviour removes the
/// contender key, and only `.lock` naming the dead holder is left. The next
/// contender prunes that holder, takes the slot, and leaves the prefix clean.
#[cfg(target_os = "linux")]
#[test]
fn a_killed_consem_takes_its_child_along_and_the_next_contender_prunes_it() {
    let world = World::consul("parent-death");
    let mut consem = world.spawn(1, &[], &strs(&pid_then_sleep(&world, "pid")));
    let pid = read_pid(&world, "pid");
    let sessions = world.sessions();
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    let session = sessions[0].0.clone();

    signal(&consem, libc::SIGKILL);
    let status = consem.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    wait_until(PROMPT, "the orphaned child to die with consem", || {
        process_gone(pid)
    });

    // Nothing was cleaned up: the session lives on until its TTL runs out.
    assert_eq!(world.contender_keys(), 1);
    assert_eq!(
        lock_holders(&world.lock_value().unwrap()),
        std::slice::from_ref(&session)
    );

    match world.store.double() {
        Some(double) => assert_eq!(double.expire_sessions_idle_for(Duration::ZERO), 1),
        None => world.store.destroy_session(&session),
    }
    wait_until(PROMPT, "the contender key to go with the session", || {
        world.contender_keys() == 0
    });
    assert_eq!(world.sessions(), vec![]);
    let left: Vec<String> = world.entries().into_iter().map(|e| e.key).collect();
    assert_eq!(left, [world.key(".lock")], "only .lock is left");
    assert_eq!(
        lock_holders(&world.lock_value().unwrap()),
        [session],
        ".lock still names the dead holder"
    );

    let output = world.consem(1, &[], &["true"]).output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    world.assert_clean();
}

// ---- the session while holding ------------------------------------------

/// With expiry at exactly the TTL (the double's multiplier 1.0 instead of
/// Consul's up-to-2x), renewals every TTL/2 keep the slot: the child runs
/// across two renewals, i.e. past the TTL, and ends normally.
#[test]
fn renewal_keeps_the_slot_past_the_ttl() {
    let world = World::on_the_double("renewal");
    let double = world.the_double();
    double.set_ttl_multiplier(1.0);
    let holder = world.spawn(
        1,
        &["--ttl", "10s"],
        &strs(&world.held_until("ready", "go", 0)),
    );
    wait_until(PROMPT, "the child to start", || world.exists("ready"));
    let sessions = double.sessions();
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    let session = sessions[0].id.clone();
    assert_eq!(sessions[0].ttl, Some(Duration::from_secs(10)));

    // Renewals are due at about 5 s and 10 s; the second is past the TTL.
    wait_until(Duration::from_secs(25), "two renewals", || {
        let now = double.sessions();
        let ours = now
            .iter()
            .find(|s| s.id == session)
            .unwrap_or_else(|| panic!("the session expired: {now:?}"));
        ours.renewals >= 2
    });
    assert_eq!(lock_holders(&world.lock_value().unwrap()), [session]);
    world.touch("go");
    let output = finish(holder);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    world.assert_clean();
}

/// Consul invalidating every session (as after a lost node health check)
/// deletes our contender key; consem stops the child and exits 76.
#[test]
fn sessions_invalidated_while_holding_stop_the_child_with_76() {
    let world = World::on_the_double("invalidated");
    let double = world.the_double();
    let holder = world.spawn(
        1,
        &["--kill-grace", "1s"],
        &strs(&pid_then_sleep(&world, "pid")),
    );
    let pid = read_pid(&world, "pid");
    double.invalidate_all_sessions();
    let output = finish(holder);
    assert_eq!(output.status.code(), Some(76), "{}", stderr(&output));
    assert!(stderr(&output).contains("slot lost"), "{}", stderr(&output));
    assert!(process_gone(pid), "the child was stopped");
    world.assert_clean();
}

/// A restarted agent (the double's `restart`: connections dropped, sessions
/// and KV lost, index back to the start) takes the slot with it: the child is
/// stopped, consem exits 76, and nothing is left or recreated.
#[test]
fn agent_restart_while_holding_stops_the_child_with_76() {
    let world = World::on_the_double("restart-holding");
    let double = world.the_double();
    let holder = world.spawn(
        1,
        // A long TTL: the watch, not the renewer, must notice the restart.
        &["--ttl", "1h", "--kill-grace", "1s"],
        &strs(&pid_then_sleep(&world, "pid")),
    );
    let pid = read_pid(&world, "pid");
    // The watch starts once the command has: a restart before its first
    // query would leave that query blocking on an index the agent no longer
    // reaches (until the wait ends, a minute on), which is not what this
    // tests.
    let lock_key = format!("/v1/kv/{}", world.key(".lock"));
    wait_until(PROMPT, "the holder's watch of .lock", || {
        double
            .requests()
            .iter()
            .any(|r| r.method == "GET" && r.path == lock_key && r.query_value("index").is_some())
    });
    let started = Instant::now();
    double.restart();
    let output = finish(holder);
    assert!(
        started.elapsed() < PROMPT,
        "restart noticed after {:?}",
        started.elapsed()
    );
    assert_eq!(output.status.code(), Some(76), "{}", stderr(&output));
    assert!(stderr(&output).contains("slot lost"), "{}", stderr(&output));
    assert!(process_gone(pid), "the child was stopped");
    world.assert_clean();
}

// ---- the agent restarting while waiting ----------------------------------

/// A restart while one consem holds and another waits: the holder loses its
/// slot (76); the waiter's contender key is gone too, so it rejoins with a new
/// session, takes the free slot and runs its child.
#[test]
fn agent_restart_while_waiting_makes_the_waiter_rejoin_and_run() {
    let world = World::on_the_double("restart-waiting");
    let double = world.the_double();
    let holder = world.spawn(
        1,
        &["--ttl", "10s", "--kill-grace", "1s"],
        &strs(&world.held_until("ready", "go", 0)),
    );
    wait_until(PROMPT, "the holder's child to start", || {
        world.exists("ready")
    });
    let holder_session = double.sessions()[0].id.clone();
    let waiter = world.spawn(
        1,
        &["--ttl", "10s"],
        &["sh", "-c", "printf 'ran with %s' \"$CONSEM_SESSION\""],
    );
    wait_until(PROMPT, "the waiter's contender key", || {
        world.contender_keys() == 2
    });
    let old_sessions: Vec<String> = double.sessions().into_iter().map(|s| s.id).collect();
    assert_eq!(old_sessions.len(), 2);
    let waiter_session = old_sessions
        .iter()
        .find(|id| **id != holder_session)
        .unwrap()
        .clone();
    // Restart only once the waiter's blocking read is in flight: a read sent
    // after the restart with the old, higher index would block for the whole
    // wait on any Consul (the index went backwards), which is not what this
    // test is about.
    // The holder watches its own keys; only the waiter reads the prefix.
    let dir = format!("/v1/kv/{}/", world.prefix);
    wait_until(PROMPT, "the waiter's blocking read", || {
        let requests = double.requests();
        let joined = requests
            .iter()
            .rposition(|r| r.query_value("acquire") == Some(waiter_session.as_str()));
        joined.is_some_and(|at| {
            requests[at..].iter().any(|r| {
                r.method == "GET"
                    && r.path == dir
                    && r.query_value("index").is_some_and(|i| i != "0")
            })
        })
    });
    double.restart();

    let waiter = finish(waiter);
    assert_eq!(waiter.status.code(), Some(0), "{}", stderr(&waiter));
    let shown = String::from_utf8_lossy(&waiter.stdout).into_owned();
    let new_session = shown
        .strip_prefix("ran with ")
        .unwrap_or_else(|| panic!("the waiter's child did not run: {shown:?}"));
    assert_eq!(new_session.len(), 36, "{shown}");
    assert_ne!(new_session, waiter_session, "the waiter made a new session");
    assert_ne!(new_session, holder_session);

    let holder = finish(holder);
    assert_eq!(holder.status.code(), Some(76), "{}", stderr(&holder));
    world.assert_clean();
}

// ---- failures at first contact --------------------------------------------

/// A first contact that fails (500 on session create) is not retried: consem
/// exits 69 with one line saying why, and leaves nothing.
#[test]
fn server_errors_at_first_contact_exit_69_at_once() {
    let world = World::on_the_double("first-contact-500");
    let double = world.the_double();
    double.inject(
        Fault::status(500, "No cluster leader", 100)
            .on(Match::method_path("PUT", "/v1/session/create")),
    );
    let started = Instant::now();
    let output = world.consem(1, &[], &["true"]).output().unwrap();
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    assert!(started.elapsed() < PROMPT, "took {:?}", started.elapsed());
    let message = stderr(&output);
    assert_eq!(message.lines().count(), 1, "{message}");
    assert!(message.contains("No cluster leader"), "{message}");
    let creates = double
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/session/create")
        .count();
    assert_eq!(creates, 1, "no retry at first contact");
    world.assert_clean();
}

/// A Consul that never answers the first request must not hold consem
/// hostage: SIGTERM still ends it within seconds (143), well before the
/// request's own timeout, and no session exists since none was created.
#[test]
fn sigterm_during_a_stalled_first_request_exits_143_promptly() {
    let world = World::on_the_double("stalled-start");
    let double = world.the_double();
    double.inject(Fault::stall(1).on(Match::method_path("PUT", "/v1/session/create")));
    let mut consem = world.spawn(1, &[], &["true"]);
    wait_until(PROMPT, "the session request to arrive", || {
        double
            .requests()
            .iter()
            .any(|r| r.path == "/v1/session/create")
    });
    let started = Instant::now();
    signal(&consem, libc::SIGTERM);
    let status = wait_with_deadline(&mut consem, PROMPT, "consem to exit after SIGTERM");
    let took = started.elapsed();
    assert_eq!(status.signal(), Some(libc::SIGTERM));
    assert!(took < Duration::from_secs(3), "took {took:?}");
    world.assert_clean();
}

// ---- a terminal shared with the child --------------------------------------

/// On a terminal, the child becomes the foreground process group: it reads
/// what is typed, and Ctrl-C reaches it once (from the terminal; consem, in
/// the background, neither gets it nor passes it on). consem runs as the
/// session leader of a new pseudo-terminal, as in a login shell.
#[test]
fn an_interactive_child_owns_the_terminal() {
    let world = World::consul("pty");
    let script = "trap 'echo INT-TRAPPED' INT; echo ready; read line; echo \"got:$line\"; \
                  read line2; echo done";
    let (mut consem, mut terminal) =
        spawn_on_terminal(world.consem(1, &[], &["sh", "-c", script])).expect("a pseudo-terminal");
    let screen = terminal.screen.clone();

    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        screen.wait_for("ready");
        terminal.type_in(b"hello\n");
        screen.wait_for("got:hello");
        terminal.type_in(b"\x03");
        screen.wait_for("INT-TRAPPED");
        // Whether `read` resumes after the trap or returns depends on the
        // shell; a line ends it either way.
        terminal.type_in(b"bye\n");
        screen.wait_for("done");
        wait_with_deadline(&mut consem, PROMPT, "consem to exit")
    }));
    let status = match outcome {
        Ok(status) => status,
        Err(panic) => {
            let _ = consem.kill();
            let _ = consem.wait();
            eprintln!("terminal:\n{}", screen.text());
            std::panic::resume_unwind(panic);
        }
    };
    let shown = screen.text();
    assert_eq!(status.code(), Some(0), "terminal:\n{shown}");
    assert_eq!(
        shown.matches("INT-TRAPPED").count(),
        1,
        "one Ctrl-C, one SIGINT:\n{shown}"
    );
    assert!(!shown.contains("consem:"), "consem said nothing:\n{shown}");
    world.assert_clean();
}

// ---- --timeout 0 ----------------------------------------------------------

// ---- more signals while waiting -------------------------------------------

// ---- what the tests once missed ------------------------------------------

/// An answer whose index is lower than the one sent (here a restore that
/// renumbers every index, the state kept) makes a holder's watches start
/// over from 0: blocking on the old, higher index would hide the loss of
/// the slot for a whole blocking wait.
#[test]
fn a_watch_whose_index_goes_back_starts_over_and_still_sees_the_loss() {
    let world = World::on_the_double("index-back");
    let double = world.the_double();
    // Raise the raft index, so that the restore takes it far down.
    for i in 0..50 {
        double.put_raw(&world.key("noise/x"), i.to_string().as_bytes(), 0);
    }
    let lock_watches = || {
        double
            .requests()
            .iter()
            .filter(|r| r.path.ends_with("/.lock") && r.query.iter().any(|(k, _)| k == "index"))
            .count()
    };
    // A long TTL: the watch of .lock, not the renewer, must see the loss.
    let holder = world.spawn(
        1,
        &["--ttl", "1h", "--kill-grace", "1s"],
        &strs(&pid_then_sleep(&world, "pid")),
    );
    let pid = read_pid(&world, "pid");
    wait_until(PROMPT, "the holder to block on .lock", || {
        lock_watches() >= 1
    });
    let before = lock_watches();
    double.restore_with_lower_index();
    wait_until(
        PROMPT,
        "the holder's watch of .lock to read again after the restore",
        || lock_watches() > before,
    );
    // The operator takes the holder out of .lock; its session stays.
    world.store.put(
        &world.key(".lock"),
        br#"{"Limit":1,"Holders":{}}"#,
        SEMAPHORE_FLAGS,
    );
    let mut holder = holder;
    wait_with_deadline(
        &mut holder,
        PROMPT,
        "consem to see it was removed from .lock",
    );
    let output = finish(holder);
    assert_eq!(output.status.code(), Some(76), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("removed from the holders"),
        "{}",
        stderr(&output)
    );
    assert!(process_gone(pid), "the child was stopped");
}

/// Renewals that fail while reads still work: the slot's lease (the last
/// confirmed renewal plus 5/6 of the TTL) runs out, and the command is
/// stopped before it does, so before Consul may free the slot (one TTL
/// after that renewal at the earliest); consem says why. A renewal answered
/// 404 is a loss at once.
#[test]
fn renewals_failing_while_reads_work_end_in_76_within_the_lease() {
    let world = World::on_the_double("renew-fails");
    let double = world.the_double();
    for (fault, status, reason) in [
        (
            Fault::status(500, "renewal refused by the test", usize::MAX),
            "500",
            "no renewal of its lease was confirmed in time",
        ),
        // A stalled agent: renewals that never get an answer.
        (
            Fault::stall(usize::MAX),
            "nothing",
            "no renewal of its lease was confirmed in time",
        ),
        (
            Fault::status(404, "renewal refused by the test", usize::MAX),
            "404",
            "Consul invalidated our session (renewal answered 404)",
        ),
    ] {
        double.clear_faults();
        double.inject(fault.on(Match::method_path("PUT", "/v1/session/renew/")));
        let started = Instant::now();
        let mut holder = world.spawn(
            1,
            &["--ttl", "10s", "--kill-grace", "1s"],
            &strs(&pid_then_sleep(&world, "pid")),
        );
        let pid = read_pid(&world, "pid");
        // consem itself must act: its watchdog, which would act at the
        // same moment, is frozen until the command is gone.
        let watchdog = children_besides(&holder, pid);
        assert_eq!(watchdog.len(), 1, "one watchdog: {watchdog:?}");
        // SAFETY: kill(2) on this test's consem's watchdog.
        unsafe { libc::kill(watchdog[0], libc::SIGSTOP) };
        wait_until(
            Duration::from_secs(30),
            "consem to stop its command",
            || process_gone(pid),
        );
        // SAFETY: as above.
        unsafe { libc::kill(watchdog[0], libc::SIGCONT) };
        // Stopped before the session's TTL could run out on the server.
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "renewals answered {status}: the command ran {:?}",
            started.elapsed()
        );
        wait_with_deadline(
            &mut holder,
            Duration::from_secs(30),
            "consem to give up on its renewals",
        );
        let output = finish(holder);
        assert_eq!(output.status.code(), Some(76), "{}", stderr(&output));
        let text = stderr(&output);
        assert!(text.contains(reason), "renewals answered {status}: {text}");
        std::fs::remove_file(world.path("pid")).unwrap();
        double.clear_faults();
        world.assert_clean();
    }
}

// ---- the lease: the command never runs past it ----------------------------

/// A child that writes the time (ns since the epoch) to `name` every 50 ms,
/// ignoring SIGTERM, so that when it stopped can be read afterwards.
fn heartbeat(world: &World<TestConsul>, name: &str, pid: &str) -> Vec<String> {
    let script = format!(
        "trap '' TERM; echo $$ > '{}'; while :; do date +%s%N > '{}.new' && mv '{}.new' '{}'; sleep 0.05; done",
        world.path(pid),
        world.path(name),
        world.path(name),
        world.path(name)
    );
    vec!["sh".into(), "-c".into(), script]
}

fn epoch_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn last_beat(world: &World<TestConsul>, name: &str) -> u128 {
    std::fs::read_to_string(world.path(name))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// consem frozen (SIGSTOP) while its command runs: it cannot renew, but the
/// watchdog stops the command's group before Consul may free the slot (one
/// TTL after the last renewal at the earliest), so the next holder never
/// runs beside it; the thawed consem exits 76.
#[test]
fn a_frozen_consem_s_command_is_stopped_within_the_lease() {
    let world = World::on_the_double("frozen");
    let double = world.the_double();
    // Sessions expire at their TTL, the earliest Consul may.
    double.set_ttl_multiplier(1.0);
    let spawned = epoch_ns();
    let holder = world.spawn(
        1,
        &["--ttl", "10s", "--kill-grace", "1s"],
        &strs(&heartbeat(&world, "beat", "pid")),
    );
    let pid = read_pid(&world, "pid");
    signal(&holder, libc::SIGSTOP);
    let waiter = world.spawn(
        1,
        &[],
        &[
            "sh",
            "-c",
            &format!("date +%s%N > '{}'", world.path("next")),
        ],
    );
    // The shell creates the file before `date` writes its line.
    wait_until(Duration::from_secs(30), "the next holder to run", || {
        std::fs::read_to_string(world.path("next")).is_ok_and(|s| s.ends_with('\n'))
    });
    assert!(process_gone(pid), "the frozen consem's command still runs");
    let next_started: u128 = std::fs::read_to_string(world.path("next"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let last = last_beat(&world, "beat");
    assert!(last < next_started, "the two commands overlapped");
    assert!(
        last < spawned + 10_000_000_000,
        "the command ran {} ms past the start, beyond the TTL",
        (last - spawned) / 1_000_000
    );
    signal(&holder, libc::SIGCONT);
    let output = finish(holder);
    assert_eq!(output.status.code(), Some(76), "{}", stderr(&output));
    assert_eq!(finish(waiter).status.code(), Some(0));
    world.assert_clean();
}

/// The command ends by itself while consem is frozen past the lease: the
/// slot may have gone to another command meanwhile, so the run is no
/// success: 76, with a message.
#[test]
fn a_command_that_ends_while_consem_is_frozen_past_the_lease_is_no_success() {
    let world = World::on_the_double("frozen-end");
    let script = format!("echo $$ > '{}'; sleep 1", world.path("pid"));
    let holder = world.spawn(
        1,
        &["--ttl", "10s", "--kill-grace", "1s"],
        &["sh", "-c", &script],
    );
    let pid = read_pid(&world, "pid");
    signal(&holder, libc::SIGSTOP);
    wait_until(PROMPT, "the command to end by itself", || process_gone(pid));
    // Past the lease: 5/6 of the TTL after the session was made.
    std::thread::sleep(Duration::from_secs(9));
    signal(&holder, libc::SIGCONT);
    let output = finish(holder);
    assert_eq!(output.status.code(), Some(76), "{}", stderr(&output));
    // Whichever consem sees first once thawed, the command's end or the
    // lease's, it says the slot was lost.
    assert!(stderr(&output).contains("slot lost"), "{}", stderr(&output));
    world.assert_clean();
}

/// Ctrl-Z for longer than the lease: consem stops the command with itself,
/// and once continued it finds the lease gone: the command is not
/// continued into a lost slot (the watchdog ended it within the lease), and
/// consem exits 76.
#[test]
fn a_stop_past_the_lease_is_never_resumed_into_a_lost_slot() {
    let world = World::on_the_double("long-stop");
    let spawned = epoch_ns();
    let holder = world.spawn(
        1,
        &["-v", "--ttl", "10s", "--kill-grace", "1s"],
        &strs(&heartbeat(&world, "beat", "pid")),
    );
    let pid = read_pid(&world, "pid");
    // A command stopped before its first beat would leave nothing to read.
    wait_until(PROMPT, "the command's first beat", || world.exists("beat"));
    // consem itself must refuse to continue the command: its watchdog,
    // which would end the command at the lease's stop point, is frozen
    // until the command is gone.
    let watchdog = children_besides(&holder, pid);
    assert_eq!(watchdog.len(), 1, "one watchdog: {watchdog:?}");
    // SAFETY: kill(2) on this test's consem's watchdog.
    unsafe { libc::kill(watchdog[0], libc::SIGSTOP) };
    signal(&holder, libc::SIGTSTP);
    wait_until(PROMPT, "the command to be stopped", || is_stopped(pid));
    std::thread::sleep(Duration::from_secs(10));
    signal(&holder, libc::SIGCONT);
    let deadline = Instant::now() + PROMPT;
    while !process_gone(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let gone = process_gone(pid);
    // SAFETY: as above.
    unsafe { libc::kill(watchdog[0], libc::SIGCONT) };
    assert!(gone, "consem continued its command into a lost slot");
    let output = finish(holder);
    assert_eq!(output.status.code(), Some(76), "{}", stderr(&output));
    // Not even for a moment: consem continued nothing.
    assert!(
        !stderr(&output).contains(" continued "),
        "{}",
        stderr(&output)
    );
    assert!(process_gone(pid));
    let last = last_beat(&world, "beat");
    assert!(
        last < spawned + 10_000_000_000,
        "the command ran {} ms past the start, beyond the TTL",
        (last - spawned) / 1_000_000
    );
    world.assert_clean();
}

/// A waiter frozen (SIGSTOP) past its renewals, and handed a slot meanwhile,
/// wins it with a single read when continued: it renews before the command
/// starts, so the command runs to its end instead of being stopped by a
/// lease that ran out while it waited.
#[test]
fn a_waiter_continued_after_its_renewals_lapsed_starts_on_a_fresh_lease() {
    let world = World::on_the_double("stopped-heir");
    let double = world.the_double();
    let holder = hold_slot(&world, 1, "held", "leave");
    let script = format!("echo ran > '{}'; sleep 1", world.path("ran"));
    let waiter = world.spawn(1, &["--ttl", "10s", "-v"], &["sh", "-c", &script]);
    wait_until(PROMPT, "the waiter to join", || world.contender_keys() == 2);
    signal(&waiter, libc::SIGSTOP);
    let stopped = Instant::now();
    // The renewer's next renewal is slow to answer, so that the slot is
    // won before it: what starts the command must not be the stale lease.
    double.inject(
        Fault::delay(Duration::from_secs(2), 1).on(Match::method_path("PUT", "/v1/session/renew")),
    );
    world.touch("leave");
    assert_eq!(finish(holder).status.code(), Some(0));
    // The scenario itself, not a guess at timing: the waiter stays frozen
    // past its lease (5/6 of the TTL after its last renewal), well within
    // the 2×TTL that Consul keeps its session.
    std::thread::sleep(Duration::from_secs(10).saturating_sub(stopped.elapsed()));
    signal(&waiter, libc::SIGCONT);
    let output = finish(waiter);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(world.exists("ran"), "{}", stderr(&output));
    world.assert_clean();
}
