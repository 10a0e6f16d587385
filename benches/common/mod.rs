//! What the benchmark harnesses of the stores share: the child mode (the
//! harness's own binary as the command, logging when it starts and ends),
//! and the measures that do not depend on the tool measured.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The consem binary measured: this build's, or another (an older
/// release, to compare) named by `CONSEM_BENCH_BIN`.
pub fn consem_bin() -> String {
    std::env::var("CONSEM_BENCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_consem").to_string())
}

/// Set in the child mode: the harness's binary is also the command it runs.
pub const CHILD_LOG_ENV: &str = "CONSEM_BENCH_CHILD_LOG";
pub const CHILD_SLEEP_ENV: &str = "CONSEM_BENCH_CHILD_SLEEP_MS";
/// A file the command waits for after its sleep, before it logs its end:
/// the harness makes it once the waiters have queued.
pub const CHILD_GO_ENV: &str = "CONSEM_BENCH_CHILD_GO";

/// Makes the command that runs `command` under one of `limit` slots named
/// `name`, with one tool or another.
pub type Make<'a> = dyn Fn(&str, usize, &[String]) -> Command + 'a;

/// Runs the child mode if this process is a child; true if it was.
pub fn run_child_mode() -> bool {
    match std::env::var(CHILD_LOG_ENV) {
        Ok(log) => {
            child(&log);
            true
        }
        Err(_) => false,
    }
}

pub fn yes(met: bool) -> &'static str {
    if met {
        "yes"
    } else {
        "no"
    }
}

/// The child mode: log our start, sleep, log our end (nanoseconds since the
/// epoch), so that gaps are measured from inside the commands.
fn child(log: &str) {
    let sleep: u64 = std::env::var(CHILD_SLEEP_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let start = now_ns();
    std::thread::sleep(Duration::from_millis(sleep));
    if let Some(go) = std::env::var_os(CHILD_GO_ENV) {
        while !Path::new(&go).exists() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let end = now_ns();
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(log)
        .unwrap();
    writeln!(file, "{start} {end}").unwrap();
}

pub fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

pub fn self_command() -> Vec<String> {
    vec![std::env::current_exe().unwrap().display().to_string()]
}

/// `runs` uncontended runs of `true`, one after the other: the median and
/// 90th percentile of the wall time, and the largest peak RSS.
pub fn uncontended(make: &Make, runs: usize) -> (Duration, Duration, f64) {
    let mut walls = Vec::new();
    let mut peak = 0.0f64;
    for run in 0..runs {
        let mut cmd = make(&format!("uncontended-{run}"), 2, &["true".to_string()]);
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        let started = Instant::now();
        let (status, rss) = run_measured(cmd);
        walls.push(started.elapsed());
        assert!(status == 0, "an uncontended run failed: {status}");
        peak = peak.max(rss);
    }
    walls.sort();
    (walls[walls.len() / 2], percentile(&walls, 0.9), peak)
}

/// Runs `cmd` and returns its exit status and the largest peak RSS (MiB) of
/// it and the processes it waited for, from `wait4`.
pub fn run_measured(mut cmd: Command) -> (i32, f64) {
    let child = cmd.spawn().unwrap();
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for a child we spawned and have not reaped.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(rc, pid);
    std::mem::forget(child);
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    (code, usage.ru_maxrss as f64 / 1024.0)
}

/// How many contenders a store shows queued under a name (with their key,
/// and waiting on it): lets the holder end only once every waiter has
/// queued and gone quiet, so that no gap includes a waiter's own start.
pub type Queued<'a> = dyn Fn(&str) -> usize + 'a;

/// A holder and `waiters` waiters, each running this binary in child mode
/// for `child_sleep`; returns the sorted gaps between one's end and the
/// next one's start. Without `queued`, the waiters start 20 ms after the
/// holder and the first gaps may include their start.
pub fn handoff(
    make: &Make,
    dir: &Path,
    name: &str,
    waiters: usize,
    child_sleep: Duration,
    queued: Option<&Queued>,
) -> Vec<Duration> {
    let log = dir.join(format!("{name}.log"));
    let go = dir.join(format!("{name}.go"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let until_queued = |queued: &Queued, n: usize| {
        while queued(name) < n {
            assert!(
                Instant::now() < deadline,
                "{name}: {n} contenders never queued"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let spawn = |i: usize| -> Child {
        let mut cmd = make(name, 1, &self_command());
        cmd.env(CHILD_LOG_ENV, &log)
            .env(CHILD_SLEEP_ENV, child_sleep.as_millis().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if i == 0 && queued.is_some() {
            cmd.env(CHILD_GO_ENV, &go);
        }
        let child = cmd.spawn().unwrap();
        // Let the holder start before the waiters queue.
        if i == 0 {
            match queued {
                Some(queued) => until_queued(queued, 1),
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        child
    };
    let children: Vec<Child> = (0..=waiters).map(spawn).collect();
    if let Some(queued) = queued {
        until_queued(queued, waiters + 1);
        // Quiet: the waiters together used under a millisecond of CPU in
        // the last 10 ms (a queued one sleeps; one still starting does not).
        let waiters_cpu = || {
            children[1..]
                .iter()
                .map(|c| tree_cpu(c.id()))
                .sum::<Duration>()
        };
        let mut before = waiters_cpu();
        loop {
            assert!(
                Instant::now() < deadline,
                "{name}: the waiters never went quiet"
            );
            std::thread::sleep(Duration::from_millis(10));
            let now = waiters_cpu();
            if now.saturating_sub(before) < Duration::from_millis(1) {
                break;
            }
            before = now;
        }
        std::fs::write(&go, "").unwrap();
    }
    for mut child in children {
        let status = child.wait().unwrap();
        assert!(status.success(), "{name}: a contender failed");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let mut runs: Vec<(u128, u128)> = text
        .lines()
        .map(|l| {
            let mut parts = l.split(' ').map(|p| p.parse::<u128>().unwrap());
            (parts.next().unwrap(), parts.next().unwrap())
        })
        .collect();
    runs.sort();
    let mut gaps: Vec<Duration> = runs
        .windows(2)
        .map(|w| Duration::from_nanos(w[1].0.saturating_sub(w[0].1) as u64))
        .collect();
    gaps.sort();
    gaps
}

/// N contenders started at once on `limit` slots named `name`, each
/// running `sleep`: the wall time until the last is done, and the overhead
/// per round beyond the sleeping (`N/limit` rounds, ideally).
pub fn crowd(
    make: &Make,
    name: &str,
    n: usize,
    limit: usize,
    sleep: Duration,
) -> (Duration, Duration) {
    let started = Instant::now();
    let children: Vec<Child> = (0..n)
        .map(|_| {
            make(
                name,
                limit,
                &["sleep".to_string(), format!("{}", sleep.as_secs_f64())],
            )
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(
            child.wait().unwrap().success(),
            "{name}: a contender failed"
        );
    }
    let wall = started.elapsed();
    let rounds = n.div_ceil(limit) as u32;
    (wall, wall.saturating_sub(sleep * rounds) / rounds)
}

/// What starting the child costs by itself: spawn it and wait.
pub fn spawn_cost(runs: usize) -> Duration {
    let log = std::env::temp_dir().join(format!("consem-bench-spawn-{}", std::process::id()));
    let mut walls: Vec<Duration> = (0..runs)
        .map(|_| {
            let started = Instant::now();
            Command::new(&self_command()[0])
                .env(CHILD_LOG_ENV, &log)
                .status()
                .unwrap();
            started.elapsed()
        })
        .collect();
    let _ = std::fs::remove_file(&log);
    walls.sort();
    walls[walls.len() / 2]
}

/// One holder sleeps; one waiter waits `waiting`; its CPU time (every
/// thread and every descendant, from /proc schedstat) over that time.
pub fn waiter_cpu(make: &Make, name: &str, waiting: Duration) -> Duration {
    let hold = (waiting + Duration::from_secs(1)).as_secs_f64();
    let mut holder = make(name, 1, &["sleep".to_string(), format!("{hold}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mut waiter = make(name, 1, &["true".to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Start counting once the waiter is set up.
    std::thread::sleep(Duration::from_millis(300));
    let before = tree_cpu(waiter.id());
    std::thread::sleep(waiting);
    let after = tree_cpu(waiter.id());
    holder.wait().unwrap();
    waiter.wait().unwrap();
    after.saturating_sub(before)
}

/// CPU time of `pid`, its threads and its descendants (helpers that some
/// tools run), from /proc.
pub fn tree_cpu(pid: u32) -> Duration {
    let mut total = 0u64;
    let mut stack = vec![pid];
    while let Some(pid) = stack.pop() {
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for task in tasks.flatten() {
                if let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) {
                    total += text
                        .split(' ')
                        .next()
                        .and_then(|n| n.parse::<u64>().ok())
                        .unwrap_or(0);
                }
                if let Ok(children) = std::fs::read_to_string(task.path().join("children")) {
                    stack.extend(
                        children
                            .split_whitespace()
                            .filter_map(|c| c.parse::<u32>().ok()),
                    );
                }
            }
        }
    }
    Duration::from_nanos(total)
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub fn percentile(sorted: &[Duration], q: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}
