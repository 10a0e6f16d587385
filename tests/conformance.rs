//! The conformance suite: every behaviour that does not depend on the store,
//! stated once and run on every store (`consul::<test>` against the Consul
//! double, or a real agent with CONSEM_TEST_CONSUL_ADDR; `local::<test>`
//! against the local store in a scratch directory; `redis::<test>` against
//! a redis-server of the test's own; `etcd::<test>` against an etcd of the
//! test's own; `redis_cluster::<test>` and `redis_sentinel::<test>` the
//! core of it on a Redis Cluster, or a primary, replica and Sentinels, of
//! the test's own). The real binary runs in each. Store-specific behaviour is
//! tested beside its store.

use std::io::Read as _;
use std::os::unix::process::ExitStatusExt as _;
use std::process::{Child, Output};
use std::time::{Duration, Instant};

use crate::common::world::*;
use crate::common::{unique_prefix, wait_until};

/// Each test takes the way to make a world on one store.
type MakeWorld<S> = fn(&str) -> World<S>;

macro_rules! on_every_store {
    ($($test:ident),* $(,)?) => {
        mod consul {
            $( #[test] fn $test() { super::$test(super::World::consul) } )*
        }
        mod local {
            $( #[test] fn $test() { super::$test(super::World::local) } )*
        }
        mod redis {
            $( #[test] fn $test() { super::$test(super::World::redis) } )*
        }
        mod etcd {
            $( #[test] fn $test() { super::$test(super::World::etcd) } )*
        }
        mod postgres {
            $( #[test] fn $test() { super::$test(super::World::postgres) } )*
        }
        mod zookeeper {
            $( #[test] fn $test() { super::$test(super::World::zookeeper) } )*
        }
    };
}

on_every_store!(
    uncontended_run_leaves_stdout_to_the_child_and_cleans_up,
    exit_codes_pass_through,
    argv_is_passed_exactly_without_a_shell,
    descriptors_the_parent_closed_stay_closed_for_the_command,
    child_sees_its_slot_in_the_environment,
    fence_grows_from_one_acquisition_to_the_next,
    eight_contenders_never_exceed_the_limit,
    waiters_get_their_slot_in_order_of_arrival,
    try_and_timeout_give_up_with_75_or_the_chosen_code,
    timeout_0_takes_a_free_slot,
    timeout_0_exits_75_at_once_when_full,
    a_short_timeout_takes_a_free_slot_and_gives_up_on_a_full_one,
    a_signal_while_waiting_ends_the_wait_promptly,
    user_signals_while_waiting_are_ignored,
    a_signal_while_running_goes_to_the_child_and_its_status_comes_back,
    signals_the_parent_ignored_stay_ignored_for_consem_and_the_command,
    a_lost_slot_stops_the_command_and_its_background_jobs_with_76,
    commands_that_cannot_run_exit_126_or_127_and_release,
    odd_prefixes_work_and_clean_up,
    prefixes_with_control_characters_or_too_long_are_usage_errors,
    another_limit_is_a_conflict_while_the_semaphore_is_in_use,
    status_of_an_unused_prefix_says_it_is_idle,
    status_lists_every_semaphore_under_a_root,
    status_shows_holders_and_waiters,
    release_by_session_stops_the_holder_with_76,
    release_by_host_and_pid_frees_the_slot_for_a_waiter,
    release_says_when_nothing_or_several_match,
    reset_refuses_while_held_and_force_evicts_first,
    a_killed_consem_takes_its_whole_group_along,
    a_killed_watchdog_is_replaced_and_still_takes_the_group_along,
    what_the_command_leaves_running_is_stopped_before_the_slot_goes,
    wait_group_keeps_the_slot_until_the_group_is_done,
    a_freed_slot_wakes_its_waiter_at_once_all_down_the_queue,
    an_operator_s_release_stops_the_holder_at_once_not_at_its_next_renewal,
);

/// Behaviours of the stores whose grant can reach consem after the lease
/// it gives has run out: Consul and Redis grant in the answer to a write.
/// The local store's slot lasts as long as consem lives, and an etcd
/// waiter reads and watches only within TTL/3 of its last confirmed
/// keep-alive (a keep-alive that fails is retried before it reads again),
/// so that a grant it reads leaves at least a second of its lease before
/// the stop point; the supervisor's check is the same on every store.
macro_rules! on_every_store_granting_in_an_answer {
    ($($test:ident),* $(,)?) => {
        mod answered_consul {
            $( #[test] fn $test() { super::$test(super::World::consul) } )*
        }
        mod answered_redis {
            $( #[test] fn $test() { super::$test(super::World::redis) } )*
        }
    };
}

on_every_store_granting_in_an_answer!(
    a_grant_that_arrives_after_its_lease_starts_nothing_unconfirmed
);

/// Behaviours of the stores whose slot outlives consem until a lease runs
/// out on the server (Consul's session, a Redis permit, an etcd lease).
macro_rules! on_every_store_with_a_lease {
    ($($test:ident),* $(,)?) => {
        mod leased_consul {
            $( #[test] fn $test() { super::$test(super::World::consul) } )*
        }
        mod leased_redis {
            $( #[test] fn $test() { super::$test(super::World::redis) } )*
        }
        mod leased_etcd {
            $( #[test] fn $test() { super::$test(super::World::etcd) } )*
        }
        mod leased_zookeeper {
            $( #[test] fn $test() { super::$test(super::World::zookeeper) } )*
        }
    };
}

on_every_store_with_a_lease!(a_slot_s_lease_on_the_server_is_the_ttl_15s_by_default);

/// Behaviours of the stores with a lease of seconds: Consul's is 10 s at
/// least, and its session may outlive that twice over, so that waiting for
/// it costs half a minute a test; Consul's server, not consem, extends it.
macro_rules! on_every_store_with_a_short_lease {
    ($($test:ident),* $(,)?) => {
        mod short_redis {
            $( #[test] fn $test() { super::$test(super::World::redis) } )*
        }
        mod short_etcd {
            $( #[test] fn $test() { super::$test(super::World::etcd) } )*
        }
        mod short_zookeeper {
            $( #[test] fn $test() { super::$test(super::World::zookeeper) } )*
        }
    };
}

on_every_store_with_a_short_lease!(a_killed_holder_s_slot_comes_back_within_its_ttl_after_renewals);

/// The core behaviours again on Redis Cluster (three primaries), consem
/// pointed at a node that does not serve the prefix's slot.
macro_rules! on_redis_cluster {
    ($($test:ident),* $(,)?) => {
        mod redis_cluster {
            $( #[test] fn $test() { super::$test(super::World::redis_cluster) } )*
        }
    };
}

on_redis_cluster!(
    uncontended_run_leaves_stdout_to_the_child_and_cleans_up,
    fence_grows_from_one_acquisition_to_the_next,
    eight_contenders_never_exceed_the_limit,
    waiters_get_their_slot_in_order_of_arrival,
    timeout_0_exits_75_at_once_when_full,
    a_signal_while_waiting_ends_the_wait_promptly,
    a_lost_slot_stops_the_command_and_its_background_jobs_with_76,
    status_shows_holders_and_waiters,
    status_lists_every_semaphore_under_a_root,
    reset_refuses_while_held_and_force_evicts_first,
    a_freed_slot_wakes_its_waiter_at_once_all_down_the_queue,
);

/// The core behaviours again on the primary that Redis Sentinel names.
macro_rules! on_redis_sentinel {
    ($($test:ident),* $(,)?) => {
        mod redis_sentinel {
            $( #[test] fn $test() { super::$test(super::World::redis_sentinel) } )*
        }
    };
}

on_redis_sentinel!(
    uncontended_run_leaves_stdout_to_the_child_and_cleans_up,
    eight_contenders_never_exceed_the_limit,
    waiters_get_their_slot_in_order_of_arrival,
    a_lost_slot_stops_the_command_and_its_background_jobs_with_76,
    status_shows_holders_and_waiters,
    status_lists_every_semaphore_under_a_root,
);

fn output<S: TestStore>(world: &World<S>, limit: u32, extra: &[&str], command: &[&str]) -> Output {
    let child = world.spawn(limit, extra, command);
    finish_within(child, "consem to exit")
}

/// Waits for `child` (killed if it passes the deadline) and collects its
/// output.
fn finish_within(mut child: Child, what: &str) -> Output {
    wait_with_deadline(&mut child, Duration::from_secs(60), what);
    child.wait_with_output().unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn admin<S: TestStore>(world: &World<S>, sub: &str, extra: &[&str]) -> Output {
    let child = world
        .admin(sub, extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    finish_within(child, &format!("consem {sub} to exit"))
}

fn status_json<S: TestStore>(world: &World<S>) -> (Option<i32>, serde_json::Value) {
    let output = admin(world, "status", &["--json"]);
    let json = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}{}", stdout(&output), stderr(&output)));
    (output.status.code(), json)
}

fn uncontended_run_leaves_stdout_to_the_child_and_cleans_up<S: TestStore>(make: MakeWorld<S>) {
    let world = make("uncontended");
    let output = output(&world, 2, &[], &["printf", "hello\\n"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(output.stdout, b"hello\n");
    assert_eq!(stderr(&output), "", "consem is quiet by default");
    world.assert_clean();
}

fn exit_codes_pass_through<S: TestStore>(make: MakeWorld<S>) {
    let world = make("exit-codes");
    let code = |script: &str| output(&world, 1, &[], &["sh", "-c", script]).status.code();
    assert_eq!(code("exit 7"), Some(7));
    assert_eq!(code("exit 0"), Some(0));
    // A command that dies of a signal: consem cleans up, then dies of the
    // same signal, so that the shell sees what it would without consem.
    let signalled = |script: &str| {
        output(&world, 1, &[], &["sh", "-c", script])
            .status
            .signal()
    };
    assert_eq!(signalled("kill -TERM $$"), Some(libc::SIGTERM));
    assert_eq!(signalled("kill -KILL $$"), Some(libc::SIGKILL));
    assert_eq!(signalled("kill -INT $$"), Some(libc::SIGINT));
    world.assert_clean();
}

fn argv_is_passed_exactly_without_a_shell<S: TestStore>(make: MakeWorld<S>) {
    let world = make("argv");
    let output = output(
        &world,
        1,
        &[],
        &["printf", "[%s]", "a b", "", "$HOME", "*", "c\"d"],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "[a b][][$HOME][*][c\"d]");
    world.assert_clean();
}

/// `cmd <&- >&-` under consem sees what it sees without consem: closed
/// descriptors, not /dev/null (which a write to would silently swallow).
fn descriptors_the_parent_closed_stay_closed_for_the_command<S: TestStore>(make: MakeWorld<S>) {
    use std::os::unix::process::CommandExt as _;
    let world = make("closed-fds");
    let script = "for fd in 0 1; do if [ -e /proc/self/fd/$fd ]; then echo \"$fd open\" >&2; else echo \"$fd closed\" >&2; fi; done";
    let mut command = world.consem(1, &[], &["sh", "-c", script]);
    command.stderr(std::process::Stdio::piped());
    // SAFETY: close(2) is async-signal-safe; the closure allocates nothing.
    unsafe {
        command.pre_exec(|| {
            libc::close(0);
            libc::close(1);
            Ok(())
        });
    }
    let closed = finish_within(command.spawn().unwrap(), "consem to exit");
    assert_eq!(closed.status.code(), Some(0), "{}", stderr(&closed));
    assert_eq!(stderr(&closed), "0 closed\n1 closed\n");
    // Open ones are passed as they are.
    let open = output(&world, 1, &[], &["sh", "-c", script]);
    assert_eq!(stderr(&open), "0 open\n1 open\n");
    world.assert_clean();
}

fn child_sees_its_slot_in_the_environment<S: TestStore>(make: MakeWorld<S>) {
    let world = make("env");
    let script = r#"printf '%s|%s|%s' "$CONSEM_PREFIX" "$CONSEM_LIMIT" "$CONSEM_FENCE""#;
    let output = output(&world, 3, &[], &["sh", "-c", script]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = stdout(&output);
    let fields: Vec<&str> = text.split('|').collect();
    assert_eq!(fields[..2], [world.prefix.as_str(), "3"]);
    assert!(fields[2].parse::<u64>().unwrap() > 0, "a fence: {text}");
    world.assert_clean();
}

fn fence_grows_from_one_acquisition_to_the_next<S: TestStore>(make: MakeWorld<S>) {
    let world = make("fence");
    let fences: Vec<u64> = (0..50)
        .map(|_| {
            let output = output(&world, 1, &[], &["sh", "-c", "printf %s \"$CONSEM_FENCE\""]);
            assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
            stdout(&output).parse().unwrap()
        })
        .collect();
    assert!(
        fences.windows(2).all(|w| w[1] > w[0]),
        "fences must grow: {fences:?}"
    );
    world.assert_clean();
}

fn eight_contenders_never_exceed_the_limit<S: TestStore>(make: MakeWorld<S>) {
    let world = make("eight");
    let log = world.path("log");
    let script = format!("echo start >> '{log}'; sleep 0.3; echo end >> '{log}'");
    let children: Vec<Child> = (0..8)
        .map(|_| world.spawn(3, &[], &["sh", "-c", &script]))
        .collect();
    for child in children {
        let output = finish_within(child, "a contender to run and exit");
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    }
    let log = std::fs::read_to_string(&log).unwrap();
    let (starts, most) = starts_and_most_at_once(&log);
    assert_eq!(starts, 8, "every contender ran:\n{log}");
    assert!(most <= 3, "{most} ran at once:\n{log}");
    world.assert_clean();
}

fn waiters_get_their_slot_in_order_of_arrival<S: TestStore>(make: MakeWorld<S>) {
    let world = make("fifo");
    let holder = hold_slot(&world, 1, "ready", "go");
    let log = world.path("order");
    let mut waiters = Vec::new();
    for position in 0..8 {
        let script = format!("echo {position} >> '{log}'");
        waiters.push(world.spawn(1, &[], &["sh", "-c", &script]));
        // The next one arrives only once this one is in the queue.
        wait_until(PROMPT, "the waiter to join the queue", || {
            world.contender_keys() == position + 2
        });
    }
    world.touch("go");
    assert_eq!(finish(holder).status.code(), Some(0));
    for waiter in waiters {
        let output = finish_within(waiter, "a waiter to run and exit");
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    }
    let order = std::fs::read_to_string(&log).unwrap();
    let expected: String = (0..8).map(|p| format!("{p}\n")).collect();
    assert_eq!(order, expected, "slots went out of arrival order");
    world.assert_clean();
}

fn try_and_timeout_give_up_with_75_or_the_chosen_code<S: TestStore>(make: MakeWorld<S>) {
    let world = make("try-timeout");
    let holder = hold_slot(&world, 1, "ready", "go");

    let started = Instant::now();
    let given_up = output(&world, 1, &["--try"], &["true"]);
    assert_eq!(given_up.status.code(), Some(75), "{}", stderr(&given_up));
    assert!(started.elapsed() < PROMPT);
    // Quiet, so that cron does not mail every round it skips.
    assert_eq!(stderr(&given_up), "");

    let given_up = output(&world, 1, &["--try", "-E", "3"], &["true"]);
    assert_eq!(given_up.status.code(), Some(3));

    // `-v` says why, and leaves a place in the queue, not a slot it never
    // held.
    let given_up = output(&world, 1, &["--try", "-v"], &["true"]);
    assert_eq!(given_up.status.code(), Some(75), "{}", stderr(&given_up));
    let log = stderr(&given_up);
    let said = format!("consem: no free slot at {}: 1/1 held", world.prefix);
    assert_eq!(
        log.lines().filter(|line| line.starts_with(&said)).count(),
        1,
        "{log}"
    );
    assert!(!log.contains(" released "), "{log}");

    let started = Instant::now();
    let given_up = output(&world, 1, &["--timeout", "2s"], &["true"]);
    let waited = started.elapsed();
    assert_eq!(given_up.status.code(), Some(75), "{}", stderr(&given_up));
    assert!(
        waited >= Duration::from_secs(2),
        "gave up early, after {waited:?}"
    );
    assert_eq!(world.contender_keys(), 1, "only the holder is left");
    // One line says what it waited for and who held the slot: the holder
    // by its host and pid where the store keeps contenders' descriptions.
    let log = stderr(&given_up);
    let said = format!(
        "consem: timed out after 2s waiting for a slot at {}: 1/1 held",
        world.prefix
    );
    assert!(
        log.starts_with(&said) && log.ends_with(", next in line\n") && log.lines().count() == 1,
        "{log}"
    );
    if log.contains('(') {
        assert!(
            log.contains(&format!(" pid {}, started ", holder.id())),
            "{log}"
        );
    }

    world.touch("go");
    assert_eq!(finish(holder).status.code(), Some(0));
    world.assert_clean();
}

/// `--timeout 0` makes one attempt, as `--try` does: a free slot is taken.
fn timeout_0_takes_a_free_slot<S: TestStore>(make: MakeWorld<S>) {
    let world = make("timeout-0-free");
    let output = output(&world, 1, &["--timeout", "0"], &["printf", "ran"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(output.stdout, b"ran");
    world.assert_clean();
}

/// `--timeout 0` on a full semaphore gives up at once with 75, without
/// announcing a wait or timing one out, and leaves no trace.
fn timeout_0_exits_75_at_once_when_full<S: TestStore>(make: MakeWorld<S>) {
    let world = make("timeout-0-full");
    let holder = hold_slot(&world, 1, "ready", "go");
    let started = Instant::now();
    let output = output(&world, 1, &["-v", "--timeout", "0"], &["true"]);
    assert_eq!(output.status.code(), Some(75), "{}", stderr(&output));
    assert!(started.elapsed() < PROMPT, "took {:?}", started.elapsed());
    let log = stderr(&output);
    assert!(!log.contains(" waiting"), "{log}");
    assert!(!log.contains(" timed-out"), "{log}");
    assert_eq!(world.contender_keys(), 1, "only the holder is left");
    world.touch("go");
    assert_eq!(finish(holder).status.code(), Some(0));
    world.assert_clean();
}

/// A timeout bounds the wait, not the first attempt: `--timeout 1ms`
/// takes a free slot however long the store takes to answer, and on a full
/// semaphore gives up once the store has said so.
fn a_short_timeout_takes_a_free_slot_and_gives_up_on_a_full_one<S: TestStore>(make: MakeWorld<S>) {
    let world = make("timeout-short");
    for _ in 0..3 {
        let output = output(&world, 1, &["-v", "--timeout", "1ms"], &["printf", "ran"]);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        assert_eq!(output.stdout, b"ran");
        // A slot held is released; its command's end said plainly.
        let log = stderr(&output);
        assert!(log.contains(" exited code=0\n"), "{log}");
        assert!(log.contains(" released prefix="), "{log}");
        assert!(!log.contains(" left-queue "), "{log}");
    }
    let holder = hold_slot(&world, 1, "ready", "go");
    let output_v = output(&world, 1, &["-v", "--timeout", "1ms"], &["true"]);
    assert_eq!(output_v.status.code(), Some(75), "{}", stderr(&output_v));
    let log = stderr(&output_v);
    assert!(log.contains(" timed-out"), "{log}");
    assert!(log.contains(" left-queue prefix="), "{log}");
    assert!(!log.contains(" released "), "{log}");
    assert!(
        log.contains("consem: timed out after 1ms waiting for a slot at "),
        "{log}"
    );
    // `-q` leaves the line out.
    let quiet = output(&world, 1, &["-q", "--timeout", "1ms"], &["true"]);
    assert_eq!(quiet.status.code(), Some(75), "{}", stderr(&quiet));
    assert_eq!(stderr(&quiet), "");
    world.touch("go");
    assert_eq!(finish(holder).status.code(), Some(0));
    world.assert_clean();
}

fn a_signal_while_waiting_ends_the_wait_promptly<S: TestStore>(make: MakeWorld<S>) {
    // consem leaves, then dies of the signal (a shell's loop stops at it).
    for sig in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGALRM,
    ] {
        let world = make(&format!("signal-waiting-{sig}"));
        let holder = hold_slot(&world, 1, "ready", "go");
        let waiter = world.spawn(1, &["-v"], &["touch", &world.path("waiter-ran")]);
        wait_until(PROMPT, "the waiter to join the queue", || {
            world.contender_keys() == 2
        });
        let started = Instant::now();
        signal(&waiter, sig);
        let output = finish_within(waiter, "the waiter to give up");
        assert_eq!(output.status.signal(), Some(sig), "{}", stderr(&output));
        let log = stderr(&output);
        let after = &log[log.find(" interrupted ").expect("an interrupted event")..];
        assert!(
            !after.contains(" rejoining "),
            "nothing after leaving: {log}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "took {:?}",
            started.elapsed()
        );
        assert!(
            !world.exists("waiter-ran"),
            "the command ran without a slot"
        );
        assert_eq!(world.contender_keys(), 1, "the waiter left the queue");
        world.touch("go");
        assert_eq!(finish(holder).status.code(), Some(0));
        world.assert_clean();
    }
}

/// SIGUSR1 and SIGUSR2 do not end a wait: consem notes them (with -v) and
/// keeps waiting, then runs its command once the holder is done.
fn user_signals_while_waiting_are_ignored<S: TestStore>(make: MakeWorld<S>) {
    let world = make("sigusr-waiting");
    let holder = hold_slot(&world, 1, "ready", "go");
    let mut waiter = spawn_verbose(&world, 1, &[], &["printf", "ran"], "waiter.log");
    wait_until(PROMPT, "the waiter to wait", || {
        log_text(&world, "waiter.log").contains(" waiting ")
    });
    for sig in [libc::SIGUSR1, libc::SIGUSR2] {
        signal(&waiter, sig);
        let noted = format!(" signal-ignored signal={sig}\n");
        wait_until(PROMPT, &format!("consem to note signal {sig}"), || {
            log_text(&world, "waiter.log").contains(&noted)
        });
    }
    assert!(waiter.try_wait().unwrap().is_none(), "still waiting");
    assert_eq!(world.contender_keys(), 2, "still in the queue");

    world.touch("go");
    assert_eq!(finish(holder).status.code(), Some(0));
    let status = wait_with_deadline(&mut waiter, PROMPT, "the waiter to run and exit");
    let mut out = String::new();
    waiter
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert_eq!(status.code(), Some(0), "{}", log_text(&world, "waiter.log"));
    assert_eq!(out, "ran");
    world.assert_clean();
}

fn a_signal_while_running_goes_to_the_child_and_its_status_comes_back<S: TestStore>(
    make: MakeWorld<S>,
) {
    let world = make("signal-running");
    let script = format!(
        "trap 'echo got-term > \"{}\"; exit 3' TERM; touch '{}'; while :; do sleep 0.02; done",
        world.path("trapped"),
        world.path("ready")
    );
    let child = world.spawn(1, &[], &["sh", "-c", &script]);
    wait_until(PROMPT, "the child to start", || world.exists("ready"));
    signal(&child, libc::SIGTERM);
    let output = finish_within(child, "consem to pass the child's status on");
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    assert!(world.exists("trapped"), "the child received SIGTERM");
    world.assert_clean();
}

/// `nohup`, `trap ''` and a shell's background jobs leave signals ignored:
/// consem does not catch them, so SIGHUP (a terminal closing) neither ends
/// it nor reaches the command, and the command starts with them ignored.
fn signals_the_parent_ignored_stay_ignored_for_consem_and_the_command<S: TestStore>(
    make: MakeWorld<S>,
) {
    use std::os::unix::process::CommandExt as _;
    let world = make("inherited-ignored");
    let script = format!(
        "grep SigIgn /proc/self/status > '{}'; touch '{}'; while [ ! -e '{}' ]; do sleep 0.02; done",
        world.path("sigign"),
        world.path("ready"),
        world.path("go")
    );
    let mut command = world.consem(1, &[], &["sh", "-c", &script]);
    // SAFETY: signal(2) is async-signal-safe; the closure allocates nothing.
    unsafe {
        command.pre_exec(|| {
            for signal in [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT] {
                libc::signal(signal, libc::SIG_IGN);
            }
            Ok(())
        });
    }
    let holder = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(PROMPT, "the command to start", || world.exists("ready"));
    let line = std::fs::read_to_string(world.path("sigign")).unwrap();
    let mask = u64::from_str_radix(line.trim().trim_start_matches("SigIgn:").trim(), 16).unwrap();
    for signal in [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT] {
        assert_ne!(
            mask & (1 << (signal - 1)),
            0,
            "signal {signal} ignored: {line}"
        );
    }
    signal(&holder, libc::SIGHUP);
    signal(&holder, libc::SIGINT);
    world.touch("go");
    let output = finish_within(holder, "consem to pass the command's status on");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    world.assert_clean();
}

/// An operator frees the slot (`consem release`): the holder stops its
/// command's whole process group, a job started in the background too,
/// and exits 76; the slot goes to the waiter.
fn a_lost_slot_stops_the_command_and_its_background_jobs_with_76<S: TestStore>(make: MakeWorld<S>) {
    let world = make("slot-lost");
    let script = format!(
        // The job's output goes elsewhere: were it to survive, it must not
        // hold the test's pipes open (the test says what it waited for).
        "sleep 300 > /dev/null 2>&1 & echo $! > '{}'; echo $$ > '{}'; wait",
        world.path("background"),
        world.path("pid")
    );
    let holder = world.spawn(1, &["--kill-grace", "1s"], &["sh", "-c", &script]);
    let shell = read_pid(&world, "pid");
    let background = read_pid(&world, "background");
    let waiter = world.spawn(1, &[], &["true"]);
    wait_until(PROMPT, "the waiter to join the queue", || {
        world.contender_keys() == 2
    });
    let host = status_json(&world).1["holders"][0]["host"]
        .as_str()
        .unwrap()
        .to_string();
    let released = admin(
        &world,
        "release",
        &["--host", &host, "--pid", &holder.id().to_string()],
    );
    assert_eq!(released.status.code(), Some(0), "{}", stderr(&released));
    let output = finish_within(holder, "the holder to stop its command");
    assert_eq!(output.status.code(), Some(76), "{}", stderr(&output));
    assert!(stderr(&output).contains("slot lost"), "{}", stderr(&output));
    wait_until(PROMPT, "the command's shell to be gone", || {
        process_gone(shell)
    });
    wait_until(
        PROMPT,
        "the job it started in the background to be gone",
        || process_gone(background),
    );
    let output = finish_within(waiter, "the waiter to run");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    world.assert_clean();
}

fn commands_that_cannot_run_exit_126_or_127_and_release<S: TestStore>(make: MakeWorld<S>) {
    let world = make("spawn-fail");
    let output_of = |command: &str| output(&world, 1, &[], &[command]);
    let missing = output_of("/nonexistent/consem-test");
    assert_eq!(missing.status.code(), Some(127));
    assert!(stderr(&missing).contains("/nonexistent/consem-test"));
    let directory = output_of(world.dir.to_str().unwrap());
    assert_eq!(directory.status.code(), Some(126));
    world.assert_clean();
}

/// Consul cannot name such keys, and they would reach operators'
/// terminals: refused at once, shown escaped and shortened.
fn prefixes_with_control_characters_or_too_long_are_usage_errors<S: TestStore>(make: MakeWorld<S>) {
    let world = make("prefix-refused");
    let long = "x".repeat(100_000);
    for prefix in ["jobs/a\nb", "tab\there", "esc\x1b[2J", long.as_str()] {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_consem"));
        command.args(["run", "--limit", "1", "--prefix", prefix]);
        world.store.point(&mut command);
        let output = command
            .args(["--", "touch", &world.path("ran")])
            .output()
            .unwrap();
        let text = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{text}");
        assert_eq!(text.lines().count(), 1, "one line: {text:?}");
        assert!(text.len() < 400, "shortened: {text}");
        assert!(!text.contains('\x1b') && !text.contains('\t'), "{text:?}");
        assert!(text.contains("--prefix"), "{text}");
    }
    assert!(!world.exists("ran"));
    world.assert_clean();
}

fn odd_prefixes_work_and_clean_up<S: TestStore>(make: MakeWorld<S>) {
    for (name, prefix) in [
        ("space", "a b"),
        ("query", "what?now"),
        ("hash", "x#y"),
        ("percent", "100%/done"),
        ("unicode", "jobs/été-日本"),
    ] {
        let mut world = make(name);
        world.prefix = format!("{}/{prefix}", unique_prefix(name));
        let output = output(
            &world,
            1,
            &[],
            &["sh", "-c", "printf %s \"$CONSEM_PREFIX\""],
        );
        assert_eq!(output.status.code(), Some(0), "{name}: {}", stderr(&output));
        assert_eq!(stdout(&output), world.prefix);
        world.assert_clean();
    }
}

/// Every contender on a prefix uses one limit: another one while the
/// semaphore is in use is a conflict (65), and the record is untouched.
fn another_limit_is_a_conflict_while_the_semaphore_is_in_use<S: TestStore>(make: MakeWorld<S>) {
    let world = make("conflict");
    let holder = hold_slot(&world, 1, "ready", "go");
    let conflict = output(&world, 2, &[], &["touch", &world.path("ran")]);
    assert_eq!(conflict.status.code(), Some(65), "{}", stderr(&conflict));
    assert!(
        stderr(&conflict).contains("--limit is 2"),
        "{}",
        stderr(&conflict)
    );
    assert!(!world.exists("ran"));
    assert_eq!(status_json(&world).1["limit"], 1);
    world.touch("go");
    assert_eq!(finish(holder).status.code(), Some(0));
    // Once idle, the prefix takes a new limit.
    let output = output(&world, 2, &[], &["true"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    world.assert_clean();
}

fn status_of_an_unused_prefix_says_it_is_idle<S: TestStore>(make: MakeWorld<S>) {
    let world = make("status-empty");
    // Nothing is kept of a semaphore nobody uses (ZooKeeper keeps its
    // limit record); run ends, status says so, and that is no error.
    let run = output(&world, 2, &[], &["true"]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    let output = admin(&world, "status", &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let said = stdout(&output);
    assert!(
        said.starts_with(&format!(
            "{}: idle, nobody holds a slot or waits for one ({} store",
            world.prefix,
            world.store_name()
        )),
        "{said}"
    );
    assert_eq!(said.lines().count(), 1, "{said}");
    assert_eq!(stderr(&output), "");
    let (code, json) = status_json(&world);
    assert_eq!(code, Some(0));
    assert_eq!(json["prefix"], world.prefix.as_str());
    assert_eq!(json["store"], world.store_name());
    assert!(json["limit"].is_null() || json["limit"] == 2, "{json}");
    assert_eq!(json["holders"], serde_json::json!([]));
    assert_eq!(json["waiters"], serde_json::json!([]));
    assert_eq!(json["dead_holders"], serde_json::json!([]));
    world.assert_clean();
}

fn status_shows_holders_and_waiters<S: TestStore>(make: MakeWorld<S>) {
    let world = make("status-live");
    let holder = hold_slot(&world, 1, "ready", "go");
    // The command's words reach operators' terminals through `status`.
    let waiter = world.spawn(1, &[], &["echo", "waiting one", "\x1b[2J\n"]);
    wait_until(PROMPT, "the waiter to join the queue", || {
        world.contender_keys() == 2
    });
    let (code, json) = status_json(&world);
    assert_eq!(code, Some(0));
    assert_eq!(json["limit"], 1);
    assert_eq!(json["store"], world.store_name());
    let holders = json["holders"].as_array().unwrap();
    let waiters = json["waiters"].as_array().unwrap();
    assert_eq!((holders.len(), waiters.len()), (1, 1), "{json}");
    assert_eq!(holders[0]["pid"], holder.id());
    assert_eq!(waiters[0]["pid"], waiter.id());
    assert_eq!(waiters[0]["command"], "echo waiting one \x1b[2J\n");
    assert!(holders[0]["command"].as_str().unwrap().starts_with("sh -c"));
    assert!(holders[0]["host"].is_string() && holders[0]["started"].is_string());
    assert!(
        holders[0]["create_index"].as_u64() < waiters[0]["create_index"].as_u64(),
        "{json}"
    );
    let table = stdout(&admin(&world, "status", &[]));
    assert!(table.contains("1 of 1 slots held, 1 waiting"), "{table}");
    assert!(table.contains("echo waiting one \\x1b[2J\\n"), "{table}");
    assert!(!table.contains('\x1b'), "no raw escape: {table:?}");
    world.touch("go");
    assert_eq!(finish(holder).status.code(), Some(0));
    assert_eq!(finish_within(waiter, "the waiter").status.code(), Some(0));
    world.assert_clean();
}

/// `consem run --prefix <prefix> --limit <limit> -- <command>` on the
/// world's store, at a prefix other than the world's.
fn spawn_at<S: TestStore>(world: &World<S>, prefix: &str, limit: u32, command: &[String]) -> Child {
    let mut cmd = world.consem_command();
    cmd.args(["run", "--prefix", prefix, "--limit", &limit.to_string()]);
    world.store.point(&mut cmd);
    cmd.arg("--")
        .args(command)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// `consem status <args>` on the world's store, without the world's
/// prefix.
fn status_of<S: TestStore>(world: &World<S>, args: &[&str]) -> Output {
    let mut cmd = world.consem_command();
    cmd.arg("status").args(args);
    world.store.point(&mut cmd);
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    finish_within(child, "consem status to exit")
}

fn listing_json<S: TestStore>(world: &World<S>, args: &[&str]) -> serde_json::Value {
    let output = status_of(world, &[args, &["--json"]].concat());
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}{}", stdout(&output), stderr(&output)))
}

/// The prefixes of a listing, and what it says of each.
fn listed(listing: &serde_json::Value) -> Vec<(String, serde_json::Value)> {
    listing["semaphores"]
        .as_array()
        .unwrap_or_else(|| panic!("no semaphores: {listing}"))
        .iter()
        .map(|s| (s["prefix"].as_str().unwrap().to_string(), s.clone()))
        .collect()
}

fn status_lists_every_semaphore_under_a_root<S: TestStore>(make: MakeWorld<S>) {
    let world = make("status-list");
    // On Redis Cluster a prefix is braced, so that its keys share a slot;
    // the braces do not count against the root.
    let (root, braced) = match world.prefix.strip_prefix('{') {
        Some(bare) => (bare.trim_end_matches('}').to_string(), true),
        None => (world.prefix.clone(), false),
    };
    let at = |name: &str| match braced {
        true => format!("{{{root}/{name}}}"),
        false => format!("{root}/{name}"),
    };
    let (a, nested) = (at("a"), at("b/c"));
    // Beside the root, not under it.
    let beside = match braced {
        true => format!("{{{root}-beside}}"),
        false => format!("{root}-beside"),
    };
    let holder_a = spawn_at(&world, &a, 2, &world.held_until("ready-a", "go", 0));
    let holder_nested = spawn_at(&world, &nested, 1, &world.held_until("ready-c", "go", 0));
    let holder_beside = spawn_at(&world, &beside, 1, &world.held_until("ready-x", "go", 0));
    wait_until(PROMPT, "the holders' commands to start", || {
        world.exists("ready-a") && world.exists("ready-c") && world.exists("ready-x")
    });
    let waiter = spawn_at(&world, &nested, 1, &["true".to_string()]);
    let under_root = format!("{root}/");
    wait_until(PROMPT, "the waiter to be listed", || {
        let listing = listing_json(&world, &["--prefix", &under_root]);
        listed(&listing)
            .iter()
            .any(|(prefix, s)| *prefix == nested && s["waiting"] == 1)
    });
    let listing = listing_json(&world, &["--prefix", &under_root]);
    assert_eq!(listing["root"], root.as_str(), "{listing}");
    assert_eq!(listing["store"], world.store_name(), "{listing}");
    let semaphores = listed(&listing);
    let prefixes: Vec<&str> = semaphores.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(prefixes, [a.as_str(), nested.as_str()], "{listing}");
    let (of_a, of_nested) = (&semaphores[0].1, &semaphores[1].1);
    assert_eq!(
        (&of_a["limit"], &of_a["held"], &of_a["waiting"]),
        (&2.into(), &1.into(), &0.into()),
        "{listing}"
    );
    assert_eq!(
        (
            &of_nested["limit"],
            &of_nested["held"],
            &of_nested["waiting"]
        ),
        (&1.into(), &1.into(), &1.into()),
        "{listing}"
    );
    assert_eq!(of_a["oldest_holder"]["pid"], holder_a.id(), "{listing}");
    assert!(of_a["oldest_holder"]["started"].is_string(), "{listing}");
    // The whole store: these three among whatever else it holds.
    let everything = listed(&listing_json(&world, &[]));
    for prefix in [&a, &nested, &beside] {
        assert!(
            everything.iter().any(|(p, _)| p == prefix),
            "{prefix} not in {everything:?}"
        );
    }
    // One line each, in columns.
    let output = status_of(&world, &["--prefix", &under_root]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let table = stdout(&output);
    let line_of = |prefix: &str| {
        table
            .lines()
            .find(|line| line.split_whitespace().next() == Some(prefix))
            .unwrap_or_else(|| panic!("no line for {prefix}: {table}"))
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(line_of(&a)[1..4], ["2", "1", "0"], "{table}");
    assert_eq!(line_of(&nested)[1..4], ["1", "1", "1"], "{table}");
    assert!(
        line_of(&a)
            .join(" ")
            .contains(&format!("pid {}, started ", holder_a.id())),
        "{table}"
    );
    assert!(!table.contains(&beside), "{table}");
    world.touch("go");
    for (child, what) in [
        (holder_a, "the holder at a"),
        (holder_nested, "the holder at b/c"),
        (holder_beside, "the holder beside"),
        (waiter, "the waiter"),
    ] {
        let output = finish_within(child, what);
        assert_eq!(output.status.code(), Some(0), "{what}: {}", stderr(&output));
    }
    // Nothing in use under the root any more: an empty listing, no error.
    let listing = listing_json(&world, &["--prefix", &under_root]);
    assert_eq!(listing["semaphores"], serde_json::json!([]), "{listing}");
    let output = status_of(&world, &["--prefix", &under_root]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stdout(&output).starts_with(&format!("no semaphore in use under {root}/")),
        "{}",
        stdout(&output)
    );
    for prefix in [&a, &nested, &beside] {
        world.store.assert_clean(prefix);
    }
}

fn release_by_session_stops_the_holder_with_76<S: TestStore>(make: MakeWorld<S>) {
    let world = make("release-session");
    let holder = hold_slot(&world, 1, "ready", "go");
    let (_, json) = status_json(&world);
    let session = json["holders"][0]["session"].as_str().unwrap().to_string();
    // A unique beginning of the identifier will do.
    let beginning = &session[..session.len().min(8)];
    let output = admin(&world, "release", &["--session", beginning]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stdout(&output).contains(&session), "{}", stdout(&output));
    let held = finish_within(holder, "the holder to stop");
    assert_eq!(held.status.code(), Some(76), "{}", stderr(&held));
    world.assert_clean();
}

fn release_by_host_and_pid_frees_the_slot_for_a_waiter<S: TestStore>(make: MakeWorld<S>) {
    let world = make("release-host-pid");
    let holder = hold_slot(&world, 1, "ready", "go");
    let waiter = world.spawn(1, &[], &["true"]);
    wait_until(PROMPT, "the waiter to join the queue", || {
        world.contender_keys() == 2
    });
    let (_, json) = status_json(&world);
    let host = json["holders"][0]["host"].as_str().unwrap().to_string();
    let pid = holder.id().to_string();
    let output = admin(&world, "release", &["--host", &host, "--pid", &pid]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(finish_within(holder, "the holder").status.code(), Some(76));
    assert_eq!(
        finish_within(waiter, "the waiter").status.code(),
        Some(0),
        "the waiter got the slot"
    );
    world.assert_clean();
}

fn release_says_when_nothing_or_several_match<S: TestStore>(make: MakeWorld<S>) {
    let world = make("release-ambiguous");
    let first = hold_slot(&world, 2, "ready-1", "go");
    let second = hold_slot(&world, 2, "ready-2", "go");
    let output = admin(&world, "release", &["--session", "zzzz"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("no holder"), "{}", stderr(&output));
    let output = admin(&world, "release", &["--session", ""]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("matches 2 holders"),
        "{}",
        stderr(&output)
    );
    let output = admin(&world, "release", &["--host", "nowhere", "--pid", "1"]);
    assert_eq!(output.status.code(), Some(1));
    world.touch("go");
    assert_eq!(finish(first).status.code(), Some(0));
    assert_eq!(finish(second).status.code(), Some(0));
    world.assert_clean();
}

fn reset_refuses_while_held_and_force_evicts_first<S: TestStore>(make: MakeWorld<S>) {
    let world = make("reset");
    let holder = hold_slot(&world, 1, "ready", "go");
    let output = admin(&world, "reset", &[]);
    assert_eq!(output.status.code(), Some(1));
    let (_, json) = status_json(&world);
    assert_eq!(json["limit"], 1, "refused: the limit stays");
    // The holder named as `release --session` takes it.
    let session = json["holders"][0]["session"].as_str().unwrap();
    let said = format!(
        "1 live holder at {} (session {session}): wait for it to end, free its slot with consem release --session {session}, or reset with --force",
        world.prefix
    );
    assert!(stderr(&output).contains(&said), "{}", stderr(&output));

    let output = admin(&world, "reset", &["--force"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        stdout(&output).trim_end(),
        format!(
            "reset {}: released 1 holder, cleared the limit (1)",
            world.prefix
        ),
    );
    assert_eq!(finish_within(holder, "the holder").status.code(), Some(76));
    world.assert_clean();

    let output = admin(&world, "reset", &[]);
    assert_eq!(output.status.code(), Some(1), "nothing left to reset");
}

/// consem SIGKILLed (the OOM killer, a CI runner's timeout): the command
/// and what it started in the background are gone within the kill grace
/// (at once on the local store, whose slot is free the moment consem dies),
/// stopped by the watchdog.
fn a_killed_consem_takes_its_whole_group_along<S: TestStore>(make: MakeWorld<S>) {
    let world = make("killed-group");
    let script = format!(
        "sleep 300 & echo $! > '{}'; sleep 300 & echo $! > '{}'; echo $$ > '{}'; wait",
        world.path("first"),
        world.path("second"),
        world.path("shell")
    );
    let holder = world.spawn(1, &["--kill-grace", "1s"], &["sh", "-c", &script]);
    let pids: Vec<i32> = ["first", "second", "shell"]
        .iter()
        .map(|name| read_pid(&world, name))
        .collect();
    signal(&holder, libc::SIGKILL);
    wait_until(
        Duration::from_secs(2),
        "the command's whole group to be gone",
        || pids.iter().all(|&pid| process_gone(pid)),
    );
    finish(holder);
}

/// The watchdog killed (by hand, the OOM killer) is replaced, so that a
/// consem killed afterwards still takes its command's whole group along.
fn a_killed_watchdog_is_replaced_and_still_takes_the_group_along<S: TestStore>(make: MakeWorld<S>) {
    let world = make("killed-watchdog");
    let script = format!(
        "sleep 300 & echo $! > '{}'; echo $$ > '{}'; wait",
        world.path("background"),
        world.path("shell")
    );
    // stderr to a file, read while consem runs: its warning comes once the
    // new watchdog has started, and consem is killed only after it.
    let mut holder = world
        .consem(1, &["--kill-grace", "1s"], &["sh", "-c", &script])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(world.path("holder.log")).unwrap())
        .spawn()
        .unwrap();
    let pids = [read_pid(&world, "background"), read_pid(&world, "shell")];
    let watchdog = children_besides(&holder, pids[1]);
    assert_eq!(watchdog.len(), 1, "one watchdog: {watchdog:?}");
    // SAFETY: kill(2) on the watchdog, a process of this test's consem.
    unsafe { libc::kill(watchdog[0], libc::SIGKILL) };
    wait_until(PROMPT, "another watchdog", || {
        let now = children_besides(&holder, pids[1]);
        now.len() == 1 && now[0] != watchdog[0]
    });
    wait_until(PROMPT, "consem to say it started another watchdog", || {
        log_text(&world, "holder.log").contains("watchdog")
    });
    signal(&holder, libc::SIGKILL);
    wait_until(
        Duration::from_secs(2),
        "the command's whole group to be gone",
        || pids.iter().all(|&pid| process_gone(pid)),
    );
    wait_with_deadline(&mut holder, PROMPT, "the killed consem");
}

/// The command exits but leaves a job running in its process group: the
/// job is stopped before the slot is released, so that the next holder
/// never runs beside it. A job that ignores SIGTERM is SIGKILLed once the
/// kill grace has passed (5 s when none is given, as documented).
fn what_the_command_leaves_running_is_stopped_before_the_slot_goes<S: TestStore>(
    make: MakeWorld<S>,
) {
    let world = make("leftover");
    let log = world.path("log");
    // The worker logs while it runs; the shell exits a second later. The
    // first one ignores SIGTERM (and so do the commands it runs).
    let worker = |name: &str, on_term: &str| {
        format!(
            "(trap {on_term} TERM; echo $BASHPID > '{dir}/{name}.pid'; while :; do echo {name} >> '{log}'; sleep 0.05; done) > /dev/null 2>&1 & while [ ! -s '{dir}/{name}.pid' ]; do sleep 0.01; done; sleep 1",
            dir = world.dir.display()
        )
    };
    // The default grace, 5 s, with a lease of 12 s (the longest grace that
    // fits it): the command's second and the grace outlast the stop point
    // of the lease it started on, so that the run ends 0 only if the
    // renewals that come during the grace are taken.
    let grace = Duration::from_secs(5);
    let ignoring_args = if S::HAS_LEASE {
        vec!["-v", "--ttl", "12s"]
    } else {
        vec!["-v"]
    };
    let runs = [
        ("first", "''", ignoring_args),
        ("second", "'exit 0'", vec!["-v", "--kill-grace", "1s"]),
    ];
    for (name, on_term, args) in runs {
        let script = worker(name, on_term);
        let output = output(&world, 1, &args, &["bash", "-c", &script]);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let log = stderr(&output);
        assert!(
            log.contains(" stopping-group "),
            "says it stopped the group: {log}"
        );
        let pid: i32 = std::fs::read_to_string(world.dir.join(format!("{name}.pid")))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        if !process_gone(pid) {
            // SAFETY: getpgid(2) and killpg(2) on the worker this test's
            // command started, which must not run on after the test.
            unsafe { libc::killpg(libc::getpgid(pid), libc::SIGKILL) };
            panic!("{name}'s worker outlived consem: {log}");
        }
        if name == "first" {
            // SIGTERM, which it ignores, then SIGKILL after the grace.
            let at = |signal: &str| {
                log.lines()
                    .find(|line| {
                        line.contains(" stopping-group ")
                            && line.ends_with(&format!(" signal={signal}"))
                    })
                    .map(event_seconds)
                    .unwrap_or_else(|| panic!("no stopping-group with signal {signal}: {log}"))
            };
            let waited = (at("9") - at("15")).rem_euclid(86_400.0);
            assert!(
                waited >= grace.as_secs_f64() - 0.002 && waited < grace.as_secs_f64() + 1.5,
                "SIGKILL came {waited:.3} s after SIGTERM, for a grace of {grace:?}: {log}"
            );
        }
    }
    let lines = std::fs::read_to_string(&log).unwrap();
    let lines_in_order: Vec<&str> = lines.lines().collect();
    let first_last = lines_in_order.iter().rposition(|l| *l == "first").unwrap();
    let second_first = lines_in_order.iter().position(|l| *l == "second").unwrap();
    assert!(
        first_last < second_first,
        "the first worker ran beside the second:\n{lines}"
    );
    world.assert_clean();
}

/// The time of day of a `-v` line (`2026-11-22T10:04:05.123Z consem[..] ...`),
/// in seconds.
fn event_seconds(line: &str) -> f64 {
    let time = line
        .split_whitespace()
        .next()
        .and_then(|stamp| stamp.split_once('T'))
        .map(|(_, time)| time.trim_end_matches('Z'))
        .unwrap_or_else(|| panic!("not an event line: {line}"));
    let parts: Vec<f64> = time.split(':').map(|p| p.parse().unwrap()).collect();
    parts[0] * 3600.0 + parts[1] * 60.0 + parts[2]
}

/// With `--wait-group`, the slot is kept until what the command left
/// running has ended by itself.
fn wait_group_keeps_the_slot_until_the_group_is_done<S: TestStore>(make: MakeWorld<S>) {
    let world = make("wait-group");
    let script = format!(
        "(sleep 0.5; touch '{}') & exit 0",
        world.path("worker-done")
    );
    let output = output(&world, 1, &["--wait-group"], &["sh", "-c", &script]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        world.exists("worker-done"),
        "consem returned before the worker ended"
    );
    world.assert_clean();
}

/// A grant that reaches consem after the lease it gives has reached its
/// stop point (a link that holds answers back) starts nothing: the command
/// runs only once a renewal confirms the slot, or never (76), and never
/// beside another holder.
fn a_grant_that_arrives_after_its_lease_starts_nothing_unconfirmed<S: ServerStore>(
    make: MakeWorld<S>,
) {
    let world = make("late-grant");
    // Long enough to pass the lease's stop point (5/6 of the TTL less the
    // kill grace that fits), not so long that a waiter gives up.
    let (ttl, delay) = match world.store_name() {
        // Past the permit's expiry on the server too: the slot is gone.
        "redis" => ("3s", Duration::from_secs(4)),
        _ => ("10s", Duration::from_secs(6)),
    };
    let log = world.path("log");
    let run =
        |name: &str| format!("echo start {name} >> '{log}'; sleep 0.5; echo end {name} >> '{log}'");
    let holder = hold_slot(&world, 1, "ready", "go");
    let proxy = crate::common::proxy::DelayingProxy::start(&world.server_addr());
    let late = world
        .consem_via(
            &proxy.addr(),
            1,
            &["-v", "--ttl", ttl],
            &["sh", "-c", &run("late")],
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(world.path("late.log")).unwrap())
        .spawn()
        .unwrap();
    wait_until(PROMPT, "the late waiter to join the queue", || {
        world.contender_keys() == 2
    });
    let other = world.spawn(1, &["--ttl", ttl], &["sh", "-c", &run("other")]);
    wait_until(PROMPT, "the other waiter to join the queue", || {
        world.contender_keys() == 3
    });
    proxy.delay_answers(delay);
    world.touch("go");
    let deadline = Instant::now() + PROMPT + delay * 4;
    while !log_text(&world, "late.log").contains("grant-late") {
        assert!(
            Instant::now() < deadline,
            "the late grant was not noticed:\n{}",
            log_text(&world, "late.log")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let ran = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !ran.contains("start late"),
        "the command started on a grant whose lease had run out:\n{ran}\n{}",
        log_text(&world, "late.log")
    );
    proxy.delay_answers(Duration::ZERO);
    let mut late = late;
    let late_status = wait_with_deadline(&mut late, PROMPT + delay * 2, "the late waiter to end");
    let late_log = log_text(&world, "late.log");
    match late_status.code() {
        Some(76) => {
            assert!(late_log.contains("the command did not run"), "{late_log}");
        }
        Some(0) if world.store_name() != "redis" => {
            assert!(late_log.contains("lease-confirmed"), "{late_log}");
        }
        other => panic!("the late waiter ended with {other:?}:\n{late_log}"),
    }
    for child in [holder, other] {
        let output = finish_within(child, "a contender to end");
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    }
    let ran = std::fs::read_to_string(&log).unwrap();
    let mut running = 0;
    for line in ran.lines() {
        running += if line.starts_with("start") { 1 } else { -1 };
        assert!(running <= 1, "two ran at once:\n{ran}");
    }
    assert_eq!(
        ran.contains("start late"),
        late_status.code() == Some(0),
        "{ran}"
    );
    world.assert_clean();
}

/// `--ttl <ttl>` where the store has a lease; nothing on the local store,
/// which refuses it (its slot lasts as long as consem does).
fn ttl_args<'a, S: TestStore>(_: &World<S>, ttl: &'a str) -> Vec<&'a str> {
    if S::HAS_LEASE {
        vec!["--ttl", ttl]
    } else {
        Vec::new()
    }
}

/// Contenders a test started; those still running when it ends (it failed
/// early) are SIGKILLed, so that their commands, which wait for files in a
/// directory that goes with the world, do not run on (the watchdog takes
/// a killed consem's command along).
struct Contenders(Vec<Child>);

impl Contenders {
    /// Waits for each to end, and checks that each exited 0.
    fn finish_all(mut self) {
        for child in std::mem::take(&mut self.0) {
            let output = finish_within(child, "a contender to end");
            assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        }
    }
}

impl Drop for Contenders {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// How soon a waiter must start once the slot it waits for is free: far
/// below the periodic look (TTL/3, 10 s at `--ttl 30s`) that would serve
/// it if the wake-up meant for it never came, and generous for a loaded
/// machine.
const AT_ONCE: Duration = Duration::from_secs(4);

/// Each slot that frees wakes the waiter it is for at once, the second,
/// third, ... in line too, and not at that waiter's next periodic look
/// (every TTL/3: 10 s at `--ttl 30s`). Two slots, two holders and five
/// waiters; slots free one at a time and two at once, and each waiter
/// must start within seconds. Two slots freed while the first in line is
/// stopped (it cannot look yet) serve the second in line too: the first,
/// when it takes its slot, wakes the next (Redis: the grant pushes to the
/// waiter now first in line; etcd: the relay write owed to the waiter
/// behind; Consul: the hand-off's rewrite of the heir's key; local: the
/// queue file's lock let go).
fn a_freed_slot_wakes_its_waiter_at_once_all_down_the_queue<S: TestStore>(make: MakeWorld<S>) {
    let world = make("handoff-at-once");
    let ttl = ttl_args(&world, "30s");
    let mut contenders = Contenders(Vec::new());
    let started = |name: &str| world.exists(&format!("started-{name}"));
    let go = |name: &str| world.touch(&format!("go-{name}"));
    let spawn = |name: &str| {
        let command = world.held_until(&format!("started-{name}"), &format!("go-{name}"), 0);
        world.spawn(2, &ttl, &strs(&command))
    };
    for name in ["h1", "h2"] {
        contenders.0.push(spawn(name));
        wait_until(PROMPT, "a holder's command to start", || started(name));
    }
    let waiters = ["w1", "w2", "w3", "w4", "w5"];
    for (position, name) in waiters.iter().enumerate() {
        contenders.0.push(spawn(name));
        wait_until(PROMPT, "the waiter to join the queue", || {
            world.contender_keys() == 3 + position
        });
    }
    assert!(
        waiters.iter().all(|name| !started(name)),
        "a waiter started while both slots were held"
    );
    let starts_at_once = |name: &str, freed: &str| {
        wait_until(
            AT_ONCE,
            &format!("{name} to start at once when {freed} left (not at its next look)"),
            || started(name),
        );
    };
    // One at a time: the first waiter, then the second, which was further
    // back when the first one's slot freed.
    go("h1");
    starts_at_once("w1", "h1");
    go("h2");
    starts_at_once("w2", "h2");
    // Two at once, while the first in line is stopped: its slot and the
    // next are free before it looks.
    let w3 = contenders.0[4].id() as i32;
    // SAFETY: kill(2) on a consem this test started and has not reaped.
    unsafe { libc::kill(w3, libc::SIGSTOP) };
    go("w1");
    go("w2");
    wait_until(PROMPT, "w1 and w2 to leave", || world.contender_keys() == 3);
    // SAFETY: as above.
    unsafe { libc::kill(w3, libc::SIGCONT) };
    starts_at_once("w3", "w1 and w2 (w3 stopped meanwhile)");
    starts_at_once("w4", "w1 and w2 (w3 stopped meanwhile)");
    go("w3");
    starts_at_once("w5", "w3");
    for name in ["h1", "h2", "w1", "w2", "w3", "w4", "w5"] {
        go(name);
    }
    contenders.finish_all();
    world.assert_clean();
}

/// An operator's release reaches the holder through what it watches,
/// not through its next renewal (every TTL/3: 10 s at `--ttl 30s`): the
/// command is stopped, and consem exits 76, within seconds.
fn an_operator_s_release_stops_the_holder_at_once_not_at_its_next_renewal<S: TestStore>(
    make: MakeWorld<S>,
) {
    let world = make("release-at-once");
    let mut args = ttl_args(&world, "30s");
    args.extend(["--kill-grace", "1s"]);
    let holder = world.spawn(1, &args, &strs(&world.held_until("ready", "go", 0)));
    let mut contenders = Contenders(vec![holder]);
    wait_until(PROMPT, "the holder's command to start", || {
        world.exists("ready")
    });
    let (_, json) = status_json(&world);
    let session = json["holders"][0]["session"].as_str().unwrap().to_string();
    let released = admin(&world, "release", &["--session", &session]);
    assert_eq!(released.status.code(), Some(0), "{}", stderr(&released));
    let released_at = Instant::now();
    let status = wait_with_deadline(
        &mut contenders.0[0],
        PROMPT,
        "the holder to stop once released",
    );
    assert_eq!(status.code(), Some(76));
    assert!(
        released_at.elapsed() < AT_ONCE,
        "the holder stopped {:?} after its release",
        released_at.elapsed()
    );
    contenders.0.clear();
    world.assert_clean();
}

/// The slot's lease on the server is `--ttl`, 15 s when none is given,
/// as docs/run.md documents: a longer one keeps a dead consem's slot from the
/// others longer than they were told, a shorter one lets it go while the
/// command may run.
fn a_slot_s_lease_on_the_server_is_the_ttl_15s_by_default<S: LeasedStore>(make: MakeWorld<S>) {
    let world = make("lease-ttl");
    for (args, ttl) in [(&[][..], 15.0), (&["--ttl", "21s"][..], 21.0)] {
        let (ready, go) = (format!("ready-{ttl}"), format!("go-{ttl}"));
        let holder = world.spawn(1, args, &strs(&world.held_until(&ready, &go, 0)));
        let contenders = Contenders(vec![holder]);
        wait_until(PROMPT, "the holder's command to start", || {
            world.exists(&ready)
        });
        let leases = world.store.lease_seconds(&world.prefix);
        assert_eq!(leases.len(), 1, "one lease: {leases:?}");
        if S::NAME == "redis" {
            // Set by the grant or a renewal, at most a period ago.
            assert!(
                leases[0] <= ttl + 0.01 && leases[0] > ttl * 2.0 / 3.0 - 1.0,
                "a permit that expires {leases:?} s from now, for a TTL of {ttl} s"
            );
        } else {
            assert_eq!(leases[0], ttl, "for a TTL of {ttl} s");
        }
        world.touch(&go);
        contenders.finish_all();
    }
    world.assert_clean();
}

/// A holder renews its lease every TTL/3; each renewal gives it one TTL
/// from the server's now, never more (a renewal that extended the old
/// expiry would add a TTL each time). So after many renewals a SIGKILLed
/// consem's slot still comes back within about a TTL, and the waiter
/// behind takes it.
fn a_killed_holder_s_slot_comes_back_within_its_ttl_after_renewals<S: LeasedStore>(
    make: MakeWorld<S>,
) {
    const TTL: Duration = Duration::from_secs(2);
    let world = make("killed-after-renewals");
    // The kill grace that fits in a 2 s lease is none: SIGKILL at once.
    let args = ["--ttl", "2s"];
    let holder = world.spawn(1, &args, &strs(&world.held_until("ready", "go", 0)));
    let mut contenders = Contenders(vec![holder]);
    wait_until(PROMPT, "the holder's command to start", || {
        world.exists("ready") || contenders.0[0].try_wait().unwrap().is_some()
    });
    assert!(world.exists("ready"), "the holder ended without running");
    let waiter = world.spawn(1, &args, &["touch", &world.path("waiter-ran")]);
    contenders.0.push(waiter);
    wait_until(PROMPT, "the waiter to queue", || {
        world.contender_keys() == 2
    });
    // Two TTLs: the slot is still the holder's only if it renewed, five
    // times or so. What the server keeps it for stays within a TTL.
    let holding = Instant::now();
    while holding.elapsed() < TTL * 2 {
        for lease in world.store.lease_seconds(&world.prefix) {
            assert!(
                lease <= TTL.as_secs_f64() + 0.01,
                "the server keeps the slot {lease} s, for a TTL of {TTL:?}"
            );
        }
        assert!(
            !world.exists("waiter-ran"),
            "the waiter ran beside the holder"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        contenders.0[0].try_wait().unwrap().is_none(),
        "the holder kept its slot"
    );
    contenders.0[0].kill().unwrap();
    contenders.0[0].wait().unwrap();
    let killed = Instant::now();
    // Its lease runs out within a TTL of the last renewal; the waiter
    // notices within a renewal period (Redis) or at once (etcd), and etcd
    // looks for expired leases every 0.5 s.
    let bound = TTL * 5 / 2;
    wait_until(bound + PROMPT, "the waiter to get the slot", || {
        world.exists("waiter-ran")
    });
    assert!(
        killed.elapsed() < bound,
        "the slot came back {:?} after the holder was killed, for a TTL of {TTL:?}",
        killed.elapsed()
    );
    let waiter = contenders.0.pop().unwrap();
    contenders.0.clear();
    let output = finish_within(waiter, "the waiter to end");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    world.assert_clean();
}
