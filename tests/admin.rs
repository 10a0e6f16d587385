//! The operators' commands on the Consul store: what `status` shows of
//! Consul's sessions and of `consul lock`'s layout, and `.lock`s left by
//! dead holders. What every store does is in tests/conformance.rs.

use std::process::{Command, Output, Stdio};

use crate::common::wait_until;
use crate::common::world::*;

const SEMAPHORE_FLAGS: u64 = 16210313421097356768;

/// `consem <sub> --prefix <prefix> <extra>`.
fn admin(world: &World<TestConsul>, sub: &str, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_consem"))
        .env("CONSUL_HTTP_ADDR", world.http_addr())
        .env_remove("CONSUL_HTTP_TOKEN")
        .env_remove("CONSUL_HTTP_TOKEN_FILE")
        .args([sub, "--prefix", &world.prefix])
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn status_json(world: &World<TestConsul>) -> (Option<i32>, serde_json::Value) {
    let output = admin(world, "status", &["--json"]);
    let json = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}{}", stdout(&output), stderr(&output)));
    (output.status.code(), json)
}

#[test]
fn status_shows_holders_and_waiters_field_by_field() {
    let world = World::consul("status-live");
    let holder = hold_slot(&world, 1, "ready", "go");
    let waiter = world.spawn(1, &[], &["true"]);
    wait_until(PROMPT, "the waiter's contender key", || {
        world.contender_keys() == 2
    });

    let (code, json) = status_json(&world);
    assert_eq!(code, Some(0), "{json}");
    assert_eq!(json["limit"], 1);
    assert_eq!(json["layout"], "map");
    let holders = json["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 1, "{json}");
    let h = &holders[0];
    assert_eq!(h["pid"], u64::from(holder.id()), "{json}");
    assert!(h["host"].as_str().is_some_and(|s| !s.is_empty()), "{json}");
    assert!(
        h["command"].as_str().unwrap().starts_with("sh -c"),
        "{json}"
    );
    assert!(h["started"].as_str().unwrap().ends_with('Z'), "{json}");
    assert!(h["node"].as_str().is_some(), "{json}");
    assert!(
        h["session_name"].as_str().unwrap().contains(&world.prefix),
        "{json}"
    );
    assert_eq!(h["session"].as_str().unwrap().len(), 36);
    let waiters = json["waiters"].as_array().unwrap();
    assert_eq!(waiters.len(), 1, "{json}");
    assert_eq!(waiters[0]["pid"], u64::from(waiter.id()));
    assert!(waiters[0]["create_index"].as_u64() > h["create_index"].as_u64());
    assert_eq!(json["dead_holders"], serde_json::json!([]));

    let table = stdout(&admin(&world, "status", &[]));
    assert!(table.contains("1 of 1 slots held, 1 waiting"), "{table}");
    assert!(
        table.contains("HOLDERS") && table.contains("WAITING"),
        "{table}"
    );

    world.touch("go");
    assert_eq!(finish(holder).status.code(), Some(0));
    assert_eq!(finish(waiter).status.code(), Some(0));
    world.assert_clean();
}

#[test]
fn status_reads_the_consul_lock_layout_and_dead_holders() {
    let world = World::consul("status-peer");
    let peer = consul_lock_holder(&world, 2);
    let (code, json) = status_json(&world);
    assert_eq!(code, Some(0), "{json}");
    assert_eq!(json["limit"], 2);
    let holder = &json["holders"][0];
    assert_eq!(holder["session"], peer.as_str());
    // consul lock leaves its contender value empty: what is known is shown.
    assert!(
        holder["host"].is_null() && holder["pid"].is_null(),
        "{json}"
    );
    assert_eq!(holder["session_name"], "consul lock peer");

    world.store.destroy_session(&peer);
    let (code, json) = status_json(&world);
    assert_eq!(code, Some(0));
    assert_eq!(json["holders"], serde_json::json!([]));
    assert_eq!(json["dead_holders"], serde_json::json!([peer]));
    world.store.delete_tree(&format!("{}/", world.prefix));
    world.assert_clean();
}

#[test]
fn status_of_a_foreign_lock_is_a_conflict() {
    let world = World::consul("status-foreign");
    world
        .store
        .put(&world.key(".lock"), b"garbage", SEMAPHORE_FLAGS);
    let output = admin(&world, "status", &[]);
    assert_eq!(output.status.code(), Some(65), "{}", stderr(&output));
    assert_eq!(stderr(&output).lines().count(), 1);
    world.store.delete_tree(&format!("{}/", world.prefix));
    world.assert_clean();
}

#[test]
fn reset_clears_a_lock_left_by_dead_holders_so_a_new_limit_works() {
    let world = World::consul("reset-dead");
    world.store.put(
        &world.key(".lock"),
        br#"{"Limit":2,"Holders":{"00000000-0000-4000-8000-000000000001":true}}"#,
        SEMAPHORE_FLAGS,
    );
    let output = world.consem(3, &[], &["true"]).output().unwrap();
    assert_eq!(
        output.status.code(),
        Some(65),
        "another limit is a conflict"
    );
    let output = admin(&world, "reset", &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let output = world.consem(3, &[], &["true"]).output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    world.assert_clean();
}

/// Releasing the last holder of a prefix (here a `consul lock` peer, whose
/// own process would not tidy up) deletes `.lock`, as a consem leaving
/// last does.
#[test]
fn releasing_the_last_holder_leaves_the_prefix_empty() {
    let world = World::consul("release-last");
    let peer = consul_lock_holder(&world, 2);
    let output = admin(&world, "release", &["--session", &peer]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(world.lock_value(), None, "an empty .lock was left behind");
    world.assert_clean();
}
