//! Chaos at the level of processes, and leaks over many runs: the real
//! `consem` binary, forty at once, against the Consul double, while the test
//! SIGKILLs some of them, destroys holders' sessions as an operator would and
//! makes Consul fail within and beyond `--monitor-retry`. The children log
//! when they start and end; from that log and from what the double holds the
//! test checks the limit, the exit codes, the parent-death signal and that
//! nothing is left behind. A second test makes hundreds of consecutive runs
//! of every kind and checks that none leaves a key or a session.
//!
//! How the chaos is made, and why:
//! - Every fourth child runs 1.5 s instead of 0.3 to 0.6 s: a watcher needs
//!   about 0.6 s (three reads, 0.2 s and 0.4 s of backoff) to go beyond
//!   `--monitor-retry 2`, longer than most short children have left.
//! - Failures beyond the budget are outages: every read of the prefix fails
//!   (500 "No cluster leader", or the connection dropped) from the moment
//!   a long child has a second left until its watcher lost the slot (3 s at
//!   most), like a leader election. A burst of N faults would go mostly to
//!   the 37 waiters the nudge wakes with the watchers, and its leftovers to
//!   new holders' confirming reads, which back off to 1 s and stall the run.
//! - Failures within the budget are 1 or 2 faults on the watchers' blocking
//!   reads (a watcher's retry carries no index, so no watcher meets two in
//!   a row) or on any read of the prefix.
//! - A nudge (a write to `<prefix>/nudge/x`) wakes every blocking query so
//!   that the faults are met at once.
//! - Sessions expire when the test says so: a SIGKILLed consem's once its
//!   child is confirmed gone (a 10 s TTL would idle the slot it held, or the
//!   waiters queued behind it, for 20 s), the rest with
//!   `expire_sessions_idle_for(0)` after the run.
//!
//! The chaos is seeded. `CONSEM_CHAOS_SEED=<n>` (decimal or `0x` hex) runs
//! another seed; a failure names the seed it ran. The seed fixes what is
//! done and roughly when; which process it hits still depends on timing.
//!
//! `CONSEM_CHAOS_KEEP=1` keeps the children's log and each consem's `-v`
//! output in the temporary directory and prints what the test did (a
//! failure always keeps them).
//!
//! The summary lines are written to the real stderr (not the captured one),
//! so that `cargo test --test suite chaos::` shows them for docs/reliability.md.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::double::{ConsulDouble, Fault, Match};
use crate::common::world::*;
use crate::common::{encode_key, http, shell_status, wait_until};

// ---- the chaos test's settings ------------------------------------------

const CONTENDERS: usize = 40;
const LIMIT: u32 = 3;
const KILL_GRACE: &str = "1s";
const MONITOR_RETRY: &str = "2";
/// The shortest TTL Consul accepts. A SIGKILLed holder's slot would stay
/// taken for up to twice this, so the test ends such sessions itself once
/// the killed consem's child is confirmed gone, standing in for the TTL.
const TTL: &str = "10s";
/// The contenders start one after the other over this long.
const STAGGER: Duration = Duration::from_secs(1);
/// Every fourth child runs this long, so that a watcher has time to fail
/// three reads in a row (0.2 s and 0.4 s of backoff) while its child runs.
const LONG_CHILD: Duration = Duration::from_millis(1500);
/// After a slot loss, the old child must have ended within `--kill-grace`
/// plus one second.
const LOSS_TO_END: i128 = 2_000_000_000;
/// An outage ends at the latest after this long.
const OUTAGE_AT_MOST: Duration = Duration::from_secs(3);
/// All contenders must have exited by then (the run takes 10 to 13 s).
const RUN_DEADLINE: Duration = Duration::from_secs(50);
/// A chaos action that finds no target yet tries again for this long.
const ACTION_PATIENCE: Duration = Duration::from_secs(5);
/// A SIGKILLed consem's child must be gone within this.
const PDEATH_WITHIN: Duration = Duration::from_secs(5);
const DEFAULT_SEED: u64 = 0x00C0_5E11_2026_0003;
const SEED_ENV: &str = "CONSEM_CHAOS_SEED";
/// Set to keep the chaos test's files and print what it did, even when it
/// passes.
const KEEP_ENV: &str = "CONSEM_CHAOS_KEEP";

// ---- the leak test's settings --------------------------------------------

const LEAK_RUNS_ENV: &str = "CONSEM_LEAK_RUNS";
const DEFAULT_LEAK_RUNS: usize = 500;

// ---- small tools ----------------------------------------------------------

/// SplitMix64: tiny, seedable, good enough to pick times and targets.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// A duration in [low, high), in milliseconds.
    fn between(&mut self, low_ms: u64, high_ms: u64) -> Duration {
        Duration::from_millis(low_ms + self.next() % (high_ms - low_ms))
    }
}

fn chaos_seed() -> u64 {
    match std::env::var(SEED_ENV) {
        Ok(text) => {
            let text = text.trim();
            let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => text.parse(),
            };
            parsed.unwrap_or_else(|e| panic!("{SEED_ENV}={text:?} is not a u64: {e}"))
        }
        Err(_) => DEFAULT_SEED,
    }
}

/// CLOCK_REALTIME in nanoseconds: the clock `date +%s%N` reads in the
/// children, so the test's times and the log's compare.
fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_nanos() as i128
}

fn ms(nanos: i128) -> i128 {
    nanos / 1_000_000
}

/// Writes a line to the process's real stderr, which the test harness does
/// not capture: the summaries are meant to be read.
fn summary(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The processes whose parent is `parent`, from /proc.
/// The commands consem started: its children in its own session (the
/// lease watchdog, also its child, runs in a session of its own).
fn children_of(parent: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    // /proc/<pid>/stat after the name: state, ppid, pgrp, session, ...
    let fields = |pid: i32| -> Option<(i32, i32)> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (_, rest) = stat.rsplit_once(')')?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        Some((fields.get(1)?.parse().ok()?, fields.get(3)?.parse().ok()?))
    };
    let Some((_, session)) = fields(parent) else {
        return Vec::new();
    };
    dir.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| fields(pid) == Some((parent, session)))
        .collect()
}

/// The session IDs a `.lock` value names as holders, in either Holders
/// form (a name set to `false` is a holder on its way out, no holder).
fn lock_holders(value: &[u8]) -> Vec<String> {
    let Ok(lock) = serde_json::from_slice::<serde_json::Value>(value) else {
        return Vec::new();
    };
    match &lock["Holders"] {
        serde_json::Value::Object(map) => map
            .iter()
            .filter(|(_, held)| **held == serde_json::Value::Bool(true))
            .map(|(name, _)| name.clone())
            .collect(),
        serde_json::Value::Array(list) => list
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

/// Parses the RFC 3339 timestamp that starts a `-v` line
/// (`2026-11-22T10:04:05.123Z`) into Unix nanoseconds.
fn verbose_time(line: &str) -> Option<i128> {
    let stamp = line.split_whitespace().next()?.strip_suffix('Z')?;
    let (date, time) = stamp.split_once('T')?;
    let mut date = date.split('-').map(|p| p.parse::<i64>());
    let (year, month, day) = (date.next()?.ok()?, date.next()?.ok()?, date.next()?.ok()?);
    let (hms, millis) = time.split_once('.')?;
    let mut hms = hms.split(':').map(|p| p.parse::<i64>());
    let (h, m, s) = (hms.next()?.ok()?, hms.next()?.ok()?, hms.next()?.ok()?);
    let millis: i64 = millis.parse().ok()?;
    // Days from civil (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + m * 60 + s;
    Some(i128::from(secs) * 1_000_000_000 + i128::from(millis) * 1_000_000)
}

// ---- the children's log ---------------------------------------------------

/// One line a child wrote: `start|end <contender> <session> <nanos> <pid>`.
#[derive(Clone, Debug)]
struct LogLine {
    start: bool,
    contender: usize,
    session: String,
    nanos: i128,
    pid: i32,
}

fn parse_log(text: &str) -> Vec<LogLine> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [what, contender, session, nanos, pid] = f[..] else {
                return None;
            };
            Some(LogLine {
                start: match what {
                    "start" => true,
                    "end" => false,
                    _ => return None,
                },
                contender: contender.parse().ok()?,
                session: session.to_string(),
                nanos: nanos.parse().ok()?,
                pid: pid.parse().ok()?,
            })
        })
        .collect()
}

/// The first start and the first end line of each contender's child.
#[derive(Default)]
struct Seen {
    start: HashMap<usize, LogLine>,
    end: HashMap<usize, LogLine>,
}

impl Seen {
    fn from(lines: &[LogLine]) -> Seen {
        let mut seen = Seen::default();
        for line in lines {
            let map = if line.start {
                &mut seen.start
            } else {
                &mut seen.end
            };
            map.entry(line.contender).or_insert_with(|| line.clone());
        }
        seen
    }

    fn running(&self, contender: usize) -> Option<&LogLine> {
        self.start
            .get(&contender)
            .filter(|_| !self.end.contains_key(&contender))
    }
}

/// The child of contender `index`: logs its start, runs `run`, logs its end;
/// SIGTERM (consem stopping it) logs the end at once and exits 143. `sleep &
/// wait` lets the trap run as soon as the signal arrives.
fn child_script(log: &str, index: usize, run: Duration) -> String {
    assert!(
        !log.contains(['"', '\'', '$', '\\', '`']),
        "the log path needs no quoting: {log}"
    );
    format!(
        r#"log() {{ echo "$1 {index} $CONSEM_SESSION $(date +%s%N) $$" >> "{log}"; }}; trap 'log end; exit 143' TERM; log start; sleep {secs}.{millis:03} & wait $!; log end"#,
        secs = run.as_secs(),
        millis = run.subsec_millis()
    )
}

// ---- the contenders ---------------------------------------------------------

struct Kill {
    at: i128,
    /// The child pids consem had (from /proc before the kill, and the log),
    /// each with when it was seen gone.
    children: Vec<(i32, Option<i128>)>,
    /// It had a child or was named in `.lock` when killed.
    holding: bool,
}

struct Contender {
    index: usize,
    planned: Duration,
    process: Child,
    pid: i32,
    stderr: PathBuf,
    status: Option<ExitStatus>,
    /// When the test saw it exit (an upper bound).
    exited_at: i128,
    kill: Option<Kill>,
}

impl Contender {
    fn alive(&mut self) -> bool {
        if self.status.is_none() {
            if let Some(status) = self.process.try_wait().unwrap() {
                self.status = Some(status);
                self.exited_at = now_ns();
            }
        }
        self.status.is_none()
    }

    fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Every session this consem created, from its `-v` output.
    fn sessions(&self) -> Vec<String> {
        self.stderr_text()
            .lines()
            .filter(|l| l.contains(" session-created "))
            .filter_map(|l| {
                l.split_whitespace()
                    .find_map(|f| f.strip_prefix("session="))
                    .map(str::to_string)
            })
            .collect()
    }

    /// Why it lost its slot, from its `slot lost: ...` error line.
    fn loss_reason(&self) -> Option<String> {
        self.stderr_text()
            .lines()
            .find_map(|l| l.strip_prefix("consem: error: slot lost: "))
            .map(str::to_string)
    }

    /// When it started stopping its child (the `stopping` event).
    fn stopping_at(&self) -> Option<i128> {
        self.stderr_text()
            .lines()
            .find(|l| l.contains(" stopping "))
            .and_then(verbose_time)
    }

    fn exit_label(&self) -> String {
        match self.status {
            None => "running".into(),
            Some(status) => match (status.code(), status.signal()) {
                (Some(code), _) => code.to_string(),
                (None, Some(signal)) => format!("signal {signal}"),
                _ => format!("{status:?}"),
            },
        }
    }
}

/// Kills every contender still running when the test ends, even by a panic.
struct Fleet(Vec<Contender>);

impl Drop for Fleet {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if c.status.is_none() {
                let _ = c.process.kill();
                let _ = c.process.wait();
            }
        }
    }
}

// ---- the chaos --------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum FaultKind {
    Status500,
    Drop,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Action {
    /// SIGKILL a consem that waits for a slot.
    KillWaiting,
    /// SIGKILL a consem whose child runs.
    KillHolding,
    /// Destroy a holder's session, as an operator would.
    Destroy,
    /// `count` faults on the watchers' blocking reads (`?consistent&index=`):
    /// a watcher's retry read carries no index, so no watcher meets two in a
    /// row; within the budget.
    WatchBlip(FaultKind, usize),
    /// `count` faults on any read of the prefix: waiters and watchers alike.
    AnyBlip(FaultKind, usize),
    /// A leader election, or an agent that lost its servers: every read of
    /// the prefix fails until the watcher of a long child has failed more
    /// than `--monitor-retry` times in a row and lost its slot (at most
    /// `OUTAGE_AT_MOST`). Waits for a child with a second or more to run.
    Outage(FaultKind),
}

struct Pending {
    due: Duration,
    first_due: Duration,
    action: Action,
}

fn schedule(rng: &mut Rng) -> Vec<Pending> {
    let mut plan = Vec::new();
    let mut add = |due: Duration, action| {
        plan.push(Pending {
            due,
            first_due: due,
            action,
        })
    };
    for _ in 0..2 {
        add(rng.between(600, 4000), Action::KillWaiting);
        add(rng.between(1000, 7000), Action::KillHolding);
    }
    for _ in 0..4 {
        add(rng.between(1000, 8000), Action::Destroy);
    }
    for kind in [FaultKind::Status500, FaultKind::Drop] {
        for _ in 0..2 {
            add(
                rng.between(500, 8000),
                Action::WatchBlip(kind, 1 + rng.below(2)),
            );
        }
        add(
            rng.between(500, 8000),
            Action::AnyBlip(kind, 1 + rng.below(2)),
        );
    }
    add(
        rng.between(1500, 3500),
        Action::Outage(FaultKind::Status500),
    );
    add(rng.between(4500, 6500), Action::Outage(FaultKind::Drop));
    plan.sort_by_key(|p| p.due);
    plan
}

impl FaultKind {
    fn fault(self, count: usize) -> Fault {
        match self {
            FaultKind::Status500 => Fault::status(500, "No cluster leader", count),
            FaultKind::Drop => Fault::drop_connection(count),
        }
    }

    fn name(self) -> &'static str {
        match self {
            FaultKind::Status500 => "500",
            FaultKind::Drop => "drop",
        }
    }
}

struct Chaos<'a> {
    world: &'a World<TestConsul>,
    double: &'a ConsulDouble,
    log: String,
    fleet: Fleet,
    rng: Rng,
    /// Contender -> (session, when the test destroyed it).
    destroyed: HashMap<usize, (String, i128)>,
    /// Sessions of killed holders the test ended in place of their TTL.
    expired_early: Vec<String>,
    /// What was done, when (ms since the start), for the failure report.
    journal: Vec<String>,
    skipped: Vec<String>,
    problems: Vec<String>,
    /// Most holders `.lock` named, sampled every loop.
    most_in_lock: usize,
    /// The outage under way: its long child's contender, and since when.
    outage: Option<(usize, Instant)>,
    outages: Vec<Duration>,
    t0: Instant,
    /// The same moment on CLOCK_REALTIME, to show log times from the start.
    t0_ns: i128,
}

enum Done {
    Yes,
    NoTargetYet,
}

impl<'a> Chaos<'a> {
    fn lock_entry_holders(&self) -> Vec<String> {
        let key = format!("{}/.lock", self.world.prefix);
        self.double
            .entries(&format!("{}/", self.world.prefix))
            .into_iter()
            .find(|e| e.key == key)
            .map_or_else(Vec::new, |e| lock_holders(&e.value))
    }

    fn seen(&self) -> Seen {
        Seen::from(&parse_log(
            &std::fs::read_to_string(&self.log).unwrap_or_default(),
        ))
    }

    fn note(&mut self, what: String) {
        self.journal
            .push(format!("{:>6} ms  {what}", self.t0.elapsed().as_millis()));
    }

    fn spawn(&mut self, index: usize) {
        let planned = if index % 4 == 1 {
            LONG_CHILD
        } else {
            self.rng.between(300, 600)
        };
        let stderr = self.world.dir.join(format!("consem-{index}.err"));
        let script = child_script(&self.log, index, planned);
        let process = self
            .world
            .consem(
                LIMIT,
                &[
                    "-v",
                    "--kill-grace",
                    KILL_GRACE,
                    "--monitor-retry",
                    MONITOR_RETRY,
                    "--ttl",
                    TTL,
                ],
                &["sh", "-c", &script],
            )
            .stdout(Stdio::null())
            .stderr(File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let pid = process.id() as i32;
        self.fleet.0.push(Contender {
            index,
            planned,
            process,
            pid,
            stderr,
            status: None,
            exited_at: 0,
            kill: None,
        });
    }

    fn pick(&mut self, candidates: &[usize]) -> Option<usize> {
        (!candidates.is_empty()).then(|| candidates[self.rng.below(candidates.len())])
    }

    fn act(&mut self, action: Action) -> Done {
        let seen = self.seen();
        match action {
            Action::KillWaiting => {
                let candidates: Vec<usize> = (0..self.fleet.0.len())
                    .filter(|&i| {
                        let c = &mut self.fleet.0[i];
                        c.alive()
                            && c.kill.is_none()
                            && !seen.start.contains_key(&c.index)
                            && c.stderr_text().contains(" waiting ")
                    })
                    .collect();
                match self.pick(&candidates) {
                    Some(i) => self.kill(i),
                    None => Done::NoTargetYet,
                }
            }
            Action::KillHolding => {
                let candidates: Vec<usize> = (0..self.fleet.0.len())
                    .filter(|&i| {
                        let c = &mut self.fleet.0[i];
                        c.alive()
                            && c.kill.is_none()
                            && seen.running(c.index).is_some()
                            && !self.destroyed.contains_key(&c.index)
                            && self.outage.map(|(target, _)| target) != Some(c.index)
                    })
                    .collect();
                match self.pick(&candidates) {
                    Some(i) => self.kill(i),
                    None => Done::NoTargetYet,
                }
            }
            Action::Destroy => {
                let candidates: Vec<usize> = (0..self.fleet.0.len())
                    .filter(|&i| {
                        let c = &mut self.fleet.0[i];
                        c.alive()
                            && c.kill.is_none()
                            && seen.running(c.index).is_some()
                            && !self.destroyed.contains_key(&c.index)
                            && self.outage.map(|(target, _)| target) != Some(c.index)
                    })
                    .collect();
                let Some(i) = self.pick(&candidates) else {
                    return Done::NoTargetYet;
                };
                let index = self.fleet.0[i].index;
                let session = seen.start[&index].session.clone();
                let at = now_ns();
                self.double.destroy_session(&session);
                self.destroyed.insert(index, (session.clone(), at));
                self.note(format!(
                    "destroyed session {session} of contender {index} (its child runs)"
                ));
                Done::Yes
            }
            // A fault added during an outage would wait behind it and be
            // cleared with it.
            Action::WatchBlip(..) | Action::AnyBlip(..) if self.outage.is_some() => {
                Done::NoTargetYet
            }
            Action::WatchBlip(kind, count) => {
                self.double.inject(
                    kind.fault(count)
                        .on(Match::method_path("GET", "consistent&index=")),
                );
                self.nudge();
                self.note(format!(
                    "{count} x {} on the watchers' blocking reads (within the budget)",
                    kind.name()
                ));
                Done::Yes
            }
            Action::AnyBlip(kind, count) => {
                self.double
                    .inject(kind.fault(count).on(Match::method_path("GET", "/v1/kv/")));
                self.nudge();
                self.note(format!(
                    "{count} x {} on any read of the prefix (within the budget)",
                    kind.name()
                ));
                Done::Yes
            }
            Action::Outage(kind) => {
                if self.outage.is_some() {
                    return Done::NoTargetYet;
                }
                // A child with a second or more to run, so that its watcher
                // meets three failures in a row (0.2 s and 0.4 s apart)
                // before it ends.
                let now = now_ns();
                let long_one = self.fleet.0.iter_mut().find_map(|c| {
                    let line = seen.running(c.index)?;
                    let left = line.nanos + c.planned.as_nanos() as i128 - now;
                    (c.alive() && c.kill.is_none() && left >= 1_000_000_000).then_some(c.index)
                });
                let Some(index) = long_one else {
                    return Done::NoTargetYet;
                };
                self.double.inject(
                    kind.fault(usize::MAX)
                        .on(Match::method_path("GET", "/v1/kv/")),
                );
                self.nudge();
                self.outage = Some((index, Instant::now()));
                self.note(format!(
                    "outage: every read answers {} (beyond the budget) while contender {index}'s child runs on for a second",
                    kind.name()
                ));
                Done::Yes
            }
        }
    }

    /// Ends the outage once its watcher lost the slot, its child ended, or
    /// `OUTAGE_AT_MOST` passed. Faults not used up by then go too.
    fn end_outage_when_done(&mut self) {
        let Some((index, since)) = self.outage else {
            return;
        };
        let c = &self.fleet.0[index];
        let lost = c.loss_reason().is_some();
        let ended = self.seen().end.contains_key(&index) || c.status.is_some();
        if lost || ended || since.elapsed() > OUTAGE_AT_MOST {
            self.double.clear_faults();
            self.outage = None;
            let why = if lost {
                "its watcher lost the slot"
            } else if ended {
                "its child ended first"
            } else {
                "time"
            };
            self.note(format!(
                "outage over after {} ms ({why}); faults cleared",
                since.elapsed().as_millis()
            ));
            self.outages.push(since.elapsed());
        }
    }

    /// Wakes every blocking query on the prefix, so that watchers read (and
    /// meet a fault just injected) now.
    /// Rewrites `.lock` unchanged: the holders' watchers and the waiters
    /// that block on the prefix wake and read.
    fn nudge(&self) {
        self.double.rewrite(&self.world.key(".lock"));
    }

    fn kill(&mut self, i: usize) -> Done {
        let c = &mut self.fleet.0[i];
        let index = c.index;
        let before: Vec<i32> = children_of(c.pid);
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(c.pid, libc::SIGKILL) };
        let status = c.process.wait().unwrap();
        let at = now_ns();
        c.status = Some(status);
        c.exited_at = at;
        if status.signal() != Some(libc::SIGKILL) {
            // It exited by itself just before: not a kill; pick another.
            return Done::NoTargetYet;
        }
        let mut pids = before;
        if let Some(line) = self.seen().start.get(&index) {
            if !pids.contains(&line.pid) {
                pids.push(line.pid);
            }
        }
        let mut children = Vec::new();
        for pid in pids {
            let deadline = Instant::now() + PDEATH_WITHIN;
            while !process_gone(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            let gone = process_gone(pid).then(now_ns);
            if gone.is_none() {
                self.problems.push(format!(
                    "(c) contender {index}: child {pid} still runs {PDEATH_WITHIN:?} after consem was SIGKILLed"
                ));
            }
            children.push((pid, gone));
        }
        // Its TTL would free a slot it held, or the waiters queued behind
        // it, only after up to 20 s: end its sessions now that its child is
        // gone, as the TTL would.
        let in_lock = self.lock_entry_holders();
        let sessions = self.fleet.0[i].sessions();
        let holding = !children.is_empty() || sessions.iter().any(|s| in_lock.contains(s));
        for session in &sessions {
            self.double.destroy_session(session);
            self.expired_early.push(session.clone());
        }
        let gone_after = children
            .iter()
            .filter_map(|(_, gone)| gone.map(|g| ms(g - at)))
            .max();
        self.fleet.0[i].kill = Some(Kill {
            at,
            children,
            holding,
        });
        self.note(format!(
            "SIGKILLed contender {index} while {}{}",
            if holding { "holding" } else { "waiting" },
            match gone_after {
                Some(ms) => format!("; its child was gone {ms} ms later"),
                None => String::new(),
            }
        ));
        Done::Yes
    }

    /// Starts the contenders over `STAGGER`, plays the schedule, and waits
    /// for every consem to exit.
    fn run(&mut self, mut plan: Vec<Pending>) {
        let mut spawned = 0;
        loop {
            let now = self.t0.elapsed();
            while spawned < CONTENDERS && now >= STAGGER * spawned as u32 / CONTENDERS as u32 {
                self.spawn(spawned);
                spawned += 1;
            }
            let all_exited = self.fleet.0.iter_mut().all(|c| !c.alive());
            if spawned == CONTENDERS && all_exited {
                break;
            }
            let holders = self.lock_entry_holders().len();
            self.most_in_lock = self.most_in_lock.max(holders);
            self.end_outage_when_done();

            let mut later = Vec::new();
            for pending in std::mem::take(&mut plan) {
                if pending.due > now {
                    later.push(pending);
                    continue;
                }
                match self.act(pending.action) {
                    Done::Yes => {}
                    Done::NoTargetYet if now < pending.first_due + ACTION_PATIENCE => {
                        later.push(Pending {
                            due: now + Duration::from_millis(50),
                            ..pending
                        });
                    }
                    Done::NoTargetYet => self.skipped.push(format!(
                        "{:?} (due at {} ms): no target",
                        pending.action,
                        pending.first_due.as_millis()
                    )),
                }
            }
            plan = later;

            if now > RUN_DEADLINE {
                let running: Vec<usize> = self
                    .fleet
                    .0
                    .iter_mut()
                    .filter_map(|c| c.alive().then_some(c.index))
                    .collect();
                self.problems.push(format!(
                    "contenders {running:?} still run after {RUN_DEADLINE:?}"
                ));
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for pending in plan {
            self.skipped.push(format!(
                "{:?} (due at {} ms): the run was over",
                pending.action,
                pending.first_due.as_millis()
            ));
        }
    }
}

/// What the checks found, for the summary.
#[derive(Default)]
struct Figures {
    children_run: usize,
    max_overlap: i32,
    max_overlap_raw: i32,
    losses_destroyed: usize,
    losses_watch: usize,
    losses_other: usize,
    longest_stop_ms: i128,
    kills_waiting: usize,
    kills_holding: usize,
    slowest_pdeath_ms: i128,
    exits: BTreeMap<String, usize>,
    tolerated_watch_retries: usize,
    waiter_retries: usize,
    lock_writes: usize,
    most_in_written_lock: usize,
}

impl Chaos<'_> {
    /// Checks (a) the limit, (b) the exit codes and (c) the parent-death
    /// signal from the log and the consems' stderr.
    fn check(&mut self) -> Figures {
        let mut figures = Figures::default();
        let lines = parse_log(&std::fs::read_to_string(&self.log).unwrap_or_default());
        let seen = Seen::from(&lines);
        figures.children_run = seen.start.len();

        // (b) every consem exited with a documented code, or was killed.
        for c in &self.fleet.0 {
            let label = match (&c.kill, c.status) {
                (Some(_), _) => "SIGKILL (test)".to_string(),
                (None, Some(status)) => match status.code() {
                    Some(code @ (0 | 69 | 76)) => code.to_string(),
                    _ => {
                        self.problems.push(format!(
                            "(b) contender {}: exit {} is not one this test allows\n{}",
                            c.index,
                            c.exit_label(),
                            c.stderr_text()
                        ));
                        c.exit_label()
                    }
                },
                (None, None) => "running".into(),
            };
            *figures.exits.entry(label).or_default() += 1;
            if c.kill.is_none() && c.status.and_then(|s| s.code()) == Some(0) {
                let ran = seen.start.contains_key(&c.index) && seen.end.contains_key(&c.index);
                if !ran {
                    self.problems.push(format!(
                        "(b) contender {} exited 0 but its child did not log both start and end",
                        c.index
                    ));
                }
            }
            let text = c.stderr_text();
            let retries = text.lines().filter(|l| l.contains(" watch-retry ")).count();
            if c.status.and_then(|s| s.code()) == Some(0) {
                figures.tolerated_watch_retries += retries;
            }
            figures.waiter_retries += text.lines().filter(|l| l.contains(" retry ")).count();
        }

        // (c) a killed consem's child died with it and logged nothing after.
        for c in &self.fleet.0 {
            let Some(kill) = &c.kill else { continue };
            if kill.holding {
                figures.kills_holding += 1;
            } else {
                figures.kills_waiting += 1;
            }
            let gone_by = kill
                .children
                .iter()
                .filter_map(|(_, gone)| *gone)
                .max()
                .unwrap_or(kill.at);
            figures.slowest_pdeath_ms = figures.slowest_pdeath_ms.max(ms(gone_by - kill.at));
            if let Some(start) = seen.start.get(&c.index) {
                let known = kill.children.iter().any(|(pid, _)| *pid == start.pid);
                if !known && !process_gone(start.pid) {
                    self.problems.push(format!(
                        "(c) contender {}: its child {} outlived the SIGKILLed consem",
                        c.index, start.pid
                    ));
                }
            }
            if let Some(end) = seen.end.get(&c.index) {
                if end.nanos > gone_by {
                    self.problems.push(format!(
                        "(c) contender {}: its child logged its end {} ms after consem was SIGKILLed",
                        c.index,
                        ms(end.nanos - kill.at)
                    ));
                }
            }
        }

        // (a) at most LIMIT children at once, except after a slot loss; and
        // then the old child ended within --kill-grace + 1 s.
        let mut raw = Vec::new();
        let mut effective = Vec::new();
        for c in &self.fleet.0 {
            let Some(start) = seen.start.get(&c.index) else {
                continue;
            };
            let end = match (seen.end.get(&c.index), &c.kill) {
                (Some(end), _) => end.nanos,
                (None, Some(kill)) => kill
                    .children
                    .iter()
                    .filter_map(|(_, gone)| *gone)
                    .max()
                    .unwrap_or(kill.at),
                (None, None) => {
                    // Stopped with SIGKILL after the grace: no end line; it
                    // was gone by the time consem exited.
                    c.exited_at
                }
            };
            let destroyed_at = self
                .destroyed
                .get(&c.index)
                .map(|(_, at)| *at)
                .filter(|at| *at < end);
            let code = c.status.and_then(|s| s.code());
            let reported_at = (code == Some(76))
                .then(|| c.stopping_at())
                .flatten()
                .filter(|at| *at < end);
            let loss = match (destroyed_at, reported_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if code == Some(76) {
                let reason = c.loss_reason().unwrap_or_default();
                if self.destroyed.contains_key(&c.index) {
                    figures.losses_destroyed += 1;
                } else if reason.contains("cannot watch the slot") {
                    figures.losses_watch += 1;
                } else {
                    figures.losses_other += 1;
                }
            }
            if let Some((_, at)) = self.destroyed.get(&c.index) {
                self.journal.push(format!(
                    "contender {}: session destroyed {} ms after its child started, which ended {} ms later; consem exited {}",
                    c.index,
                    ms(at - start.nanos),
                    ms(end - at),
                    c.exit_label()
                ));
            }
            if let Some(loss) = loss {
                let stop = end - loss;
                figures.longest_stop_ms = figures.longest_stop_ms.max(ms(stop));
                if stop > LOSS_TO_END {
                    self.problems.push(format!(
                        "(a) contender {}: its child ended {} ms after the slot was lost (allowed: --kill-grace {KILL_GRACE} + 1 s)\n{}",
                        c.index,
                        ms(stop),
                        c.stderr_text()
                    ));
                }
            }
            raw.push((start.nanos, end, c.index));
            effective.push((start.nanos, loss.map_or(end, |l| l.min(end)), c.index));
        }
        figures.max_overlap_raw = most_at_once(&raw).0;
        let (most, at) = most_at_once(&effective);
        figures.max_overlap = most;
        if most > LIMIT as i32 {
            let around: Vec<String> = effective
                .iter()
                .filter(|(s, e, _)| *s <= at && at < *e)
                .map(|(s, e, i)| {
                    format!(
                        "contender {i}: {} .. {} ms",
                        ms(s - self.t0_ns),
                        ms(e - self.t0_ns)
                    )
                })
                .collect();
            self.problems.push(format!(
                "(a) {most} children ran at once at {} ms (the test's clock), no slot loss explains it: {around:#?}",
                ms(at - self.t0_ns)
            ));
        }

        // Every .lock written names at most LIMIT holders.
        let lock_key = format!("/v1/kv/{}/.lock", self.world.prefix);
        for request in self.double.requests() {
            if request.method == "PUT" && request.path == lock_key {
                figures.lock_writes += 1;
                let holders = lock_holders(&request.body).len();
                figures.most_in_written_lock = figures.most_in_written_lock.max(holders);
                if holders > LIMIT as usize {
                    self.problems.push(format!(
                        "a .lock write named {holders} holders: {}",
                        String::from_utf8_lossy(&request.body)
                    ));
                }
            }
        }
        if self.most_in_lock > LIMIT as usize {
            self.problems
                .push(format!(".lock named {} holders", self.most_in_lock));
        }
        figures
    }

    /// Moves the scratch directory (the children's log, each consem's `-v`
    /// output) where it outlives the test, and says where.
    fn keep_files(&self, seed: u64) -> String {
        let keep = std::env::temp_dir().join(format!("consem-chaos-{seed:#x}"));
        let _ = std::fs::remove_dir_all(&keep);
        match std::fs::rename(&self.world.dir, &keep) {
            Ok(()) => {
                // World's Drop removes its directory: leave it one.
                let _ = std::fs::create_dir_all(&self.world.dir);
                format!(
                    "kept the children's log and each consem's stderr in {}",
                    keep.display()
                )
            }
            Err(e) => format!("could not keep {}: {e}", self.world.dir.display()),
        }
    }

    fn failure(&self, seed: u64, summary_line: &str) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let kept = self.keep_files(seed);
        format!(
            "chaos with seed {seed:#x} (rerun with {SEED_ENV}={seed:#x}) found {} problem(s):\n\n{}\n\n{summary_line}\n\nwhat the test did:\n{}\nskipped: {:?}\n\nthe children's log:\n{log}\n{kept}",
            self.problems.len(),
            self.problems.join("\n\n"),
            self.journal.join("\n"),
            self.skipped,
        )
    }

    /// (d) Once every consem has exited and the killed ones' sessions have
    /// expired, no contender key and no session remain; a `.lock` naming
    /// dead holders may; one more run leaves the prefix empty. Returns how
    /// many sessions expired and how many dead holders `.lock` still named.
    fn check_nothing_left(&mut self) -> (usize, usize) {
        let world = self.world;
        let double = self.double;
        double.clear_faults();
        let nudge = format!(
            "http://{}/v1/kv/{}",
            double.addr(),
            encode_key(&format!("{}/nudge/x", world.prefix))
        );
        let (status, body) = http("DELETE", &nudge, b"");
        assert_eq!(status, 200, "DELETE {nudge}: {body}");

        let expired = double.expire_sessions_idle_for(Duration::ZERO);
        let prefix = format!("{}/", world.prefix);
        let lock_key = format!("{prefix}.lock");
        let deadline = Instant::now() + PROMPT;
        let only_lock = || double.entries(&prefix).iter().all(|e| e.key == lock_key);
        while !only_lock() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if !only_lock() {
            let keys: Vec<String> = double.entries(&prefix).into_iter().map(|e| e.key).collect();
            self.problems.push(format!(
                "(d) contender keys outlived their expired sessions: {keys:?}"
            ));
        }
        let sessions = double.sessions();
        if !sessions.is_empty() {
            self.problems
                .push(format!("(d) sessions left after expiry: {sessions:?}"));
        }
        let dead_holders = self.lock_entry_holders().len();

        let output = world.consem(LIMIT, &[], &["true"]).output().unwrap();
        if output.status.code() != Some(0) {
            self.problems.push(format!(
                "(d) the run after the chaos exited {:?}: {}",
                output.status,
                stderr(&output)
            ));
        }
        let left: Vec<String> = double.entries(&prefix).into_iter().map(|e| e.key).collect();
        if !left.is_empty() {
            self.problems.push(format!("(d) keys left: {left:?}"));
        }
        let sessions = double.sessions();
        if !sessions.is_empty() {
            self.problems
                .push(format!("(d) sessions left at the end: {sessions:?}"));
        }
        (expired, dead_holders)
    }
}

/// The most intervals [start, end) covering one moment, and that moment.
/// An end at the same nanosecond as a start comes first.
fn most_at_once(intervals: &[(i128, i128, usize)]) -> (i32, i128) {
    let mut points: Vec<(i128, i32)> = intervals
        .iter()
        .flat_map(|&(s, e, _)| [(s, 1), (e, -1)])
        .collect();
    points.sort();
    let (mut now, mut most, mut at) = (0, 0, 0);
    for (t, delta) in points {
        now += delta;
        if now > most {
            most = now;
            at = t;
        }
    }
    (most, at)
}

/// Chaos among forty contenders; see the module comment. The figures it
/// prints go into docs/reliability.md.
#[cfg(target_os = "linux")]
#[test]
fn chaos_among_forty_contenders_keeps_the_limit_and_leaves_nothing_behind() {
    let world = World::on_the_double("chaos");
    let double = world.the_double();
    // Sessions expire when the test says so (see `TTL`), not on the
    // double's clock: a run slower than 2 x TTL must not change what is
    // checked.
    double.set_ttl_multiplier(1000.0);
    let seed = chaos_seed();
    eprintln!("chaos: seed {seed:#x} (rerun with {SEED_ENV}={seed:#x})");
    let mut rng = Rng(seed);
    let plan = schedule(&mut rng);
    let started = Instant::now();
    let mut chaos = Chaos {
        world: &world,
        double,
        log: world.path("children.log"),
        fleet: Fleet(Vec::new()),
        rng,
        destroyed: HashMap::new(),
        expired_early: Vec::new(),
        journal: Vec::new(),
        skipped: Vec::new(),
        problems: Vec::new(),
        most_in_lock: 0,
        outage: None,
        outages: Vec::new(),
        t0: Instant::now(),
        t0_ns: now_ns(),
    };
    chaos.run(plan);
    let run_time = started.elapsed();
    if !chaos.problems.is_empty() {
        // The run itself went wrong (a deadline): report before checking.
        let report = chaos.failure(seed, "");
        panic!("{report}");
    }
    let figures = chaos.check();
    let (expired, dead_holders) = chaos.check_nothing_left();

    // The chaos must have happened, or the checks above prove little.
    let mut missing = Vec::new();
    if figures.kills_waiting == 0 {
        missing.push("no consem was killed while waiting");
    }
    if figures.kills_holding == 0 {
        missing.push("no consem was killed while its child ran");
    }
    if figures.losses_destroyed == 0 {
        missing.push("no destroyed session stopped a child");
    }
    if figures.losses_watch == 0 {
        missing.push("no watcher went beyond --monitor-retry");
    }
    if figures.tolerated_watch_retries == 0 {
        missing.push("no watcher rode out a failure within --monitor-retry");
    }
    for what in missing {
        chaos.problems.push(format!("chaos not exercised: {what}"));
    }

    let exits: Vec<String> = figures
        .exits
        .iter()
        .map(|(code, n)| format!("{code}: {n}"))
        .collect();
    let line = format!(
        "chaos summary: seed={seed:#x} contenders={CONTENDERS} limit={LIMIT} children_run={} \
         max_overlap={} (raw {} counting lost slots' children until they ended; .lock named at most {} holders, {} writes) \
         losses={} (destroyed {}, watch beyond --monitor-retry {}, other {}; slowest stop after a loss {} ms) \
         kills={} (waiting {}, holding {}; slowest child gone {} ms after) \
         outages={} exits={{{}}} tolerated_watch_retries={} waiter_retries={} \
         sessions_expired_at_end={} ttl_stand_ins={} dead_holders_left_in_lock={} skipped_actions={} \
         run={:.1}s total={:.1}s",
        figures.children_run,
        figures.max_overlap,
        figures.max_overlap_raw,
        figures.most_in_written_lock.max(chaos.most_in_lock),
        figures.lock_writes,
        figures.losses_destroyed + figures.losses_watch + figures.losses_other,
        figures.losses_destroyed,
        figures.losses_watch,
        figures.losses_other,
        figures.longest_stop_ms,
        figures.kills_waiting + figures.kills_holding,
        figures.kills_waiting,
        figures.kills_holding,
        figures.slowest_pdeath_ms,
        chaos
            .outages
            .iter()
            .map(|d| format!("{}ms", d.as_millis()))
            .collect::<Vec<_>>()
            .join(","),
        exits.join(", "),
        figures.tolerated_watch_retries,
        figures.waiter_retries,
        expired,
        chaos.expired_early.len(),
        dead_holders,
        chaos.skipped.len(),
        run_time.as_secs_f64(),
        started.elapsed().as_secs_f64(),
    );
    summary(&line);
    if std::env::var_os(KEEP_ENV).is_some() {
        summary(&format!(
            "{}\nwhat the test did:\n{}",
            chaos.keep_files(seed),
            chaos.journal.join("\n")
        ));
    }
    if !chaos.problems.is_empty() {
        let report = chaos.failure(seed, &line);
        panic!("{report}");
    }
}

// ---- leaks --------------------------------------------------------------------

/// Leaks: consecutive runs of every kind — the child succeeds,
/// fails, dies of a signal; no slot with `--try`, `--timeout` or
/// `--timeout 0 -E`; a waiting consem stopped by a signal — with a
/// background holder for the kinds that need a busy slot. After every round
/// (and so at the end) no key and no session is left. `CONSEM_LEAK_RUNS`
/// changes the number of runs (default 500).
#[test]
fn repeated_runs_leave_nothing_behind() {
    let world = World::consul("leaks");
    let runs: usize = match std::env::var(LEAK_RUNS_ENV) {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{LEAK_RUNS_ENV}={text:?}: {e}")),
        Err(_) => DEFAULT_LEAK_RUNS,
    };
    let started = Instant::now();
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    let mut done = 0;
    let mut count = |kind: &str, expected: i32, status: ExitStatus, why: &dyn Fn() -> String| {
        assert_eq!(shell_status(status), expected, "{kind}: {}", why());
        *tally.entry(format!("{kind}={expected}")).or_default() += 1;
    };
    let signals = [libc::SIGTERM, libc::SIGKILL, libc::SIGHUP, libc::SIGUSR1];
    let wait_signals = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];
    let mut round = 0;
    while done < runs {
        // The slot is free.
        let output = world.consem(1, &[], &["true"]).output().unwrap();
        count("success", 0, output.status, &|| stderr(&output));
        done += 1;
        let output = world
            .consem(1, &[], &["sh", "-c", "exit 3"])
            .output()
            .unwrap();
        count("failure", 3, output.status, &|| stderr(&output));
        done += 1;
        let signal = signals[round % signals.len()];
        let script = format!("kill -{signal} $$");
        let output = world
            .consem(1, &[], &["sh", "-c", &script])
            .output()
            .unwrap();
        assert_eq!(
            output.status.signal(),
            Some(signal),
            "dies of the child's signal"
        );
        count("child-signal", 128 + signal, output.status, &|| {
            stderr(&output)
        });
        done += 1;
        if done >= runs {
            break;
        }

        // The slot is held by a background consem.
        let (ready, go) = (format!("ready-{round}"), format!("go-{round}"));
        let holder = hold_slot(&world, 1, &ready, &go);
        let output = world.consem(1, &["--try"], &["true"]).output().unwrap();
        count("try", 75, output.status, &|| stderr(&output));
        done += 1;
        let (extra, expected): (&[&str], i32) = if round % 2 == 0 {
            (&["--timeout", "0.2s"], 75)
        } else {
            (&["--timeout", "0", "-E", "9"], 9)
        };
        let output = world.consem(1, extra, &["true"]).output().unwrap();
        count("timeout", expected, output.status, &|| stderr(&output));
        done += 1;
        let log = format!("waiting-{round}.err");
        let mut waiter = spawn_verbose(&world, 1, &[], &["true"], &log);
        wait_until(PROMPT, "the second consem to wait", || {
            std::fs::read_to_string(world.path(&log))
                .unwrap_or_default()
                .contains(" waiting ")
        });
        let signal = wait_signals[round % wait_signals.len()];
        signal_child(&waiter, signal);
        let status = waiter.wait().unwrap();
        assert_eq!(
            status.signal(),
            Some(signal),
            "dies of the signal that ended its wait"
        );
        count("interrupted-wait", 128 + signal, status, &|| {
            std::fs::read_to_string(world.path(&log)).unwrap_or_default()
        });
        done += 1;
        world.touch(&go);
        let output = finish(holder);
        count("holder", 0, output.status, &|| stderr(&output));
        done += 1;

        let entries = world.entries();
        assert_eq!(
            entries,
            vec![],
            "keys left after round {round} ({done} runs)"
        );
        assert_eq!(
            world.sessions(),
            vec![],
            "sessions left after round {round}"
        );
        round += 1;
    }
    world.assert_clean();
    let kinds: Vec<String> = tally.iter().map(|(k, n)| format!("{k}: {n}")).collect();
    summary(&format!(
        "leak summary: runs={done} ({}) keys_left=0 sessions_left=0 elapsed={:.1}s",
        kinds.join(", "),
        started.elapsed().as_secs_f64()
    ));
}

fn signal_child(child: &Child, signal: i32) {
    // SAFETY: kill(2) on our own child, not yet reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
}

/// The checker's own tools, on cases worked out by hand.
#[test]
fn the_checks_count_and_parse_right() {
    assert_eq!(
        verbose_time("2026-11-22T00:06:31.123Z consem[1] stopping pid=2 signal=15"),
        Some(1_795_305_991_123_000_000)
    );
    assert_eq!(verbose_time("consem: error: x"), None);
    // [0,10) [5,15) [10,20): at most two at once; an end and a start at the
    // same moment do not overlap.
    assert_eq!(most_at_once(&[(0, 10, 0), (5, 15, 1), (10, 20, 2)]), (2, 5));
    assert_eq!(most_at_once(&[(0, 10, 0), (1, 9, 1), (2, 8, 2)]).0, 3);
    let lines = parse_log("start 3 abc 100 42\nend 3 abc 200 42\nend 3 abc 300 42\ngarbage\n");
    let seen = Seen::from(&lines);
    assert_eq!(seen.start[&3].nanos, 100);
    assert_eq!(seen.end[&3].nanos, 200, "the first end counts");
    assert!(seen.running(3).is_none());
    assert_eq!(
        lock_holders(br#"{"Limit":3,"Holders":{"a":true,"b":true,"c":false}}"#),
        ["a", "b"]
    );
    assert_eq!(lock_holders(br#"{"Limit":3,"Holders":["a"]}"#), ["a"]);
}
