//! What only the ZooKeeper store does, against a real ZooKeeper of each
//! test's own: Curator's layout as the server shows it, the fence from the
//! lease node, a server frozen or killed while a command runs, a frozen
//! consem, and consem sharing one semaphore with Apache Curator's
//! `InterProcessSemaphoreV2` in JVMs; and on an ensemble of three, the
//! leader killed, a holder's member frozen, a holder cut off from every
//! member. The behaviour every store shares is in tests/conformance.rs.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::pki::{PkiFiles, TestPki};
use crate::common::proxy::DelayingProxy;
use crate::common::wait_until;
use crate::common::world::*;
use crate::common::zookeeper::CuratorHolder;
use consem::store::zookeeper::client::ZkError;

/// Bound for one consem run; every test stays well under nextest's 60 s.
const RUN_DEADLINE: Duration = Duration::from_secs(30);

fn finish_within(mut child: Child, what: &str) -> std::process::Output {
    wait_with_deadline(&mut child, RUN_DEADLINE, what);
    child.wait_with_output().unwrap()
}

/// The epoch-nanosecond intervals of `start <ns>` / `end <ns>` lines in
/// the logs under `dir` whose names begin with `log-`, and the most of
/// them that overlap at once.
fn most_at_once(dir: &std::path::Path) -> (usize, usize) {
    let mut edges: Vec<(u128, i32)> = Vec::new();
    let mut runs = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if !entry.file_name().to_string_lossy().starts_with("log-") {
            continue;
        }
        for line in std::fs::read_to_string(entry.path()).unwrap().lines() {
            let mut words = line.split_whitespace();
            let (Some(what), Some(at)) = (words.next(), words.next()) else {
                continue;
            };
            let at: u128 = at.parse().unwrap();
            match what {
                "start" => {
                    runs += 1;
                    edges.push((at, 1));
                }
                "end" => edges.push((at, -1)),
                _ => {}
            }
        }
    }
    // At the same instant an end comes before a start.
    edges.sort();
    let (mut now, mut most) = (0, 0);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    (runs, most as usize)
}

/// A shell command that logs its start and end as CuratorHolder does.
fn logged_hold(log: &str, hold: &str) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        format!(
            "echo start $(date +%s%N) >> '{log}'; sleep {hold}; echo end $(date +%s%N) >> '{log}'"
        ),
    ]
}

/// Slot holders of consem and of Curator, started together on one path
/// at limit 2: each runs in turn, and never more than two at once.
#[test]
fn consem_and_curator_holders_share_the_limit() {
    let world = World::zookeeper("curator-mixed");
    let curator = CuratorHolder::compile(&world.dir);
    let path = format!("/{}", world.prefix);
    let mut jvms: Vec<Child> = (0..3)
        .map(|i| {
            curator.spawn(
                &world.store.address(),
                &path,
                2,
                Duration::from_millis(700),
                &world.dir.join(format!("log-curator-{i}")),
            )
        })
        .collect();
    let consems: Vec<Child> = (0..3)
        .map(|i| {
            let log = world.path(&format!("log-consem-{i}"));
            world.spawn(2, &[], &strs(&logged_hold(&log, "0.7")))
        })
        .collect();
    for consem in consems {
        let output = finish_within(consem, "a consem holder");
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    }
    for jvm in jvms.iter_mut() {
        let status = wait_with_deadline(jvm, RUN_DEADLINE, "a Curator holder");
        assert!(status.success(), "a Curator holder failed");
    }
    let (runs, most) = most_at_once(&world.dir);
    assert_eq!(runs, 6, "every holder ran once");
    assert!(most <= 2, "{most} held at once, for a limit of 2");
    world.assert_clean();
}

/// A Curator holder's lease is a holder in consem's status, and takes a
/// slot from consem: at limit 1, consem waits for it.
#[test]
fn a_curator_lease_shows_in_status_and_holds_consem_off() {
    let world = World::zookeeper("curator-status");
    let curator = CuratorHolder::compile(&world.dir);
    let path = format!("/{}", world.prefix);
    let log = world.dir.join("log-curator");
    let mut jvm = curator.spawn(
        &world.store.address(),
        &path,
        1,
        Duration::from_secs(3),
        &log,
    );
    wait_until(RUN_DEADLINE, "the Curator holder to hold", || {
        std::fs::read_to_string(&log).is_ok_and(|text| text.contains("start"))
    });
    let status = world.admin("status", &["--json"]).output().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(json["holders"].as_array().map(Vec::len), Some(1), "{json}");
    // What Curator writes in its node by default: its client's address.
    assert!(
        json["holders"][0]["host"]
            .as_str()
            .is_some_and(|host| !host.is_empty()),
        "{json}"
    );
    let consem_log = world.path("log-consem");
    let consem = world.spawn(1, &[], &strs(&logged_hold(&consem_log, "0.1")));
    let output = finish_within(consem, "consem after the Curator holder");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(wait_with_deadline(&mut jvm, RUN_DEADLINE, "the Curator holder").success());
    let (runs, most) = most_at_once(&world.dir);
    assert_eq!(
        (runs, most),
        (2, 1),
        "consem ran only after Curator returned its lease"
    );
    world.assert_clean();
}

/// The fence is the lease node's creation zxid, which status shows as
/// its create_index.
#[test]
fn the_fence_is_the_lease_node_s_creation_zxid() {
    let world = World::zookeeper("fence");
    let script = format!(
        "echo $CONSEM_FENCE > '{}'; while [ ! -e '{}' ]; do sleep 0.02; done",
        world.path("fence"),
        world.path("go")
    );
    let holder = world.spawn(1, &[], &["sh", "-c", &script]);
    wait_until(PROMPT, "the fence", || {
        std::fs::read_to_string(world.path("fence")).is_ok_and(|f| f.ends_with('\n'))
    });
    let fence: u64 = std::fs::read_to_string(world.path("fence"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let status = world.admin("status", &["--json"]).output().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(json["holders"][0]["create_index"], fence, "{json}");
    assert!(
        json["holders"][0]["session"]
            .as_str()
            .unwrap()
            .starts_with("_c_"),
        "{json}"
    );
    world.touch("go");
    assert_eq!(finish_within(holder, "the holder").status.code(), Some(0));
    world.assert_clean();
}

/// On a prefix in use, a run writes only what it must: its session, its
/// lock node, its lease node, the lock node's deletion and the session's
/// end, each a transaction the ensemble agrees on. The fences (the lease
/// nodes' creation zxids) of two runs one after the other are as many
/// transactions apart, none of them a create of a parent that exists.
#[test]
fn a_run_on_a_prefix_in_use_writes_only_its_own_nodes_and_session() {
    let world = World::zookeeper("writes");
    let fence = |run: usize| -> u64 {
        let file = world.path(&format!("fence-{run}"));
        let script = format!("echo $CONSEM_FENCE > '{file}'");
        let output = finish_within(world.spawn(1, &[], &["sh", "-c", &script]), "a run");
        assert_eq!(output.status.code(), Some(0), "{output:?}");
        std::fs::read_to_string(&file)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    // The first run makes the semaphore's parents and records its limit.
    fence(0);
    let (first, second) = (fence(1), fence(2));
    assert_eq!(
        second - first,
        5,
        "transactions from one run's lease node to the next one's"
    );
    world.assert_clean();
}

/// Starts a holder with a 3 s session whose command writes its pid, then
/// cuts it off from ZooKeeper with `cut_off`: the command must be gone
/// before the session could expire on the server, within 3 s of the cut,
/// and consem exits 76.
fn cut_off_while_holding(world: &mut World<ZkServer>, cut_off: fn(&mut ZkServer)) {
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
        "the command ran {:?} after ZooKeeper was cut off",
        cut.elapsed()
    );
    wait_with_deadline(&mut holder, RUN_DEADLINE, "the holder to exit");
    let stopped = holder.wait_with_output().unwrap();
    assert_eq!(stopped.status.code(), Some(76), "{}", stderr(&stopped));
}

#[test]
fn a_frozen_server_stops_the_command_before_the_session_could_expire() {
    let mut world = World::zookeeper("frozen");
    cut_off_while_holding(&mut world, |zk| zk.freeze());
    world.store.thaw();
    let next = world
        .consem(1, &["--timeout", "20s"], &["true"])
        .output()
        .unwrap();
    assert_eq!(next.status.code(), Some(0), "{}", stderr(&next));
    world.assert_clean();
}

#[test]
fn a_killed_server_stops_the_command_before_the_session_could_expire() {
    let mut world = World::zookeeper("killed");
    cut_off_while_holding(&mut world, ZkServer::stop);
    world.store.restart();
    let next = world
        .consem(1, &["--timeout", "20s"], &["true"])
        .output()
        .unwrap();
    assert_eq!(next.status.code(), Some(0), "{}", stderr(&next));
    world.assert_clean();
}

/// consem frozen while its command runs: it cannot ping, the watchdog
/// stops the command before the server may expire the session, and the
/// next holder never overlaps it; thawed, consem exits 76.
#[test]
fn a_frozen_consem_s_command_is_stopped_before_the_next_holder_starts() {
    let world = World::zookeeper("frozen-consem");
    let beat = world.path("log-holder");
    let script = format!(
        "echo $$ > '{}'; echo start $(date +%s%N) >> '{beat}'; while :; do echo end $(date +%s%N) >> '{beat}'; sleep 0.05; done",
        world.path("pid")
    );
    let holder = world.spawn(
        1,
        &["--ttl", "3s", "--kill-grace", "500ms"],
        &["sh", "-c", &script],
    );
    let pid = read_pid(&world, "pid");
    signal(&holder, libc::SIGSTOP);
    let next_log = world.path("log-next");
    let waiter = world.spawn(1, &[], &strs(&logged_hold(&next_log, "0")));
    let waited = finish_within(waiter, "the next holder");
    assert_eq!(waited.status.code(), Some(0), "{}", stderr(&waited));
    assert!(process_gone(pid), "the frozen consem's command still runs");
    // The holder's log: one start and many ends, the last its last beat.
    let text = std::fs::read_to_string(&beat).unwrap();
    let last: u128 = text
        .lines()
        .last()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let next: u128 = std::fs::read_to_string(&next_log)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(last < next, "the two commands overlapped");
    signal(&holder, libc::SIGCONT);
    let output = finish_within(holder, "the thawed holder");
    assert_eq!(output.status.code(), Some(76), "{}", stderr(&output));
    world.assert_clean();
}

/// A server that grants shorter sessions than --ttl is refused (78): the
/// kill grace was fitted into --ttl, and the command would have no time.
#[test]
fn a_session_shorter_than_the_ttl_is_refused_as_the_server_s_setting() {
    let world = World::with_store("short-sessions", |dir| {
        ZkServer::start_granting(&dir.join("zookeeper"), Duration::from_secs(5))
    });
    let refused = world
        .consem(1, &["--ttl", "10s"], &["touch", &world.path("ran")])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(78), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("maxSessionTimeout"),
        "{}",
        stderr(&refused)
    );
    assert!(!world.exists("ran"));
    let fits = world
        .consem(1, &["--ttl", "5s"], &["true"])
        .output()
        .unwrap();
    assert_eq!(fits.status.code(), Some(0), "{}", stderr(&fits));
    world.assert_clean();
}

/// A waiter's connection forgotten by the network (a NAT, a load
/// balancer): its next ping finds it gone, the session is resumed on a new
/// connection, and since the watches went with the old one, the waiter
/// reads and watches again: it takes the slot when the holder leaves.
#[test]
fn a_waiter_whose_connection_was_forgotten_resumes_and_gets_the_slot() {
    let world = World::zookeeper("forgotten");
    let proxy = crate::common::etcd::ForgetfulProxy::start(world.store.port);
    let holder = world.spawn(1, &[], &strs(&world.held_until("ready", "go", 0)));
    wait_until(PROMPT, "the holder's command to start", || {
        world.exists("ready")
    });
    let mut waiter = world.consem_command();
    waiter
        .args([
            "run",
            "--prefix",
            &world.prefix,
            "--limit",
            "1",
            "--ttl",
            "3s",
        ])
        .arg(format!("--store=zk://127.0.0.1:{}", proxy.port))
        .args(["--", "touch", &world.path("waiter-ran")]);
    let waiter = waiter
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(PROMPT, "the waiter to queue", || {
        world.contender_keys() == 2
    });
    proxy.forget_all();
    world.touch("go");
    assert_eq!(finish_within(holder, "the holder").status.code(), Some(0));
    let left = Instant::now();
    let waited = finish_within(waiter, "the waiter");
    assert_eq!(waited.status.code(), Some(0), "{}", stderr(&waited));
    assert!(world.exists("waiter-ran"));
    assert!(
        left.elapsed() < PROMPT,
        "the waiter took the slot {:?} after the holder left",
        left.elapsed()
    );
    world.assert_clean();
}

/// The digest user of the tests that sign in.
const ALICE: &str = "alice:s3cret-zk";

/// `consem run --limit 1` at the world's prefix on `store` with `extra`,
/// its command touching `ran`.
fn run_on(world: &World<ZkServer>, store: &str, extra: &[&str], ran: &str) -> std::process::Output {
    world
        .consem_command()
        .args(["run", "--prefix", &world.prefix, "--limit", "1"])
        .args(["--store", store])
        .args(extra)
        .args(["--", "touch", &world.path(ran)])
        .output()
        .unwrap()
}

/// Digest credentials, in the URL or in --user: the nodes consem creates
/// are its user's alone (CREATOR_ALL_ACL). The same user gets in; another
/// user, a wrong password or none exits 77 naming the node and the right
/// it lacks, runs nothing and leaves nothing; nobody else may delete a
/// held lease; the password is never printed.
#[test]
fn digest_credentials_keep_other_users_off_the_nodes_consem_creates() {
    let world = World::zookeeper("digest");
    let server = world.store.address();
    let alice = format!("zk://{ALICE}@{server}");
    let path = consem::store::zookeeper::semaphore_path(&world.prefix);
    let created = run_on(&world, &alice, &["-v"], "alice-ran");
    assert_eq!(created.status.code(), Some(0), "{}", stderr(&created));
    assert!(world.exists("alice-ran"));
    assert!(!stderr(&created).contains("s3cret"), "{}", stderr(&created));
    let mut anonymous = world.store.session().unwrap();
    let refused = anonymous.children(&format!("{path}/leases"), false);
    assert!(
        matches!(refused, Err(ZkError::NoAuth { .. })),
        "the leases are open to all: {refused:?}"
    );
    let _ = anonymous.close();
    let plain = world.store.url();
    for (store, extra) in [
        (format!("zk://alice:wrong-pw@{server}"), vec![]),
        (plain.clone(), vec![]),
        (plain.clone(), vec!["--user", "bob:bobs-pw"]),
    ] {
        let output = run_on(&world, &store, &extra, "intruder-ran");
        let text = stderr(&output);
        assert_eq!(output.status.code(), Some(77), "{store} {extra:?}: {text}");
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.contains(&format!("create nodes under {path}/locks")) && text.contains("CREATE"),
            "{text}"
        );
        assert!(
            !text.contains("wrong-pw") && !text.contains("bobs-pw"),
            "{text}"
        );
        assert!(!world.exists("intruder-ran"));
    }
    let status = world.admin("status", &[]).output().unwrap();
    assert_eq!(status.status.code(), Some(77), "{}", stderr(&status));
    assert!(
        stderr(&status).contains(&format!("read {path}/leases")),
        "{}",
        stderr(&status)
    );
    // The same user in --user works as in the URL, and holds a lease that
    // nobody else may delete.
    let holder = world
        .consem_command()
        .args(["run", "--prefix", &world.prefix, "--limit", "1"])
        .args([
            "--store",
            &plain,
            "--user",
            "alice",
            "--password",
            "s3cret-zk",
        ])
        .arg("--")
        .args(world.held_until("ready", "go", 0))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(PROMPT, "the holder's command to start", || {
        world.exists("ready")
    });
    let leases = world
        .store
        .children_as(Some(ALICE), &world.prefix, "leases");
    assert_eq!(leases.len(), 1, "{leases:?}");
    let mut anonymous = world.store.session().unwrap();
    let deleted = anonymous.delete(&format!("{path}/leases/{}", leases[0]));
    assert!(
        matches!(deleted, Err(ZkError::NoAuth { .. })),
        "{deleted:?}"
    );
    let _ = anonymous.close();
    let release = world
        .admin("release", &["--session", &leases[0]])
        .output()
        .unwrap();
    assert_eq!(release.status.code(), Some(77), "{}", stderr(&release));
    let status = world
        .admin("status", &["--json", "--user", ALICE])
        .output()
        .unwrap();
    assert_eq!(status.status.code(), Some(0), "{}", stderr(&status));
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(json["holders"].as_array().map(Vec::len), Some(1), "{json}");
    world.touch("go");
    let held = finish_within(holder, "the holder");
    assert_eq!(held.status.code(), Some(0), "{}", stderr(&held));
    for parent in ["leases", "locks"] {
        assert_eq!(
            world.store.children_as(Some(ALICE), &world.prefix, parent),
            Vec::<String>::new(),
            "{parent} left"
        );
    }
}

/// consem and Curator signed in as one digest user share a semaphore
/// whose nodes are that user's: mixed holders at limit 1 take turns. A
/// Curator without the credentials cannot take a lease there.
#[test]
fn consem_and_curator_signed_in_as_one_user_share_a_protected_semaphore() {
    let world = World::zookeeper("curator-digest");
    let curator = CuratorHolder::compile(&world.dir);
    let server = world.store.address();
    let alice = format!("zk://{ALICE}@{server}");
    let first = run_on(&world, &alice, &[], "first");
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let path = format!("/{}", world.prefix);
    let mut stranger = curator.spawn(
        &server,
        &path,
        1,
        Duration::from_millis(100),
        &world.dir.join("stranger"),
    );
    let mut jvms: Vec<Child> = (0..2)
        .map(|i| {
            curator.spawn_as(
                &server,
                &path,
                1,
                Duration::from_millis(500),
                &world.dir.join(format!("log-curator-{i}")),
                Some(ALICE),
            )
        })
        .collect();
    let consems: Vec<Child> = (0..2)
        .map(|i| {
            let log = world.path(&format!("log-consem-{i}"));
            world
                .consem_command()
                .args(["run", "--prefix", &world.prefix, "--limit", "1"])
                .args(["--store", &alice, "--"])
                .args(logged_hold(&log, "0.5"))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for consem in consems {
        let output = finish_within(consem, "a consem holder");
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    }
    for jvm in jvms.iter_mut() {
        let status = wait_with_deadline(jvm, RUN_DEADLINE, "a Curator holder");
        assert!(status.success(), "a Curator holder failed");
    }
    let refused = wait_with_deadline(
        &mut stranger,
        RUN_DEADLINE,
        "the Curator without credentials",
    );
    assert!(
        !refused.success(),
        "a Curator without credentials took a lease"
    );
    assert!(!world.dir.join("stranger").exists());
    let (runs, most) = most_at_once(&world.dir);
    assert_eq!(runs, 4, "every holder ran once");
    assert_eq!(most, 1, "{most} held at once, for a limit of 1");
    for parent in ["leases", "locks"] {
        assert_eq!(
            world.store.children_as(Some(ALICE), &world.prefix, parent),
            Vec::<String>::new(),
            "{parent} left"
        );
    }
}

/// A chroot in the URL: the semaphore lives below it (created where
/// missing, as Curator's namespace is), and run, status, release and reset
/// all find it there, and only there.
#[test]
fn a_chroot_holds_the_semaphore_below_it_for_every_command() {
    let world = World::zookeeper("chroot");
    let chrooted = format!("{}/apps/team", world.store.url());
    let admin = |subcommand: &str, extra: &[&str], store: &str| {
        world
            .consem_command()
            .args([subcommand, "--prefix", &world.prefix, "--store", store])
            .args(extra)
            .output()
            .unwrap()
    };
    let holder = world
        .consem_command()
        .args(["run", "--prefix", &world.prefix, "--limit", "1"])
        .args(["--store", &chrooted, "--"])
        .args(world.held_until("ready", "go", 0))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(PROMPT, "the holder's command to start", || {
        world.exists("ready")
    });
    let below = format!("apps/team/{}", world.prefix);
    let leases = world.store.children(&below, "leases");
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(
        world.store.children(&world.prefix, "leases"),
        Vec::<String>::new()
    );
    let holders = |store: &str| {
        let status = admin("status", &["--json"], store);
        assert_eq!(status.status.code(), Some(0), "{}", stderr(&status));
        let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
        json["holders"].as_array().map_or(0, Vec::len)
    };
    assert_eq!(holders(&chrooted), 1);
    assert_eq!(holders(&world.store.url()), 0);
    let released = admin("release", &["--session", &leases[0]], &chrooted);
    assert_eq!(released.status.code(), Some(0), "{}", stderr(&released));
    let lost = finish_within(holder, "the released holder");
    assert_eq!(lost.status.code(), Some(76), "{}", stderr(&lost));
    assert_eq!(holders(&chrooted), 0);
    let mut session = world.store.session().unwrap();
    let record = format!("/{below}/leases");
    assert_eq!(session.get_data(&record).unwrap().0, b"1");
    let reset = admin("reset", &[], &chrooted);
    assert_eq!(reset.status.code(), Some(0), "{}", stderr(&reset));
    assert_eq!(session.get_data(&record).unwrap().0, b"");
    let _ = session.close();
    world.store.assert_clean(&below);
}

/// A ZooKeeper with a TLS port (its certificate signed by the test CA,
/// trusting it for clients' certificates; with `client_auth`, it wants
/// one), and the test PKI's files.
fn tls_world(name: &str, client_auth: bool) -> (World<ZkServer>, PkiFiles) {
    let mut written = None;
    let world = World::with_store(name, |dir| {
        let files = TestPki::new().write_to(&dir.join("pki"));
        let server = ZkServer::start_tls(
            &dir.join("zookeeper"),
            (&files.server, &files.server_key),
            &files.ca,
            client_auth,
        );
        written = Some(files);
        server
    });
    (world, written.expect("the PKI was written"))
}

fn path_text(path: &std::path::Path) -> String {
    path.to_str().unwrap().to_string()
}

/// `zks://` speaks TLS to the secure client port with --cacert, and
/// presents --cert and --key to a server that wants a client certificate
/// (ZooKeeper's default). A missing certificate, another CA, the plain
/// port or TLS files with zk:// are refused with one line saying what to
/// change, before the command runs and with nothing left.
#[test]
fn zks_speaks_tls_to_the_secure_port_with_cacert_cert_and_key() {
    let (world, files) = tls_world("zk-mtls", true);
    let secure = world.store.secure.as_ref().unwrap().port;
    let store = format!("zks://127.0.0.1:{secure}");
    let (ca, cert, key) = (
        path_text(&files.ca),
        path_text(&files.client),
        path_text(&files.client_key),
    );
    let other_ca = path_text(&files.other_ca);
    let mutual = [
        "--cacert",
        ca.as_str(),
        "--cert",
        cert.as_str(),
        "--key",
        key.as_str(),
    ];
    let ran = run_on(&world, &store, &mutual, "ran");
    assert_eq!(ran.status.code(), Some(0), "{}", stderr(&ran));
    assert!(world.exists("ran"));
    let status = world
        .consem_command()
        .args(["status", "--prefix", &world.prefix, "--store", &store])
        .args(mutual)
        .output()
        .unwrap();
    assert_eq!(status.status.code(), Some(0), "{}", stderr(&status));
    let plain = world.store.url();
    for (store, extra, code, says) in [
        (
            store.clone(),
            vec!["--cacert", ca.as_str()],
            69,
            "pass --cert and --key",
        ),
        (
            store.clone(),
            vec![
                "--cacert",
                other_ca.as_str(),
                "--cert",
                cert.as_str(),
                "--key",
                key.as_str(),
            ],
            69,
            "--cacert does not name the CA that signs it",
        ),
        (
            format!("zks://127.0.0.1:{}", world.store.port),
            mutual.to_vec(),
            69,
            "its plain clientPort (write zk://)",
        ),
        (
            plain,
            vec!["--cacert", ca.as_str()],
            2,
            "write zks://host:port",
        ),
        (
            store.clone(),
            vec!["--cert", cert.as_str()],
            2,
            "set both --cert and --key",
        ),
    ] {
        let output = run_on(&world, &store, &extra, "refused-ran");
        let text = stderr(&output);
        assert_eq!(
            output.status.code(),
            Some(code),
            "{store} {extra:?}: {text}"
        );
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains(says), "{store} {extra:?}: {text}");
        assert!(!world.exists("refused-ran"));
    }
    world.assert_clean();
}

/// Over TLS the session lives as over plain TCP: a holder whose command
/// outlasts --ttl (4 s against 3 s) keeps its slot by its pings, a waiter queued behind it
/// takes the slot when its watch fires, and digest credentials go over
/// TLS too (a server that wants no client certificate).
#[test]
fn over_tls_a_holder_keeps_its_session_and_a_waiter_is_woken() {
    let (world, files) = tls_world("zk-tls-session", false);
    let secure = world.store.secure.as_ref().unwrap().port;
    let store = format!("zks://{ALICE}@127.0.0.1:{secure}");
    let ca = path_text(&files.ca);
    let spawn = |log: &str, hold: &str| {
        world
            .consem_command()
            .args(["run", "--prefix", &world.prefix, "--limit", "1"])
            .args(["--store", &store, "--cacert", &ca, "--ttl", "3s"])
            .args(["--kill-grace", "500ms", "--"])
            .args(logged_hold(&world.path(log), hold))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let holder = spawn("log-holder", "4");
    wait_until(PROMPT, "the holder to start", || world.exists("log-holder"));
    let waiter = spawn("log-waiter", "0");
    for (child, what) in [(holder, "the holder"), (waiter, "the waiter")] {
        let output = finish_within(child, what);
        assert_eq!(output.status.code(), Some(0), "{what}: {}", stderr(&output));
    }
    let (runs, most) = most_at_once(&world.dir);
    assert_eq!((runs, most), (2, 1));
    for parent in ["leases", "locks"] {
        assert_eq!(
            world.store.children_as(Some(ALICE), &world.prefix, parent),
            Vec::<String>::new(),
            "{parent} left"
        );
    }
}

/// `consem run` against `store` (an ensemble's members in some order, or
/// proxies in front of them) instead of the world's own, its output kept.
fn spawn_on<S>(
    world: &World<S>,
    store: &str,
    limit: u32,
    extra: &[&str],
    command: &[&str],
) -> Child {
    let mut run: Command = world.consem_command();
    run.args(["run", "--prefix", &world.prefix])
        .args(["--limit", &limit.to_string()])
        .arg(format!("--store={store}"))
        .args(extra)
        .arg("--")
        .args(command)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    run.spawn().unwrap()
}

/// A shell command that writes its pid to `pid-<name>`, logs its start to
/// `log-<name>`, and runs until the test creates `go`, then logs its end.
fn logged_until_go<S>(world: &World<S>, name: &str) -> Vec<String> {
    let log = world.path(&format!("log-{name}"));
    vec![
        "sh".into(),
        "-c".into(),
        format!(
            "echo $$ > '{}'; echo start $(date +%s%N) >> '{log}'; while [ ! -e '{}' ]; do sleep 0.02; done; echo end $(date +%s%N) >> '{log}'",
            world.path(&format!("pid-{name}")),
            world.path("go")
        ),
    ]
}

/// Checks `condition` every 20 ms until `until`, failing as soon as it
/// does not hold.
fn holds_until(until: Instant, what: &str, mut condition: impl FnMut() -> bool) {
    while Instant::now() < until {
        assert!(condition(), "{what} no longer holds");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every contender's node (lease and lock) and the session that owns it.
fn nodes_and_owners(world: &World<ZkEnsemble>) -> Vec<(String, i64)> {
    let mut owners = world.store.owners(&world.prefix, "leases");
    owners.extend(world.store.owners(&world.prefix, "locks"));
    owners.sort();
    owners
}

/// Waits until every node in `nodes` is still there, owned by the same
/// session, and that session is connected to a member again: each
/// contender resumed its own session after losing its connection.
fn wait_for_every_session_resumed(world: &World<ZkEnsemble>, nodes: &[(String, i64)]) {
    wait_until(PROMPT, "every contender to resume its session", || {
        let connected = world.store.connected_sessions();
        nodes_and_owners(world) == nodes && nodes.iter().all(|(_, owner)| connected.contains(owner))
    });
}

/// Three members; the leader is killed while two holders keep both slots
/// of a limit of 2 and two waiters queue, some starting out on the leader
/// and some on a follower. Every member drops its clients while a new
/// leader is elected; each consem resumes its session on a member left,
/// in time (the new leader gives every session a fresh timeout), so the
/// holders' commands run on past the moment their lease from before the
/// kill ran out. A contender that comes after the election queues too,
/// and once the holders leave the queue moves on: every contender runs,
/// never more than two at once.
#[test]
fn the_leader_killed_under_holders_keeps_the_limit_and_the_queue_moves_on() {
    let mut world = World::zookeeper_ensemble("zk-leader-killed");
    let leader = world.store.leader();
    let on_leader = world.store.url_starting_with(leader);
    let on_follower = world.store.url_starting_with((leader + 1) % 3);
    // Pings every 4 s; SIGTERM 9 s after the last answered one: at least
    // 5 s after the kill for the election and the resumption.
    let lease = ["--ttl", "12s", "--kill-grace", "1s"];
    let holders: Vec<Child> = [&on_leader, &on_follower]
        .into_iter()
        .enumerate()
        .map(|(n, store)| {
            let command = logged_until_go(&world, &format!("holder-{n}"));
            spawn_on(&world, store, 2, &lease, &strs(&command))
        })
        .collect();
    let pids: Vec<i32> = (0..2)
        .map(|n| read_pid(&world, &format!("pid-holder-{n}")))
        .collect();
    let waiter = |world: &World<ZkEnsemble>, store: &str, name: &str| {
        let command = logged_hold(&world.path(&format!("log-{name}")), "0.3");
        spawn_on(world, store, 2, &lease, &strs(&command))
    };
    let mut waiters = vec![waiter(&world, &on_leader, "waiter-0")];
    wait_until(PROMPT, "the first waiter to queue", || {
        world.contender_keys() == 3
    });
    waiters.push(waiter(&world, &on_follower, "waiter-1"));
    wait_until(PROMPT, "the second waiter to queue", || {
        world.contender_keys() == 4
    });
    let nodes = nodes_and_owners(&world);

    let killed = Instant::now();
    world.store.kill(leader);
    assert_ne!(world.store.leader(), leader);
    wait_for_every_session_resumed(&world, &nodes);
    waiters.push(waiter(&world, &on_follower, "waiter-2"));
    wait_until(
        PROMPT,
        "the contender that came after the election to queue",
        || world.contender_keys() == 5,
    );
    holds_until(
        killed + Duration::from_millis(9500),
        "both holders' commands running",
        || pids.iter().all(|&pid| !process_gone(pid)),
    );
    // The old leader comes back, as a follower that sees every contender.
    world.store.restart(leader);
    assert_eq!(world.store.member(leader).contenders(&world.prefix), 5);

    world.touch("go");
    for child in holders.into_iter().chain(waiters) {
        let output = finish_within(child, "a contender to finish");
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    }
    let (runs, most) = most_at_once(&world.dir);
    assert_eq!(runs, 5, "every contender ran once");
    assert!(most <= 2, "{most} ran at once, for a limit of 2");
    world.assert_clean();
}

/// At limit 1, two waiters queue behind a holder, both on the leader: the
/// first watches the leases, the second the first's lock node. The leader
/// is killed; each resumes its session on a member left, keeps its place
/// (its nodes, its session), and watches again. Once the holder leaves,
/// the first waiter runs promptly, then the second.
#[test]
fn waiters_ride_out_a_leader_loss_in_their_order() {
    let mut world = World::zookeeper_ensemble("zk-waiters-leader-killed");
    let leader = world.store.leader();
    let on_leader = world.store.url_starting_with(leader);
    let holder = spawn_on(
        &world,
        &world.store.url_starting_with((leader + 1) % 3),
        1,
        &[],
        &strs(&logged_until_go(&world, "holder")),
    );
    read_pid(&world, "pid-holder");
    let mut waiters = Vec::new();
    for n in 0..2 {
        let command = logged_hold(&world.path(&format!("log-waiter-{n}")), "0.1");
        waiters.push(spawn_on(&world, &on_leader, 1, &[], &strs(&command)));
        wait_until(PROMPT, "the waiter to queue", || {
            world.contender_keys() == 2 + n
        });
    }
    let nodes = nodes_and_owners(&world);

    world.store.kill(leader);
    assert_ne!(world.store.leader(), leader);
    wait_for_every_session_resumed(&world, &nodes);
    world.touch("go");
    let output = finish_within(holder, "the holder");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let left = Instant::now();
    let first = finish_within(waiters.remove(0), "the first waiter");
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    assert!(
        left.elapsed() < PROMPT,
        "the first waiter finished {:?} after the holder left",
        left.elapsed()
    );
    let second = finish_within(waiters.remove(0), "the second waiter");
    assert_eq!(second.status.code(), Some(0), "{}", stderr(&second));
    let started = |name: &str| -> u128 {
        let log = std::fs::read_to_string(world.path(&format!("log-{name}"))).unwrap();
        log.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    assert!(
        started("waiter-0") < started("waiter-1"),
        "the waiters ran out of their order"
    );
    let (runs, most) = most_at_once(&world.dir);
    assert_eq!((runs, most), (3, 1), "each ran once, one at a time");
    world.assert_clean();
}

/// The member a holder talks to (a follower) is frozen (SIGSTOP) for
/// longer than the session timeout: it keeps the connection open and
/// answers nothing. consem leaves it once a ping goes a second without an
/// answer and resumes its session on the next member in the list, before
/// the lease it counts from the last answered ping runs out: the command
/// keeps running, its lease node stays, and the waiter keeps waiting, past
/// the session timeout. Thawed, the member rejoins; the holder leaves and
/// the waiter follows.
#[test]
fn a_holder_whose_member_is_frozen_moves_to_another_and_keeps_its_slot() {
    let mut world = World::zookeeper_ensemble("zk-member-frozen");
    let leader = world.store.leader();
    let frozen = (leader + 1) % 3;
    // Pings every 3 s; the member left 4 s after the last answered one,
    // SIGTERM due at 5.5 s (a ping left unanswered for a third of the
    // session, as ZooKeeper's own client does, would be too late).
    let ttl = Duration::from_secs(9);
    let holder = spawn_on(
        &world,
        &world.store.url_starting_with(frozen),
        1,
        &["--ttl", "9s", "--kill-grace", "2s"],
        &strs(&logged_until_go(&world, "holder")),
    );
    let pid = read_pid(&world, "pid-holder");
    let waiter_log = world.path("log-waiter");
    let waiter = spawn_on(
        &world,
        &world.store.url_starting_with((leader + 2) % 3),
        1,
        &[],
        &strs(&logged_hold(&waiter_log, "0.1")),
    );
    wait_until(PROMPT, "the waiter to queue", || {
        world.contender_keys() == 2
    });
    let nodes = nodes_and_owners(&world);

    let froze = Instant::now();
    world.store.freeze(frozen);
    holds_until(
        froze + ttl + Duration::from_secs(1),
        "the holder's command running, the waiter waiting",
        || !process_gone(pid) && !std::path::Path::new(&waiter_log).exists(),
    );
    wait_for_every_session_resumed(&world, &nodes);

    world.store.thaw(frozen);
    world.touch("go");
    let output = finish_within(holder, "the holder");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let output = finish_within(waiter, "the waiter");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let (runs, most) = most_at_once(&world.dir);
    assert_eq!((runs, most), (2, 1), "each ran once, one at a time");
    world.assert_clean();
}

/// A holder that reaches every member through a proxy, all cut at once:
/// nothing passes, nothing is closed. No member answers its ping nor its
/// attempts to resume; its command is stopped before the session could
/// expire on the ensemble, within the session timeout of the cut, and the
/// waiter (which reaches the members directly) starts only after that:
/// the command's own log shows no overlap. The holder exits 76.
#[test]
fn a_holder_cut_off_from_every_member_stops_its_command_before_the_next_starts() {
    let world = World::zookeeper_ensemble("zk-cut-off");
    let proxies: Vec<DelayingProxy> = (0..3)
        .map(|member| DelayingProxy::start(&world.store.address(member)))
        .collect();
    let through: Vec<String> = proxies.iter().map(DelayingProxy::addr).collect();
    let log = world.path("log-holder");
    let script = format!(
        "echo $$ > '{}'; trap 'echo end $(date +%s%N) >> {log}; exit 143' TERM; echo start $(date +%s%N) >> '{log}'; while :; do sleep 0.05; done",
        world.path("pid")
    );
    let ttl = Duration::from_secs(6);
    let holder = spawn_on(
        &world,
        &format!("zk://{}", through.join(",")),
        1,
        &["--ttl", "6s", "--kill-grace", "1s"],
        &["sh", "-c", &script],
    );
    let pid = read_pid(&world, "pid");
    let waiter = spawn_on(
        &world,
        &world.store.url_starting_with(0),
        1,
        &[],
        &strs(&logged_hold(&world.path("log-waiter"), "0.1")),
    );
    wait_until(PROMPT, "the waiter to queue", || {
        world.contender_keys() == 2
    });

    let cut = Instant::now();
    for proxy in &proxies {
        proxy.cut();
    }
    wait_until(PROMPT, "the holder's command to be stopped", || {
        process_gone(pid)
    });
    assert!(
        cut.elapsed() < ttl,
        "the command ran {:?} after the cut, with a session of {ttl:?}",
        cut.elapsed()
    );
    let output = finish_within(waiter, "the waiter");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let output = finish_within(holder, "the holder");
    assert_eq!(output.status.code(), Some(76), "{}", stderr(&output));
    let (runs, most) = most_at_once(&world.dir);
    assert_eq!((runs, most), (2, 1), "the waiter ran after the holder");
    world.assert_clean();
}

/// Credentials belong to a connection: a waiter signed in as the user whose
/// nodes it queues under, whose connection the network forgot, resumes its
/// session on a new connection, signs in again there (else its next read
/// of the leases would be refused, 77), and takes the slot when the holder
/// leaves.
#[test]
fn a_resumed_session_signs_in_again_and_keeps_reading_protected_nodes() {
    let world = World::zookeeper("digest-resumed");
    let proxy = crate::common::etcd::ForgetfulProxy::start(world.store.port);
    let through = |port: u16| format!("zk://{ALICE}@127.0.0.1:{port}");
    let spawn = |store: String, command: Vec<String>| {
        world
            .consem_command()
            .args(["run", "--prefix", &world.prefix, "--limit", "1"])
            .args([
                "--store",
                &store,
                "--ttl",
                "3s",
                "--kill-grace",
                "500ms",
                "--",
            ])
            .args(command)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let holder = spawn(
        through(world.store.port),
        world.held_until("ready", "go", 0),
    );
    wait_until(PROMPT, "the holder's command to start", || {
        world.exists("ready")
    });
    let waiter = spawn(
        through(proxy.port),
        vec!["touch".into(), world.path("waiter-ran")],
    );
    let queued = || {
        world
            .store
            .children_as(Some(ALICE), &world.prefix, "locks")
            .len()
            + world
                .store
                .children_as(Some(ALICE), &world.prefix, "leases")
                .len()
    };
    wait_until(PROMPT, "the waiter to queue", || queued() == 3);
    proxy.forget_all();
    world.touch("go");
    assert_eq!(finish_within(holder, "the holder").status.code(), Some(0));
    let waited = finish_within(waiter, "the waiter");
    assert_eq!(waited.status.code(), Some(0), "{}", stderr(&waited));
    assert!(world.exists("waiter-ran"));
    assert_eq!(queued(), 0, "nodes left");
}
