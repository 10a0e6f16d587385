//! The order in which consem contenders on the Consul double get their
//! slots, with some of them stopped, killed or terminated while they wait:
//! one scene played step by step, and a crowd (40 contenders in the suite,
//! about 10 s; larger with `CONSEM_CROWD`, as the hostile runs had it).
//!
//! Arrival is when a contender's key was created (its CreateIndex), as the
//! store sees it; a grant is the first `.lock` that names it, and a start is
//! when its command logged that it began.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::world::*;
use crate::common::{wait_until, KvEntry};
use consem::store::consul::semaphore::{self, Entry, Snapshot};

/// The shortest TTL Consul accepts: a stopped contender's session outlives
/// it by up to twice as much.
const TTL: &str = "10s";

// ---- one scene ------------------------------------------------------------

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
/// until the test lets it go; returns it once its contender key exists.
fn join(world: &World<TestConsul>, name: &'static str, limit: u32) -> Actor {
    let keys = |world: &World<TestConsul>| -> Vec<String> {
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
fn blocked_on(world: &World<TestConsul>, actor: &Actor) {
    let path = format!("/v1/kv/{}", world.key(&actor.session));
    wait_until(PROMPT, "a blocking read of the key ahead", || {
        world.the_double().requests().iter().any(|r| {
            r.method == "GET" && r.path == path && r.query_value("index").is_some_and(|i| i != "0")
        })
    });
}

fn lock_names(world: &World<TestConsul>, actor: &Actor) -> bool {
    world
        .lock_value()
        .is_some_and(|lock| lock["Holders"][&actor.session] == true)
}

/// Lets `actor`'s command end and waits for consem to exit 0.
fn let_go(world: &World<TestConsul>, mut actor: Actor) {
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

// ---- a crowd ---------------------------------------------------------------

const CROWD_LIMIT: u32 = 5;
/// Every contender that no signal reached must have run by then.
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

/// CLOCK_REALTIME in nanoseconds, the clock `date +%s%N` reads in the
/// commands.
fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i128
}

/// Kills every contender still running when the test ends, even by a panic.
struct Fleet(Vec<Child>);

impl Drop for Fleet {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One state of the prefix the poller saw, with when it saw it.
struct Sight {
    at: i128,
    snapshot: Snapshot,
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

/// A contender that no signal reached, as the crowd saw it.
struct Run {
    index: usize,
    session: String,
    /// Its key's CreateIndex: its arrival.
    arrived: u64,
    /// The first sight whose `.lock` names it.
    granted: usize,
    /// When its command logged that it began.
    started: i128,
}

/// Whether `me` could take a slot in `snapshot` if `other` held none.
fn could_take(snapshot: &Snapshot, me: &str, other: &str) -> bool {
    let Ok(Some(mut record)) = snapshot.lock_record(CROWD_LIMIT) else {
        return true;
    };
    record.holders.retain(|h| h != other);
    let live = semaphore::prune(&record, snapshot);
    snapshot.is_live(me)
        && live.holders.len() + semaphore::waiters_ahead(snapshot, &live, me) < CROWD_LIMIT as usize
}

const SLEPT: &str = "granted in order, started over 1 s after its grant";
const STARTED_LATER: &str = "granted in order, started within 1 s of its grant";
const BOTH_COULD: &str = "granted out of order, both could take a slot";
const OVERTAKEN: &str = "granted out of order, the earlier one could not take a slot";

/// Why `a`, which arrived before `b`, started after it. The poller may
/// miss states, so whether `a` could take a slot when `b` was granted is
/// asked of the sights just before and at `b`'s grant (`b` aside; at the
/// first sight, of that one).
fn inversion(a: &Run, b: &Run, history: &[Sight]) -> &'static str {
    if a.granted <= b.granted {
        if a.started - history[a.granted].at > 1_000_000_000 {
            SLEPT
        } else {
            STARTED_LATER
        }
    } else if history[b.granted.saturating_sub(1)..=b.granted]
        .iter()
        .any(|sight| could_take(&sight.snapshot, &a.session, &b.session))
    {
        BOTH_COULD
    } else {
        OVERTAKEN
    }
}

/// Many contenders at limit 5, short commands, and signals at random to
/// some of them while they wait or hold; then, among the others, each pair
/// that started its commands out of arrival order, and why. What may
/// remain: contenders that could both take a slot at once, and commands
/// that started in the other order than their grants, within a second of
/// them (a loaded machine). Not: a command that started over a second
/// after its grant (it slept through it), or a slot taken out of turn.
/// `CONSEM_CROWD=<contenders>,<signals>,<seed>` sizes the run (default
/// 40,8,1, for the suite's time; 150,30 is the crowd that found the
/// sleeping waiters); `CONSEM_CROWD_KEEP=1` keeps every consem's `-v`
/// output and the commands' log in `$TMPDIR/crowd-<seed>`.
#[test]
fn a_crowd_with_signals_gets_slots_in_order_of_arrival() {
    let (contenders, signalled, seed) = match std::env::var("CONSEM_CROWD") {
        Ok(text) => {
            let n: Vec<u64> = text.split(',').map(|p| p.trim().parse().unwrap()).collect();
            (n[0] as usize, n[1] as usize, n[2])
        }
        Err(_) => (40, 8, 1),
    };
    let world = World::on_the_double("crowd");
    let double = world.the_double();
    let log = world.path("starts.log");
    let mut rng = Rng(seed);
    let t0 = Instant::now();
    let stop_polling = AtomicBool::new(false);
    let history: Mutex<Vec<Sight>> = Mutex::default();
    let dir = format!("{}/", world.prefix);

    let (signals, spawned_at, elapsed) = std::thread::scope(|scope| {
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
        // Stops the poller even if a check below fails.
        struct StopPolling<'a>(&'a AtomicBool);
        impl Drop for StopPolling<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = StopPolling(&stop_polling);

        let mut fleet = Fleet(Vec::new());
        let mut spawned_at = Vec::new();
        for index in 0..contenders {
            let run_ms = 100 + rng.below(200);
            let script = format!(
                r#"echo "{index} $CONSEM_SESSION $(date +%s%N)" >> "{log}"; sleep 0.{run_ms:03}"#
            );
            let child = world
                .consem(CROWD_LIMIT, &["-v", "--ttl", TTL], &["sh", "-c", &script])
                .stdout(Stdio::null())
                .stderr(File::create(world.path(&format!("consem-{index}.err"))).unwrap())
                .spawn()
                .unwrap();
            spawned_at.push(now_ns());
            fleet.0.push(child);
        }
        // Signals at random times, each to a contender still running then.
        let mut plan: Vec<(Duration, i32)> = (0..signalled)
            .map(|_| {
                let at = Duration::from_millis(200 + rng.below(SIGNAL_WINDOW_MS));
                (
                    at,
                    [libc::SIGKILL, libc::SIGTERM, libc::SIGSTOP][rng.below(3) as usize],
                )
            })
            .collect();
        plan.sort_by_key(|p| p.0);
        let mut signals: BTreeMap<usize, i32> = BTreeMap::new();
        let mut exited: BTreeSet<usize> = BTreeSet::new();
        let deadline = Instant::now() + RUN_DEADLINE;
        loop {
            while let Some(&(_, number)) = plan.first().filter(|p| t0.elapsed() >= p.0) {
                plan.remove(0);
                let running: Vec<usize> = (0..contenders)
                    .filter(|i| !exited.contains(i) && !signals.contains_key(i))
                    .collect();
                if let Some(&victim) = running.get(rng.below(running.len().max(1) as u64) as usize)
                {
                    signal(&fleet.0[victim], number);
                    signals.insert(victim, number);
                }
            }
            for (i, child) in fleet.0.iter_mut().enumerate() {
                if !exited.contains(&i) && child.try_wait().unwrap().is_some() {
                    exited.insert(i);
                }
            }
            let unsignalled_left = (0..contenders)
                .filter(|i| !exited.contains(i) && !signals.contains_key(i))
                .count();
            if unsignalled_left == 0 && plan.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{unsignalled_left} contenders that no signal reached still run after {RUN_DEADLINE:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        (signals, spawned_at, t0.elapsed())
    });

    let starts: BTreeMap<usize, (String, i128)> = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let started = f[2].parse().unwrap();
            (f[0].parse().unwrap(), (f[1].to_string(), started))
        })
        .collect();
    let history = history.into_inner().unwrap();
    let mut arrived: BTreeMap<&str, u64> = BTreeMap::new();
    let mut granted: BTreeMap<&str, usize> = BTreeMap::new();
    for (at, sight) in history.iter().enumerate() {
        if let Ok(Some(record)) = sight.snapshot.lock_record(CROWD_LIMIT) {
            for holder in &record.holders {
                let holder = sight.snapshot.contenders.get_key_value(holder);
                if let Some((name, _)) = holder {
                    granted.entry(name.as_str()).or_insert(at);
                }
            }
        }
        for (name, entry) in &sight.snapshot.contenders {
            arrived.entry(name.as_str()).or_insert(entry.create_index);
        }
    }
    let runs: Vec<Run> = (0..contenders)
        .filter(|i| !signals.contains_key(i))
        .map(|index| {
            let (session, started) = starts
                .get(&index)
                .unwrap_or_else(|| panic!("contender {index} never started its command"))
                .clone();
            Run {
                index,
                arrived: arrived[session.as_str()],
                granted: granted[session.as_str()],
                session,
                started,
            }
        })
        .collect();

    let ms = |ns: i128| (ns - spawned_at[0]) / 1_000_000;
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    let mut against_spawning = 0;
    for a in &runs {
        for b in &runs {
            if a.started < b.started && spawned_at[a.index] > spawned_at[b.index] {
                against_spawning += 1;
            }
            if a.arrived >= b.arrived || b.started >= a.started {
                continue;
            }
            let kind = inversion(a, b, &history);
            *kinds.entry(kind).or_default() += 1;
            eprintln!(
                "  {kind}: {} (arrived {}, granted +{} ms, started +{} ms) after {} (arrived {}, granted +{} ms, started +{} ms)",
                a.index,
                a.arrived,
                ms(history[a.granted].at),
                ms(a.started),
                b.index,
                b.arrived,
                ms(history[b.granted].at),
                ms(b.started),
            );
        }
    }
    let slowest = runs
        .iter()
        .map(|r| r.started - history[r.granted].at)
        .max()
        .unwrap_or(0);
    let slept = runs
        .iter()
        .filter(|r| r.started - history[r.granted].at > 1_000_000_000)
        .count();
    eprintln!(
        "crowd: {contenders} contenders, limit {CROWD_LIMIT}, seed {seed}, {} signalled, {} not, {:.1} s, {} states seen",
        signals.len(),
        runs.len(),
        elapsed.as_secs_f64(),
        history.len()
    );
    eprintln!(
        "pairs out of arrival order: {} {kinds:?}; out of the order of spawning: {against_spawning}; commands started over 1 s after their grant: {slept}, the slowest {} ms after",
        kinds.values().sum::<usize>(),
        slowest / 1_000_000
    );
    if std::env::var("CONSEM_CROWD_KEEP").is_ok() {
        let kept = std::env::temp_dir().join(format!("crowd-{seed}"));
        let _ = std::fs::remove_dir_all(&kept);
        std::process::Command::new("cp")
            .args(["-r", world.dir.to_str().unwrap(), kept.to_str().unwrap()])
            .status()
            .unwrap();
        eprintln!("kept in {}", kept.display());
    }
    assert_eq!(slept, 0, "commands that slept through their grant");
    assert_eq!(kinds.get(OVERTAKEN), None, "slots taken out of turn");
}
