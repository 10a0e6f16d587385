//! The PostgreSQL store's own behaviours, against a server of the test's
//! own: a slot the server takes away (an operator's
//! `pg_terminate_backend`, a restart) is a loss (76); a killed holder's
//! slot goes to the next waiter at once; a holder cut off from the server
//! stops its command before the server can give its slot away.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::proxy::DelayingProxy;
use crate::common::wait_until;
use crate::common::world::*;

/// The backend pids holding a slot of the world's prefix.
fn holder_pids(world: &World<PostgresServer>) -> Vec<i32> {
    let text = world.store.psql(&format!(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND classid = {} AND objid < 10000 AND granted",
        crate::common::postgres::prefix_classid(&world.prefix)
    ));
    text.lines().filter_map(|line| line.parse().ok()).collect()
}

#[test]
fn a_terminated_session_is_a_loss_and_the_waiter_takes_the_slot() {
    let world = World::postgres("pg-terminate");
    let holder = hold_slot(&world, 1, "ready", "go");
    let waiter = world.spawn(1, &[], &["touch", &world.path("waiter-ran")]);
    wait_until(PROMPT, "the waiter to join", || world.contender_keys() == 2);
    let pids = holder_pids(&world);
    assert_eq!(pids.len(), 1, "{pids:?}");
    world
        .store
        .psql(&format!("SELECT pg_terminate_backend({})", pids[0]));
    let held = finish(holder);
    assert_eq!(held.status.code(), Some(76), "{}", stderr(&held));
    assert!(stderr(&held).contains("slot lost"), "{}", stderr(&held));
    let waited = finish(waiter);
    assert_eq!(waited.status.code(), Some(0), "{}", stderr(&waited));
    assert!(world.exists("waiter-ran"));
    world.assert_clean();
}

#[test]
fn a_restart_of_the_server_is_a_loss_and_the_fence_still_grows() {
    let mut world = World::postgres("pg-restart");
    let fence = |world: &World<PostgresServer>| -> u64 {
        let output = world
            .consem(1, &[], &["sh", "-c", "printf %s \"$CONSEM_FENCE\""])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        String::from_utf8_lossy(&output.stdout).parse().unwrap()
    };
    let before = fence(&world);
    let holder = hold_slot(&world, 1, "ready", "go");
    world.store.restart();
    let held = finish(holder);
    assert_eq!(held.status.code(), Some(76), "{}", stderr(&held));
    let after = fence(&world);
    assert!(after > before, "{before} then {after} across the restart");
    world.assert_clean();
}

/// consem SIGKILLed: its connection closes, the server drops its session
/// and locks, and the waiter blocked on the slot in the server has it at
/// once (its watchdog killed the old command at once too).
#[test]
fn a_killed_holder_s_slot_goes_to_the_waiter_within_a_second() {
    let world = World::postgres("pg-killed");
    let mut holder = hold_slot(&world, 1, "ready", "go");
    let waiter = world.spawn(1, &[], &strs(&world.held_until("waiter-ran", "go", 0)));
    wait_until(PROMPT, "the waiter to join", || world.contender_keys() == 2);
    holder.kill().unwrap();
    let killed = Instant::now();
    let _ = holder.wait();
    wait_until(PROMPT, "the waiter's command to start", || {
        world.exists("waiter-ran")
    });
    assert!(
        killed.elapsed() < Duration::from_secs(1),
        "the waiter started {:?} after the kill",
        killed.elapsed()
    );
    world.touch("go");
    assert_eq!(finish(waiter).status.code(), Some(0));
    world.assert_clean();
}

/// A holder whose requests no longer reach the server (a proxy swallows
/// them from its first round trip on): no round trip is confirmed, its
/// lease runs out and its command is stopped; only then does its session
/// end and the waiter start. The log shows the order.
#[test]
fn a_holder_cut_off_stops_its_command_before_the_waiter_starts() {
    let world = World::postgres("pg-cut-off");
    let proxy = DelayingProxy::start(&world.server_addr());
    let log = world.path("log");
    let holder_script = format!(
        "trap 'echo holder-stopped >> {log}; exit 0' TERM; echo holder-started >> {log}; while :; do sleep 0.05; done"
    );
    let mut holder = world
        .consem_via(
            &proxy.addr(),
            1,
            &["--ttl", "6s", "--kill-grace", "1s"],
            &["sh", "-c", &holder_script],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(PROMPT, "the holder's command to start", || {
        assert_eq!(holder.try_wait().unwrap(), None, "the holder ended early");
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("holder-started"))
    });
    proxy.swallow_requests_with("SELECT 1");
    let waiter = world.spawn(
        1,
        &[],
        &["sh", "-c", &format!("echo waiter-started >> {log}")],
    );
    let status = wait_with_deadline(&mut holder, Duration::from_secs(20), "the holder to stop");
    assert_eq!(status.code(), Some(76));
    let waited = finish(waiter);
    assert_eq!(waited.status.code(), Some(0), "{}", stderr(&waited));
    let lines: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(
        lines,
        ["holder-started", "holder-stopped", "waiter-started"],
        "the order of events"
    );
    world.assert_clean();
}
