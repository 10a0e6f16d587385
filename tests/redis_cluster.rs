//! What only Redis Cluster asks of the Redis store, against clusters of
//! each test's own: a prefix whose keys would not share a slot is refused
//! with the braced one to use; every node's slots serve whichever node, or
//! all nodes, consem is given; a failover keeps the limit and the waiters
//! follow the new primary. The core behaviours run on a cluster in
//! tests/conformance.rs (`redis_cluster::`).

use std::process::{Child, Output, Stdio};
use std::time::Duration;

use crate::common::redis_cluster::{RedisCluster, FAILOVER};
use crate::common::wait_until;
use crate::common::world::*;

fn finish(mut child: Child) -> Output {
    wait_with_deadline(&mut child, Duration::from_secs(60), "consem to exit");
    child.wait_with_output().unwrap()
}

/// `consem run` on `store`, with the world's scratch directory and
/// nothing of the caller's environment.
fn run_on(world: &World<RedisCluster>, store: &str, prefix: &str, command: &[&str]) -> Output {
    let child = world
        .consem_command()
        .args([
            "run", "--store", store, "--prefix", prefix, "--limit", "1", "--",
        ])
        .args(command)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    finish(child)
}

fn every_node(cluster: &RedisCluster) -> String {
    let nodes: Vec<String> = cluster
        .nodes
        .iter()
        .map(|node| format!("127.0.0.1:{}", node.port))
        .collect();
    format!("redis://{}", nodes.join(","))
}

/// The world's prefix without its braces.
fn bare(world: &World<RedisCluster>) -> String {
    world.prefix.trim_matches(['{', '}']).to_string()
}

#[test]
fn a_prefix_whose_keys_would_not_share_a_slot_is_refused_with_the_braced_one() {
    let world = World::redis_cluster("unbraced");
    let prefix = bare(&world);
    let braced = format!("--prefix '{{{prefix}}}'");
    // Given every node, consem knows it is a cluster before it connects;
    // given one, once that node refuses the first script.
    for store in [every_node(&world.store), world.store.url_of(0)] {
        let output = run_on(&world, &store, &prefix, &["touch", &world.path("ran")]);
        let text = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{store}: {text}");
        assert!(text.contains("must hash to one slot"), "{store}: {text}");
        assert!(text.contains(&braced), "{store}: {text}");
        assert_eq!(text.lines().count(), 1, "{store}: {text}");
        assert!(!world.exists("ran"), "{store}: the command ran");
        assert!(
            world.store.keys(&prefix).is_empty(),
            "{store}: {:?}",
            world.store.keys(&prefix)
        );
    }
}

#[test]
fn a_cluster_has_database_0_only() {
    let world = World::redis_cluster("database");
    let store = format!("{}/2", every_node(&world.store));
    let output = run_on(&world, &store, &world.prefix, &["true"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("drop /2"), "{}", stderr(&output));
}

#[test]
fn every_node_s_slots_serve_whichever_node_consem_is_given() {
    let world = World::redis_cluster("each-node");
    let cluster = &world.store;
    let stores: Vec<String> = (0..cluster.nodes.len())
        .map(|i| cluster.url_of(i))
        .chain([every_node(cluster)])
        .collect();
    for owner in 0..cluster.nodes.len() {
        // A prefix whose slot lives on `owner`.
        let prefix = (0..)
            .map(|n| format!("{{{}-{n}}}", bare(&world)))
            .find(|p| cluster.primary_of(&format!("semaphore:{p}")) == owner)
            .unwrap();
        let mut fences = Vec::new();
        for store in &stores {
            let output = run_on(&world, store, &prefix, &["sh", "-c", "echo $CONSEM_FENCE"]);
            assert_eq!(
                output.status.code(),
                Some(0),
                "{store}: {}",
                stderr(&output)
            );
            fences.push(
                String::from_utf8_lossy(&output.stdout)
                    .trim()
                    .parse::<u64>()
                    .unwrap(),
            );
        }
        assert!(
            fences.windows(2).all(|w| w[0] < w[1]),
            "node {owner}'s fences do not grow: {fences:?}"
        );
        cluster.assert_clean(&prefix);
    }
}

/// Holders hold and waiters wait while the primary of the prefix's slot
/// hands over to its replica (`CLUSTER FAILOVER`, which waits for the
/// replica to catch up): nobody's permit is lost, never more than the
/// limit run, and the waiters, whose `BLPOP` the old primary ends, find the
/// new primary.
#[test]
fn a_failover_keeps_the_limit_and_the_waiters_follow_the_new_primary() {
    let mut world = World::with_store("failover", |dir| {
        RedisCluster::start(&dir.join("cluster"), 3, 1)
    });
    world.prefix = format!("{{{}}}", world.prefix);
    let owner = world
        .store
        .primary_of(&format!("semaphore:{}", world.prefix));
    // consem is given the node that will stop being the primary.
    world.store.pointed = owner;
    let replica = world
        .store
        .replica_of(owner)
        .expect("every primary has a replica");
    let log = world.path("log");
    let go = world.path("go");
    let holding = format!(
        "echo start >> '{log}'; while [ ! -e '{go}' ]; do sleep 0.05; done; echo end >> '{log}'"
    );
    let holders: Vec<Child> = (0..2)
        .map(|_| world.spawn(2, &["--ttl", "5s"], &["sh", "-c", &holding]))
        .collect();
    wait_until(PROMPT, "both holders to run", || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.lines().count() == 2)
    });
    let quick = format!("echo start >> '{log}'; echo end >> '{log}'");
    let waiters: Vec<Child> = (0..3)
        .map(|_| world.spawn(2, &["--ttl", "5s"], &["sh", "-c", &quick]))
        .collect();
    wait_until(PROMPT, "the waiters to queue", || {
        world.contender_keys() == 5
    });
    let _: String = world.store.nodes[replica]
        .query(redis::cmd("CLUSTER").arg("FAILOVER"))
        .unwrap();
    wait_until(FAILOVER, "the replica to take over the slot", || {
        world
            .store
            .primary_of(&format!("semaphore:{}", world.prefix))
            == replica
    });
    // The holders keep their permits through the failover: their renewals
    // (every second) reach the new primary and push the expiries on.
    let expiries = |world: &World<RedisCluster>| -> Vec<f64> {
        let permits: Vec<(String, f64)> = world.store.nodes[replica]
            .query(
                redis::cmd("ZRANGE")
                    .arg(format!("semaphore:{}", world.prefix))
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES"),
            )
            .unwrap();
        let mut expiries: Vec<f64> = permits.into_iter().map(|(_, expiry)| expiry).collect();
        expiries.sort_by(f64::total_cmp);
        expiries
    };
    let before = expiries(&world);
    assert_eq!(before.len(), 2, "both permits reached the new primary");
    wait_until(PROMPT, "both holders to renew on the new primary", || {
        let now = expiries(&world);
        now.len() == 2 && now.iter().zip(&before).all(|(now, then)| now > then)
    });
    std::fs::write(&go, "").unwrap();
    for child in holders.into_iter().chain(waiters) {
        let output = finish(child);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    }
    let log = std::fs::read_to_string(&log).unwrap();
    let (starts, most) = starts_and_most_at_once(&log);
    assert_eq!(starts, 5, "{log}");
    assert!(most <= 2, "{most} ran at once:\n{log}");
    world.assert_clean();
}

/// `--redis-wait-replicas` asks the primary of the prefix's slot, which
/// took the grant, not every node: one replica acknowledges, two never do.
#[test]
fn replicas_acknowledge_on_the_primary_of_the_prefix_s_slot() {
    let mut world = World::with_store("cluster-wait", |dir| {
        RedisCluster::start(&dir.join("cluster"), 3, 1)
    });
    world.prefix = format!("{{{}}}", world.prefix);
    let store = every_node(&world.store);
    let run = |replicas: &str| {
        let child = world
            .consem_command()
            .args([
                "run",
                "--store",
                &store,
                "--prefix",
                &world.prefix,
                "--limit",
                "1",
            ])
            .args(["--ttl", "2s", "--redis-wait-replicas", replicas, "--"])
            .args(["touch", &world.path(replicas)])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        finish(child)
    };
    let output = run("1");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(world.exists("1"));
    let output = run("2");
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("1 replicas"),
        "{}",
        stderr(&output)
    );
    assert!(!world.exists("2"), "the command ran on an unconfirmed slot");
    world.assert_clean();
}

/// The eviction policy that counts is that of the node holding the
/// prefix's keys, not of the node consem was given.
#[test]
fn the_eviction_check_reads_the_node_that_holds_the_keys() {
    let world = World::redis_cluster("evicting-owner");
    let owner = world
        .store
        .primary_of(&format!("semaphore:{}", world.prefix));
    for (name, value) in [("maxmemory", "100mb"), ("maxmemory-policy", "allkeys-lru")] {
        let _: String = world.store.nodes[owner]
            .query(redis::cmd("CONFIG").arg("SET").arg(name).arg(value))
            .unwrap();
    }
    let given = world.store.url_of(world.store.pointed);
    assert_ne!(world.store.pointed, owner);
    let output = run_on(
        &world,
        &given,
        &world.prefix,
        &["touch", &world.path("ran")],
    );
    assert_eq!(output.status.code(), Some(78), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("allkeys-lru"),
        "{}",
        stderr(&output)
    );
    assert!(!world.exists("ran"));
    world.assert_clean();
}

/// A listing scans every primary: a semaphore on each is found, whether
/// consem is given every node or one (which it learns is a cluster's).
#[test]
fn status_lists_the_semaphores_of_every_primary() {
    let world = World::redis_cluster("list-primaries");
    let root = bare(&world);
    let primaries: Vec<usize> = (0..world.store.nodes.len())
        .filter(|&i| world.store.is_primary(i))
        .collect();
    assert_eq!(primaries.len(), 3);
    // A prefix whose slot each primary serves.
    let prefixes: Vec<String> = primaries
        .iter()
        .map(|&primary| {
            (0..)
                .map(|n| format!("{{{root}/{n}}}"))
                .find(|prefix| world.store.primary_of(&format!("semaphore:{prefix}")) == primary)
                .unwrap()
        })
        .collect();
    let holders: Vec<Child> = prefixes
        .iter()
        .enumerate()
        .map(|(i, prefix)| {
            world
                .consem_command()
                .args([
                    "run",
                    "--store",
                    &every_node(&world.store),
                    "--prefix",
                    prefix,
                ])
                .args(["--limit", "2", "--"])
                .args(world.held_until(&format!("ready-{i}"), "go", 0))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    wait_until(PROMPT, "every holder's command to start", || {
        (0..prefixes.len()).all(|i| world.exists(&format!("ready-{i}")))
    });
    for store in [every_node(&world.store), world.store.url_of(primaries[0])] {
        let output = world
            .consem_command()
            .args([
                "status",
                "--store",
                &store,
                "--prefix",
                &format!("{root}/"),
                "--json",
            ])
            .output()
            .unwrap();
        assert_eq!(
            output.status.code(),
            Some(0),
            "{store}: {}",
            stderr(&output)
        );
        let listing: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let listed: Vec<&str> = listing["semaphores"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["prefix"].as_str().unwrap())
            .collect();
        let mut expected: Vec<&str> = prefixes.iter().map(String::as_str).collect();
        expected.sort();
        assert_eq!(listed, expected, "{store}: {listing}");
    }
    world.touch("go");
    for holder in holders {
        let output = finish(holder);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    }
}
