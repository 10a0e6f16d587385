//! What only the Redis store does, against a real redis-server of each
//! test's own: it shares its sorted set with the common sorted-set clients,
//! loses a slot that a restarted server forgot, stops its command before
//! its permit could expire when Redis is gone, and refuses bad credentials.
//! The behaviour every store shares is in tests/conformance.rs.

mod common;

use std::os::unix::process::ExitStatusExt as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::redis::RedisServer;
use common::wait_until;
use common::world::*;

fn server_time(redis: &RedisServer) -> f64 {
    let mut connection = redis.connection().unwrap();
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query(&mut connection).unwrap();
    seconds as f64 + micros as f64 / 1e6
}

/// A permit as the common clients write it: `ZADD semaphore:<prefix>
/// <expiry> <id>`, with the expiry in Unix seconds.
fn foreign_permit(world: &World, id: &str, expires_in: f64) {
    let redis = world.redis.as_ref().unwrap();
    let expiry = server_time(redis) + expires_in;
    let mut connection = redis.connection().unwrap();
    let _: i64 = redis::cmd("ZADD")
        .arg(format!("semaphore:{}", world.prefix))
        .arg(expiry)
        .arg(id)
        .query(&mut connection)
        .unwrap();
}

fn output(world: &World, limit: u32, extra: &[&str], command: &[&str]) -> std::process::Output {
    let mut child = world
        .consem(limit, extra, command)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_with_deadline(&mut child, Duration::from_secs(60), "consem to exit");
    child.wait_with_output().unwrap()
}

#[test]
fn permits_of_the_common_clients_count_against_the_limit_and_expire_as_they_expect() {
    let world = World::redis("foreign");
    foreign_permit(&world, "python-client-permit", 30.0);
    let full = output(&world, 1, &["--try"], &["touch", &world.path("ran")]);
    assert_eq!(full.status.code(), Some(75), "{}", stderr(&full));
    assert!(!world.exists("ran"), "ran beside the foreign permit");
    // Their permit in consem's status, as a holder that says nothing of itself.
    let status = world.admin("status", &["--json"]).output().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(
        json["holders"][0]["session"], "python-client-permit",
        "{json}"
    );
    assert!(json["holders"][0]["host"].is_null());
    // A permit whose expiry passed is gone for everyone.
    let redis = world.redis.as_ref().unwrap();
    let mut connection = redis.connection().unwrap();
    let _: i64 = redis::cmd("DEL")
        .arg(format!("semaphore:{}", world.prefix))
        .query(&mut connection)
        .unwrap();
    foreign_permit(&world, "expired-permit", -1.0);
    // And consem's permit counts for them: ZCARD while it holds, scored by
    // an expiry in the future.
    let script = format!(
        "redis-cli -p {} ZRANGE 'semaphore:{}' 0 -1 WITHSCORES",
        redis.port, world.prefix
    );
    let held = output(&world, 1, &[], &["sh", "-c", &script]);
    assert_eq!(held.status.code(), Some(0), "{}", stderr(&held));
    let seen = String::from_utf8_lossy(&held.stdout).to_string();
    let lines: Vec<&str> = seen.lines().collect();
    assert_eq!(
        lines.len(),
        2,
        "only our permit, the expired one gone: {seen}"
    );
    let expiry: f64 = lines[1].parse().unwrap();
    assert!(expiry > server_time(redis), "{seen}");
    world.assert_clean();
}

#[test]
fn a_server_restarted_without_persistence_takes_the_slot_away() {
    let mut world = World::redis("restarted");
    let script = format!("echo $$ > '{}'; exec sleep 60", world.path("pid"));
    let holder = world.spawn(
        1,
        &["--ttl", "6s", "--kill-grace", "1s"],
        &["sh", "-c", &script],
    );
    let pid = read_pid(&world, "pid");
    world.redis.as_mut().unwrap().restart();
    let output = finish(holder);
    assert_eq!(output.status.code(), Some(76), "{}", stderr(&output));
    assert!(stderr(&output).contains("slot lost"), "{}", stderr(&output));
    assert!(process_gone(pid));
    world.assert_clean();
}

#[test]
fn redis_gone_stops_the_command_before_its_permit_could_expire() {
    let mut world = World::redis("gone");
    let script = format!("echo $$ > '{}'; exec sleep 60", world.path("pid"));
    let started = Instant::now();
    let holder = world.spawn(
        1,
        &["--ttl", "4s", "--kill-grace", "1s"],
        &["sh", "-c", &script],
    );
    let pid = read_pid(&world, "pid");
    world.redis.as_mut().unwrap().stop();
    wait_until(Duration::from_secs(10), "the command to be stopped", || {
        process_gone(pid)
    });
    // The permit could expire on the server 4 s after its last renewal.
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the command ran {:?} after the start",
        started.elapsed()
    );
    let output = finish(holder);
    assert_eq!(output.status.code(), Some(76), "{}", stderr(&output));
}

/// A TCP relay to `target` that passes the first connection on and leaves
/// every later one hanging, unanswered: a link that fails right after the
/// slot was won, before the first renewal.
fn first_connection_only(target: u16) -> u16 {
    use std::io::copy;
    use std::net::{TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut hanging = Vec::new();
        for (n, client) in listener.incoming().enumerate() {
            let Ok(client) = client else { return };
            if n > 0 {
                hanging.push(client);
                continue;
            }
            let server = TcpStream::connect(("127.0.0.1", target)).unwrap();
            let (mut client_in, mut server_out) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || copy(&mut client_in, &mut server_out));
            let (mut server_in, mut client_out) = (server, client);
            std::thread::spawn(move || copy(&mut server_in, &mut client_out));
        }
    });
    port
}

/// The permit's expiry is set by the script that grants it, so the lease
/// counts from there: a holder whose renewals never get through stops its
/// command before the permit can expire, even the first renewal.
#[test]
fn a_holder_whose_first_renewal_never_arrives_stops_within_the_permit() {
    let world = World::redis("first-renewal-lost");
    let relay = first_connection_only(world.redis.as_ref().unwrap().port);
    let script = format!("echo $$ > '{}'; exec sleep 60", world.path("pid"));
    let started = Instant::now();
    let holder = std::process::Command::new(env!("CARGO_BIN_EXE_consem"))
        .args([
            "run",
            "--prefix",
            &world.prefix,
            "--limit",
            "1",
            "--ttl",
            "4s",
            "--kill-grace",
            "1s",
        ])
        .arg(format!("--store=redis://127.0.0.1:{relay}"))
        .args(["--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = read_pid(&world, "pid");
    wait_until(Duration::from_secs(10), "the command to be stopped", || {
        process_gone(pid)
    });
    // The permit expires on the server 4 s after the script that granted it.
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the command ran {:?} after the start",
        started.elapsed()
    );
    let stopped = finish(holder);
    assert_eq!(stopped.status.code(), Some(76), "{}", stderr(&stopped));
    // Its release could not get through either: the permit expires, and
    // the slot is free for the next contender.
    let next = output(&world, 1, &["--timeout", "10s"], &["true"]);
    assert_eq!(next.status.code(), Some(0), "{}", stderr(&next));
    world.assert_clean();
}

#[test]
fn wrong_credentials_and_missing_permissions_exit_77() {
    let world = World::redis("auth");
    let redis = world.redis.as_ref().unwrap();
    let mut connection = redis.connection().unwrap();
    let _: () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER",
                "limited",
                "on",
                ">limited-pw",
                "~*",
                "-@all",
                "+ping",
                "+hello",
            ][..],
        )
        .query(&mut connection)
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", "s3cret-redis"][..])
        .query(&mut connection)
        .unwrap();
    let run = |store: &str, password_env: Option<&str>| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_consem"));
        command
            .args([
                "run",
                "--prefix",
                &world.prefix,
                "--limit",
                "1",
                "--store",
                store,
            ])
            .args(["--", "touch", &world.path("ran")])
            .env_remove("REDISCLI_AUTH")
            .stdin(Stdio::null());
        if let Some(password) = password_env {
            command.env("REDISCLI_AUTH", password);
        }
        command.output().unwrap()
    };
    let base = format!("127.0.0.1:{}", redis.port);
    for (store, env, says) in [
        (format!("redis://{base}"), None, "refused the credentials"),
        (
            format!("redis://:wrong@{base}"),
            None,
            "refused the credentials",
        ),
        (
            format!("redis://{base}"),
            Some("wrong"),
            "refused the credentials",
        ),
        (
            format!("redis://limited:limited-pw@{base}"),
            None,
            "may not do what consem needs",
        ),
    ] {
        let output = run(&store, env);
        let text = stderr(&output);
        assert_eq!(output.status.code(), Some(77), "{store}: {text}");
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains(says), "{text}");
        assert!(
            !text.contains("wrong") && !text.contains("limited-pw"),
            "a password in: {text}"
        );
        assert!(!world.exists("ran"));
    }
    let output = run(&format!("redis://{base}"), Some("s3cret-redis"));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(world.exists("ran"));
}

/// Puts what is not consem's where the semaphore's keys go.
fn set_string(connection: &mut redis::Connection, key: &str, value: &str) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query(connection)
        .unwrap();
}

#[test]
fn a_key_that_is_not_a_sorted_set_is_a_conflict_and_stays_untouched() {
    let world = World::redis("not-a-zset");
    let redis = world.redis.as_ref().unwrap();
    let mut connection = redis.connection().unwrap();
    let key = format!("semaphore:{}", world.prefix);
    set_string(&mut connection, &key, "someone else's");
    let output = output(&world, 1, &[], &["touch", &world.path("ran")]);
    let message = stderr(&output);
    assert_eq!(output.status.code(), Some(65), "{message}");
    // One line that says what the key is, without a cleanup warning or a
    // word of limits.
    assert_eq!(message.lines().count(), 1, "{message}");
    assert!(
        message.contains("not a sorted set") && !message.contains("--limit"),
        "{message}"
    );
    assert!(!world.exists("ran"));
    let value: String = redis::cmd("GET").arg(&key).query(&mut connection).unwrap();
    assert_eq!(value, "someone else's");
}

/// A limit record that holds no limit is reported by every command, and
/// neither overwritten by `run` nor deleted by `reset`.
#[test]
fn a_limit_record_that_is_not_a_limit_is_a_conflict_and_stays_untouched() {
    let world = World::redis("foreign-limit");
    let redis = world.redis.as_ref().unwrap();
    let mut connection = redis.connection().unwrap();
    let key = format!("semaphore:{}:limit", world.prefix);
    set_string(&mut connection, &key, "notanumber");
    let ran = output(&world, 1, &[], &["touch", &world.path("ran")]);
    assert_eq!(ran.status.code(), Some(65), "{}", stderr(&ran));
    assert_eq!(stderr(&ran).lines().count(), 1, "{}", stderr(&ran));
    assert!(!world.exists("ran"));
    for (command, extra) in [("status", &[][..]), ("reset", &["--force"][..])] {
        let answer = world.admin(command, extra).output().unwrap();
        assert_eq!(
            answer.status.code(),
            Some(65),
            "{command}: {}",
            stderr(&answer)
        );
    }
    let value: String = redis::cmd("GET").arg(&key).query(&mut connection).unwrap();
    assert_eq!(value, "notanumber");
}

/// The fence counter goes with a server restarted without persistence; it
/// starts again above every fence handed out before.
#[test]
fn the_fence_grows_on_across_a_server_restart() {
    let mut world = World::redis("fence-restart");
    let fence = |world: &World| -> u64 {
        let run = output(world, 1, &[], &["sh", "-c", "printf %s \"$CONSEM_FENCE\""]);
        assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
        String::from_utf8(run.stdout).unwrap().parse().unwrap()
    };
    let before = [fence(&world), fence(&world)];
    assert!(before[0] < before[1], "{before:?}");
    world.redis.as_mut().unwrap().restart();
    let after = fence(&world);
    assert!(after > before[1], "{after} after {before:?}");
    world.assert_clean();
}

/// A waiter killed in the queue leaves its entries until the next
/// contender drops them; `reset` drops them too.
#[test]
fn reset_drops_waiters_that_died_in_the_queue() {
    let world = World::redis("reset-dead-waiter");
    let holder = hold_slot(&world, 1, "ready", "go");
    let mut waiter = world.spawn(1, &["--ttl", "2s"], &["true"]);
    wait_until(PROMPT, "the waiter to queue", || {
        world.contender_keys() == 2
    });
    waiter.kill().unwrap();
    waiter.wait().unwrap();
    world.touch("go");
    assert_eq!(finish(holder).status.code(), Some(0));
    let redis = world.redis.as_ref().unwrap();
    wait_until(
        PROMPT,
        "the dead waiter's liveness (its --ttl) to run out",
        || {
            let mut connection = redis.connection().unwrap();
            let live: u64 = redis::cmd("ZCOUNT")
                .arg(format!("semaphore:{}:alive", world.prefix))
                .arg(format!("({}", server_time(redis)))
                .arg("+inf")
                .query(&mut connection)
                .unwrap();
            live == 0
        },
    );
    let reset = world.admin("reset", &[]).output().unwrap();
    assert_eq!(reset.status.code(), Some(0), "{}", stderr(&reset));
    world.assert_clean();
}

#[test]
fn runs_of_every_kind_leave_nothing_but_the_counters() {
    let world = World::redis("leaks");
    let holder = hold_slot(&world, 1, "ready", "go");
    // 66 rounds of 3 runs, and 2 more: 200 runs.
    for round in 0..66 {
        let tried = output(&world, 1, &["--try"], &["true"]);
        assert_eq!(tried.status.code(), Some(75), "round {round}");
        let timed = output(&world, 1, &["--timeout", "100ms"], &["true"]);
        assert_eq!(timed.status.code(), Some(75), "round {round}");
        let waiter = world.spawn(1, &[], &["true"]);
        wait_until(PROMPT, "the waiter to queue", || {
            world.contender_keys() == 2
        });
        signal(&waiter, libc::SIGTERM);
        assert_eq!(
            finish(waiter).status.signal(),
            Some(libc::SIGTERM),
            "round {round}"
        );
    }
    world.touch("go");
    assert_eq!(finish(holder).status.code(), Some(0));
    for code in [0, 3] {
        let ran = output(&world, 1, &[], &["sh", "-c", &format!("exit {code}")]);
        assert_eq!(ran.status.code(), Some(code));
    }
    world.assert_clean();
}

#[test]
fn rediss_checks_the_server_certificate_against_the_trusted_roots() {
    let world = World::on_the_double("redis-tls");
    let pki = common::pki::TestPki::new();
    let files = pki.write_to(&world.dir.join("pki"));
    let tls_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let _server = RedisServer::start(
        &world.dir.join("redis"),
        &[
            "--tls-port",
            &tls_port,
            "--tls-cert-file",
            &path(&files.server),
            "--tls-key-file",
            &path(&files.server_key),
            "--tls-ca-cert-file",
            &path(&files.ca),
            "--tls-auth-clients",
            "no",
        ],
    );
    let run = |trusted: Option<&std::path::Path>| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_consem"));
        command
            .args(["run", "--prefix", &world.prefix, "--limit", "1"])
            .args(["--store", &format!("rediss://127.0.0.1:{tls_port}")])
            .args(["--", "echo", "over tls"])
            .env_remove("SSL_CERT_DIR")
            .stdin(Stdio::null());
        match trusted {
            Some(ca) => command.env("SSL_CERT_FILE", ca),
            None => command.env_remove("SSL_CERT_FILE"),
        };
        command.output().unwrap()
    };
    let output = run(Some(&files.ca));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(output.stdout, b"over tls\n");
    // A CA that did not sign the server's certificate: refused, and said so.
    let output = run(Some(&files.other_ca));
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    let text = stderr(&output);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.contains("over TLS") && text.contains("SSL_CERT_FILE"),
        "{text}"
    );
}

/// `rediss://` to a server without TLS: it never answers the handshake;
/// refused in one line that names `redis://`, and nothing left behind.
#[test]
fn rediss_to_a_plain_server_points_to_redis() {
    let world = World::redis("rediss-to-plain");
    let plain = world.redis.as_ref().unwrap().url();
    let store = plain.replacen("redis://", "rediss://", 1);
    let mut command = world.consem_command();
    command
        .args(["run", "--prefix", &world.prefix, "--limit", "1"])
        .args(["--store", &store, "--", "echo", "ran"])
        .stdin(Stdio::null());
    let output = command.output().unwrap();
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(69), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains("use redis://"), "{text}");
    assert!(output.stdout.is_empty(), "the command ran");
    world.assert_clean();
}

#[test]
fn waiters_retry_while_redis_is_gone_then_give_up() {
    let mut world = World::redis("gone-waiting");
    let holder = world.spawn(
        1,
        &["--ttl", "4s", "--kill-grace", "1s"],
        &strs(&world.held_until("ready", "go", 0)),
    );
    wait_until(PROMPT, "the holder's command to start", || {
        world.exists("ready")
    });
    let mut waiter = world.spawn(1, &["-v", "--ttl", "4s", "--kill-grace", "1s"], &["true"]);
    wait_until(PROMPT, "the waiter to queue", || {
        world.contender_keys() == 2
    });
    let stopped = Instant::now();
    world.redis.as_mut().unwrap().stop();
    // It retries for up to one TTL, then gives up: 69.
    wait_with_deadline(
        &mut waiter,
        Duration::from_secs(30),
        "the waiter to give up",
    );
    let output = finish(waiter);
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    let text = stderr(&output);
    assert!(text.contains(" retry "), "it retried: {text}");
    assert!(text.contains("cannot reach Redis"), "{text}");
    assert!(!text.contains("os error"), "no errno noise: {text}");
    assert!(
        stopped.elapsed() >= Duration::from_secs(4),
        "gave up after {:?}",
        stopped.elapsed()
    );
    assert_eq!(finish(holder).status.code(), Some(76));
}

/// The acquire script's rule, driven directly: a contender takes a slot only
/// while the permits plus the live waiters ahead of it are fewer than the
/// limit, whichever of them happens to look first.
#[test]
fn the_acquire_script_takes_slots_in_order_of_arrival() {
    let world = World::redis("script-fifo");
    let redis = world.redis.as_ref().unwrap();
    let mut connection = redis.connection().unwrap();
    let script = redis::Script::new(include_str!("../src/store/redis/acquire.lua"));
    let base = format!("semaphore:{}", world.prefix);
    let acquire = |connection: &mut redis::Connection, id: &str, limit: u32| -> String {
        let answer: Vec<redis::Value> = script
            .key(&base)
            .key(format!("{base}:queue"))
            .key(format!("{base}:tickets"))
            .key(format!("{base}:fence"))
            .key(format!("{base}:limit"))
            .key(format!("{base}:alive"))
            .arg(id)
            .arg(limit)
            .arg(30_000)
            .arg(format!("{base}:"))
            .arg("{}")
            .arg("wait")
            .invoke(connection)
            .unwrap();
        match &answer[0] {
            redis::Value::BulkString(word) => String::from_utf8_lossy(word).into_owned(),
            other => format!("{other:?}"),
        }
    };
    // A holds the one slot; B, then C queue behind it.
    assert_eq!(acquire(&mut connection, "A", 1), "acquired");
    assert_eq!(acquire(&mut connection, "B", 1), "wait");
    assert_eq!(acquire(&mut connection, "C", 1), "wait");
    // A leaves. C looks first: B arrived before it, so C still waits.
    let _: i64 = redis::cmd("ZREM")
        .arg(&base)
        .arg("A")
        .query(&mut connection)
        .unwrap();
    assert_eq!(acquire(&mut connection, "C", 1), "wait", "C overtook B");
    assert_eq!(acquire(&mut connection, "B", 1), "acquired");
    // A permit of another client counts too.
    let _: i64 = redis::cmd("ZREM")
        .arg(&base)
        .arg("B")
        .query(&mut connection)
        .unwrap();
    let _: i64 = redis::cmd("ZADD")
        .arg(&base)
        .arg(9_999_999_999u64)
        .arg("foreign")
        .query(&mut connection)
        .unwrap();
    assert_eq!(
        acquire(&mut connection, "C", 1),
        "wait",
        "C ran beside a foreign permit"
    );
}
