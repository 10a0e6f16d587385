//! What only the Redis store does, against a real redis-server of each
//! test's own: it shares its sorted set with the common sorted-set clients,
//! loses a slot that a restarted server forgot, stops its command before
//! its permit could expire when Redis is gone, and refuses bad credentials.
//! The behaviour every store shares is in tests/conformance.rs.

use std::os::unix::process::ExitStatusExt as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::redis::RedisServer;
use crate::common::wait_until;
use crate::common::world::*;

fn server_time(redis: &RedisServer) -> f64 {
    let mut connection = redis.connection().unwrap();
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query(&mut connection).unwrap();
    seconds as f64 + micros as f64 / 1e6
}

/// A permit as the common clients write it: `ZADD semaphore:<prefix>
/// <expiry> <id>`, with the expiry in Unix seconds.
fn foreign_permit(world: &World<RedisServer>, id: &str, expires_in: f64) {
    let redis = &world.store;
    let expiry = server_time(redis) + expires_in;
    let mut connection = redis.connection().unwrap();
    let _: i64 = redis::cmd("ZADD")
        .arg(format!("semaphore:{}", world.prefix))
        .arg(expiry)
        .arg(id)
        .query(&mut connection)
        .unwrap();
}

fn output(
    world: &World<RedisServer>,
    limit: u32,
    extra: &[&str],
    command: &[&str],
) -> std::process::Output {
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
    let redis = &world.store;
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

/// A server restarted without its data forgets every permit: the holder
/// notices within about a second (it looks between renewals), stops its
/// command (76), and no slot is granted on the prefix for a TTL, so that
/// every holder the server forgot has stopped before its slot is taken.
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
    world.store.restart();
    let output_of_holder = finish(holder);
    let text = stderr(&output_of_holder);
    assert_eq!(output_of_holder.status.code(), Some(76), "{text}");
    assert!(
        text.contains("slot lost") && text.contains("lost the semaphore's keys"),
        "{text}"
    );
    assert!(process_gone(pid));
    // The lock delay: a TTL during which nobody takes a slot.
    let tried = output(&world, 1, &["--try"], &["true"]);
    assert_eq!(tried.status.code(), Some(75), "{}", stderr(&tried));
    let lock_delay = format!("semaphore:{}:lock-delay", world.prefix);
    let mut connection = world.store.connection().unwrap();
    let left: i64 = redis::cmd("PTTL")
        .arg(&lock_delay)
        .query(&mut connection)
        .unwrap();
    assert!(
        0 < left && left <= 6000,
        "the lock delay has {left} ms left"
    );
    let status = world.admin("status", &[]).output().unwrap();
    let shown = String::from_utf8_lossy(&status.stdout);
    assert!(
        shown.contains("LOCK DELAY"),
        "status says nothing of the lock delay: {shown}"
    );
    wait_until(PROMPT, "the lock delay to end", || {
        let left: i64 = redis::cmd("PTTL")
            .arg(&lock_delay)
            .query(&mut connection)
            .unwrap();
        left < 0
    });
    let after = output(&world, 1, &["--try"], &["true"]);
    assert_eq!(after.status.code(), Some(0), "{}", stderr(&after));
    world.assert_clean();
}

/// When each command started and ended, by name, from a log that
/// `logged_run` writes.
fn spans(log: &str) -> std::collections::HashMap<String, (f64, f64)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut spans = std::collections::HashMap::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [what, name, at] = fields[..] else {
            panic!("a line of the log: {line}")
        };
        let at: f64 = at.parse().unwrap();
        let span = spans
            .entry(name.to_string())
            .or_insert((f64::NAN, f64::NAN));
        if what == "start" {
            span.0 = at;
        } else {
            span.1 = at;
        }
    }
    spans
}

/// A command that logs when it starts and ends (a SIGTERM ends it at once,
/// logged), running for `seconds`.
fn logged_run(log: &str, name: &str, seconds: u32) -> Vec<String> {
    let now = "$(date +%s.%N)";
    vec![
        "sh".into(),
        "-c".into(),
        format!(
            "echo start {name} {now} >> '{log}'; trap 'echo end {name} {now} >> '\\''{log}'\\''; exit 0' TERM; \
             sleep {seconds} & wait; echo end {name} {now} >> '{log}'"
        ),
    ]
}

fn overlap(a: (f64, f64), b: (f64, f64)) -> f64 {
    (a.1.min(b.1) - a.0.max(b.0)).max(0.0)
}

/// FLUSHALL under a holder, a waiter and a newcomer: the holder stops
/// within about a second plus its kill grace (76); the waiter, which had
/// seen the keys, takes no slot until a TTL has passed; a newcomer that
/// came right after the wipe may run beside the holder only until the
/// holder notices.
#[test]
fn a_wipe_stops_the_holder_and_holds_back_every_grant_for_a_ttl() {
    let world = World::redis("flushall");
    let log = world.path("log");
    let ttl = ["--ttl", "6s", "--kill-grace", "1s"];
    let holder = world.spawn(1, &ttl, &strs(&logged_run(&log, "holder", 60)));
    wait_until(PROMPT, "the holder's command to start", || {
        spans(&log).contains_key("holder")
    });
    let waiter = world.spawn(1, &ttl, &strs(&logged_run(&log, "waiter", 1)));
    wait_until(PROMPT, "the waiter to join the queue", || {
        world.contender_keys() == 2
    });
    let mut connection = world.store.connection().unwrap();
    let _: () = redis::cmd("FLUSHALL").query(&mut connection).unwrap();
    let wiped = server_time(&world.store);
    let newcomer = world.spawn(1, &ttl, &strs(&logged_run(&log, "newcomer", 1)));
    let stopped = finish(holder);
    assert_eq!(stopped.status.code(), Some(76), "{}", stderr(&stopped));
    for child in [waiter, newcomer] {
        let done = finish(child);
        assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
    }
    let spans = spans(&log);
    let (holder, waiter, newcomer) = (spans["holder"], spans["waiter"], spans["newcomer"]);
    assert!(
        overlap(holder, newcomer) < 1.0 + 1.0 + 2.0,
        "the newcomer ran {:.2} s beside the forgotten holder: {spans:?}",
        overlap(holder, newcomer)
    );
    assert_eq!(overlap(holder, waiter), 0.0, "{spans:?}");
    assert_eq!(overlap(newcomer, waiter), 0.0, "{spans:?}");
    assert!(
        waiter.0 - wiped >= 5.0,
        "the waiter started {:.2} s after the wipe, within the lock delay: {spans:?}",
        waiter.0 - wiped
    );
    wait_until(PROMPT, "the lock delay to end", || {
        world
            .store
            .keys(&world.prefix)
            .iter()
            .all(|k| !k.ends_with(":lock-delay"))
    });
    world.assert_clean();
}

/// A Redis that may evict any key once its memory is full is refused
/// (78) before anything is written, unless the run accepts the risk.
#[test]
fn a_redis_that_may_evict_the_permits_is_refused_unless_allowed() {
    let world = World::redis("evicting");
    let redis = &world.store;
    let mut connection = redis.connection().unwrap();
    let config = |connection: &mut redis::Connection, name: &str, value: &str| {
        let _: () = redis::cmd("CONFIG")
            .arg(&["SET", name, value][..])
            .query(connection)
            .unwrap();
    };
    config(&mut connection, "maxmemory", "64mb");
    config(&mut connection, "maxmemory-policy", "allkeys-lru");
    let refused = output(&world, 1, &[], &["touch", &world.path("ran")]);
    let text = stderr(&refused);
    assert_eq!(refused.status.code(), Some(78), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    for says in ["allkeys-lru", "noeviction", "--redis-allow-eviction"] {
        assert!(text.contains(says), "{says} not in: {text}");
    }
    assert!(!world.exists("ran"));
    assert_eq!(redis.keys(&world.prefix), Vec::<String>::new());
    let allowed = output(&world, 1, &["--redis-allow-eviction"], &["true"]);
    assert_eq!(allowed.status.code(), Some(0), "{}", stderr(&allowed));
    config(&mut connection, "maxmemory-policy", "volatile-lru");
    let volatile = output(&world, 1, &[], &["true"]);
    assert_eq!(volatile.status.code(), Some(0), "{}", stderr(&volatile));
    config(&mut connection, "maxmemory-policy", "allkeys-random");
    config(&mut connection, "maxmemory", "0");
    let unlimited = output(&world, 1, &[], &["true"]);
    assert_eq!(unlimited.status.code(), Some(0), "{}", stderr(&unlimited));
    world.assert_clean();
}

/// With eviction allowed, a flood of other keys that evicts the permits
/// under a holder: the holder stops within about a second plus its kill
/// grace (76), and no more than the limit run for longer than that.
#[test]
fn evicted_permits_are_noticed_within_about_a_second() {
    let world = World::redis("evicted");
    let redis = &world.store;
    let mut connection = redis.connection().unwrap();
    let log = world.path("log");
    let args = [
        "--ttl",
        "6s",
        "--kill-grace",
        "1s",
        "--redis-allow-eviction",
    ];
    let holder = world.spawn(1, &args, &strs(&logged_run(&log, "holder", 60)));
    wait_until(PROMPT, "the holder's command to start", || {
        spans(&log).contains_key("holder")
    });
    let waiter = world.spawn(1, &args, &strs(&logged_run(&log, "waiter", 1)));
    wait_until(PROMPT, "the waiter to join the queue", || {
        world.contender_keys() == 2
    });
    let used: String = redis::cmd("INFO")
        .arg("memory")
        .query(&mut connection)
        .unwrap();
    let used: u64 = used
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory-policy", "allkeys-random"][..])
        .query(&mut connection)
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", &(used + 2_000_000).to_string()][..])
        .query(&mut connection)
        .unwrap();
    let permits = format!("semaphore:{}", world.prefix);
    let filler = "x".repeat(16 * 1024);
    let mut flooded = 0;
    wait_until(PROMPT * 3, "the flood to evict the permits", || {
        for _ in 0..50 {
            let _: () = redis::cmd("SET")
                .arg(format!("flood:{flooded}"))
                .arg(&filler)
                .query(&mut connection)
                .unwrap();
            flooded += 1;
        }
        let left: i64 = redis::cmd("EXISTS")
            .arg(&permits)
            .query(&mut connection)
            .unwrap();
        left == 0
    });
    // No more evictions: what follows is the semaphore's own doing.
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", "0"][..])
        .query(&mut connection)
        .unwrap();
    let stopped = finish(holder);
    assert_eq!(stopped.status.code(), Some(76), "{}", stderr(&stopped));
    let waited = finish(waiter);
    assert_eq!(waited.status.code(), Some(0), "{}", stderr(&waited));
    let spans = spans(&log);
    assert!(
        overlap(spans["holder"], spans["waiter"]) < 1.0 + 1.0 + 2.0,
        "the waiter ran {:.2} s beside the holder whose permit was evicted: {spans:?}",
        overlap(spans["holder"], spans["waiter"])
    );
}

/// A restart of Redis with its data, longer than the three failures in a
/// row that once ended a holder: holders with the default settings retry
/// while their lease lasts and go on (exit 0).
#[test]
fn holders_ride_out_a_restart_of_redis_with_its_data() {
    let mut world = World::redis("ride-out");
    let holders: Vec<_> = (0..2)
        .map(|n| {
            let ready = format!("ready{n}");
            spawn_verbose(
                &world,
                2,
                &[],
                &strs(&world.held_until(&ready, "go", 0)),
                &format!("holder{n}.log"),
            )
        })
        .collect();
    wait_until(PROMPT, "both commands to start", || {
        world.exists("ready0") && world.exists("ready1")
    });
    world.store.shut_down_saving();
    wait_until(PROMPT, "each holder to fail four times in a row", || {
        (0..2).all(|n| {
            log_text(&world, &format!("holder{n}.log"))
                .matches("watch-retry")
                .count()
                >= 4
        })
    });
    world.store.start_again();
    world.touch("go");
    for (n, holder) in holders.into_iter().enumerate() {
        let output = finish(holder);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{}",
            log_text(&world, &format!("holder{n}.log"))
        );
    }
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
    world.store.stop();
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
    let relay = first_connection_only(world.store.port);
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
    let redis = &world.store;
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
    let redis = &world.store;
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
    let redis = &world.store;
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
    let fence = |world: &World<RedisServer>| -> u64 {
        let run = output(world, 1, &[], &["sh", "-c", "printf %s \"$CONSEM_FENCE\""]);
        assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
        String::from_utf8(run.stdout).unwrap().parse().unwrap()
    };
    let before = [fence(&world), fence(&world)];
    assert!(before[0] < before[1], "{before:?}");
    world.store.restart();
    let after = fence(&world);
    assert!(after > before[1], "{after} after {before:?}");
    world.assert_clean();
}

/// A waiter killed in the queue leaves its entries until the next
/// contender drops them; `status` says they are stale, and `reset` drops
/// them too.
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
    let redis = &world.store;
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
    let status = world.admin("status", &["--json"]).output().unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let stale: Vec<&str> = status["stale"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item.as_str().unwrap())
        .collect();
    assert_eq!(stale.len(), 2, "{status}");
    assert!(stale[0].contains("stopped looking"), "{status}");
    assert!(
        stale[1].contains("with no live holder or waiter"),
        "{status}"
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

/// A redis-server with a TLS port beside its plain one (which the test
/// reads keys through), its certificate signed by `files.ca`; with
/// `auth_clients`, it wants a client certificate that CA signed.
fn tls_redis(
    world: &World<NoStore>,
    files: &crate::common::pki::PkiFiles,
    auth_clients: bool,
) -> (RedisServer, u16) {
    let server = (files.server.as_path(), files.server_key.as_path());
    tls_redis_with(world, "redis", files, server, auth_clients)
}

/// [`tls_redis`] in `world.dir/<name>`, with the certificate and key
/// `server`.
fn tls_redis_with(
    world: &World<NoStore>,
    name: &str,
    files: &crate::common::pki::PkiFiles,
    server: (&std::path::Path, &std::path::Path),
    auth_clients: bool,
) -> (RedisServer, u16) {
    let tls_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let server = RedisServer::start(
        &world.dir.join(name),
        &[
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            &path(server.0),
            "--tls-key-file",
            &path(server.1),
            "--tls-ca-cert-file",
            &path(&files.ca),
            "--tls-auth-clients",
            if auth_clients { "yes" } else { "no" },
        ],
    );
    (server, tls_port)
}

/// `consem run` on `store` with `extra` options, `SSL_CERT_FILE` set to
/// `trusted` (or unset), its command touching `ran`.
fn tls_run(
    world: &World<NoStore>,
    store: &str,
    extra: &[&str],
    trusted: Option<&std::path::Path>,
) -> std::process::Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_consem"));
    command
        .args(["run", "--prefix", &world.prefix, "--limit", "1"])
        .args(["--store", store])
        .args(extra)
        .args(["--", "touch", &world.path("ran")])
        .env_remove("SSL_CERT_DIR")
        .stdin(Stdio::null());
    match trusted {
        Some(ca) => command.env("SSL_CERT_FILE", ca),
        None => command.env_remove("SSL_CERT_FILE"),
    };
    command.output().unwrap()
}

#[test]
fn rediss_checks_the_server_certificate_against_the_trusted_roots() {
    let world = World::without_store("redis-tls");
    let files = crate::common::pki::TestPki::new().write_to(&world.dir.join("pki"));
    let (_server, tls_port) = tls_redis(&world, &files, false);
    let store = format!("rediss://127.0.0.1:{tls_port}");
    let output = tls_run(&world, &store, &[], Some(&files.ca));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(world.exists("ran"));
    std::fs::remove_file(world.path("ran")).unwrap();
    // A CA that did not sign the server's certificate: refused, and said so.
    let output = tls_run(&world, &store, &[], Some(&files.other_ca));
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    let text = stderr(&output);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.contains("over TLS") && text.contains("--cacert") && text.contains("SSL_CERT_FILE"),
        "{text}"
    );
    // --cacert replaces the system's roots: the right CA works whatever
    // SSL_CERT_FILE says, and another is named as the culprit.
    let ca = files.ca.to_str().unwrap();
    let output = tls_run(&world, &store, &["--cacert", ca], Some(&files.other_ca));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(world.exists("ran"));
    let other_ca = files.other_ca.to_str().unwrap();
    let output = tls_run(&world, &store, &["--cacert", other_ca], Some(&files.ca));
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(69), "{text}");
    assert!(
        text.contains("--cacert does not name the CA that signs it"),
        "{text}"
    );
}

/// A server certificate that has expired, or that was issued for another
/// name: 69, saying which, and what to do.
#[test]
fn rediss_names_an_expired_certificate_and_one_for_another_name() {
    let world = World::without_store("redis-tls-names");
    let files = crate::common::pki::TestPki::new().write_to(&world.dir.join("pki"));
    let ca = files.ca.to_str().unwrap();
    for (name, server, says) in [
        (
            "expired",
            (files.expired.as_path(), files.expired_key.as_path()),
            "has expired: renew it on the server",
        ),
        (
            "elsewhere",
            (files.elsewhere.as_path(), files.elsewhere_key.as_path()),
            "is not valid for '127.0.0.1': use a name it was issued for in --store",
        ),
    ] {
        let (_server, tls_port) = tls_redis_with(&world, name, &files, server, false);
        let store = format!("rediss://127.0.0.1:{tls_port}");
        let output = tls_run(&world, &store, &["--cacert", ca], None);
        let text = stderr(&output);
        assert_eq!(output.status.code(), Some(69), "{name}: {text}");
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains(says), "{name}: {text}");
        assert!(!world.exists("ran"));
    }
}

/// A server that verifies clients (`tls-auth-clients yes`): `--cert` and
/// `--key` get in; without them, or with a certificate its CA did not sign,
/// the run exits 69 naming the options, before the command starts and
/// with nothing written.
#[test]
fn rediss_presents_the_client_certificate_of_cert_and_key() {
    let world = World::without_store("redis-mtls");
    let files = crate::common::pki::TestPki::new().write_to(&world.dir.join("pki"));
    let (server, tls_port) = tls_redis(&world, &files, true);
    let store = format!("rediss://127.0.0.1:{tls_port}");
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let (ca, cert, key) = (
        path(&files.ca),
        path(&files.client),
        path(&files.client_key),
    );
    let (other, other_key) = (path(&files.other_client), path(&files.other_client_key));
    for (extra, says) in [
        (
            vec!["--cacert", &ca],
            "wants a client certificate (tls-auth-clients): pass --cert and --key",
        ),
        (
            vec!["--cacert", &ca, "--cert", &other, "--key", &other_key],
            "refused our client certificate (--cert)",
        ),
    ] {
        let output = tls_run(&world, &store, &extra, None);
        let text = stderr(&output);
        assert_eq!(output.status.code(), Some(69), "{extra:?}: {text}");
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains(says), "{extra:?}: {text}");
        assert!(!world.exists("ran"), "the command ran");
    }
    assert_eq!(server.keys(&world.prefix), Vec::<String>::new());
    let output = tls_run(
        &world,
        &store,
        &["--cacert", &ca, "--cert", &cert, "--key", &key],
        None,
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(world.exists("ran"));
    // The operators' commands present them too (`status` finds the
    // prefix idle once the run left).
    let status = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_consem"))
            .args(["status", "--prefix", &world.prefix, "--store", &store])
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let output = status(&["--cacert", &ca, "--cert", &cert, "--key", &key]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stderr(&output).is_empty(), "{}", stderr(&output));
    let output = status(&["--cacert", &ca]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(69), "{text}");
    assert!(text.contains("pass --cert and --key"), "{text}");
}

/// TLS files that cannot be used are usage errors (exit 2), one line
/// naming the file, the option and the fix, found before any contact:
/// the store named is a port nobody listens on.
#[test]
fn unusable_tls_files_are_usage_errors_before_any_contact() {
    let world = World::without_store("redis-tls-files");
    let files = crate::common::pki::TestPki::new().write_to(&world.dir.join("pki"));
    let nobody = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let rediss = format!("rediss://127.0.0.1:{nobody}");
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let (cert, key) = (path(&files.client), path(&files.client_key));
    let missing = world.path("no-such.pem");
    let not_pem = path(&files.not_pem);
    let server_key = path(&files.server_key);
    for (store, extra, says) in [
        (
            &rediss,
            vec!["--cert", cert.as_str()],
            "a client certificate needs its key and the other way round: set both --cert and --key",
        ),
        (
            &rediss,
            vec!["--key", key.as_str()],
            "set both --cert and --key",
        ),
        (
            &rediss,
            vec!["--cert", missing.as_str(), "--key", key.as_str()],
            "(--cert): No such file or directory",
        ),
        (
            &rediss,
            vec!["--cert", cert.as_str(), "--key", not_pem.as_str()],
            "(--key) holds no PEM private key",
        ),
        (
            &rediss,
            vec!["--cert", cert.as_str(), "--key", cert.as_str()],
            "(--key) holds no PEM private key",
        ),
        (
            &rediss,
            vec!["--cert", key.as_str(), "--key", key.as_str()],
            "(--cert) holds no PEM certificate",
        ),
        (
            &rediss,
            vec!["--cert", cert.as_str(), "--key", server_key.as_str()],
            "(--key) is not the private key of the certificate in",
        ),
        (
            &rediss,
            vec!["--cacert", not_pem.as_str()],
            "(--cacert) holds no PEM certificate",
        ),
        (
            &format!("redis://127.0.0.1:{nobody}"),
            vec!["--cacert", cert.as_str()],
            "--cacert is for TLS, and --store is redis://: write rediss://host:port",
        ),
    ] {
        let output = tls_run(&world, store, &extra, None);
        let text = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{extra:?}: {text}");
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains(says), "{extra:?}: {text}");
        assert!(!world.exists("ran"));
    }
}

/// `rediss://` to a server without TLS: it never answers the handshake;
/// refused in one line that names `redis://`, and nothing left behind.
#[test]
fn rediss_to_a_plain_server_points_to_redis() {
    let world = World::redis("rediss-to-plain");
    let plain = world.store.url();
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
    world.store.stop();
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
    let redis = &world.store;
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
            .key(format!("{base}:epoch"))
            .key(format!("{base}:lock-delay"))
            .arg(id)
            .arg(limit)
            .arg(30_000)
            .arg(format!("{base}:"))
            .arg("{}")
            .arg("wait")
            .arg("")
            .arg(30_000)
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

fn config_set(redis: &RedisServer, name: &str, value: &str) {
    let mut connection = redis.connection().unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", name, value][..])
        .query(&mut connection)
        .unwrap();
}

/// The acquire script run again after its first answer was lost finds the
/// slot its first run took, and renews the permit: the lease consem counts
/// from the second call's sending is then within the permit's expiry.
#[test]
fn a_slot_found_again_after_a_lost_answer_is_renewed() {
    let world = World::redis("answer-lost");
    let redis = &world.store;
    let mut connection = redis.connection().unwrap();
    let script = redis::Script::new(include_str!("../src/store/redis/acquire.lua"));
    let base = format!("semaphore:{}", world.prefix);
    let acquire = |connection: &mut redis::Connection| -> Vec<redis::Value> {
        script
            .key(&base)
            .key(format!("{base}:queue"))
            .key(format!("{base}:tickets"))
            .key(format!("{base}:fence"))
            .key(format!("{base}:limit"))
            .key(format!("{base}:alive"))
            .key(format!("{base}:epoch"))
            .key(format!("{base}:lock-delay"))
            .arg("A")
            .arg(1)
            .arg(6_000)
            .arg(format!("{base}:"))
            .arg("{}")
            .arg("wait")
            .arg("")
            .arg(6_000)
            .invoke(connection)
            .unwrap()
    };
    let expiry = |connection: &mut redis::Connection| -> f64 {
        redis::cmd("ZSCORE")
            .arg(&base)
            .arg("A")
            .query(connection)
            .unwrap()
    };
    let first = acquire(&mut connection);
    let first_expiry = expiry(&mut connection);
    let granted_at = server_time(redis);
    wait_until(PROMPT, "a second of the server's time to pass", || {
        server_time(redis) > granted_at + 1.0
    });
    let sent_again = server_time(redis);
    let again = acquire(&mut connection);
    assert_eq!(first[..2], again[..2], "the same slot, the same fence");
    let renewed = expiry(&mut connection);
    assert!(
        renewed > first_expiry + 0.9 && renewed >= sent_again + 6.0,
        "the permit expires at {renewed}, granted to expire at {first_expiry}, found again at {sent_again}"
    );
}

/// Redis restarted from a snapshot older than the last grant: the holder
/// whose permit the snapshot lacks sees the fence counter below its own
/// fence, stops (76) and sets the lock delay; every fence handed out after
/// is above every fence before.
#[test]
fn a_restart_from_an_older_snapshot_repeats_no_fence() {
    let mut world = World::redis("older-snapshot");
    let fence_of = |world: &World<RedisServer>, name: &str| -> u64 {
        std::fs::read_to_string(world.path(name))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let record = |world: &World<RedisServer>, name: &str| {
        format!("printf %s \"$CONSEM_FENCE\" > '{}'", world.path(name))
    };
    let first = output(&world, 1, &[], &["sh", "-c", &record(&world, "first")]);
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let mut connection = world.store.connection().unwrap();
    let _: () = redis::cmd("SAVE").query(&mut connection).unwrap();
    let holder_script = format!("{}; exec sleep 60", record(&world, "holder"));
    let holder = world.spawn(
        1,
        &["--ttl", "6s", "--kill-grace", "1s"],
        &["sh", "-c", &holder_script],
    );
    wait_until(PROMPT, "the holder's command to start", || {
        world.exists("holder")
    });
    // Killed: what it wrote since the snapshot is lost.
    world.store.stop();
    world.store.start_again();
    let stopped = finish(holder);
    let text = stderr(&stopped);
    assert_eq!(stopped.status.code(), Some(76), "{text}");
    assert!(text.contains("lost the semaphore's keys"), "{text}");
    let after = output(
        &world,
        1,
        &["--timeout", "20s"],
        &["sh", "-c", &record(&world, "after")],
    );
    assert_eq!(after.status.code(), Some(0), "{}", stderr(&after));
    let (first, holder, after) = (
        fence_of(&world, "first"),
        fence_of(&world, "holder"),
        fence_of(&world, "after"),
    );
    assert!(
        first < holder && holder < after,
        "fences {first}, {holder}, {after}"
    );
    wait_until(PROMPT, "the lock delay to end", || {
        world
            .store
            .keys(&world.prefix)
            .iter()
            .all(|k| !k.ends_with(":lock-delay"))
    });
    world.assert_clean();
}

/// Contenders with different TTLs on one prefix: the lock delay a waiter
/// sets when the keys vanish covers the longest TTL in use, so that a
/// holder with a longer lease, which cannot look (stopped), has stopped
/// before the slot is granted again.
#[test]
fn the_lock_delay_covers_the_longest_ttl_in_use() {
    let world = World::redis("mixed-ttl");
    let script = format!("echo $$ > '{}'; exec sleep 60", world.path("pid"));
    let holder = world.spawn(
        1,
        &["--ttl", "8s", "--kill-grace", "1s"],
        &["sh", "-c", &script],
    );
    let pid = read_pid(&world, "pid");
    let waiter = world.spawn(1, &["--ttl", "2s"], &["true"]);
    wait_until(PROMPT, "the waiter to join the queue", || {
        world.contender_keys() == 2
    });
    // The holder cannot look, as behind a partition.
    signal(&holder, libc::SIGSTOP);
    let redis = &world.store;
    let mut connection = redis.connection().unwrap();
    let _: () = redis::cmd("FLUSHALL").query(&mut connection).unwrap();
    let lock_delay = format!("semaphore:{}:lock-delay", world.prefix);
    let mut left: i64 = -2;
    wait_until(PROMPT, "the waiter to set the lock delay", || {
        left = redis::cmd("PTTL")
            .arg(&lock_delay)
            .query(&mut connection)
            .unwrap();
        left > 0
    });
    assert!(
        left > 6_000,
        "a lock delay of {left} ms, not the holder's 8 s TTL"
    );
    signal(&holder, libc::SIGCONT);
    let stopped = finish(holder);
    assert_eq!(stopped.status.code(), Some(76), "{}", stderr(&stopped));
    assert!(process_gone(pid));
    let waited = finish(waiter);
    assert_eq!(waited.status.code(), Some(0), "{}", stderr(&waited));
    wait_until(PROMPT, "the lock delay to end", || {
        redis
            .keys(&world.prefix)
            .iter()
            .all(|k| !k.ends_with(":lock-delay"))
    });
    world.assert_clean();
}

/// A Redis full with noeviction refuses writes: a holder retries while its
/// lease lasts, saying what is wrong and how to fix it, and goes on once
/// memory is back.
#[test]
fn a_full_redis_is_ridden_out_by_holders() {
    let world = World::redis("full");
    let redis = &world.store;
    let holder = spawn_verbose(
        &world,
        1,
        &[],
        &strs(&world.held_until("ready", "go", 0)),
        "holder.log",
    );
    wait_until(PROMPT, "the holder's command to start", || {
        world.exists("ready")
    });
    config_set(redis, "maxmemory-policy", "noeviction");
    config_set(redis, "maxmemory", "1");
    wait_until(PROMPT, "the holder's renewals to be refused twice", || {
        log_text(&world, "holder.log")
            .matches("out of memory")
            .count()
            >= 2
    });
    let told = log_text(&world, "holder.log");
    assert!(told.contains("raise maxmemory"), "{told}");
    config_set(redis, "maxmemory", "0");
    world.touch("go");
    let done = finish(holder);
    assert_eq!(
        done.status.code(),
        Some(0),
        "{}",
        log_text(&world, "holder.log")
    );
    world.assert_clean();
}

/// The lease counts from when each call was sent, not from when its answer
/// came: behind a link that holds every answer back 0.7 s, the grant (sent
/// at `a`) leaves the command 2.5 s (`--ttl 3s`, a sixth less, no kill
/// grace), so it starts; but the first renewal cannot be answered before
/// `a` + 2.8 s (the answer to the grant, then the holder's new connection
/// (the client's CLIENT SETINFO, consem's PING) and the renewal, each 0.7 s
/// late), past that stop point: the command is stopped and consem exits
/// 76, although Redis renewed the permit every time. Counted from the
/// answers, each lease would have lasted until the next answer came (2.1 s
/// after the grant's, then 1.7 s apart).
#[test]
fn answers_that_come_late_shorten_the_lease_to_nothing() {
    let world = World::redis("late-answers");
    // A run straight to Redis loads the scripts, so that each call behind
    // the proxy is one round trip (not EVALSHA, SCRIPT LOAD, EVALSHA).
    let direct = output(&world, 1, &[], &["true"]);
    assert_eq!(direct.status.code(), Some(0), "{}", stderr(&direct));
    let proxy = crate::common::proxy::DelayingProxy::start(&world.server_addr());
    proxy.delay_answers(Duration::from_millis(700));
    let script = format!(
        "echo $$ > '{}'; while [ ! -e '{}' ]; do sleep 0.02; done",
        world.path("pid"),
        world.path("go")
    );
    let mut holder = world
        .consem_via(
            &proxy.addr(),
            1,
            &["-v", "--ttl", "3s", "--kill-grace", "0s"],
            &["sh", "-c", &script],
        )
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(world.path("holder.log")).unwrap())
        .spawn()
        .unwrap();
    let status = wait_with_deadline(&mut holder, Duration::from_secs(20), "the holder to stop");
    let log = log_text(&world, "holder.log");
    assert!(log.contains(" started "), "the command started: {log}");
    let pid = read_pid(&world, "pid");
    assert_eq!(status.code(), Some(76), "{log}");
    // Consem's own stop point, or its watchdog's on a loaded machine (the
    // command then ends before consem looks: "slot lost while the command
    // ran"); either way for want of a renewal confirmed in time.
    assert!(
        log.contains("slot lost") && log.contains(" was confirmed"),
        "{log}"
    );
    assert!(!log.contains("watch-retry"), "no call failed: {log}");
    assert!(process_gone(pid), "{log}");
    proxy.delay_answers(Duration::ZERO);
    wait_until(PROMPT, "the permit to be gone", || {
        world.contender_keys() == 0
    });
    world.assert_clean();
}

/// A world on a primary with one replica of its own.
fn replicated(name: &str) -> (World<RedisServer>, RedisServer) {
    let world = World::redis(name);
    let replica = RedisServer::replica_of(&world.store, &world.dir.join("replica"));
    (world, replica)
}

/// `--redis-wait-replicas 1`: with the replica acknowledging, runs go as
/// ever; with it frozen, a granted slot is given back, never used: the
/// command does not start, the run retries for one TTL and exits 69 naming
/// the replicas, and nothing is left; with the replica back, runs go again.
#[test]
fn a_grant_the_replicas_do_not_confirm_is_given_back_and_not_used() {
    let (world, replica) = replicated("wait-grant");
    let wait = ["--redis-wait-replicas", "1", "--ttl", "2s"];
    let ran = output(&world, 1, &wait, &["touch", &world.path("ran")]);
    assert_eq!(ran.status.code(), Some(0), "{}", stderr(&ran));
    assert!(world.exists("ran"));
    std::fs::remove_file(world.path("ran")).unwrap();

    replica.freeze();
    let started = Instant::now();
    let mut extra = vec!["-v"];
    extra.extend_from_slice(&wait);
    let refused = output(&world, 1, &extra, &["touch", &world.path("ran")]);
    let text = stderr(&refused);
    assert_eq!(refused.status.code(), Some(69), "{text}");
    assert!(
        !world.exists("ran"),
        "the command ran on an unconfirmed slot"
    );
    let last = text.lines().last().unwrap_or_default();
    assert!(
        last.contains("0 replicas of Redis at")
            && last.contains("acknowledged our slot within 333ms")
            && last.contains("asks for 1, so it was given back unused")
            && last.contains("lower --redis-wait-replicas"),
        "{text}"
    );
    assert!(text.contains(" retry "), "it tried again: {text}");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "gave up after {:?}, before a TTL of retrying",
        started.elapsed()
    );
    world.assert_clean();

    // The same run without the option does not wait for the replica.
    let ran = output(&world, 1, &wait[2..], &["touch", &world.path("ran")]);
    assert_eq!(ran.status.code(), Some(0), "{}", stderr(&ran));
    std::fs::remove_file(world.path("ran")).unwrap();

    replica.thaw();
    world.store.wait_for_replicas(1);
    let ran = output(&world, 1, &wait, &["touch", &world.path("ran")]);
    assert_eq!(ran.status.code(), Some(0), "{}", stderr(&ran));
    assert!(world.exists("ran"));
    world.assert_clean();
}

/// A holder whose renewals the replica stops acknowledging counts them as
/// failed: its lease runs out from the last confirmed one, its command is
/// stopped and it exits 76, `-v` showing why.
#[test]
fn a_holder_whose_renewals_are_not_confirmed_loses_its_slot_with_its_lease() {
    let (world, replica) = replicated("wait-renew");
    let wait = [
        "--redis-wait-replicas",
        "1",
        "--ttl",
        "3s",
        "--kill-grace",
        "500ms",
    ];
    let mut extra = vec!["-v"];
    extra.extend_from_slice(&wait);
    let holder = world.spawn(1, &extra, &strs(&world.held_until("ready", "go", 0)));
    wait_until(PROMPT, "the holder's command to start", || {
        world.exists("ready")
    });
    replica.freeze();
    let frozen = Instant::now();
    let mut holder = holder;
    wait_with_deadline(&mut holder, Duration::from_secs(20), "the holder to stop");
    let stopped = frozen.elapsed();
    let output = finish(holder);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(76), "{text}");
    // Whichever ends it first says so: the lease running out, or the
    // renewals' retries giving up within it.
    assert!(
        text.contains("slot lost: no renewal of its lease was confirmed in time")
            || text.contains("slot lost while the command ran: 0 replicas"),
        "{text}"
    );
    assert!(
        text.contains("watch-retry") && text.contains("acknowledged our renewal within 500ms"),
        "-v shows why: {text}"
    );
    // The lease (5/6 of 3 s from the last confirmed renewal, sent before
    // the freeze) ends it, about 2 s after the freeze; renewals counted
    // without the replica would have kept it running to the deadline. The
    // bound leaves room for a loaded machine.
    assert!(
        stopped < Duration::from_secs(6),
        "stopped {stopped:?} after the freeze"
    );
    world.assert_clean();
    replica.thaw();
}

/// Makes `user` (password `pw`) with every permission consem needs, and
/// WAIT only if `wait`.
fn acl_user(redis: &RedisServer, user: &str, wait: bool) {
    let mut connection = redis.connection().unwrap();
    let mut rule = vec![
        "SETUSER",
        user,
        "on",
        ">pw",
        "~semaphore:*",
        "+@read",
        "+@write",
        "+@scripting",
        "+blpop",
        "+time",
        "+ping",
        "+type",
        "+info",
    ];
    rule.push(if wait { "+wait" } else { "-wait" });
    let _: () = redis::cmd("ACL")
        .arg(&rule[..])
        .query(&mut connection)
        .unwrap();
}

/// A user who may not send WAIT: with `--redis-wait-replicas`, the slot
/// granted is given back and the run exits 77 naming WAIT; a holder whose
/// user loses the permission loses its slot (76) saying so.
#[test]
fn wait_refused_by_the_acl_is_a_permission_error() {
    let (world, _replica) = replicated("wait-acl");
    let redis = &world.store;
    acl_user(redis, "nowait", false);
    let as_user = |user: &str, extra: &[&str], command: &[&str]| {
        let addr = format!("{user}:pw@127.0.0.1:{}", redis.port);
        let mut command = world.consem_via(&addr, 1, extra, command);
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        command.spawn().unwrap()
    };
    let mut refused = as_user(
        "nowait",
        &["--redis-wait-replicas", "1"],
        &["touch", &world.path("ran")],
    );
    wait_with_deadline(&mut refused, Duration::from_secs(20), "consem to exit");
    let refused = finish(refused);
    let text = stderr(&refused);
    assert_eq!(refused.status.code(), Some(77), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.contains("may not do what consem needs")
            && text.contains("WAIT with --redis-wait-replicas"),
        "{text}"
    );
    assert!(!world.exists("ran"));
    world.assert_clean();

    acl_user(redis, "waits", true);
    let mut holder = as_user(
        "waits",
        &[
            "--redis-wait-replicas",
            "1",
            "--ttl",
            "3s",
            "--kill-grace",
            "500ms",
        ],
        &strs(&world.held_until("ready", "go", 0)),
    );
    wait_until(PROMPT, "the holder's command to start", || {
        world.exists("ready")
    });
    acl_user(redis, "waits", false);
    wait_with_deadline(&mut holder, Duration::from_secs(20), "the holder to stop");
    let output = finish(holder);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(76), "{text}");
    assert!(text.contains("may not do what consem needs"), "{text}");
    world.assert_clean();
}

/// Calls of `command` the server has answered so far.
fn command_calls(redis: &RedisServer, command: &str) -> u64 {
    let mut connection = redis.connection().unwrap();
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut connection)
        .unwrap();
    stats
        .lines()
        .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// A failover by hand: the primary crashes while its replica lags (the
/// replica replicates through a proxy that holds the primary's stream
/// back), and the replica is made primary. With `wait`, the holder's grant
/// is first not used, and the replica catches up (straight from the
/// primary) before the holder's command starts. A contender `--try` on
/// the promoted replica then tells whether the holder's permit survived:
/// `Some(0)`, it did not, and a second holder runs; `Some(75)`, it did.
/// Returns that, and the holder's exit code.
fn failover_after_a_grant(name: &str, wait: bool) -> (Option<i32>, Option<i32>) {
    let mut world = World::redis(name);
    let link = crate::common::proxy::DelayingProxy::start(&world.store.address());
    let replica = RedisServer::start(
        &world.dir.join("replica"),
        &["--replicaof", "127.0.0.1", &link.port.to_string()],
    );
    world.store.wait_for_replicas(1);
    let command = |replica: &RedisServer, args: &[&str]| {
        let mut connection = replica.connection().unwrap();
        redis::cmd(args[0])
            .arg(&args[1..])
            .query::<()>(&mut connection)
            .unwrap();
    };
    let mut extra = vec!["--ttl", "6s", "--kill-grace", "1s"];
    if wait {
        extra.extend_from_slice(&["--redis-wait-replicas", "1"]);
    }
    link.delay_answers(Duration::from_secs(60));
    let waits_before = command_calls(&world.store, "wait");
    let mut holder = world.spawn(1, &extra, &strs(&world.held_until("ready", "go", 0)));
    if wait {
        // Its grant waited for the lagging replica, and was not used.
        wait_until(PROMPT, "the holder's WAIT", || {
            command_calls(&world.store, "wait") > waits_before
        });
        assert!(
            !world.exists("ready"),
            "a grant the replica did not acknowledge was used"
        );
        let port = world.store.port.to_string();
        command(&replica, &["REPLICAOF", "127.0.0.1", &port]);
    }
    wait_until(PROMPT, "the holder's command to start", || {
        world.exists("ready")
    });
    world.store.stop();
    command(&replica, &["REPLICAOF", "NO", "ONE"]);
    let promoted = format!("127.0.0.1:{}", replica.port);
    let second = world
        .consem_via(&promoted, 1, &["--try"], &["true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .unwrap();
    // Its command never ends by itself: its lease's end stops it.
    wait_with_deadline(&mut holder, Duration::from_secs(30), "the holder to stop");
    (second.status.code(), holder.wait().unwrap().code())
}

/// What `--redis-wait-replicas` closes: without it, a permit the primary
/// acknowledged is lost with it when the replica promoted had not received
/// it, and a second holder runs beside the first; with it, the holder's
/// command starts only once the replica has the permit, which the promoted
/// replica then keeps: no second holder. Either way the first holder, cut
/// off from the primary it knew, stops when its lease ends (76).
#[test]
fn a_grant_the_replica_acknowledged_survives_a_failover() {
    assert_eq!(
        failover_after_a_grant("failover-plain", false),
        (Some(0), Some(76)),
        "without the option, the failover should admit a second holder"
    );
    assert_eq!(
        failover_after_a_grant("failover-wait", true),
        (Some(75), Some(76)),
        "with the option, the promoted replica keeps the permit"
    );
}

/// A listing only reads: a Redis user that may read and nothing else
/// lists the semaphores, and what it lists is what is held.
#[test]
fn a_listing_needs_no_permission_to_write() {
    let world = World::redis("list-read-only");
    let holder = hold_slot(&world, 2, "ready", "go");
    let mut connection = world.store.connection().unwrap();
    let _: () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER",
                "reader",
                "on",
                ">reader-pw",
                "~*",
                "-@all",
                "+@read",
                "+info",
                "+time",
                "+hello",
                "+ping",
            ][..],
        )
        .query(&mut connection)
        .unwrap();
    let root = world.prefix.rsplit_once('/').unwrap().0.to_string();
    let output = world
        .consem_command()
        .args(["status", "--prefix", &format!("{root}/"), "--json"])
        .arg(format!(
            "--store=redis://reader:reader-pw@127.0.0.1:{}",
            world.store.port
        ))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let listing: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let ours = listing["semaphores"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["prefix"] == world.prefix.as_str())
        .unwrap_or_else(|| panic!("{} not listed: {listing}", world.prefix));
    assert_eq!((&ours["limit"], &ours["held"]), (&2.into(), &1.into()));
    assert_eq!(ours["oldest_holder"]["pid"], holder.id());
    world.touch("go");
    assert_eq!(finish(holder).status.code(), Some(0));
    world.assert_clean();
}
