//! `consem run` on the Consul store, end to end: the real binary against the
//! Consul double (or a real agent when CONSEM_TEST_CONSUL_ADDR is set): the
//! layout shared with `consul lock`, sessions, faults, herd-free waiting.
//! What every store does is in tests/conformance.rs. One behaviour per test;
//! every test ends by checking that nothing is left behind.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::double::{Fault, Match};
use crate::common::world::*;
use crate::common::{encode_key, http, wait_until};

#[test]
fn child_sees_its_slot_in_the_environment() {
    let world = World::consul("env");
    let script = r#"printf '%s|%s|%s|%s|%s' "$CONSEM_PREFIX" "$CONSEM_LIMIT" "$CONSUL_LOCK_HELD" "$CONSEM_SESSION" "$CONSEM_FENCE""#;
    let output = world
        .consem(3, &[], &["sh", "-c", script])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = String::from_utf8(output.stdout).unwrap();
    let fields: Vec<&str> = text.split('|').collect();
    assert_eq!(fields[..3], [world.prefix.as_str(), "3", "true"]);
    assert_eq!(fields[3].len(), 36, "a session ID: {text}");
    assert!(fields[4].parse::<u64>().unwrap() > 0, "a fence: {text}");
    world.assert_clean();
}

#[test]
fn a_lock_in_the_list_form_is_used_and_kept_in_that_form() {
    let world = World::consul("list-form");
    world.store.put(
        &world.key(".lock"),
        br#"{"Limit":2,"Holders":[]}"#,
        SEMAPHORE_FLAGS,
    );
    let holder = hold_slot(&world, 2, "ready", "go");
    let lock = world.lock_value().unwrap();
    let holders = lock["Holders"].as_array().expect("still a list");
    assert_eq!(holders.len(), 1);
    world.touch("go");
    let output = finish(holder);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    world.assert_clean();
}

#[test]
fn shares_a_prefix_with_a_consul_lock_holder() {
    let world = World::consul("consul-lock-peer");
    let peer = consul_lock_holder(&world, 2);
    let holder = hold_slot(&world, 2, "ready", "go");
    let lock = world.lock_value().unwrap();
    let holders = lock["Holders"].as_object().expect("still a map");
    assert_eq!(holders.len(), 2, "{lock}");
    assert_eq!(holders[&peer], serde_json::Value::Bool(true));
    world.touch("go");
    assert_eq!(finish(holder).status.code(), Some(0));
    // The peer still holds its slot: .lock stays, naming only the peer.
    let lock = world.lock_value().expect(".lock kept for the peer");
    assert_eq!(lock["Holders"].as_object().unwrap().len(), 1, "{lock}");
    assert!(lock["Holders"].get(&peer).is_some());
    world.store.destroy_session(&peer);
    world.store.delete_tree(&format!("{}/", world.prefix));
    world.assert_clean();
}

#[test]
fn waits_for_a_consul_lock_holder_and_times_out() {
    let world = World::consul("consul-lock-full");
    let peer = consul_lock_holder(&world, 1);
    let output = world
        .consem(1, &["--timeout", "1s"], &["true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(75), "{}", stderr(&output));
    let lock = world.lock_value().unwrap();
    assert_eq!(lock["Holders"].as_object().unwrap().len(), 1, "{lock}");
    world.store.destroy_session(&peer);
    world.store.delete_tree(&format!("{}/", world.prefix));
    world.assert_clean();
}

#[test]
fn a_foreign_lock_is_a_conflict_and_stays_untouched() {
    for (name, value, flags, limit) in [
        ("flags", &br#"{"Limit":2,"Holders":{}}"#[..], 0u64, 2u32),
        ("limit", br#"{"Limit":3,"Holders":{}}"#, SEMAPHORE_FLAGS, 2),
        ("garbage", b"\x00not json\xff", SEMAPHORE_FLAGS, 2),
    ] {
        let world = World::consul(&format!("foreign-{name}"));
        world.store.put(&world.key(".lock"), value, flags);
        let before = world.entries();
        let output = world.consem(limit, &[], &["true"]).output().unwrap();
        assert_eq!(
            output.status.code(),
            Some(65),
            "{name}: {}",
            stderr(&output)
        );
        let message = stderr(&output);
        assert!(message.contains(".lock"), "{name}: {message}");
        assert_eq!(message.lines().count(), 1, "{name}: one line: {message}");
        assert_eq!(world.entries(), before, "{name}: .lock changed");
        world.store.delete_tree(&format!("{}/", world.prefix));
        world.assert_clean();
    }
}

#[test]
fn an_operator_destroying_the_session_stops_the_child_with_76() {
    let world = World::consul("slot-lost-operator");
    let script = format!("echo $$ > '{}'; exec sleep 60", world.path("pid"));
    let child = world.spawn(1, &["--kill-grace", "1s"], &["sh", "-c", &script]);
    wait_until(PROMPT, "the child to start", || world.exists("pid"));
    let session = world.sessions().pop().unwrap().0;
    let started = Instant::now();
    world.store.destroy_session(&session);
    let output = finish(child);
    assert_eq!(output.status.code(), Some(76), "{}", stderr(&output));
    assert!(stderr(&output).contains("slot lost"), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("invalidated"),
        "{}",
        stderr(&output)
    );
    assert!(started.elapsed() < PROMPT);
    let pid: i32 = std::fs::read_to_string(world.path("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: signal 0 only asks whether the process exists.
    assert_ne!(unsafe { libc::kill(pid, 0) }, 0, "the child was stopped");
    world.assert_clean();
}

/// A lost slot is reported as what was seen: the contender key deleted by
/// hand (the session lives on), the key released from the session, the
/// holder taken out of `.lock`, `.lock` deleted, or the session invalidated.
#[test]
fn a_lost_slot_says_what_was_observed() {
    type Take = fn(&World<TestConsul>, &str);
    let cases: [(&str, Take, &str); 5] = [
        (
            "key deleted",
            |world, session| {
                let key = encode_key(&world.key(session));
                world.store.request("DELETE", &format!("/v1/kv/{key}"), b"");
            },
            "our contender key was deleted while our session is alive",
        ),
        (
            "key released",
            |world, session| {
                let key = encode_key(&world.key(session));
                let path = format!("/v1/kv/{key}?release={session}");
                world.store.request("PUT", &path, b"");
            },
            "released from our session",
        ),
        (
            "taken out of .lock",
            |world, _| {
                world.store.put(
                    &world.key(".lock"),
                    br#"{"Limit":1,"Holders":{}}"#,
                    SEMAPHORE_FLAGS,
                )
            },
            "removed from the holders",
        ),
        (
            ".lock deleted",
            |world, _| {
                let key = encode_key(&world.key(".lock"));
                world.store.request("DELETE", &format!("/v1/kv/{key}"), b"");
            },
            "the .lock key was deleted",
        ),
        (
            "session destroyed",
            |world, session| world.store.destroy_session(session),
            "invalidated",
        ),
    ];
    for (name, take, said) in cases {
        let world = World::consul("loss-report");
        let holder = world.spawn(1, &[], &strs(&world.held_until("ready", "go", 0)));
        wait_until(PROMPT, "the child to start", || world.exists("ready"));
        let session = world.sessions().pop().unwrap().0;
        take(&world, &session);
        let output = finish(holder);
        let message = stderr(&output);
        assert_eq!(output.status.code(), Some(76), "{name}: {message}");
        assert!(message.contains(said), "{name}: {message}");
        if name != "session destroyed" {
            assert!(!message.contains("invalidated"), "{name}: {message}");
        }
        world.store.delete_tree(&format!("{}/", world.prefix));
        world.assert_clean();
    }
}

/// A session create still unanswered when the run ends is reported, though
/// no session ID is known yet: what it creates lives until its TTL runs out
/// twice over.
#[test]
fn a_session_create_in_flight_at_exit_is_reported() {
    let message = a_slow_session_create_ends_the_run(3, &["--timeout", "500ms"], 75);
    assert!(message.contains("still in flight"), "{message}");
}

/// A session create that went out and got no answer within its budget (a
/// stalled agent) may still land: the run that gives up on it says so, as
/// for one still in flight.
#[test]
fn a_session_create_that_got_no_answer_is_reported() {
    let message = a_slow_session_create_ends_the_run(12, &["--try"], 69);
    assert!(message.contains("no answer in time"), "{message}");
    assert!(message.contains("got no answer"), "{message}");
}

/// Runs consem (`--ttl 10s` and `extra`) with its session create answered
/// only after `delay_secs`, checks that the run ends with `code` and warns
/// of the session left for 2×TTL, waits for that session to land, removes
/// it, and returns consem's stderr.
fn a_slow_session_create_ends_the_run(delay_secs: u64, extra: &[&str], code: i32) -> String {
    let world = World::on_the_double("create-unsettled");
    let double = world.the_double();
    double.inject(
        Fault::delay(Duration::from_secs(delay_secs), 1)
            .on(Match::method_path("PUT", "/v1/session/create")),
    );
    let args: Vec<&str> = ["--ttl", "10s"].iter().chain(extra).copied().collect();
    let output = world.consem(1, &args, &["true"]).output().unwrap();
    let message = stderr(&output);
    assert_eq!(output.status.code(), Some(code), "{message}");
    assert!(message.contains("within 20s"), "{message}");
    // The request lands after consem is gone and leaves its session, as said.
    wait_until(PROMPT, "the delayed session create to land", || {
        !world.sessions().is_empty()
    });
    for (id, _) in world.sessions() {
        world.store.destroy_session(&id);
    }
    world.assert_clean();
    message
}

/// A `.lock` naming more live holders than its Limit (a hand edit) is a
/// conflict: `run` refuses to join it (65) and leaves it as it is, and
/// `status` shows the holders and says so.
#[test]
fn a_lock_with_more_live_holders_than_its_limit_is_a_conflict() {
    let world = World::consul("over-limit");
    let first = consul_lock_holder(&world, 1);
    let second = peer_session(&world, "another holder");
    let key = encode_key(&world.key(&second));
    let path = format!("/v1/kv/{key}?acquire={second}&flags={SEMAPHORE_FLAGS}");
    assert_eq!(world.store.request("PUT", &path, b"").1.trim(), "true");
    let both = format!(r#"{{"Limit":1,"Holders":{{"{first}":true,"{second}":true}}}}"#);
    world
        .store
        .put(&world.key(".lock"), both.as_bytes(), SEMAPHORE_FLAGS);
    let before = world.entries();
    let output = world.consem(1, &[], &["true"]).output().unwrap();
    let message = stderr(&output);
    assert_eq!(output.status.code(), Some(65), "{message}");
    assert!(
        message.contains("2 live holders but its Limit is 1"),
        "{message}"
    );
    assert!(message.contains("consem release"), "{message}");
    assert_eq!(message.lines().count(), 1, "{message}");
    assert_eq!(world.entries(), before, ".lock changed");
    let status = world.admin("status", &[]).output().unwrap();
    assert_eq!(status.status.code(), Some(65));
    let table = String::from_utf8_lossy(&status.stdout);
    // Each by a unique beginning of its session ID, which release takes.
    assert!(
        table.contains(&first[..8]) && table.contains(&second[..8]),
        "{table}"
    );
    assert!(
        stderr(&status).contains("2 live holders"),
        "{}",
        stderr(&status)
    );
    let json = world.admin("status", &["--json"]).output().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(
        json["conflict"]
            .as_str()
            .is_some_and(|c| c.contains("limit of 1")),
        "{json}"
    );
    world.store.destroy_session(&first);
    world.store.destroy_session(&second);
    world.store.delete_tree(&format!("{}/", world.prefix));
    world.assert_clean();
}

#[test]
fn failures_past_monitor_retry_stop_the_child_with_76() {
    let world = World::on_the_double("slot-lost-faults");
    let double = world.the_double();
    let holder = world.spawn(
        1,
        &["--monitor-retry", "2"],
        &strs(&world.held_until("ready", "go", 0)),
    );
    wait_until(PROMPT, "the child to start", || world.exists("ready"));
    double.inject(
        Fault::status(500, "No cluster leader", 3).on(Match::method_path("GET", "/v1/kv/")),
    );
    nudge(double, &world);
    let output = finish(holder);
    assert_eq!(output.status.code(), Some(76), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("No cluster leader"),
        "{}",
        stderr(&output)
    );
    world.assert_clean();
}

#[test]
fn failures_within_monitor_retry_do_not_stop_the_child() {
    let world = World::on_the_double("faults-tolerated");
    let double = world.the_double();
    let kv_reads = Match::method_path("GET", "/v1/kv/");
    holder_rides_out(
        &world,
        double,
        vec![
            Fault::status(500, "No cluster leader", 2).on(kv_reads.clone()),
            Fault::drop_connection(1).on(kv_reads),
        ],
    );
}

/// With the default settings (no `--monitor-retry`), a holder tries again
/// for as long as its lease lasts, as docs/run.md documents ("no limit: the
/// lease decides"): five failures in a row of its watch of `.lock` (0.5 s,
/// then 1 s apart, well within the 12.5 s of a 15 s TTL's lease) do not
/// stop its command.
#[test]
fn with_the_default_settings_a_holder_retries_while_its_lease_lasts() {
    let world = World::on_the_double("faults-default");
    let double = world.the_double();
    let holder = spawn_verbose(
        &world,
        1,
        &[],
        &strs(&world.held_until("ready", "go", 0)),
        "holder.log",
    );
    wait_until(PROMPT, "the child to start", || world.exists("ready"));
    let lock_reads = Match::method_path("GET", "/.lock");
    let reads = |double: &crate::common::ConsulDouble| {
        double
            .requests()
            .iter()
            .filter(|r| r.method == "GET" && r.path.ends_with("/.lock"))
            .count()
    };
    let before = reads(double);
    double.inject(Fault::status(500, "No cluster leader", 5).on(lock_reads));
    nudge(double, &world);
    wait_until(PROMPT, "five failed reads of .lock and a good one", || {
        reads(double) > before + 5
    });
    world.touch("go");
    let output = finish(holder);
    let log = log_text(&world, "holder.log");
    assert_eq!(output.status.code(), Some(0), "{log}");
    assert!(log.contains(" watch-retry failures=5 "), "{log}");
    world.assert_clean();
}

/// `--timeout` bounds the wait, not the first attempt, which gets up to
/// 2 s for the store's answer (docs/run.md, `--timeout`): a session created in
/// 1 s still takes the free slot under `--timeout 1ms`, and a store that
/// never answers is given up with 75 at 2 s, not at the timeout nor at the
/// call's own budget (10 s).
#[test]
fn a_short_timeout_gives_the_first_attempt_2s() {
    let world = World::on_the_double("first-attempt");
    let double = world.the_double();
    let creates = Match::path("/v1/session/create");
    double.inject(Fault::delay(Duration::from_secs(1), 1).on(creates.clone()));
    let slow = world
        .consem(1, &["--timeout", "1ms"], &["printf", "ran"])
        .output()
        .unwrap();
    assert_eq!(slow.status.code(), Some(0), "{}", stderr(&slow));
    assert_eq!(slow.stdout, b"ran");
    double.inject(Fault::stall(1).on(creates));
    let started = Instant::now();
    let stalled = world
        .consem(
            1,
            &["-v", "--timeout", "1ms"],
            &["touch", &world.path("ran")],
        )
        .output()
        .unwrap();
    let took = started.elapsed();
    assert_eq!(stalled.status.code(), Some(75), "{}", stderr(&stalled));
    assert!(
        stderr(&stalled).contains(" timed-out"),
        "{}",
        stderr(&stalled)
    );
    // Given up at 2 s; leaving then takes a second at most.
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_millis(4500),
        "gave up after {took:?}"
    );
    assert!(!world.exists("ran"));
}

#[test]
fn consul_down_at_start_exits_69_naming_the_address() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let output = Command::new(env!("CARGO_BIN_EXE_consem"))
        .args([
            "run",
            "--prefix",
            "p",
            "--limit",
            "1",
            "--http-addr",
            &addr,
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(69));
    let message = stderr(&output);
    assert!(message.contains(&addr), "{message}");
    assert!(
        message.contains("use --store local"),
        "names the store that needs no server: {message}"
    );
    assert!(
        message.contains(": connection refused (") && !message.contains("os error"),
        "says the cause without the layers' noise: {message}"
    );
    assert_eq!(message.lines().count(), 1, "{message}");
}

/// A token file's path that cannot be read as text is refused, naming the
/// variable, never taken as "no token".
#[test]
fn a_token_file_path_that_is_not_utf8_is_a_usage_error() {
    use std::os::unix::ffi::OsStrExt as _;
    let world = World::consul("token-file-bytes");
    let output = world
        .consem(1, &[], &["touch", &world.path("ran")])
        .env(
            "CONSUL_HTTP_TOKEN_FILE",
            std::ffi::OsStr::from_bytes(b"/tmp/token-\xff"),
        )
        .output()
        .unwrap();
    let message = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{message}");
    assert!(message.contains("CONSUL_HTTP_TOKEN_FILE"), "{message}");
    assert_eq!(message.lines().count(), 1, "{message}");
    assert!(!world.exists("ran"));
    world.assert_clean();
}

/// An argument that is not UTF-8 is a usage error that names its option,
/// in either log format (it once made consem panic).
#[test]
fn an_argument_that_is_not_utf8_is_a_usage_error_naming_its_option() {
    use std::os::unix::ffi::OsStrExt as _;
    for format in ["text", "json"] {
        let output = Command::new(env!("CARGO_BIN_EXE_consem"))
            .args(["run", "--log-format", format, "--limit", "1", "--prefix"])
            .arg(std::ffi::OsStr::from_bytes(b"jobs/\xff"))
            .args(["--", "true"])
            .output()
            .unwrap();
        let message = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{message}");
        assert_eq!(message.lines().count(), 1, "{message}");
        assert!(message.contains("--prefix is not valid UTF-8"), "{message}");
    }
}

#[test]
fn usage_errors_exit_2_with_one_line() {
    let world = World::consul("usage");
    for extra in [
        &["--prefix", "/"][..],
        &["--prefix", "p", "--http-addr", "ftp://x"],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_consem"))
            .args(["run", "--limit", "1"])
            .args(extra)
            .args(["--", "true"])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{extra:?}");
        assert_eq!(stderr(&output).lines().count(), 1, "{}", stderr(&output));
    }
    let _ = Path::new(&world.dir);
}

/// What clap finds wrong is one line too, with the prefix every error has,
/// and a JSON object with `--log-format json`.
#[test]
fn command_line_errors_are_one_line_in_either_log_format() {
    for (args, says) in [
        (
            &["run", "--limit", "two", "--prefix", "p", "--", "true"][..],
            "expected a whole number",
        ),
        (&["run", "--prefix", "p", "--", "true"], "--limit <N>"),
        (
            &["run", "--prefix", "p", "--limit", "1", "true"],
            "the command goes after --",
        ),
        (&["frobnicate"], "unrecognized subcommand"),
    ] {
        for json in [false, true] {
            let mut command = Command::new(env!("CARGO_BIN_EXE_consem"));
            command.arg(args[0]);
            if json {
                command.arg("--log-format=json");
            }
            command.args(&args[1..]);
            let output = command.output().unwrap();
            assert_eq!(output.status.code(), Some(2), "{args:?}");
            let text = stderr(&output);
            assert_eq!(text.lines().count(), 1, "{args:?}: {text}");
            assert!(text.contains(says), "{args:?}: {text}");
            if json {
                let line: serde_json::Value = serde_json::from_str(&text).unwrap();
                assert_eq!(line["level"], "error", "{text}");
            } else {
                assert!(text.starts_with("consem: error: "), "{text}");
            }
        }
    }
}

#[test]
fn verbose_reports_the_lifecycle_on_stderr_only() {
    let world = World::consul("verbose");
    let output = world
        .consem(1, &["-v"], &["printf", "out"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(output.stdout, b"out");
    let log = stderr(&output);
    for event in [
        "session-created",
        "acquired",
        "started",
        "exited",
        "released",
    ] {
        assert!(log.contains(&format!(" {event}")), "no {event} in:\n{log}");
    }
    world.assert_clean();
}

#[test]
fn json_log_lines_are_one_object_each() {
    let world = World::consul("json-log");
    let output = world
        .consem(1, &["-v", "--log-format", "json"], &["printf", "out"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(output.stdout, b"out");
    let events: Vec<serde_json::Value> = stderr(&output)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    for event in &events {
        assert_eq!(event["level"], "info");
        assert!(event["time"].as_str().unwrap().ends_with('Z'));
        assert!(event["consem_pid"].as_u64().is_some());
    }
    let names: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    for wanted in [
        "session-created",
        "acquired",
        "started",
        "exited",
        "released",
    ] {
        assert!(names.contains(&wanted), "no {wanted} in {names:?}");
    }
    let acquired = events.iter().find(|e| e["event"] == "acquired").unwrap();
    assert_eq!(acquired["prefix"], world.prefix.as_str());
    world.assert_clean();
}

#[test]
fn option_errors_speak_json_too() {
    let output = Command::new(env!("CARGO_BIN_EXE_consem"))
        .args([
            "run",
            "--log-format",
            "json",
            "--prefix",
            "/",
            "--limit",
            "1",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let line: serde_json::Value = serde_json::from_slice(&output.stderr).unwrap();
    assert_eq!(line["level"], "error");
    assert!(
        line["message"].as_str().unwrap().contains("--prefix"),
        "{line}"
    );
}

/// Herd-free waiting: a waiter further back blocks on the contender key of
/// the waiter just ahead of it (which rewrites it when it takes its slot),
/// not on the whole prefix, so handing the slot on does not make every
/// waiter re-read the prefix. Requests are what the double recorded.
#[test]
fn waiters_further_back_block_on_the_key_ahead_and_handoffs_stay_cheap() {
    const WAITERS: usize = 10;
    let world = World::on_the_double("herd-free");
    let double = world.the_double();
    let holder = hold_slot(&world, 1, "ready", "go");
    let contender_names = || -> Vec<String> {
        world
            .entries()
            .into_iter()
            .filter_map(|e| e.key.rsplit('/').next().map(str::to_string))
            .filter(|name| name != ".lock")
            .collect()
    };
    let log = world.path("order");
    let mut waiters = Vec::new();
    let mut arrivals: Vec<String> = Vec::new();
    for position in 0..WAITERS {
        let known = contender_names();
        // Each command runs until the test lets it go: the relay is made
        // once the command has started, and a command that ended first
        // would leave its wake-up to the release.
        let script = format!(
            "echo {position} >> '{log}'; touch '{}'; while [ ! -e '{}' ]; do sleep 0.02; done",
            world.path(&format!("ready-{position}")),
            world.path(&format!("go-{position}"))
        );
        waiters.push(world.spawn(1, &[], &["sh", "-c", &script]));
        wait_until(PROMPT, "the waiter's contender key", || {
            world.contender_keys() == position + 2
        });
        let new = contender_names().into_iter().find(|n| !known.contains(n));
        arrivals.push(new.unwrap());
    }
    // Each waiter but the first (which one departure can serve) blocks on
    // the key of the waiter that arrived just before it.
    for ahead in &arrivals[..WAITERS - 1] {
        let path = format!("/v1/kv/{}", world.key(ahead));
        wait_until(PROMPT, "a blocking read of the key ahead", || {
            double.requests().iter().any(|r| {
                r.method == "GET"
                    && r.path == path
                    && r.query_value("index").is_some_and(|i| i != "0")
            })
        });
    }
    let before = double.requests().len();
    world.touch("go");
    assert_eq!(finish(holder).status.code(), Some(0));
    let relayed = |name: &str| {
        let path = format!("/v1/kv/{}", world.key(name));
        double
            .requests()
            .iter()
            .any(|r| r.method == "PUT" && r.path == path && r.query_value("cas").is_some())
    };
    for (position, name) in arrivals.iter().enumerate() {
        wait_until(PROMPT, "the next command to start", || {
            world.exists(&format!("ready-{position}"))
        });
        if position < WAITERS - 1 {
            wait_until(PROMPT, "its relay write", || relayed(name));
        }
        world.touch(&format!("go-{position}"));
    }
    for waiter in waiters {
        let output = finish(waiter);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    }
    let order = std::fs::read_to_string(&log).unwrap();
    let expected: String = (0..WAITERS).map(|p| format!("{p}\n")).collect();
    assert_eq!(order, expected, "slots went out of arrival order");
    // Each waiter that took its slot with someone behind it relayed: it
    // rewrote its key with a CAS on the index the confirming read showed,
    // never with an acquire, which would bring back a key that an operator
    // deleted or released in between (and start the command without a slot).
    // The holder that handed it the slot rewrote it too, with a CAS on the
    // index its own listing showed (the relay then finds the key changed
    // if that came first, and writes nothing).
    for name in &arrivals[..WAITERS - 1] {
        let path = format!("/v1/kv/{}", world.key(name));
        let writes: Vec<&str> = double
            .requests()
            .iter()
            .filter(|r| r.method == "PUT" && r.path == path)
            .map(|r| {
                if r.query_value("acquire").is_some() {
                    "acquire"
                } else if r.query_value("cas").is_some() {
                    "cas"
                } else {
                    "plain"
                }
            })
            .collect();
        assert_eq!(
            writes,
            ["acquire", "cas", "cas"],
            "writes of {name}'s key: joining, then the wake-up and the relay"
        );
    }
    let listings = double.requests()[before..]
        .iter()
        .filter(|r| r.method == "GET" && r.query_value("recurse").is_some())
        .count();
    // About 4.5 a waiter here; with every waiter on the prefix it was about
    // 13 (it grows with the waiters: each handoff woke all that remained).
    assert!(
        listings <= 7 * WAITERS,
        "{listings} prefix listings while {WAITERS} waiters took their turn"
    );
    world.assert_clean();
}

/// A leaving holder hands its slot on deciding on the listing that
/// confirmed its slot, with `.lock` and its heir's key read afresh: the
/// prefix listing, as long as the crowd, is not read again on the
/// hand-off's path while that listing shows a waiter (here it does for
/// every holder but the first, whose slot was taken on an empty prefix,
/// and the last). Requests are what the double recorded.
#[test]
fn a_hand_off_reads_lock_and_the_heirs_key_not_the_prefix() {
    const WAITERS: usize = 5;
    let world = World::on_the_double("hand-off-reads");
    let double = world.the_double();
    let holder = hold_slot(&world, 1, "ready", "go");
    let log = world.path("order");
    let waiters: Vec<_> = (0..WAITERS)
        .map(|position| {
            let script = format!("echo {position} >> '{log}'");
            let waiter = world.spawn(1, &[], &["sh", "-c", &script]);
            wait_until(PROMPT, "the waiter's contender key", || {
                world.contender_keys() == position + 2
            });
            waiter
        })
        .collect();
    let before = double.requests().len();
    world.touch("go");
    assert_eq!(finish(holder).status.code(), Some(0));
    for waiter in waiters {
        let output = finish(waiter);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    }
    let order = std::fs::read_to_string(&log).unwrap();
    let expected: String = (0..WAITERS).map(|p| format!("{p}\n")).collect();
    assert_eq!(order, expected, "slots went out of arrival order");
    let lock_path = format!("/v1/kv/{}", world.key(".lock"));
    let fresh_lock_reads = double.requests()[before..]
        .iter()
        .filter(|r| {
            r.method == "GET"
                && r.path == lock_path
                && r.query_value("consistent").is_some()
                && r.query_value("index").is_none()
        })
        .count();
    assert!(
        fresh_lock_reads >= WAITERS - 1,
        "{fresh_lock_reads} reads of .lock alone for {} hand-offs decided on a known listing",
        WAITERS - 1
    );
    world.assert_clean();
}

/// A holder whose confirming listing went out of date while it held (every
/// waiter it showed has left, and others came) still hands its slot on,
/// after one fresh listing: skipping the stale listing's waiters one read
/// at a time ran out of attempts, and no hand-off was made.
#[test]
fn a_holder_whose_listing_went_stale_still_hands_its_slot_on() {
    const GONE: usize = 10;
    let world = World::on_the_double("stale-listing");
    let first = hold_slot(&world, 1, "ready0", "go0");
    let holder = world.spawn(1, &["-v"], &strs(&world.held_until("ready1", "go1", 0)));
    wait_until(PROMPT, "the holder-to-be to queue", || {
        world.contender_keys() == 2
    });
    let gone: Vec<_> = (0..GONE)
        .map(|i| {
            let waiter = world.spawn(1, &[], &["true"]);
            wait_until(PROMPT, "a waiter to queue", || {
                world.contender_keys() == i + 3
            });
            waiter
        })
        .collect();
    world.touch("go0");
    assert_eq!(finish(first).status.code(), Some(0));
    wait_until(PROMPT, "the holder's command to start", || {
        world.exists("ready1")
    });
    // Every waiter its confirming listing showed leaves; a newcomer comes.
    for waiter in &gone {
        signal(waiter, libc::SIGTERM);
    }
    for waiter in gone {
        finish(waiter);
    }
    wait_until(PROMPT, "the waiters' keys to go", || {
        world.contender_keys() == 1
    });
    let newcomer = world.spawn(1, &[], &["true"]);
    wait_until(PROMPT, "the newcomer to queue", || {
        world.contender_keys() == 2
    });
    world.touch("go1");
    let held = finish(holder);
    assert_eq!(held.status.code(), Some(0), "{}", stderr(&held));
    assert!(
        stderr(&held).contains(" handed-over "),
        "no hand-off: {}",
        stderr(&held)
    );
    assert_eq!(finish(newcomer).status.code(), Some(0));
    world.assert_clean();
}

/// A `consul lock` waiter does not relay (its contender key's value is
/// empty) and does not queue: a consem that arrived after it neither blocks
/// on its key nor waits for it, and takes the slot when the holder leaves.
#[test]
fn a_consul_lock_waiter_does_not_hold_up_a_consem_waiter() {
    let world = World::on_the_double("behind-peer");
    let double = world.the_double();
    let holder = consul_lock_holder(&world, 1);
    let peer = peer_session(&world, "consul lock waiter");
    let peer_key = world.key(&peer);
    let url = format!(
        "{}/v1/kv/{}?acquire={peer}&flags={SEMAPHORE_FLAGS}",
        world.store.base_url(),
        encode_key(&peer_key)
    );
    assert_eq!(http("PUT", &url, b"").1.trim(), "true");
    let waiter = world.spawn(1, &[], &["true"]);
    let dir = format!("/v1/kv/{}/", world.prefix);
    wait_until(PROMPT, "the consem's blocking read of the prefix", || {
        double.requests().iter().any(|r| {
            r.path == dir
                && r.query_value("recurse").is_some()
                && r.query_value("index").is_some_and(|i| i != "0")
        })
    });
    let peer_path = format!("/v1/kv/{peer_key}");
    assert!(
        !double
            .requests()
            .iter()
            .any(|r| r.method == "GET" && r.path == peer_path),
        "consem read the key of a waiter that does not relay"
    );
    // The holder leaves; the peer, which would have raced for the slot,
    // does nothing here: the consem takes it though the peer came first.
    world.store.destroy_session(&holder);
    let output = finish(waiter);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    // The consem left while the peer still waited: `.lock` stays, empty,
    // for the peer, whose own exit (played here) removes what is left.
    let lock = world.lock_value().expect(".lock kept for the waiting peer");
    assert_eq!(lock["Holders"], serde_json::json!({}));
    world.store.destroy_session(&peer);
    world.store.delete_tree(&world.prefix);
    world.assert_clean();
}

/// Beside clients that do not queue (`consul lock`), a consem holder that
/// leaves hands its slot straight to the first consem waiter, in the same
/// write that takes it out of `.lock`: the `consul lock` loops that arrived
/// after that waiter, racing for every slot they see free, never see this
/// one free.
#[test]
fn a_leaving_holder_hands_its_slot_to_the_consem_waiter_beside_consul_lock() {
    use crate::common::consul_lock::ConsulLockLoop;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let world = World::consul("hand-off");
    let peer = consul_lock_holder(&world, 2);
    let holder = hold_slot(&world, 2, "held", "leave");
    let waiter = world.spawn(2, &[], &strs(&world.held_until("runs", "done", 0)));
    wait_until(PROMPT, "the consem waiter to join", || {
        world.contender_keys() == 3
    });
    let base = format!("http://{}", world.http_addr());
    let racing: Vec<Arc<AtomicBool>> = (0..3).map(|_| Arc::new(AtomicBool::new(false))).collect();
    let racers: Vec<ConsulLockLoop> = racing
        .iter()
        .map(|flag| {
            ConsulLockLoop::start_watched(
                &base,
                &world.prefix,
                2,
                Duration::from_millis(20),
                Some(Arc::clone(flag)),
            )
        })
        .collect();
    wait_until(PROMPT, "the consul lock loops to join", || {
        world.contender_keys() == 6
    });
    world.touch("leave");
    assert_eq!(finish(holder).status.code(), Some(0));
    wait_until(PROMPT, "the consem waiter's command to start", || {
        world.exists("runs")
    });
    assert!(
        racers.iter().all(|r| r.runs() == 0) && racing.iter().all(|f| !f.load(Ordering::SeqCst)),
        "a consul lock loop took the slot the leaving consem handed on"
    );
    // The peer and the heir hold; the holder that left is named `false`
    // until the next write of `.lock` finds its key gone.
    let lock = world.lock_value().expect(".lock");
    let holding = |held: bool| {
        lock["Holders"]
            .as_object()
            .map(|h| h.values().filter(|v| **v == held).count())
    };
    assert_eq!(
        (holding(true), holding(false)),
        (Some(2), Some(1)),
        "{lock}"
    );
    world.touch("done");
    let output = finish(waiter);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    // The slot the consem leaves without a consem waiter goes to the race.
    wait_until(PROMPT, "a consul lock loop to run", || {
        racers.iter().any(|r| r.runs() > 0)
    });
    for racer in racers {
        racer.stop();
    }
    // The peers played here leave `.lock` naming the one that never ran a
    // loop; nothing of consem's is left.
    world.store.destroy_session(&peer);
    world.store.delete_tree(&world.prefix);
    world.assert_clean();
}

/// Holders in `.lock` whose names no contender key can have (`.`, `..`,
/// empty, with a `/`): dead, pruned without asking Consul for a key it
/// would answer with a redirect.
#[test]
fn holders_that_cannot_have_a_contender_key_are_pruned() {
    let world = World::consul("odd-holders");
    world.store.put(
        &world.key(".lock"),
        br#"{"Limit":1,"Holders":{".":true,"..":true,"":true,"a/b":true}}"#,
        SEMAPHORE_FLAGS,
    );
    let output = world.consem(1, &[], &["printf", "ran"]).output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(output.stdout, b"ran");
    world.assert_clean();
}

/// A holder that hands its slot on is out of `.lock` a moment before its
/// session ends and takes its contender key with it. An heir whose command
/// ends within that moment must not hand the slot back to it: the session
/// then ends, and `.lock` would go on naming a dead holder on an idle
/// prefix (and hold up a waiter behind until someone pruned it). The
/// double holds the leaving holder's session destroy back, so that the
/// heir leaves inside that moment every time.
#[test]
fn an_heir_that_leaves_at_once_does_not_hand_the_slot_back() {
    let world = World::on_the_double("hand-back");
    let double = world.the_double();
    let first = hold_slot(&world, 1, "ready", "go");
    let first_session = world
        .entries()
        .iter()
        .map(|e| e.key.rsplit('/').next().unwrap().to_string())
        .find(|name| name != ".lock")
        .unwrap();
    let heir = world.spawn(1, &[], &["true"]);
    wait_until(PROMPT, "the heir to wait", || world.contender_keys() == 2);
    let destroy = format!("/v1/session/destroy/{first_session}");
    double.inject(Fault::delay(Duration::from_secs(5), 1).on(Match::method_path("PUT", &destroy)));
    world.touch("go");
    let output = finish(heir);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let first_key = world.key(&first_session);
    assert!(
        world.entries().iter().any(|e| e.key == first_key),
        "the first holder's session ended before its heir left: the test proves nothing"
    );
    assert_eq!(
        world.lock_value(),
        None,
        "the heir, last out but for a holder that is leaving, deletes .lock"
    );
    assert_eq!(finish(first).status.code(), Some(0));
    world.assert_clean();
}

/// A command that cannot run is refused before a slot is asked for: behind
/// a busy slot it exits 127 or 126 at once, without joining the queue (a
/// cron line must not wait hours for a typo), as does a script whose `#!`
/// line names an interpreter that is not there (126, as shells say).
#[test]
fn a_command_that_cannot_run_is_refused_before_waiting() {
    use std::os::unix::fs::PermissionsExt as _;
    let world = World::local("cannot-run");
    let script = world.path("script");
    std::fs::write(&script, "#!/no/such/interpreter\necho ran\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let holder = hold_slot(&world, 1, "ready", "go");
    for (command, code) in [
        ("consem-no-such-command", 127),
        ("/", 126),
        (script.as_str(), 126),
    ] {
        let mut child = world.spawn(1, &[], &[command]);
        wait_with_deadline(&mut child, PROMPT, "consem to refuse the command at once");
        let output = child.wait_with_output().unwrap();
        assert_eq!(output.status.code(), Some(code), "{}", stderr(&output));
        assert!(stderr(&output).contains(command), "{}", stderr(&output));
        assert_eq!(world.contender_keys(), 1, "{command} joined the queue");
    }
    world.touch("go");
    let output = holder.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    world.assert_clean();
}
