//! What only Redis Sentinel asks of the Redis store, against a primary, a
//! replica and three Sentinels of each test's own: the URL must name the
//! primary, a name the Sentinels do not know is said so, and a failover
//! under holders and waiters keeps the limit while the waiters follow the
//! new primary. The core behaviours run there in tests/conformance.rs
//! (`redis_sentinel::`).

use std::process::{Child, Output, Stdio};
use std::time::Duration;

use crate::common::redis_sentinel::{RedisSentinel, PRIMARY_NAME};
use crate::common::wait_until;
use crate::common::world::*;

fn finish(mut child: Child) -> Output {
    wait_with_deadline(&mut child, Duration::from_secs(60), "consem to exit");
    child.wait_with_output().unwrap()
}

fn run_on(world: &World<RedisSentinel>, store: &str, command: &[&str]) -> Output {
    let child = world
        .consem_command()
        .args([
            "run",
            "--store",
            store,
            "--prefix",
            &world.prefix,
            "--limit",
            "1",
            "--",
        ])
        .args(command)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    finish(child)
}

#[test]
fn the_url_names_the_primary_the_sentinels_know() {
    let world = World::redis_sentinel("names");
    let nameless = world.store.url_for("");
    let output = run_on(&world, &nameless, &["touch", &world.path("ran")]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("names no primary"),
        "{}",
        stderr(&output)
    );
    let unknown = world.store.url_for("no-such-primary");
    let output = run_on(&world, &unknown, &["touch", &world.path("ran")]);
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("no primary named 'no-such-primary'"),
        "{}",
        stderr(&output)
    );
    assert_eq!(stderr(&output).lines().count(), 1, "{}", stderr(&output));
    assert!(!world.exists("ran"));
    let named = world.store.url_for(PRIMARY_NAME);
    let output = run_on(&world, &named, &["touch", &world.path("ran")]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    world.assert_clean();
}

/// Holders hold and waiters wait while the Sentinels fail the primary over
/// (`SENTINEL FAILOVER`): a holder keeps its permit if the replica had it,
/// else stops its command with 76; never more than the limit run; the
/// waiters, whose `BLPOP` the old primary ends, find the new primary.
#[test]
fn a_failover_keeps_the_limit_and_the_waiters_follow_the_new_primary() {
    let world = World::redis_sentinel("failover");
    failover_under_holders_and_waiters(&world, &["--ttl", "5s"]);
}

/// With `--redis-wait-replicas 1` and two replicas, every grant and
/// renewal was on a replica before it counted, and the replica left beside
/// the promoted one acknowledges the renewals after: both holders keep
/// their slots. (With one replica the new primary has none until the old
/// primary has synced with it, and renewals go unconfirmed meanwhile;
/// docs/redis.md says so.)
#[test]
fn with_replicas_acknowledging_a_failover_loses_no_holder() {
    let world = World::with_store("failover-wait", |dir| {
        RedisSentinel::start(&dir.join("sentinel"), 2)
    });
    let lost = failover_under_holders_and_waiters(&world, &["--redis-wait-replicas", "1"]);
    assert_eq!(lost, 0, "holders lost their permits in the failover");
}

/// Two holders and three waiters at `--limit 2` through a Sentinel
/// failover: the holders end 0 or 76, the waiters 0, never more at once
/// than the limit and the lost holders; how many holders were lost.
fn failover_under_holders_and_waiters(world: &World<RedisSentinel>, extra: &[&str]) -> i32 {
    let log = world.path("log");
    let go = world.path("go");
    // A holder stopped for a lost slot logs its end too.
    let holding = format!(
        "trap \"echo end >> '{log}'; exit 143\" TERM; echo start >> '{log}'; while [ ! -e '{go}' ]; do sleep 0.05; done; echo end >> '{log}'"
    );
    let holders: Vec<Child> = (0..2)
        .map(|_| world.spawn(2, extra, &["sh", "-c", &holding]))
        .collect();
    wait_until(PROMPT, "both holders to run", || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.lines().count() == 2)
    });
    let quick = format!("echo start >> '{log}'; echo end >> '{log}'");
    let waiters: Vec<Child> = (0..3)
        .map(|_| world.spawn(2, extra, &["sh", "-c", &quick]))
        .collect();
    wait_until(PROMPT, "the waiters to queue", || {
        world.contender_keys() == 5
    });
    let old = world.store.primary().port;
    world.store.fail_over();
    assert_ne!(world.store.primary().port, old);
    std::fs::write(&go, "").unwrap();
    let mut lost = 0;
    for child in holders {
        let output = finish(child);
        let code = output.status.code();
        assert!(
            code == Some(0) || code == Some(76),
            "a holder ended {code:?}: {}",
            stderr(&output)
        );
        lost += i32::from(code == Some(76));
    }
    for child in waiters {
        let output = finish(child);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    }
    let log = std::fs::read_to_string(&log).unwrap();
    let (starts, most) = starts_and_most_at_once(&log);
    assert_eq!(starts, 5, "{log}");
    // A holder whose permit the failover lost runs beside its successor
    // until its next renewal finds it gone (docs/redis.md: what Redis does not give).
    assert!(
        most <= 2 + lost as usize,
        "{most} ran at once, {lost} holders lost:\n{log}"
    );
    world.assert_clean();
    lost
}

/// One frozen Sentinel among three costs a moment, and a URL naming only
/// it ends with 69: every call to a Sentinel has a deadline.
#[test]
fn a_frozen_sentinel_costs_a_moment_not_the_run() {
    let world = World::redis_sentinel("frozen-sentinel");
    world.store.freeze_sentinel(0);
    let output = run_on(
        &world,
        &world.store.url_for(PRIMARY_NAME),
        &["touch", &world.path("ran")],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(world.exists("ran"));
    let output = run_on(
        &world,
        &world.store.url_of_sentinel(0),
        &["touch", &world.path("again")],
    );
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    assert!(!world.exists("again"));
    world.assert_clean();
}
