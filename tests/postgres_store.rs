//! The PostgreSQL store's own behaviours, against a server of the test's
//! own: a slot the server takes away (an operator's
//! `pg_terminate_backend`, a restart) is a loss (76); a killed holder's
//! slot goes to the next waiter at once; a holder cut off from the server
//! stops its command before the server can give its slot away.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::postgres::PgBouncer;
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

/// `consem run` on the world's prefix, at `address` rather than the
/// world's own.
fn run_at(world: &World<PostgresServer>, address: &str, limit: u32, command: &[&str]) -> Command {
    let mut run = world.consem_command();
    run.args([
        "run",
        "--prefix",
        &world.prefix,
        "--limit",
        &limit.to_string(),
    ])
    .args(["--store", address, "--"])
    .args(command);
    run
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
    assert!(
        stderr(&held).contains("terminating connection due to administrator command"),
        "the server's reason: {}",
        stderr(&held)
    );
    let waited = finish(waiter);
    assert_eq!(waited.status.code(), Some(0), "{}", stderr(&waited));
    assert!(world.exists("waiter-ran"));
    world.assert_clean();
}

#[test]
fn a_restart_of_the_server_is_a_loss_and_the_fence_still_grows_across_crashes() {
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
    // A crash the moment after a run: the fence's commit was on disk
    // before the command started, so that it is not handed out again.
    let mut last = after;
    for _ in 0..3 {
        world.store.crash_and_start_again();
        let next = fence(&world);
        assert!(next > last, "{last} then {next} across a crash");
        last = next;
    }
    world.assert_clean();
}

/// A Unix socket, as libpq reaches a local server, in each form libpq
/// takes: the directory as the address's host, as `host=` (with
/// `sslmode=require`, which libpq does not apply to a socket), and in
/// PGHOST (with `PGSSLMODE=verify-full` and no root certificate).
#[test]
fn a_unix_socket_is_reached_in_each_form_libpq_takes() {
    let world = World::postgres("pg-socket");
    let dir = world.store.socket_dir.to_str().unwrap().to_string();
    let port = world.store.port.to_string();
    let forms: [(String, &[(&str, &str)]); 3] = [
        (
            format!(
                "postgres://postgres@{}:{port}/postgres",
                dir.replace('/', "%2F")
            ),
            &[],
        ),
        (
            format!("postgres:///postgres?host={dir}&port={port}&user=postgres&sslmode=require"),
            &[],
        ),
        (
            "postgres://".to_string(),
            &[
                ("PGUSER", "postgres"),
                ("PGDATABASE", "postgres"),
                ("PGSSLMODE", "verify-full"),
            ],
        ),
    ];
    for (address, env) in forms {
        let mut run = run_at(
            &world,
            &address,
            1,
            &["sh", "-c", "printf %s \"$CONSEM_FENCE\""],
        );
        run.envs(env.iter().copied());
        if address == "postgres://" {
            run.env("PGHOST", &dir).env("PGPORT", &port);
        }
        let output = run.output().unwrap();
        assert_eq!(
            output.status.code(),
            Some(0),
            "{address}: {}",
            stderr(&output)
        );
        let fence = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            fence.parse::<u64>().is_ok_and(|fence| fence > 0),
            "{address}: {fence}"
        );
    }
    world.assert_clean();
}

/// A schema ahead of pg_catalog in the search path (the address's
/// `options`, or a role's setting) whose functions are named like the lock
/// calls cannot stand in for them: consem's statements use the system's.
/// The holder holds; the other contender finds no slot.
#[test]
fn a_search_path_cannot_replace_the_lock_functions() {
    let world = World::postgres("pg-search-path");
    world.store.psql(
        "CREATE SCHEMA evil; \
         CREATE FUNCTION evil.pg_try_advisory_lock(int, int) RETURNS boolean LANGUAGE sql AS 'SELECT true'; \
         CREATE FUNCTION evil.pg_advisory_lock(int, int) RETURNS void LANGUAGE sql AS 'SELECT'; \
         CREATE FUNCTION evil.pg_advisory_lock_shared(int, int) RETURNS void LANGUAGE sql AS 'SELECT'; \
         CREATE ROLE shadowed LOGIN; ALTER ROLE shadowed SET search_path = evil, pg_catalog",
    );
    let holder = hold_slot(&world, 1, "ready", "go");
    let port = world.store.port;
    for address in [
        format!("postgres://postgres@127.0.0.1:{port}/postgres?options=-c%20search_path%3Devil,pg_catalog"),
        format!("postgres://shadowed@127.0.0.1:{port}/postgres"),
    ] {
        let output = world
            .consem_command()
            .args(["run", "--try", "--prefix", &world.prefix, "--limit", "1"])
            .args(["--store", &address, "--", "touch", &world.path("shadowed-ran")])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(75), "{address}: {}", stderr(&output));
        assert!(!world.exists("shadowed-ran"), "{address} ran beside the holder");
    }
    world.touch("go");
    assert_eq!(finish(holder).status.code(), Some(0));
    world.assert_clean();
}

/// A join the server does not answer (a pooler waiting for a server that
/// restarts, here a proxy that swallows it) is given up after the TTL:
/// 69, naming the wait, rather than a grant that arrives after its lease.
#[test]
fn a_join_unanswered_within_the_ttl_is_unavailable_69() {
    let world = World::postgres("pg-join-unanswered");
    let proxy = DelayingProxy::start(&world.server_addr());
    proxy.swallow_requests_with("consem.taken");
    let started = Instant::now();
    let output = world
        .consem_via(
            &proxy.addr(),
            1,
            &["--ttl", "2s"],
            &["touch", &world.path("ran")],
        )
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("no answer to joining within --ttl 2s"),
        "{}",
        stderr(&output)
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert!(!world.exists("ran"));
    world.assert_clean();
}

/// An address nobody answers at: 69 at once, one line that says where
/// the server was looked for and what to check, nothing run.
#[test]
fn an_address_nobody_answers_at_is_unavailable_69_with_a_hint() {
    let world = World::postgres("pg-nobody");
    let port = crate::common::redis::free_port();
    let address = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let output = run_at(&world, &address, 1, &["touch", &world.path("ran")])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    let said = stderr(&output);
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(
        said.contains(&format!(
            "cannot reach PostgreSQL at postgres://…@127.0.0.1:{port}/postgres: connection refused"
        )) && said.contains("check --store, PGHOST and PGPORT"),
        "{said}"
    );
    assert!(!world.exists("ran"));
}

/// The server down while two wait: each waiter's session is gone, and
/// each tries a new one for as long as the outage lasts no longer than
/// its TTL: the one with a TTL of 2 s gives up (69), the other joins again
/// once the server is back and runs; the holder lost its slot (76).
#[test]
fn a_waiter_joins_again_after_an_outage_shorter_than_its_ttl() {
    let mut world = World::postgres("pg-outage-waiting");
    let holder = hold_slot(&world, 1, "ready", "go");
    let patient = world.spawn(1, &["--ttl", "30s"], &["touch", &world.path("patient-ran")]);
    wait_until(PROMPT, "the first waiter to join", || {
        world.contender_keys() == 2
    });
    let brief = world.spawn(1, &["--ttl", "2s"], &["touch", &world.path("brief-ran")]);
    wait_until(PROMPT, "the second waiter to join", || {
        world.contender_keys() == 3
    });
    world.store.stop();
    let held = finish(holder);
    assert_eq!(held.status.code(), Some(76), "{}", stderr(&held));
    let gave_up = finish(brief);
    assert_eq!(gave_up.status.code(), Some(69), "{}", stderr(&gave_up));
    assert!(
        stderr(&gave_up).contains("127.0.0.1"),
        "names the server: {}",
        stderr(&gave_up)
    );
    world.store.start_again();
    let ran = finish(patient);
    assert_eq!(ran.status.code(), Some(0), "{}", stderr(&ran));
    assert!(world.exists("patient-ran"));
    assert!(!world.exists("brief-ran"));
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
    // The keep-alive round trip, the last statement of its message.
    proxy.swallow_requests_with("\nSELECT pg_backend_pid()\0");
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

/// Behind PgBouncer in transaction or statement pooling, a server session
/// goes from client to client between transactions (advisory locks are
/// re-entrant: two contenders on one session would hold the same slot).
/// A lone contender refuses, naming the pooling (78), and leaves no lock
/// in the session the pooler keeps; so does a second one joining while a
/// first (on a direct connection) holds.
#[test]
fn pgbouncer_in_transaction_pooling_is_refused_with_its_name() {
    let world = World::postgres("pg-bouncer-transaction");
    for mode in ["transaction", "statement"] {
        let bouncer = PgBouncer::start(&world.store, &world.dir.join(mode), mode);
        let lone = world
            .consem_via(&bouncer.address(), 1, &[], &["touch", &world.path("ran")])
            .output()
            .unwrap();
        assert_eq!(lone.status.code(), Some(78), "{mode}: {}", stderr(&lone));
        assert!(
            stderr(&lone).contains("pool_mode = transaction or statement"),
            "{mode}: {}",
            stderr(&lone)
        );
        assert!(!world.exists("ran"), "{mode}");
        world.assert_clean();
    }
    let bouncer = PgBouncer::start(&world.store, &world.dir.join("beside"), "transaction");
    let holder = hold_slot(&world, 1, "ready", "go");
    let second = world
        .consem_via(&bouncer.address(), 1, &[], &["touch", &world.path("ran")])
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(78), "{}", stderr(&second));
    assert!(!world.exists("ran"));
    world.touch("go");
    let held = finish(holder);
    assert_eq!(held.status.code(), Some(0), "{}", stderr(&held));
    world.assert_clean();
}

/// Behind PgBouncer in session pooling, each contender has a server
/// session of its own: the waiter waits, then takes the slot; a killed
/// holder's session is reset by PgBouncer (DISCARD ALL), its locks with it.
#[test]
fn pgbouncer_in_session_pooling_works() {
    let world = World::postgres("pg-bouncer-session");
    let bouncer = PgBouncer::start(&world.store, &world.dir.join("bouncer"), "session");
    let spawn = |command: Vec<String>| {
        world
            .consem_via(&bouncer.address(), 1, &[], &strs(&command))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut holder = spawn(world.held_until("ready", "go", 0));
    wait_until(PROMPT, "the holder's command to start", || {
        world.exists("ready")
    });
    let waiter = spawn(world.held_until("waiter-ran", "go", 0));
    wait_until(PROMPT, "the waiter to join", || world.contender_keys() == 2);
    assert!(!world.exists("waiter-ran"));
    holder.kill().unwrap();
    let _ = holder.wait();
    wait_until(PROMPT, "the waiter's command to start", || {
        world.exists("waiter-ran")
    });
    world.touch("go");
    let waited = finish(waiter);
    assert_eq!(waited.status.code(), Some(0), "{}", stderr(&waited));
    world.assert_clean();
}

/// A role with LOGIN alone (CONNECT comes from PUBLIC) is all consem
/// needs; one refused CONNECT is 77, naming the right and its GRANT.
#[test]
fn a_role_needs_only_connect_and_without_it_is_77_naming_it() {
    let world = World::postgres("pg-roles");
    world.store.psql("CREATE ROLE plain LOGIN");
    world.store.psql("CREATE DATABASE jobs");
    let address = format!("postgres://plain@{}/jobs", world.server_addr());
    let run = |command: &[&str]| run_at(&world, &address, 2, command).output().unwrap();
    let ran = run(&["true"]);
    assert_eq!(ran.status.code(), Some(0), "{}", stderr(&ran));
    let status = world
        .consem_command()
        .args(["status", "--prefix", &world.prefix, "--store", &address])
        .output()
        .unwrap();
    // Idle once the run left: an answer, not an error.
    assert_eq!(status.status.code(), Some(0), "{}", stderr(&status));
    world
        .store
        .psql("REVOKE CONNECT ON DATABASE jobs FROM PUBLIC");
    let refused = run(&["touch", &world.path("ran")]);
    assert_eq!(refused.status.code(), Some(77), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("GRANT CONNECT ON DATABASE jobs TO plain"),
        "{}",
        stderr(&refused)
    );
    assert!(!world.exists("ran"));
}

/// A wrong password is 77 and never shown, from the address or from
/// PGPASSWORD.
#[test]
fn a_wrong_password_is_77_and_never_shown() {
    let world = World::postgres("pg-password");
    world.store.psql(
        "SET password_encryption = 'scram-sha-256'; CREATE ROLE alice LOGIN PASSWORD 'Right-1'",
    );
    world
        .store
        .hba_first("host all alice 127.0.0.1/32 scram-sha-256");
    let run = |address: &str, password: Option<&str>| {
        let mut command = run_at(&world, address, 1, &["true"]);
        if let Some(password) = password {
            command.env("PGPASSWORD", password);
        }
        command.output().unwrap()
    };
    let server = world.server_addr();
    let good = run(&format!("postgres://alice:Right-1@{server}/postgres"), None);
    assert_eq!(good.status.code(), Some(0), "{}", stderr(&good));
    let good = run(
        &format!("postgres://alice@{server}/postgres"),
        Some("Right-1"),
    );
    assert_eq!(good.status.code(), Some(0), "{}", stderr(&good));
    for (address, password) in [
        (format!("postgres://alice:Wrong-2@{server}/postgres"), None),
        (
            format!("postgres://alice@{server}/postgres"),
            Some("Wrong-2"),
        ),
    ] {
        let refused = run(&address, password);
        assert_eq!(refused.status.code(), Some(77), "{}", stderr(&refused));
        assert!(
            !stderr(&refused).contains("Wrong-2"),
            "{}",
            stderr(&refused)
        );
        assert!(stderr(&refused).contains("alice"), "{}", stderr(&refused));
    }
    let missing = run(&format!("postgres://alice@{server}/postgres"), None);
    assert_eq!(missing.status.code(), Some(77), "{}", stderr(&missing));
    assert!(
        stderr(&missing).contains("PGPASSWORD"),
        "{}",
        stderr(&missing)
    );
}

/// `sslmode=verify-full` against a server with a certificate of the test
/// CA, which takes nothing but TLS over TCP: the chain and the name are
/// verified; another CA is refused (69, saying why); plain text is refused
/// by the server (77).
#[test]
fn tls_verify_full_against_a_test_certificate() {
    let pki = crate::common::pki::TestPki::new();
    let world = World::with_store("pg-tls", |dir| {
        let files = pki.write_to(&dir.join("pki"));
        PostgresServer::start_tls(&dir.join("postgres"), &files)
    });
    world.store.hba_first("hostnossl all all 0.0.0.0/0 reject");
    let files = pki.write_to(&world.dir.join("client-pki"));
    let run = |host: &str, query: &str| {
        let address = format!(
            "postgres://postgres@{host}:{}/postgres?{query}",
            world.store.port
        );
        run_at(
            &world,
            &address,
            1,
            &["sh", "-c", "printf %s \"$CONSEM_FENCE\""],
        )
        .output()
        .unwrap()
    };
    let ca = format!("sslmode=verify-full&sslrootcert={}", files.ca.display());
    for host in ["localhost", "127.0.0.1"] {
        let ran = run(host, &ca);
        assert_eq!(ran.status.code(), Some(0), "{host}: {}", stderr(&ran));
    }
    let other = run(
        "127.0.0.1",
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            files.other_ca.display()
        ),
    );
    assert_eq!(other.status.code(), Some(69), "{}", stderr(&other));
    assert!(stderr(&other).contains("certificate"), "{}", stderr(&other));
    let plain = run("127.0.0.1", "sslmode=disable");
    assert_eq!(plain.status.code(), Some(77), "{}", stderr(&plain));
    let unverified = run("127.0.0.1", "sslmode=require");
    assert_eq!(unverified.status.code(), Some(0), "{}", stderr(&unverified));
    world.assert_clean();
}
