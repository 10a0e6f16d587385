//! Answers a real agent would not give, or gives only when something is
//! wrong: cut short, not JSON, without X-Consul-Index, never. Each is retried
//! or reported, and the semaphore is never corrupted.

use std::time::{Duration, Instant};

use crate::common::double::{Fault, Match};
use crate::common::wait_until;
use crate::common::world::*;

/// Holders named in `.lock` (a name set to `false` is one on its way out).
fn lock_holders(world: &World<TestConsul>) -> usize {
    world.lock_value().map_or(0, |lock| {
        lock["Holders"]
            .as_object()
            .map_or(0, |h| h.values().filter(|held| **held == true).count())
    })
}

#[test]
fn a_cas_whose_answer_is_cut_short_still_takes_the_slot_once() {
    let world = World::on_the_double("truncated-cas");
    let double = world.the_double();
    double.inject(Fault::truncate(1).on(Match::method_path("PUT", "/.lock")));
    let holder = world.spawn(1, &[], &strs(&world.held_until("ready", "go", 0)));
    wait_until(PROMPT, "the child to start", || world.exists("ready"));
    assert_eq!(lock_holders(&world), 1, "{:?}", world.lock_value());
    world.touch("go");
    let output = finish(holder);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    world.assert_clean();
}

#[test]
fn listings_that_are_not_json_or_lack_an_index_are_retried_while_waiting() {
    let world = World::on_the_double("garbage-waiting");
    let double = world.the_double();
    let kv_reads = Match::method_path("GET", "/v1/kv/");
    double.inject(Fault::status(200, "this is not json", 1).on(kv_reads.clone()));
    double.inject(Fault::status(200, "[]", 1).on(kv_reads.clone()));
    double.inject(Fault::truncate(1).on(kv_reads));
    let output = world.consem(1, &[], &["true"]).output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    world.assert_clean();
}

#[test]
fn bad_answers_while_holding_count_against_monitor_retry() {
    let world = World::on_the_double("garbage-holding");
    let double = world.the_double();
    let kv_reads = Match::method_path("GET", "/v1/kv/");
    holder_rides_out(
        &world,
        double,
        vec![
            Fault::status(200, "<html>oops</html>", 1).on(kv_reads.clone()),
            Fault::status(200, "[]", 1).on(kv_reads.clone()),
            Fault::truncate(1).on(kv_reads),
        ],
    );
}

#[test]
fn a_server_that_never_answers_at_start_is_given_up_on() {
    let world = World::on_the_double("stalled-start");
    let double = world.the_double();
    double.inject(Fault::stall(1).on(Match::path("/v1/session/create")));
    let started = Instant::now();
    let output = world.consem(1, &[], &["true"]).output().unwrap();
    let took = started.elapsed();
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("no answer in time"),
        "{}",
        stderr(&output)
    );
    // The call budget is 10 s; it must neither hang nor give up at once.
    assert!(took >= Duration::from_secs(9), "gave up after {took:?}");
    assert!(
        took < Duration::from_secs(10) + PROMPT,
        "gave up after {took:?}"
    );
    world.assert_clean();
}
