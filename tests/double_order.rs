//! The order in which consem contenders on the Consul double get their
//! slots, with some of them stopped, killed or terminated while they wait:
//! one scene played step by step, and a crowd (ignored by default: it
//! takes a minute or more; run it with
//! `cargo test --test double_order -- --ignored --nocapture`).
//!
//! Arrival is when a contender's key was created (its CreateIndex), as the
//! store sees it; a grant is the first `.lock` that names it, and a start is
//! when its command logged that it began.

mod common;

use std::collections::BTreeMap;
use std::fs::File;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::world::*;
use common::{wait_until, KvEntry};
use consem::store::consul::semaphore::{self, Entry, Snapshot};

const LIMIT: u32 = 5;
const TTL: &str = "10s";
const RUN_DEADLINE: Duration = Duration::from_secs(300);
/// Signals fall in this many milliseconds from the start.
const SIGNAL_WINDOW_MS: u64 = 12_000;

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i128
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Signal {
    Kill,
    Term,
    Stop,
}

/// One state of the prefix the poller saw, with when it saw it.
struct Sight {
    at: i128,
    snapshot: Snapshot,
}

/// What the poller saw of one session: its key's CreateIndex, and the
/// first sight (index into the history) whose `.lock` names it.
#[derive(Default, Debug, Clone)]
struct Seen {
    create_index: u64,
    granted: Option<usize>,
}

fn snapshot_of(entries: &[KvEntry], dir: &str) -> Snapshot {
    Snapshot::from_entries(
        entries
            .iter()
            .map(|e| Entry {
                name: e.key[dir.len()..].to_string(),
                value: e.value.clone(),
                flags: e.flags,
                session: e.session.clone(),
                create_index: e.create_index,
                modify_index: e.modify_index,
            })
            .collect(),
    )
}

/// A contender of the scene: its process, its session, and the files its
/// command uses (`ready-<name>` once it runs, `go-<name>` to end).
struct Actor {
    name: &'static str,
    process: Child,
    session: String,
}

impl Drop for Actor {
    /// Kills it if the test ends first (a panic), stopped or not.
    fn drop(&mut self) {
        if self.process.try_wait().ok().flatten().is_none() {
            let _ = self.process.kill();
            let _ = self.process.wait();
        }
    }
}

/// Starts a contender whose command appends its name to `starts` and runs
/// until the test lets it go, once the one before it has joined; returns
/// it once its contender key exists.
fn join(world: &World, name: &'static str, limit: u32) -> Actor {
    let keys = |world: &World| -> Vec<String> {
        world
            .entries()
            .into_iter()
            .filter_map(|e| e.session)
            .collect()
    };
    let known = keys(world);
    let script = format!(
        "echo {name} >> '{}'; touch '{}'; while [ ! -e '{}' ]; do sleep 0.02; done",
        world.path("starts"),
        world.path(&format!("ready-{name}")),
        world.path(&format!("go-{name}"))
    );
    let process = world
        .consem(limit, &["--ttl", TTL], &["sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut session = None;
    wait_until(PROMPT, "the contender's key", || {
        session = keys(world).into_iter().find(|s| !known.contains(s));
        session.is_some()
    });
    Actor {
        name,
        process,
        session: session.unwrap(),
    }
}

/// Waits until someone blocks on `actor`'s contender key.
fn blocked_on(world: &World, actor: &Actor) {
    let path = format!("/v1/kv/{}", world.key(&actor.session));
    wait_until(PROMPT, "a blocking read of the key ahead", || {
        world.the_double().requests().iter().any(|r| {
            r.method == "GET" && r.path == path && r.query_value("index").is_some_and(|i| i != "0")
        })
    });
}

fn lock_names(world: &World, actor: &Actor) -> bool {
    world
        .lock_value()
        .is_some_and(|lock| lock["Holders"].get(&actor.session).is_some())
}

/// Lets `actor`'s command end and waits for consem to exit 0.
fn let_go(world: &World, mut actor: Actor) {
    world.touch(&format!("go-{}", actor.name));
    let status = wait_with_deadline(&mut actor.process, PROMPT, "the holder to leave");
    assert_eq!(status.code(), Some(0), "{} exited {status:?}", actor.name);
}

/// A waiter that is stopped while it waits keeps its session, so it is
/// still counted, and the slot that comes to it idles until its session
/// expires. Those behind it keep their order: the next slot goes to the
/// waiter just behind it, which must run at once, not sleep on the
/// stopped one's key until that expiry while a waiter further back (which
/// the departure of one in between woke) takes the slot after.
#[test]
fn waiters_behind_a_stopped_one_start_in_order_of_arrival() {
    let world = World::on_the_double("behind-a-stopped-waiter");
    let double = world.the_double();
    // The stopped waiter's session outlives the test unless it ends it.
    double.set_ttl_multiplier(100.0);
    let holders: Vec<Actor> = ["h0", "h1", "h2"]
        .into_iter()
        .map(|name| {
            let actor = join(&world, name, 3);
            wait_until(PROMPT, "the holder's command", || {
                world.exists(&format!("ready-{name}"))
            });
            actor
        })
        .collect();
    let stopped = join(&world, "stopped", 3);
    let first = join(&world, "first", 3);
    blocked_on(&world, &stopped);
    let terminated = join(&world, "terminated", 3);
    blocked_on(&world, &first);
    let last = join(&world, "last", 3);
    blocked_on(&world, &terminated);

    signal(&stopped.process, libc::SIGSTOP);
    let mut holders = holders.into_iter();
    let_go(&world, holders.next().unwrap());
    wait_until(PROMPT, "the slot handed to the stopped waiter", || {
        lock_names(&world, &stopped)
    });
    let_go(&world, holders.next().unwrap());
    wait_until(PROMPT, "the slot handed to the first waiter", || {
        lock_names(&world, &first)
    });
    wait_until(PROMPT, "the first waiter's command", || {
        world.exists("ready-first")
    });
    let mut terminated = terminated;
    signal(&terminated.process, libc::SIGTERM);
    wait_with_deadline(&mut terminated.process, PROMPT, "the terminated waiter");
    let_go(&world, holders.next().unwrap());
    wait_until(PROMPT, "the last waiter's command", || {
        world.exists("ready-last")
    });
    let starts = std::fs::read_to_string(world.path("starts")).unwrap();
    assert_eq!(starts, "h0\nh1\nh2\nfirst\nlast\n");

    let_go(&world, first);
    let_go(&world, last);
    drop(stopped);
    double.expire_sessions_idle_for(Duration::ZERO);
    // The next contender prunes the stopped one from `.lock`, and the last
    // one out deletes it.
    let output = world.consem(3, &[], &["true"]).output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    world.assert_clean();
}

/// Whether `me` could take a slot in `snapshot` if `other` held none.
fn could_take(snapshot: &Snapshot, me: &str, other: &str) -> bool {
    let Ok(Some(mut record)) = snapshot.lock_record(LIMIT) else {
        return true;
    };
    record.holders.retain(|h| h != other);
    let live = semaphore::prune(&record, snapshot);
    snapshot.is_live(me)
        && live.holders.len() + semaphore::waiters_ahead(snapshot, &live, me) < LIMIT as usize
}

#[test]
#[ignore = "a crowd of consem processes for a minute or more; run it by hand"]
fn a_crowd_with_signals_gets_slots_in_order_of_arrival() {
    let (contenders, signalled, seed) = match std::env::var("CONSEM_CROWD") {
        Ok(text) => {
            let n: Vec<u64> = text.split(',').map(|p| p.trim().parse().unwrap()).collect();
            (n[0] as usize, n[1] as usize, n[2])
        }
        Err(_) => (150, 30, 1),
    };
    let world = World::on_the_double("crowd");
    let double = world.the_double();
    let log = world.path("starts.log");
    let mut rng = Rng(seed);
    let t0 = Instant::now();
    let stop_polling = AtomicBool::new(false);
    let history: Mutex<Vec<Sight>> = Mutex::default();
    let dir = format!("{}/", world.prefix);

    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut last_index = 0;
            while !stop_polling.load(Ordering::Relaxed) {
                let entries = double.entries(&dir);
                let at = now_ns();
                let index = entries.iter().map(|e| e.modify_index).max().unwrap_or(0);
                if index != last_index {
                    last_index = index;
                    history.lock().unwrap().push(Sight {
                        at,
                        snapshot: snapshot_of(&entries, &dir),
                    });
                }
                std::thread::sleep(Duration::from_micros(500));
            }
        });

        let mut fleet: Vec<Child> = Vec::new();
        let mut spawned_at = Vec::new();
        for index in 0..contenders {
            let run_ms = 100 + rng.below(200);
            let script = format!(
                r#"echo "{index} $CONSEM_SESSION $(date +%s%N)" >> "{log}"; sleep 0.{run_ms:03}"#
            );
            let child = world
                .consem(LIMIT, &["-v", "--ttl", TTL], &["sh", "-c", &script])
                .stdout(Stdio::null())
                .stderr(File::create(world.path(&format!("consem-{index}.err"))).unwrap())
                .spawn()
                .unwrap();
            spawned_at.push(now_ns());
            fleet.push(child);
        }
        // Signals at random times over the first part of the run, each to
        // a contender still running then, waiting or holding.
        let mut plan: Vec<(Duration, Signal)> = (0..signalled)
            .map(|_| {
                let signal = match rng.below(3) {
                    0 => Signal::Kill,
                    1 => Signal::Term,
                    _ => Signal::Stop,
                };
                (
                    Duration::from_millis(200 + rng.below(SIGNAL_WINDOW_MS)),
                    signal,
                )
            })
            .collect();
        plan.sort_by_key(|p| p.0);
        let mut signals: BTreeMap<usize, Signal> = BTreeMap::new();
        let mut signalled_holding = 0;
        let deadline = Instant::now() + RUN_DEADLINE;
        let mut exited: BTreeMap<usize, std::process::ExitStatus> = BTreeMap::new();
        loop {
            while let Some(&(at, signal)) = plan.first() {
                if t0.elapsed() < at {
                    break;
                }
                plan.remove(0);
                let running: Vec<usize> = (0..contenders)
                    .filter(|i| !exited.contains_key(i) && !signals.contains_key(i))
                    .collect();
                if running.is_empty() {
                    continue;
                }
                let v = running[rng.below(running.len() as u64) as usize];
                let number = match signal {
                    Signal::Kill => libc::SIGKILL,
                    Signal::Term => libc::SIGTERM,
                    Signal::Stop => libc::SIGSTOP,
                };
                let started = std::fs::read_to_string(&log).unwrap_or_default();
                if started
                    .lines()
                    .any(|l| l.split(' ').next() == Some(&v.to_string()))
                {
                    signalled_holding += 1;
                }
                unsafe { libc::kill(fleet[v].id() as i32, number) };
                signals.insert(v, signal);
            }
            for (i, child) in fleet.iter_mut().enumerate() {
                if !exited.contains_key(&i) {
                    if let Some(status) = child.try_wait().unwrap() {
                        exited.insert(i, status);
                    }
                }
            }
            let unsignalled_left = (0..contenders)
                .filter(|i| !exited.contains_key(i) && !signals.contains_key(i))
                .count();
            if unsignalled_left == 0 && plan.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{unsignalled_left} unsignalled contenders still running after {RUN_DEADLINE:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let elapsed = t0.elapsed();
        stop_polling.store(true, Ordering::Relaxed);
        for child in &mut fleet {
            let _ = child.kill();
            let _ = child.wait();
        }

        let starts: BTreeMap<usize, (String, i128)> = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (
                    f[0].parse().unwrap(),
                    (f[1].to_string(), f[2].parse().unwrap()),
                )
            })
            .collect();
        let history = history.lock().unwrap();
        let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
        for (at, sight) in history.iter().enumerate() {
            let holders = sight
                .snapshot
                .lock_record(LIMIT)
                .ok()
                .flatten()
                .map(|r| r.holders)
                .unwrap_or_default();
            for holder in holders {
                seen.entry(holder).or_default().granted.get_or_insert(at);
            }
            for entry in sight.snapshot.contenders.values() {
                let s = seen.entry(entry.name.clone()).or_default();
                if s.create_index == 0 {
                    s.create_index = entry.create_index;
                }
            }
        }
        struct Row {
            index: usize,
            session: String,
            create: u64,
            granted: usize,
            started: i128,
        }
        let mut rows: Vec<Row> = Vec::new();
        for i in 0..contenders {
            if signals.contains_key(&i) {
                continue;
            }
            let (session, started) = starts
                .get(&i)
                .unwrap_or_else(|| panic!("contender {i} never started its command"))
                .clone();
            let s = seen.get(&session).cloned().unwrap_or_default();
            rows.push(Row {
                index: i,
                session,
                create: s.create_index,
                granted: s
                    .granted
                    .expect("every contender that ran was seen in .lock"),
                started,
            });
        }
        let ms = |ns: i128| (ns - spawned_at[0]) / 1_000_000;
        let mut by_spawn = 0;
        let mut by_start = 0;
        let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
        let mut details = Vec::new();
        for a in &rows {
            for b in &rows {
                if a.started < b.started && spawned_at[a.index] > spawned_at[b.index] {
                    by_spawn += 1;
                }
                // a arrived first, b started first.
                if a.create >= b.create || b.started >= a.started {
                    continue;
                }
                by_start += 1;
                let kind = if a.granted <= b.granted {
                    // Granted in order: a started late.
                    if a.started - history[a.granted].at > 1_000_000_000 {
                        "granted in order, started over 1 s after its grant"
                    } else {
                        "granted in order, started within 1 s of its grant"
                    }
                } else {
                    // b was granted first: was a's turn there too, just
                    // before b's grant or as it was seen (b aside)? The
                    // poller may miss states in between.
                    let sights = [&history[b.granted - 1], &history[b.granted]];
                    if sights
                        .iter()
                        .any(|sight| could_take(&sight.snapshot, &a.session, &b.session))
                    {
                        "granted out of order, both could take a slot"
                    } else {
                        "granted out of order, a could not"
                    }
                };
                *kinds.entry(kind).or_default() += 1;
                details.push(format!(
                    "  {kind}: {ai} (create {ac}, granted +{ag} ms, started +{ast} ms) after {bi} (create {bc}, granted +{bg} ms, started +{bst} ms)",
                    ai = a.index,
                    ac = a.create,
                    ag = ms(history[a.granted].at),
                    ast = ms(a.started),
                    bi = b.index,
                    bc = b.create,
                    bg = ms(history[b.granted].at),
                    bst = ms(b.started),
                ));
            }
        }
        let counts: BTreeMap<String, usize> = signals.values().fold(BTreeMap::new(), |mut m, s| {
            *m.entry(format!("{s:?}")).or_default() += 1;
            m
        });
        let late = rows
            .iter()
            .filter(|r| r.started - history[r.granted].at > 1_000_000_000)
            .count();
        let slowest_start = rows
            .iter()
            .map(|r| r.started - history[r.granted].at)
            .max()
            .unwrap_or(0);
        eprintln!(
            "crowd: {contenders} contenders, limit {LIMIT}, seed {seed}, signals {counts:?} ({signalled_holding} after their command started), {} unsignalled, {:.1} s, {} states seen",
            rows.len(),
            elapsed.as_secs_f64(),
            history.len()
        );
        eprintln!(
            "inversions among the unsignalled (arrival = CreateIndex, got = command start): {by_start} {kinds:?}; against spawn order: {by_spawn}; started over 1 s after their grant: {late}, the slowest {} ms after"
            ,slowest_start / 1_000_000);
        for line in &details {
            eprintln!("{line}");
        }
        if std::env::var("CONSEM_CROWD_KEEP").is_ok() {
            let kept = std::env::temp_dir().join(format!("crowd-{seed}"));
            let _ = std::fs::remove_dir_all(&kept);
            std::process::Command::new("cp")
                .args(["-r", world.dir.to_str().unwrap(), kept.to_str().unwrap()])
                .status()
                .unwrap();
            eprintln!("kept in {}", kept.display());
        }
    });
}
