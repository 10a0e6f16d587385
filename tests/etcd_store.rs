//! What only the etcd store does, against a real etcd of each test's own
//! (three members for a failover): its keys and leases as etcd shows them,
//! a slot taken away with etcdctl, a server killed or frozen while a
//! command runs, a leader killed under holders and waiters, credentials,
//! endpoints that are down, TLS, and nothing left behind after runs of
//! every kind. The behaviour every store shares is in tests/conformance.rs.

use std::os::unix::process::ExitStatusExt as _;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::etcd::{
    free_ports, EtcdCluster, EtcdEntry, EtcdServer, ForgetfulProxy, TlsFiles,
};
use crate::common::wait_until;
use crate::common::world::*;

/// Bound for one consem run; every test stays well under nextest's 60 s.
const RUN_DEADLINE: Duration = Duration::from_secs(30);

fn spawn(mut command: Command) -> Child {
    command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `child` (killed if it passes the deadline) and collects its
/// output.
fn finish_within(mut child: Child, what: &str) -> Output {
    wait_with_deadline(&mut child, RUN_DEADLINE, what);
    child.wait_with_output().unwrap()
}

fn output_of(command: Command) -> Output {
    finish_within(spawn(command), "consem to exit")
}

fn output(world: &World<EtcdServer>, limit: u32, extra: &[&str], command: &[&str]) -> Output {
    output_of(world.consem(limit, extra, command))
}

/// `consem run` against `store` instead of the world's own.
fn run_on<S>(
    world: &World<S>,
    store: &str,
    limit: u32,
    extra: &[&str],
    command: &[&str],
) -> Command {
    let mut run = world.consem_command();
    run.args(["run", "--prefix", &world.prefix])
        .args(["--limit", &limit.to_string()])
        .arg(format!("--store={store}"))
        .args(extra)
        .arg("--")
        .args(command);
    run
}

/// `consem status --json` against `store`.
fn status_on<S>(world: &World<S>, store: &str) -> (Option<i32>, serde_json::Value) {
    let mut status = world.consem_command();
    status
        .args(["status", "--json", "--prefix", &world.prefix])
        .arg(format!("--store={store}"));
    let output = output_of(status);
    let json = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", stderr(&output)));
    (output.status.code(), json)
}

/// The contender keys under `prefix`, oldest (lowest create revision) first.
fn contenders(etcd: &EtcdServer, prefix: &str) -> Vec<EtcdEntry> {
    let limit = format!("{prefix}/.limit");
    let mut entries: Vec<EtcdEntry> = etcd
        .entries(prefix)
        .into_iter()
        .filter(|e| e.key != limit)
        .collect();
    entries.sort_by_key(|e| e.create_revision);
    entries
}

fn lease_of(entry: &EtcdEntry) -> &str {
    entry
        .lease
        .as_deref()
        .unwrap_or_else(|| panic!("a contender key without a lease: {entry:?}"))
}

/// Commands that append "start" and "end" to one log: how many ran, and
/// the most that ran at once.
fn starts_and_most_at_once(log: &str) -> (usize, usize) {
    let (mut running, mut most, mut starts) = (0usize, 0usize, 0usize);
    for line in log.lines() {
        if line == "start" {
            running += 1;
            starts += 1;
        } else {
            running -= 1;
        }
        most = most.max(running);
    }
    (starts, most)
}

/// The slot as etcd shows it: a contender key named after its lease (in
/// hex) and attached to it, granted `--ttl`, describing its consem; the
/// limit record without a lease; the holder's key and its create revision
/// (which is the fence) in the command's environment; the leases as the
/// sessions of `status`.
#[test]
fn a_slot_is_a_key_on_a_lease_and_its_create_revision_is_the_fence() {
    let world = World::etcd("layout");
    let etcd = &world.store;
    let script = format!(
        "printf '%s|%s|%s' \"$ETCD_LOCK_KEY\" \"$ETCD_LOCK_REV\" \"$CONSEM_FENCE\" > '{}'; touch '{}'; while [ ! -e '{}' ]; do sleep 0.02; done",
        world.path("env"),
        world.path("ready"),
        world.path("go")
    );
    let holder = world.spawn(1, &["--ttl", "7s"], &["sh", "-c", &script]);
    wait_until(PROMPT, "the holder's command to start", || {
        world.exists("ready")
    });
    let waiter = world.spawn(1, &["--ttl", "7s"], &["true"]);
    wait_until(PROMPT, "the waiter to queue", || {
        world.contender_keys() == 2
    });

    let entries = etcd.entries(&world.prefix);
    let limit_key = world.key(".limit");
    let limit = entries
        .iter()
        .find(|e| e.key == limit_key)
        .unwrap_or_else(|| panic!("no {limit_key}: {entries:?}"));
    assert_eq!(limit.value, "1", "{limit:?}");
    assert_eq!(limit.lease, None, "the limit record outlives contenders");
    let contenders = contenders(etcd, &world.prefix);
    assert_eq!(contenders.len(), 2, "{entries:?}");
    for (entry, consem) in contenders.iter().zip([&holder, &waiter]) {
        let lease = lease_of(entry);
        assert_eq!(entry.key, world.key(lease), "named after its lease");
        assert_eq!(etcd.time_to_live(lease).0, 7, "granted --ttl");
        let description: serde_json::Value = serde_json::from_str(&entry.value)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {entry:?}"));
        assert_eq!(description["Pid"], consem.id(), "{description}");
        for field in ["Host", "Command", "Started"] {
            assert!(description[field].is_string(), "{field}: {description}");
        }
    }
    let mut leases: Vec<String> = contenders.iter().map(|e| lease_of(e).to_string()).collect();
    leases.sort();
    assert_eq!(etcd.leases(), leases, "one lease per contender");

    let held = &contenders[0];
    let env = std::fs::read_to_string(world.path("env")).unwrap();
    let revision = held.create_revision;
    assert_eq!(env, format!("{}|{revision}|{revision}", held.key));

    let status = world.admin("status", &["--json"]).output().unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["holders"][0]["session"], lease_of(held), "{status}");
    assert_eq!(
        status["waiters"][0]["session"],
        lease_of(&contenders[1]),
        "{status}"
    );

    world.touch("go");
    let held = finish_within(holder, "the holder to finish");
    assert_eq!(held.status.code(), Some(0), "{}", stderr(&held));
    let waited = finish_within(waiter, "the waiter to run");
    assert_eq!(waited.status.code(), Some(0), "{}", stderr(&waited));
    world.assert_clean();
}

/// Twice the conformance suite's contenders, each keeping its slot
/// briefly, so that slots change hands while others still join.
#[test]
fn sixteen_contenders_never_run_more_than_three_at_once() {
    let world = World::etcd("sixteen");
    let log = world.path("log");
    let script = format!("echo start >> '{log}'; sleep 0.1; echo end >> '{log}'");
    let children: Vec<Child> = (0..16)
        .map(|_| world.spawn(3, &[], &["sh", "-c", &script]))
        .collect();
    for child in children {
        let output = finish_within(child, "a contender to run and exit");
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    }
    let log = std::fs::read_to_string(&log).unwrap();
    let (starts, most) = starts_and_most_at_once(&log);
    assert_eq!(starts, 16, "every contender ran:\n{log}");
    assert!(most <= 3, "{most} ran at once:\n{log}");
    world.assert_clean();
}

/// With two slots, each slot that frees goes to the waiter that queued
/// first, whichever holder leaves, a later one too.
#[test]
fn freed_slots_go_to_the_earliest_waiters() {
    let world = World::etcd("fifo-two");
    let holders = [
        hold_slot(&world, 2, "ready-a", "go-a"),
        hold_slot(&world, 2, "ready-b", "go-b"),
    ];
    let mut waiters = Vec::new();
    for n in 0..4 {
        let command = world.held_until(&format!("ready-{n}"), &format!("go-{n}"), 0);
        waiters.push(world.spawn(2, &[], &strs(&command)));
        wait_until(PROMPT, "the waiter to queue", || {
            world.contender_keys() == 3 + n
        });
    }
    let started = || -> Vec<usize> {
        (0..4)
            .filter(|n| world.exists(&format!("ready-{n}")))
            .collect()
    };
    // (who leaves, the waiter that takes its slot)
    for (leaving, next) in [("b", 0), ("a", 1), ("1", 2), ("0", 3)] {
        world.touch(&format!("go-{leaving}"));
        wait_until(PROMPT, &format!("waiter {next} to start"), || {
            world.exists(&format!("ready-{next}"))
        });
        assert_eq!(
            started(),
            (0..=next).collect::<Vec<_>>(),
            "after {leaving} left"
        );
    }
    world.touch("go-2");
    world.touch("go-3");
    for child in holders.into_iter().chain(waiters) {
        let output = finish_within(child, "a contender to finish");
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    }
    world.assert_clean();
}

/// The first waiter hears every departure under the prefix and counts
/// those ahead of it: waiters behind it leaving change nothing for it, a
/// holder leaving gives it the slot (at once, without reading again).
#[test]
fn the_first_waiter_takes_a_slot_only_when_a_holder_leaves() {
    let world = World::etcd("first-waiter");
    let log = world.path("log");
    let logged = |ready: &str, go: &str| {
        format!(
            "echo start >> '{log}'; touch '{}'; while [ ! -e '{}' ]; do sleep 0.02; done; echo end >> '{log}'",
            world.path(ready),
            world.path(go)
        )
    };
    let mut holders = Vec::new();
    for name in ["a", "b"] {
        let script = logged(&format!("ready-{name}"), &format!("go-{name}"));
        holders.push(world.spawn(2, &[], &["sh", "-c", &script]));
        wait_until(PROMPT, "the holder to start", || {
            world.exists(&format!("ready-{name}"))
        });
    }
    let first = world.spawn(2, &[], &["sh", "-c", &logged("ready-first", "go-first")]);
    wait_until(PROMPT, "the first waiter to queue", || {
        world.contender_keys() == 3
    });
    let mut behind = Vec::new();
    for n in 0..2 {
        behind.push(world.spawn(2, &[], &["true"]));
        wait_until(PROMPT, "a waiter behind to queue", || {
            world.contender_keys() == 4 + n
        });
    }
    for waiter in behind.into_iter().rev() {
        signal(&waiter, libc::SIGTERM);
        let output = finish_within(waiter, "a waiter behind to leave");
        assert_eq!(
            output.status.signal(),
            Some(libc::SIGTERM),
            "{}",
            stderr(&output)
        );
    }
    wait_until(PROMPT, "the waiters behind to be gone", || {
        world.contender_keys() == 3
    });
    // A third command now would be one too many: the log shows it.
    world.touch("go-b");
    wait_until(PROMPT, "the first waiter to start", || {
        world.exists("ready-first")
    });
    world.touch("go-a");
    world.touch("go-first");
    for child in holders.into_iter().chain([first]) {
        let output = finish_within(child, "a contender to finish");
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    }
    let log = std::fs::read_to_string(&log).unwrap();
    assert_eq!(starts_and_most_at_once(&log), (3, 2), "{log}");
    world.assert_clean();
}

/// A waiter reads a glimpse of the queue, not the whole prefix: its head
/// (who holds) and the few keys just ahead of its own (the one it
/// watches). A handoff deep in a queue of long descriptions costs etcd
/// less than one listing of the prefix, and three transactions: the read
/// of the waiter that moves up to first in line (its watch for departures
/// opened before it, so that no second read is needed), the relay write of
/// the one that takes the slot, and the leaver's look for contenders
/// left. A waiter whose key ahead leaves while it waits (a waiter that
/// gave up) finds the next one ahead from a glimpse: the slots still go in
/// order of arrival.
#[test]
fn a_waiter_reads_a_glimpse_of_the_queue_and_still_sees_the_key_ahead_leave() {
    const WAITERS: usize = 24;
    const LEAVER: usize = 12;
    let world = World::etcd("glimpse");
    // Each key describes its command: a long one makes a listing heavy.
    let long = "x".repeat(400);
    let held = |n: &str| {
        let mut command = world.held_until(&format!("ready-{n}"), &format!("go-{n}"), 0);
        command[2] = format!("{} # {long}", command[2]);
        command
    };
    let holder = world.spawn(1, &[], &strs(&held("h")));
    wait_until(PROMPT, "the holder to start", || world.exists("ready-h"));
    let mut waiters = Vec::new();
    for n in 0..WAITERS {
        waiters.push(world.spawn(1, &[], &strs(&held(&n.to_string()))));
        wait_until(PROMPT, "the waiter to queue", || {
            world.contender_keys() == 2 + n
        });
    }
    // Every waiter watches (and the holder its own key): all have read.
    wait_until(PROMPT, "every waiter to watch", || {
        world.store.metric("etcd_debugging_mvcc_watcher_total") >= (WAITERS + 1) as f64
    });
    let listing: usize = world
        .store
        .entries(&world.prefix)
        .iter()
        .map(|entry| entry.key.len() + entry.value.len())
        .sum();
    let leaver = waiters.remove(LEAVER);
    signal(&leaver, libc::SIGTERM);
    let output = finish_within(leaver, "the waiter that gives up to leave");
    assert_eq!(
        output.status.signal(),
        Some(libc::SIGTERM),
        "{}",
        stderr(&output)
    );
    let order: Vec<String> = (0..WAITERS)
        .filter(|&n| n != LEAVER)
        .map(|n| n.to_string())
        .collect();
    let sent = || {
        world
            .store
            .metric("etcd_network_client_grpc_sent_bytes_total")
    };
    let txns = || {
        world.store.metric(
            r#"grpc_server_msg_received_total{grpc_method="Txn",grpc_service="etcdserverpb.KV",grpc_type="unary"}"#,
        )
    };
    let (before, txns_before) = (sent(), txns());
    let mut leaving = "h".to_string();
    for next in &order {
        world.touch(&format!("go-{leaving}"));
        wait_until(PROMPT, &format!("waiter {next} to start"), || {
            world.exists(&format!("ready-{next}"))
        });
        let early: Vec<&String> = order
            .iter()
            .skip_while(|n| *n != next)
            .skip(1)
            .filter(|n| world.exists(&format!("ready-{n}")))
            .collect();
        assert!(early.is_empty(), "{early:?} started before {next}");
        leaving = next.clone();
    }
    let per_handoff = (sent() - before) / order.len() as f64;
    let txns_per_handoff = (txns() - txns_before) / order.len() as f64;
    world.touch(&format!("go-{leaving}"));
    for child in [holder].into_iter().chain(waiters) {
        let output = finish_within(child, "a contender to finish");
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    }
    assert!(!world.exists(&format!("ready-{LEAVER}")));
    assert!(
        per_handoff < listing as f64,
        "etcd sent {per_handoff:.0} bytes a handoff, more than a listing of the prefix ({listing} bytes)"
    );
    // The waiter behind the one that gave up may read once more meanwhile.
    assert!(
        txns_per_handoff < 3.5,
        "{txns_per_handoff:.2} transactions a handoff"
    );
    world.assert_clean();
}

/// A waiter's keep-alives go from a thread of their own, and its watch
/// stays open across them: over several keep-alive periods, waiters renew
/// their leases every TTL/3 but open a watch about once a TTL.
#[test]
fn a_waiters_watch_stays_open_across_its_keep_alives() {
    const WAITERS: usize = 4;
    let world = World::etcd("renewing-waiters");
    let ttl = ["--ttl", "2s"];
    let holder = world.spawn(1, &ttl, &strs(&world.held_until("ready-h", "go-h", 0)));
    wait_until(PROMPT, "the holder to start", || world.exists("ready-h"));
    let waiters: Vec<Child> = (0..WAITERS)
        .map(|n| {
            let waiter = world.spawn(1, &ttl, &["true"]);
            wait_until(PROMPT, "the waiter to queue", || {
                world.contender_keys() == 2 + n
            });
            waiter
        })
        .collect();
    let received = |method: &str, service: &str, kind: &str| {
        world.store.metric(&format!(
            r#"grpc_server_msg_received_total{{grpc_method="{method}",grpc_service="etcdserverpb.{service}",grpc_type="{kind}"}}"#
        ))
    };
    let watches = || received("Watch", "Watch", "bidi_stream");
    let keep_alives = || received("LeaseKeepAlive", "Lease", "bidi_stream");
    let (watches_before, keep_alives_before) = (watches(), keep_alives());
    let began = Instant::now();
    // Six TTLs: eighteen keep-alive periods.
    let span = Duration::from_secs(12);
    wait_until(span + PROMPT, "six TTLs to pass", || {
        began.elapsed() >= span
    });
    let periods = began.elapsed().as_secs_f64() / (2.0 / 3.0);
    let (watches, keep_alives) = (
        watches() - watches_before,
        keep_alives() - keep_alives_before,
    );
    assert_eq!(world.contender_keys(), 1 + WAITERS, "every lease lived");
    let contenders = (1 + WAITERS) as f64;
    assert!(
        keep_alives >= 0.7 * periods * contenders,
        "{keep_alives} keep-alives in {periods:.1} periods"
    );
    // The holder watches its own key anew at each keep-alive; each waiter
    // about once a TTL (every third period).
    let waiters_watches = watches - periods;
    assert!(
        waiters_watches <= 0.5 * periods * WAITERS as f64,
        "{waiters_watches:.0} watches of {WAITERS} waiters in {periods:.1} periods"
    );
    world.touch("go-h");
    for child in [holder].into_iter().chain(waiters) {
        let output = finish_within(child, "a contender to finish");
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    }
    world.assert_clean();
}

/// A waiter whose lease is revoked (by hand, or lost in an outage) learns
/// it from its renewing thread and joins again on a new lease, at the back.
#[test]
fn a_waiter_whose_lease_is_revoked_joins_again() {
    let world = World::etcd("waiter-revoked");
    let ttl = ["--ttl", "2s"];
    let holder = world.spawn(1, &ttl, &strs(&world.held_until("ready-h", "go-h", 0)));
    wait_until(PROMPT, "the holder to start", || world.exists("ready-h"));
    let waiter = world.spawn(1, &ttl, &["touch", &world.path("ran")]);
    wait_until(PROMPT, "the waiter to queue", || {
        world.contender_keys() == 2
    });
    let queued = contenders(&world.store, &world.prefix);
    let revoked = lease_of(&queued[1]).to_string();
    world.store.revoke(&revoked);
    wait_until(PROMPT, "the waiter to join again on a new lease", || {
        let now = contenders(&world.store, &world.prefix);
        now.len() == 2 && lease_of(&now[1]) != revoked
    });
    assert!(!world.exists("ran"));
    world.touch("go-h");
    for child in [holder, waiter] {
        let output = finish_within(child, "a contender to finish");
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    }
    assert!(world.exists("ran"));
    world.assert_clean();
}

/// etcd that takes a request and answers late (a busy server) is not an
/// etcd that cannot be reached: the first call, answered after its budget,
/// is sent again, and the run goes on once etcd answers in time.
#[test]
fn a_first_call_answered_late_is_sent_again_not_unavailable() {
    let world = World::etcd("answered-late");
    let proxy = crate::common::proxy::DelayingProxy::start(&world.store.address());
    proxy.delay_answers(Duration::from_secs(7));
    let store = format!("etcd://{}", proxy.addr());
    let run = spawn(run_on(
        &world,
        &store,
        1,
        &["--ttl", "20s"],
        &["touch", &world.path("ran")],
    ));
    wait_until(PROMPT, "the lease grant to reach etcd", || {
        !world.store.leases().is_empty()
    });
    proxy.delay_answers(Duration::ZERO);
    let output = finish_within(run, "consem to run once etcd answers");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(world.exists("ran"));
}

/// etcd frozen (SIGSTOP) before the first call: the connection is taken
/// and nothing is ever answered. Once a TTL has passed without an answer,
/// the store is unavailable (69), and says that etcd did not answer.
#[test]
fn an_etcd_that_never_answers_is_unavailable_69_after_a_ttl() {
    let world = World::etcd("never-answers");
    world.store.freeze();
    let started = Instant::now();
    let output = output(&world, 1, &["--ttl", "2s"], &["touch", &world.path("ran")]);
    world.store.thaw();
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(69), "{text}");
    assert!(text.contains("did not answer"), "{text}");
    assert!(started.elapsed() >= Duration::from_secs(2), "{text}");
    assert!(!world.exists("ran"));
}

/// etcd serves a watch that starts at a revision it has passed late (it
/// catches such watches up every 100 ms, holding back every change
/// meanwhile), and on a busy etcd every read is soon passed. So a watch
/// starts where etcd stands when it creates it, and says where: what
/// changed between a read and then, the caller reads.
#[test]
fn a_watch_starts_where_etcd_stands_and_is_served_live() {
    use consem::store::etcd::client::{Changes, Client, Connection, WatchRequest, Watched};
    let world = World::etcd("live-watch");
    let etcd = &world.store;
    let client = Client::new(Connection {
        endpoints: vec![etcd.endpoint()],
        user: None,
        tls: Default::default(),
    })
    .unwrap();
    let (key, end) = (world.prefix.as_bytes(), format!("{}0", world.prefix));
    let revision = || client.range(key, end.as_bytes()).unwrap().header.revision;
    let read_at = revision();
    let name = format!("{}/changed", world.prefix);
    etcd.put(&name, "after the read");
    let request = WatchRequest {
        key,
        end: Some(end.as_bytes()),
        deletions_only: false,
        after: None,
    };
    let wait = Duration::from_secs(5);
    let mut watch = client.watch(&request, wait).unwrap().expect("a watch");
    assert_eq!(
        watch.created_at,
        read_at + 1,
        "it starts past the write that came after the read"
    );
    assert_eq!(
        etcd.metric("etcd_debugging_mvcc_slow_watcher_total"),
        0.0,
        "etcd serves it live"
    );
    etcd.put(&name, "after the watch");
    assert_eq!(
        client.next_change(&mut watch, read_at + 1),
        Ok(Watched::Changed(Changes {
            deleted: vec![],
            through: read_at + 2
        }))
    );
    // A change the caller has read already is skipped.
    etcd.put(&name, "read");
    etcd.delete(&name);
    assert_eq!(
        client.next_change(&mut watch, read_at + 3),
        Ok(Watched::Changed(Changes {
            deleted: vec![name.clone().into_bytes()],
            through: read_at + 4
        }))
    );
    let mut quiet = client
        .watch(&request, Duration::from_millis(300))
        .unwrap()
        .expect("a watch");
    assert_eq!(quiet.created_at, read_at + 4);
    assert_eq!(
        client.next_change(&mut quiet, read_at + 4),
        Ok(Watched::Quiet)
    );
}

/// The fence is the contender key's create revision, which etcd keeps on
/// disk: it grows from one run to the next, across a restart of the
/// server too.
#[test]
fn the_fence_is_the_create_revision_and_grows_across_a_restart() {
    let mut world = World::etcd("fence-restart");
    let fence = |world: &World<EtcdServer>| -> i64 {
        let script = "printf '%s %s' \"$CONSEM_FENCE\" \"$ETCD_LOCK_REV\"";
        let run = output(world, 1, &[], &["sh", "-c", script]);
        assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
        let text = String::from_utf8(run.stdout).unwrap();
        let (fence, revision) = text.split_once(' ').unwrap();
        assert_eq!(fence, revision, "the fence is the key's create revision");
        fence.parse().unwrap()
    };
    let mut fences: Vec<i64> = (0..5).map(|_| fence(&world)).collect();
    world.store.restart();
    fences.extend((0..5).map(|_| fence(&world)));
    assert!(
        fences.windows(2).all(|w| w[1] > w[0]),
        "fences must grow: {fences:?}"
    );
    world.assert_clean();
}

/// An operator takes the slot away with etcdctl while the command runs
/// (`take` is given the holder's key): the holder stops the command and
/// exits 76, and the slot goes to the waiter. The holder learns it from
/// the watch of its key, at once: not from its next keep-alive (every
/// 10 s at `--ttl 30s`), which a deletion of the key alone never tells.
fn taken_away_with_etcdctl(name: &str, take: fn(&EtcdServer, &EtcdEntry)) {
    let world = World::etcd(name);
    let etcd = &world.store;
    let script = format!("echo $$ > '{}'; exec sleep 60", world.path("pid"));
    let args = ["--ttl", "30s", "--kill-grace", "1s"];
    let holder = world.spawn(1, &args, &["sh", "-c", &script]);
    let pid = read_pid(&world, "pid");
    let waiter = world.spawn(1, &[], &["true"]);
    wait_until(PROMPT, "the waiter to queue", || {
        world.contender_keys() == 2
    });
    take(etcd, &contenders(etcd, &world.prefix)[0]);
    let taken = Instant::now();
    let stopped = finish_within(holder, "the holder to stop its command");
    assert!(
        taken.elapsed() < Duration::from_secs(4),
        "the holder stopped {:?} after its slot was taken: {}",
        taken.elapsed(),
        stderr(&stopped)
    );
    assert_eq!(stopped.status.code(), Some(76), "{}", stderr(&stopped));
    assert!(
        stderr(&stopped).contains("slot lost"),
        "{}",
        stderr(&stopped)
    );
    wait_until(PROMPT, "the command to be gone", || process_gone(pid));
    let waited = finish_within(waiter, "the waiter to run");
    assert_eq!(waited.status.code(), Some(0), "{}", stderr(&waited));
    world.assert_clean();
}

#[test]
fn a_lease_revoked_with_etcdctl_stops_the_command_with_76() {
    taken_away_with_etcdctl("revoked", |etcd, holder| etcd.revoke(lease_of(holder)));
}

/// The holder's lease outlives its key: consem revokes it when it leaves.
#[test]
fn a_contender_key_deleted_with_etcdctl_stops_the_command_with_76() {
    taken_away_with_etcdctl("deleted", |etcd, holder| etcd.delete(&holder.key));
}

/// A key an operator rewrites without its lease (`etcdctl put` with no
/// `--lease`) is no contender's any more: the waiter behind may take the
/// slot. The holder's watch sees the rewrite, and the holder stops its
/// command (76) rather than run beside the next.
#[test]
fn a_key_rewritten_without_its_lease_is_a_lost_slot() {
    let world = World::etcd("detached");
    let etcd = &world.store;
    let script = format!("echo $$ > '{}'; exec sleep 60", world.path("pid"));
    let holder = world.spawn(1, &["--kill-grace", "1s"], &["sh", "-c", &script]);
    let pid = read_pid(&world, "pid");
    let waiter = world.spawn(1, &[], &["true"]);
    wait_until(PROMPT, "the waiter to queue", || {
        world.contender_keys() == 2
    });
    let key = contenders(etcd, &world.prefix)[0].key.clone();
    etcd.put(&key, "{}");
    let stopped = finish_within(holder, "the holder to stop its command");
    assert_eq!(stopped.status.code(), Some(76), "{}", stderr(&stopped));
    assert!(
        stderr(&stopped).contains("without our lease"),
        "{}",
        stderr(&stopped)
    );
    wait_until(PROMPT, "the command to be gone", || process_gone(pid));
    // The key, on no lease, is left for the operator who wrote it.
    etcd.delete(&key);
    let waited = finish_within(waiter, "the waiter to run");
    assert_eq!(waited.status.code(), Some(0), "{}", stderr(&waited));
    world.assert_clean();
}

/// A waiter whose key is written again by hand without its lease joins
/// again under a new lease (a key of another name) and gets its turn: it
/// does not take the stray key for its own, find itself gone at its next
/// look, and join again at once, for ever (hundreds of times a second).
#[test]
fn a_waiter_whose_key_is_written_again_without_its_lease_joins_again_once() {
    let world = World::etcd("waiter-detached");
    let etcd = &world.store;
    let holder = hold_slot(&world, 1, "ready", "go");
    let first = world.spawn(1, &[], &["true"]);
    wait_until(PROMPT, "the first waiter to queue", || {
        world.contender_keys() == 2
    });
    let second = world.spawn(1, &["-v"], &["true"]);
    wait_until(PROMPT, "the second waiter to queue", || {
        world.contender_keys() == 3
    });
    let key = contenders(etcd, &world.prefix)[2].key.clone();
    etcd.put(&key, "{}");
    world.touch("go");
    assert_eq!(finish_within(holder, "the holder").status.code(), Some(0));
    assert_eq!(
        finish_within(first, "the first waiter").status.code(),
        Some(0)
    );
    let second = finish_within(second, "the second waiter to run");
    assert_eq!(second.status.code(), Some(0), "{}", stderr(&second));
    let rejoins = stderr(&second).matches(" rejoin ").count();
    assert!(
        (1..=2).contains(&rejoins),
        "{rejoins} rejoins: {}",
        stderr(&second)
    );
    // The key, on no lease, is left for the operator who wrote it.
    etcd.delete(&key);
    world.assert_clean();
}

/// A prefix nested in another (`p/inner` under `p`) is a semaphore of its
/// own: its keys lie in `p`'s range, but `p`'s contenders neither count
/// them nor wait for them.
#[test]
fn a_nested_prefix_is_a_semaphore_of_its_own() {
    let world = World::etcd("nested");
    let mut inner = world.consem_command();
    inner
        .args(["run", "--prefix", &format!("{}/inner", world.prefix)])
        .args(["--limit", "1"]);
    world.store.point(&mut inner);
    inner
        .arg("--")
        .args(strs(&world.held_until("inner-ready", "go", 0)));
    let inner = spawn(inner);
    wait_until(PROMPT, "the nested prefix's holder to start", || {
        world.exists("inner-ready")
    });
    // While the nested prefix's slot is held, the outer one's is free.
    let outer = output_of(world.consem(1, &[], &["true"]));
    assert_eq!(outer.status.code(), Some(0), "{}", stderr(&outer));
    world.touch("go");
    assert_eq!(
        finish_within(inner, "the nested holder").status.code(),
        Some(0)
    );
    world.assert_clean();
}

/// A keep-alive that etcd answers "no such lease" ends the run at once
/// (76), as the watch of the key would have: it is not a failure to try
/// again until the lease runs out. Here the watch never gets through (a
/// proxy that swallows watches, as a middlebox that holds streamed answers
/// back does), so the keep-alive is the holder's only news of the lease.
#[test]
fn a_keep_alive_that_finds_the_lease_gone_ends_the_run_at_once() {
    let world = World::etcd("lease-gone");
    let etcd = &world.store;
    let proxy = crate::common::proxy::DelayingProxy::start(&etcd.address());
    proxy.swallow_requests_with("/v3/watch");
    let script = format!("echo $$ > '{}'; exec sleep 60", world.path("pid"));
    let holder = world
        .consem_via(
            &proxy.addr(),
            1,
            &["-v", "--ttl", "9s", "--kill-grace", "1s"],
            &["sh", "-c", &script],
        )
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(world.path("holder.log")).unwrap())
        .spawn()
        .unwrap();
    let pid = read_pid(&world, "pid");
    etcd.revoke(lease_of(&contenders(etcd, &world.prefix)[0]));
    let revoked = Instant::now();
    let mut holder = holder;
    let status = wait_with_deadline(&mut holder, RUN_DEADLINE, "the holder to exit");
    let log = log_text(&world, "holder.log");
    assert_eq!(status.code(), Some(76), "{log}");
    assert!(log.contains("is gone"), "{log}");
    assert!(
        !log.contains("watch-retry"),
        "a lease etcd does not know is no failure to retry: {log}"
    );
    // The next keep-alive is due within 3 s; the lease's stop point, which
    // retrying would have waited for, is 6.5 s after the last one.
    assert!(
        revoked.elapsed() < Duration::from_secs(5),
        "the holder stopped {:?} after its lease was revoked: {log}",
        revoked.elapsed()
    );
    assert!(process_gone(pid), "{log}");
    world.assert_clean();
}

/// The lease is revoked just before the command exits, and consem hears of
/// the two together (frozen meanwhile here; on a busy machine, a matter of
/// milliseconds): the command may have run on without the slot, so its
/// exit is not reported as its own. The release finds the lease gone, and
/// says so.
#[test]
fn a_lease_revoked_as_the_command_exits_is_a_loss_76() {
    let world = World::etcd("revoked-at-exit");
    let etcd = &world.store;
    let (ready, go) = (world.path("ready"), world.path("go"));
    let script = format!(
        "echo $$ > '{}'; touch '{ready}'; while [ ! -e '{go}' ]; do sleep 0.02; done; exit 3",
        world.path("pid")
    );
    let holder = world.spawn(1, &[], &["sh", "-c", &script]);
    wait_until(PROMPT, "the command to start", || world.exists("ready"));
    let pid = read_pid(&world, "pid");
    signal(&holder, libc::SIGSTOP);
    etcd.revoke(lease_of(&contenders(etcd, &world.prefix)[0]));
    std::fs::write(&go, "").unwrap();
    // The command's shell ends on its own; consem, frozen, cannot see it.
    wait_until(PROMPT, "the command to exit", || process_gone(pid));
    signal(&holder, libc::SIGCONT);
    let output = finish_within(holder, "the holder to exit");
    assert_eq!(output.status.code(), Some(76), "{}", stderr(&output));
    assert!(stderr(&output).contains("slot lost"), "{}", stderr(&output));
    world.assert_clean();
}

/// Starts a holder with a 3 s lease whose command writes its pid, then
/// cuts it off from etcd with `cut_off`: the command must be gone before
/// the lease could run out on the server, that is within 3 s of the cut
/// (one TTL after the last keep-alive, which came before it). consem
/// exits 76 within three TTLs: once the lease is over, a release that etcd
/// does not answer is not worth waiting for.
fn cut_off_while_holding(world: &mut World<EtcdServer>, cut_off: fn(&mut EtcdServer)) {
    let script = format!("echo $$ > '{}'; exec sleep 60", world.path("pid"));
    let mut holder = world.spawn(
        1,
        &["--ttl", "3s", "--kill-grace", "500ms"],
        &["sh", "-c", &script],
    );
    let pid = read_pid(world, "pid");
    let cut = Instant::now();
    cut_off(&mut world.store);
    wait_until(Duration::from_secs(10), "the command to be stopped", || {
        process_gone(pid)
    });
    assert!(
        cut.elapsed() < Duration::from_secs(3),
        "the command ran {:?} after etcd was cut off",
        cut.elapsed()
    );
    wait_with_deadline(&mut holder, RUN_DEADLINE, "the holder to exit");
    let stopped = holder.wait_with_output().unwrap();
    assert_eq!(stopped.status.code(), Some(76), "{}", stderr(&stopped));
    assert!(
        cut.elapsed() < Duration::from_secs(9),
        "consem exited {:?} after etcd was cut off: {}",
        cut.elapsed(),
        stderr(&stopped)
    );
}

/// etcd killed while a command runs; restarted, it still has the dead
/// holder's lease, and the next contender gets the slot once it runs out.
#[test]
fn a_killed_server_stops_the_command_before_the_lease_could_run_out() {
    let mut world = World::etcd("killed");
    cut_off_while_holding(&mut world, EtcdServer::stop);
    world.store.restart();
    let next = output(&world, 1, &["--timeout", "20s"], &["true"]);
    assert_eq!(next.status.code(), Some(0), "{}", stderr(&next));
    world.assert_clean();
}

/// etcd frozen (SIGSTOP) while a command runs: requests are accepted and
/// never answered. Thawed, it lets the lease run out, and the next
/// contender gets the slot.
#[test]
fn a_frozen_server_stops_the_command_before_the_lease_could_run_out() {
    let mut world = World::etcd("frozen");
    cut_off_while_holding(&mut world, |etcd| etcd.freeze());
    world.store.thaw();
    let next = output(&world, 1, &["--timeout", "20s"], &["true"]);
    assert_eq!(next.status.code(), Some(0), "{}", stderr(&next));
    world.assert_clean();
}

/// A consem killed with SIGKILL cannot revoke its lease: its slot comes
/// back when the lease runs out, one TTL later, and the waiter gets it.
#[test]
fn the_slot_of_a_killed_consem_comes_back_when_its_lease_runs_out() {
    let world = World::etcd("killed-holder");
    let mut holder = world.spawn(
        1,
        &["--ttl", "2s"],
        &strs(&world.held_until("ready", "go", 0)),
    );
    wait_until(PROMPT, "the holder's command to start", || {
        world.exists("ready")
    });
    let waiter = world.spawn(1, &["--ttl", "2s"], &["touch", &world.path("waiter-ran")]);
    wait_until(PROMPT, "the waiter to queue", || {
        world.contender_keys() == 2
    });
    holder.kill().unwrap();
    holder.wait().unwrap();
    let killed = Instant::now();
    let waited = finish_within(waiter, "the waiter to get the slot");
    assert_eq!(waited.status.code(), Some(0), "{}", stderr(&waited));
    assert!(world.exists("waiter-ran"));
    assert!(
        killed.elapsed() < PROMPT,
        "the slot came back {:?} after the kill",
        killed.elapsed()
    );
    world.assert_clean();
}

/// Three members; the leader is killed while two holders keep both slots
/// and two waiters queue. consem moves on to the members left: every
/// lease is renewed through them, a contender arriving after the kill
/// queues and gets its turn, `--try` still finds the semaphore full, and
/// never more than two commands run at once.
#[test]
fn holders_and_waiters_ride_out_the_death_of_the_leader() {
    let world = World::without_store("etcd-leader-killed");
    let mut cluster = EtcdCluster::start(&world.dir.join("etcd"));
    let leader = cluster.leader();
    // The leader first: consem starts out talking to the member that dies.
    let store = cluster.url_starting_with(leader);
    let log = world.path("log");
    let contender = |script: &str| {
        spawn(run_on(
            &world,
            &store,
            2,
            // Room in the lease for an election: SIGTERM comes 6.5 s after
            // a renewal that was due and failed.
            &["--ttl", "15s", "--kill-grace", "1s"],
            &["sh", "-c", script],
        ))
    };
    let holders: Vec<Child> = (0..2)
        .map(|n| {
            contender(&format!(
                "echo start >> '{log}'; touch '{}'; while [ ! -e '{}' ]; do sleep 0.02; done; echo end >> '{log}'",
                world.path(&format!("ready-{n}")),
                world.path("go")
            ))
        })
        .collect();
    wait_until(PROMPT, "both holders' commands to start", || {
        world.exists("ready-0") && world.exists("ready-1")
    });
    let waiter_script = format!("echo start >> '{log}'; sleep 0.2; echo end >> '{log}'");
    let mut waiters: Vec<Child> = (0..2).map(|_| contender(&waiter_script)).collect();
    wait_until(PROMPT, "the waiters to queue", || {
        cluster.any_running().contenders(&world.prefix) == 4
    });

    cluster.kill(leader);
    let elected = cluster.leader();
    assert_ne!(elected, leader);
    waiters.push(contender(&waiter_script));
    wait_until(
        PROMPT,
        "the contender that came after the kill to queue",
        || cluster.any_running().contenders(&world.prefix) == 5,
    );
    let tried = output_of(run_on(
        &world,
        &store,
        2,
        &["--try"],
        &["touch", &world.path("tried")],
    ));
    assert_eq!(tried.status.code(), Some(75), "{}", stderr(&tried));

    // The new leader extended every lease once when it took over; a lease
    // whose time left then goes up again was renewed by consem.
    let member = cluster.any_running();
    for entry in contenders(member, &world.prefix) {
        let lease = lease_of(&entry);
        let mut lowest = i64::MAX;
        wait_until(
            Duration::from_secs(20),
            &format!("a keep-alive of lease {lease} after the failover"),
            || {
                let (_, left) = member.time_to_live(lease);
                assert!(
                    left >= 0,
                    "lease {lease} is gone: its consem gave the slot up, or etcd let it run out"
                );
                let renewed = left > lowest;
                lowest = lowest.min(left);
                renewed
            },
        );
    }

    world.touch("go");
    for child in holders.into_iter().chain(waiters) {
        let output = finish_within(child, "a contender to finish");
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    }
    let log = std::fs::read_to_string(&log).unwrap();
    let (starts, most) = starts_and_most_at_once(&log);
    assert_eq!(starts, 5, "every contender ran:\n{log}");
    assert!(most <= 2, "{most} ran at once:\n{log}");
    assert!(!world.exists("tried"));
    assert_eq!(member.keys(&world.prefix), Vec::<String>::new());
    assert_eq!(member.leases(), Vec::<String>::new());
}

/// With authentication on, a wrong or missing password (by option or
/// etcdctl's variables) and a user without the rights consem needs are
/// refused with 77 and one line that shows no password; root's password
/// works, and a refused contender leaves no lease behind.
#[test]
fn wrong_credentials_and_missing_permissions_exit_77() {
    let mut world = World::etcd("auth");
    let etcd = &mut world.store;
    etcd.add_user("limited", "limited-pw");
    etcd.enable_auth("s3cret-etcd");
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut command = world.consem(1, args, &["touch", &world.path("ran")]);
        command.envs(env.iter().copied());
        output_of(command)
    };
    let no_env: &[(&str, &str)] = &[];
    for (args, env) in [
        (&[][..], no_env),
        (&["--user", "root:bad-pass-1"][..], no_env),
        (&["--user", "root", "--password", "bad-pass-1"][..], no_env),
        (&[][..], &[("ETCDCTL_USER", "root:bad-pass-1")][..]),
        (
            &[][..],
            &[("ETCDCTL_USER", "root"), ("ETCDCTL_PASSWORD", "bad-pass-1")][..],
        ),
        (&["--user", "limited:limited-pw"][..], no_env),
    ] {
        let output = run(args, env);
        let text = stderr(&output);
        assert_eq!(output.status.code(), Some(77), "{args:?} {env:?}: {text}");
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            !text.contains("bad-pass-1") && !text.contains("limited-pw"),
            "a password in: {text}"
        );
        assert!(!world.exists("ran"), "{args:?} {env:?}");
    }
    let output = run(&["--user", "root:s3cret-etcd"], no_env);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(world.exists("ran"));
    world.assert_clean();
}

/// No etcd at the one endpoint: 69 and one line that names it, for `run`
/// and `status`, and the command never runs.
#[test]
fn an_endpoint_nobody_answers_at_is_unavailable_69() {
    let world = World::without_store("etcd-unreachable");
    let [dead] = free_ports();
    let store = format!("etcd://127.0.0.1:{dead}");
    let ran = output_of(run_on(
        &world,
        &store,
        1,
        &[],
        &["touch", &world.path("ran")],
    ));
    let text = stderr(&ran);
    assert_eq!(ran.status.code(), Some(69), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains(&format!("127.0.0.1:{dead}")), "{text}");
    assert!(!world.exists("ran"));
    let mut status = world.consem_command();
    status
        .args(["status", "--prefix", &world.prefix])
        .arg(format!("--store={store}"));
    let status = output_of(status);
    assert_eq!(status.status.code(), Some(69), "{}", stderr(&status));
}

/// The first endpoint in the list (of the store's URL, or of
/// ETCDCTL_ENDPOINTS) is down: `run` and `status` use the next one.
#[test]
fn a_later_endpoint_in_the_list_serves_when_the_first_is_down() {
    let world = World::etcd("second-endpoint");
    let etcd = &world.store;
    let [dead] = free_ports();
    let store = format!("etcd://127.0.0.1:{dead},{}", etcd.address());
    let held = world.held_until("ready", "go", 0);
    let holder = spawn(run_on(&world, &store, 1, &[], &strs(&held)));
    wait_until(PROMPT, "the holder's command to start", || {
        world.exists("ready")
    });
    let (code, status) = status_on(&world, &store);
    assert_eq!(code, Some(0), "{status}");
    assert_eq!(status["holders"][0]["pid"], holder.id(), "{status}");
    world.touch("go");
    let output = finish_within(holder, "the holder to finish");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    // `--store etcd` takes the list from ETCDCTL_ENDPOINTS, as etcdctl does.
    let mut from_env = run_on(&world, "etcd", 1, &[], &["printf", "ran"]);
    from_env.env(
        "ETCDCTL_ENDPOINTS",
        format!("http://127.0.0.1:{dead},{}", etcd.endpoint()),
    );
    let ran = output_of(from_env);
    assert_eq!(ran.status.code(), Some(0), "{}", stderr(&ran));
    assert_eq!(ran.stdout, b"ran");
    world.assert_clean();
}

/// A connection the network dropped silently (a NAT or a load balancer
/// forgot it) fails only when a call uses it: the release that finds it in
/// the pool sends its revoke again on a fresh one, and the slot goes at
/// once instead of when the lease runs out.
#[test]
fn a_connection_the_network_forgot_does_not_hold_the_slot() {
    let world = World::etcd("forgotten");
    let etcd = &world.store;
    let port = etcd.address().rsplit_once(':').unwrap().1.parse().unwrap();
    let proxy = ForgetfulProxy::start(port);
    let (started, go) = (world.path("started"), world.path("go"));
    let script = format!("touch '{started}'; while [ ! -e '{go}' ]; do sleep 0.02; done");
    let store = format!("etcd://127.0.0.1:{}", proxy.port);
    let holder = spawn(run_on(&world, &store, 1, &[], &["sh", "-c", &script]));
    wait_until(Duration::from_secs(10), "the command to start", || {
        std::path::Path::new(&started).exists()
    });
    proxy.forget_all();
    std::fs::write(&go, "").unwrap();
    let output = finish_within(holder, "the holder to exit");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        !stderr(&output).contains("could not clean up"),
        "{}",
        stderr(&output)
    );
    assert_eq!(
        etcd.keys(&world.prefix),
        Vec::<String>::new(),
        "nothing left"
    );
}

/// 202 runs of every kind on one prefix: `--try` and `--timeout` that
/// found no slot, waiters interrupted in the queue, a holder, commands
/// that succeed, fail or die of a signal. No key is left under the
/// prefix, and no lease.
#[test]
fn runs_of_every_kind_leave_no_key_and_no_lease() {
    let world = World::etcd("leaks");
    let holder = hold_slot(&world, 1, "ready", "go");
    for round in 0..40 {
        let tried = output(&world, 1, &["--try"], &["true"]);
        assert_eq!(tried.status.code(), Some(75), "round {round}");
        let timed = output(&world, 1, &["--timeout", "100ms"], &["true"]);
        assert_eq!(timed.status.code(), Some(75), "round {round}");
        let waiter = world.spawn(1, &[], &["true"]);
        wait_until(PROMPT, "the waiter to queue", || {
            world.contender_keys() == 2
        });
        signal(&waiter, libc::SIGTERM);
        let interrupted = finish_within(waiter, "the waiter to leave");
        assert_eq!(
            interrupted.status.signal(),
            Some(libc::SIGTERM),
            "round {round}"
        );
    }
    world.touch("go");
    assert_eq!(finish(holder).status.code(), Some(0));
    for round in 0..27 {
        for code in [0, 3] {
            let ran = output(&world, 1, &[], &["sh", "-c", &format!("exit {code}")]);
            assert_eq!(ran.status.code(), Some(code), "round {round}");
        }
        let killed = output(&world, 1, &[], &["sh", "-c", "kill -KILL $$"]);
        assert_eq!(killed.status.signal(), Some(libc::SIGKILL), "round {round}");
    }
    world.assert_clean();
}

/// Runs `echo over tls` under consem against the TLS member `etcd`,
/// with `args` and `env` and no system-wide trust settings.
fn over_tls(
    world: &World<NoStore>,
    etcd: &EtcdServer,
    args: &[&str],
    env: &[(&str, &str)],
) -> Output {
    let mut command = run_on(world, &etcd.url(), 1, args, &["echo", "over tls"]);
    command
        .env_remove("SSL_CERT_FILE")
        .env_remove("SSL_CERT_DIR")
        .envs(env.iter().copied());
    output_of(command)
}

fn path(p: &std::path::Path) -> String {
    p.to_str().unwrap().to_string()
}

/// `etcds://` checks the server's certificate against `--cacert` or
/// ETCDCTL_CACERT; a CA that did not sign it is refused in one line, and
/// the command does not run.
#[test]
fn etcds_checks_the_server_certificate_against_the_given_ca() {
    let world = World::without_store("etcd-tls");
    let files = crate::common::pki::TestPki::new().write_to(&world.dir.join("pki"));
    let etcd = EtcdServer::start_tls(&world.dir.join("etcd"), TlsFiles::server_only(&files));
    let (ca, other_ca) = (path(&files.ca), path(&files.other_ca));
    for (args, env) in [
        (vec!["--cacert", &ca], vec![]),
        (vec![], vec![("ETCDCTL_CACERT", ca.as_str())]),
    ] {
        let trusted = over_tls(&world, &etcd, &args, &env);
        assert_eq!(trusted.status.code(), Some(0), "{}", stderr(&trusted));
        assert_eq!(trusted.stdout, b"over tls\n");
    }
    let refused = over_tls(&world, &etcd, &["--cacert", &other_ca], &[]);
    let text = stderr(&refused);
    assert_eq!(refused.status.code(), Some(69), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(refused.stdout.is_empty(), "the command ran");
    assert_eq!(etcd.keys(&world.prefix), Vec::<String>::new());
    assert_eq!(etcd.leases(), Vec::<String>::new());
}

/// `etcds://` to a member without TLS is refused in one line that names
/// `etcd://`, and the command does not run.
#[test]
fn etcds_to_a_plain_member_points_to_etcd() {
    let world = World::without_store("etcds-to-plain");
    let etcd = EtcdServer::start(&world.dir.join("etcd"));
    let store = etcd.url().replacen("etcd://", "etcds://", 1);
    let refused = output_of(run_on(&world, &store, 1, &[], &["echo", "ran"]));
    let text = stderr(&refused);
    assert_eq!(refused.status.code(), Some(69), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains("use etcd:// in --store"), "{text}");
    assert!(refused.stdout.is_empty(), "the command ran");
    assert_eq!(etcd.keys(&world.prefix), Vec::<String>::new());
    assert_eq!(etcd.leases(), Vec::<String>::new());
}

/// A member that asks for a client certificate gets the one of `--cert`
/// and `--key`, or ETCDCTL_CERT and ETCDCTL_KEY; without one, consem is
/// refused in one line, and the command does not run.
#[test]
fn etcds_presents_the_client_certificate() {
    let world = World::without_store("etcd-mtls");
    let tls = TlsFiles::mutual(&world.dir.join("pki"));
    let etcd = EtcdServer::start_tls(&world.dir.join("etcd"), tls.clone());
    let ca = path(&tls.ca);
    let (cert, key) = tls.client.as_ref().unwrap();
    let (cert, key) = (path(cert), path(key));
    for (args, env) in [
        (
            vec!["--cacert", &ca, "--cert", &cert, "--key", &key],
            vec![],
        ),
        (
            vec![],
            vec![
                ("ETCDCTL_CACERT", ca.as_str()),
                ("ETCDCTL_CERT", cert.as_str()),
                ("ETCDCTL_KEY", key.as_str()),
            ],
        ),
    ] {
        let presented = over_tls(&world, &etcd, &args, &env);
        assert_eq!(presented.status.code(), Some(0), "{}", stderr(&presented));
        assert_eq!(presented.stdout, b"over tls\n");
    }
    let refused = over_tls(&world, &etcd, &["--cacert", &ca], &[]);
    let text = stderr(&refused);
    assert_eq!(refused.status.code(), Some(69), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(refused.stdout.is_empty(), "the command ran");
    assert_eq!(etcd.keys(&world.prefix), Vec::<String>::new());
    assert_eq!(etcd.leases(), Vec::<String>::new());
}

/// A limit record left with no contender (every contender ended while etcd
/// could not be reached) is shown as stale, and the next contender, with
/// another limit, replaces it.
#[test]
fn a_limit_record_left_by_an_outage_is_stale_and_replaced() {
    let world = World::etcd("stale-limit");
    let etcd = &world.store;
    etcd.put(&format!("{}/.limit", world.prefix), "2");
    let (code, status) = status_on(&world, &etcd.url());
    assert_eq!(code, Some(0), "{status}");
    let stale = status["stale"].as_array().unwrap();
    assert_eq!(stale.len(), 1, "{status}");
    assert!(
        stale[0]
            .as_str()
            .unwrap()
            .contains(".limit (limit 2) with no contender"),
        "{status}"
    );
    let run = output(&world, 3, &[], &["true"]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    world.assert_clean();
}

/// A limit record that holds no limit is reported by every command, and
/// neither overwritten nor deleted by `run` (whose lease goes with it) or
/// `reset`.
#[test]
fn a_limit_record_that_is_not_a_limit_is_a_conflict_and_stays_untouched() {
    let world = World::etcd("foreign-limit");
    let etcd = &world.store;
    let key = format!("{}/.limit", world.prefix);
    etcd.put(&key, "xyz");
    let ran = output(&world, 1, &[], &["touch", &world.path("ran")]);
    assert_eq!(ran.status.code(), Some(65), "{}", stderr(&ran));
    assert!(stderr(&ran).contains("untouched"), "{}", stderr(&ran));
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
    let left: Vec<(String, String)> = etcd
        .entries(&world.prefix)
        .into_iter()
        .map(|e| (e.key, e.value))
        .collect();
    assert_eq!(
        left,
        [(key, "xyz".to_string())],
        "only the record, as it was"
    );
    assert!(etcd.leases().is_empty(), "no lease left");
}

/// etcd down for longer than three failures in a row, then back with its
/// data: holders with the default settings retry while their lease lasts
/// and go on (exit 0), as on Redis.
#[test]
fn holders_ride_out_a_restart_of_etcd() {
    let mut world = World::etcd("ride-out");
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
    world.store.stop();
    wait_until(
        PROMPT * 2,
        "each holder to fail four times in a row",
        || {
            (0..2).all(|n| {
                log_text(&world, &format!("holder{n}.log"))
                    .matches("watch-retry")
                    .count()
                    >= 4
            })
        },
    );
    world.store.restart();
    world.touch("go");
    for (n, holder) in holders.into_iter().enumerate() {
        let output = holder.wait_with_output().unwrap();
        assert_eq!(
            output.status.code(),
            Some(0),
            "{}",
            log_text(&world, &format!("holder{n}.log"))
        );
    }
    world.assert_clean();
}
