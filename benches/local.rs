//! Benchmark of the local store, side by side with what people use on one
//! host instead: `flock(1)` on one of N lock files (tried with `flock -n` in
//! turn, as a script would), and GNU parallel's `sem` if it is installed.
//! Prints one report on stdout:
//!
//! - uncontended: wall time (median) and peak RSS of a run of `true`;
//! - handoff gap at limit 1 with 12 waiters queued: from one command's end
//!   to the next one's start, median and 90th percentile;
//! - a waiter's CPU time over 5 s of waiting.
//!
//! Run it with:
//!
//!     cargo bench --bench local
//!     CONSEM_BENCH_QUICK=1 cargo bench --profile dev --bench local   # tiny sizes (CI)
//!
//! Goals (docs/performance.md): uncontended within 2x of `flock(1)`; a
//! handoff gap under 1 ms plus the cost of starting the command; a waiter's
//! CPU under 10 ms over 5 s. Figures, not assertions: nothing here fails on
//! a slow machine.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const CONSEM: &str = env!("CARGO_BIN_EXE_consem");
const QUICK_ENV: &str = "CONSEM_BENCH_QUICK";
/// Set in the child mode: the bench binary is also the command it runs.
const CHILD_LOG_ENV: &str = "LOCAL_BENCH_CHILD_LOG";
const CHILD_SLEEP_ENV: &str = "LOCAL_BENCH_CHILD_SLEEP_MS";

struct Sizes {
    uncontended_runs: usize,
    waiters: usize,
    child_sleep: Duration,
    waiting: Duration,
}

/// One of the tools compared.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tool {
    Consem,
    Flock,
    Sem,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Consem => "consem --store local",
            Tool::Flock => "flock(1), N lock files",
            Tool::Sem => "GNU parallel sem",
        }
    }
}

struct Bench {
    dir: PathBuf,
    sem_available: bool,
}

impl Bench {
    /// The command that runs `command` under one of `limit` slots named
    /// `name`, waiting for it.
    fn command(&self, tool: Tool, name: &str, limit: usize, command: &[String]) -> Command {
        match tool {
            Tool::Consem => {
                let mut cmd = Command::new(CONSEM);
                cmd.args(["run", "--store"])
                    .arg(format!("local:{}", self.dir.join("consem").display()))
                    .args(["--prefix", name, "--limit", &limit.to_string(), "--"])
                    .args(command);
                cmd
            }
            Tool::Flock => {
                // What a script does for N slots with flock(1): try each
                // lock file without waiting, and wait on the first one
                // when all are taken.
                let base = self.dir.join(format!("flock-{name}"));
                let script = format!(
                    r#"for i in $(seq 1 {limit}); do flock -n -E 75 "{base}.$i" "$@"; rc=$?; [ $rc -ne 75 ] && exit $rc; done; exec flock "{base}.1" "$@""#,
                    base = base.display()
                );
                let mut cmd = Command::new("sh");
                cmd.args(["-c", &script, "sh"]).args(command);
                cmd
            }
            Tool::Sem => {
                let mut cmd = Command::new("sem");
                cmd.env("HOME", self.dir.join("sem-home"))
                    .args([
                        "--will-cite",
                        "--fg",
                        "--id",
                        name,
                        "-j",
                        &limit.to_string(),
                    ])
                    .args(command);
                cmd
            }
        }
    }

    fn tools(&self) -> Vec<Tool> {
        let mut tools = vec![Tool::Consem, Tool::Flock];
        if self.sem_available {
            tools.push(Tool::Sem);
        }
        tools
    }
}

fn main() {
    if let Ok(log) = std::env::var(CHILD_LOG_ENV) {
        child(&log);
        return;
    }
    let quick = std::env::var(QUICK_ENV).is_ok_and(|v| !v.is_empty());
    let sizes = if quick {
        Sizes {
            uncontended_runs: 5,
            waiters: 3,
            child_sleep: Duration::from_millis(20),
            waiting: Duration::from_millis(500),
        }
    } else {
        Sizes {
            uncontended_runs: 200,
            waiters: 12,
            child_sleep: Duration::from_millis(50),
            waiting: Duration::from_secs(5),
        }
    };
    // A tmpfs, as /run/lock (the local store's default) is on most systems.
    let scratch = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let dir = scratch.join(format!("consem-bench-local-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("sem-home")).unwrap();
    let bench = Bench {
        sem_available: Command::new("sem")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success()),
        dir: dir.clone(),
    };
    println!(
        "# local store benchmark{}",
        if quick {
            " (quick: tiny sizes, figures only show the harness works)"
        } else {
            ""
        }
    );
    println!("(lock files and the store in {})", scratch.display());
    if !bench.sem_available {
        println!(
            "(GNU parallel's sem is not installed: apt-get install parallel to compare with it)"
        );
    }

    println!(
        "\n## uncontended run of `true` ({} runs each)",
        sizes.uncontended_runs
    );
    println!("| tool | wall median | wall p90 | peak RSS |");
    println!("|---|---|---|---|");
    let mut walls = Vec::new();
    for tool in bench.tools() {
        let (median, p90, rss) = uncontended(&bench, tool, &sizes);
        println!(
            "| {} | {:.2} ms | {:.2} ms | {:.1} MiB |",
            tool.name(),
            ms(median),
            ms(p90),
            rss
        );
        walls.push((tool, median));
    }

    println!(
        "\n## handoff gap at limit 1, {} waiters queued (one command's end to the next one's start)",
        sizes.waiters
    );
    println!("| tool | median | p90 | max |");
    println!("|---|---|---|---|");
    let mut gaps = Vec::new();
    for tool in bench.tools() {
        let gap = handoff(&bench, tool, &sizes);
        println!(
            "| {} | {:.2} ms | {:.2} ms | {:.2} ms |",
            tool.name(),
            ms(gap[gap.len() / 2]),
            ms(percentile(&gap, 0.9)),
            ms(*gap.last().unwrap())
        );
        gaps.push((tool, gap[gap.len() / 2]));
    }
    let spawn = spawn_cost(&sizes);
    println!(
        "(starting the command alone, fork+exec of this binary in child mode, median: {:.2} ms)",
        ms(spawn)
    );

    println!(
        "\n## a waiter's CPU over {:.1} s of waiting",
        sizes.waiting.as_secs_f64()
    );
    println!("| tool | CPU |");
    println!("|---|---|");
    let mut cpus = Vec::new();
    for tool in bench.tools() {
        let cpu = waiter_cpu(&bench, tool, &sizes);
        println!("| {} | {:.2} ms |", tool.name(), ms(cpu));
        cpus.push((tool, cpu));
    }

    let of =
        |list: &[(Tool, Duration)], tool: Tool| list.iter().find(|(t, _)| *t == tool).unwrap().1;
    let ratio = ms(of(&walls, Tool::Consem)) / ms(of(&walls, Tool::Flock));
    let gap_over_spawn = ms(of(&gaps, Tool::Consem)) - ms(spawn);
    let cpu = ms(of(&cpus, Tool::Consem));
    println!("\n## goals");
    println!("| goal | figure | met |");
    println!("|---|---|---|");
    println!(
        "| uncontended wall within 2x of flock(1) | {ratio:.2}x | {} |",
        yes(ratio <= 2.0)
    );
    println!("| handoff gap under 1 ms plus starting the command | {gap_over_spawn:.2} ms over the start | {} |", yes(gap_over_spawn < 1.0));
    println!(
        "| a waiter's CPU under 10 ms over 5 s | {cpu:.2} ms | {} |",
        yes(cpu < 10.0)
    );
    if quick {
        println!("(quick mode: sizes too small to judge)");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn yes(met: bool) -> &'static str {
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
    let end = now_ns();
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(log)
        .unwrap();
    writeln!(file, "{start} {end}").unwrap();
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn self_command() -> Vec<String> {
    vec![std::env::current_exe().unwrap().display().to_string()]
}

fn uncontended(bench: &Bench, tool: Tool, sizes: &Sizes) -> (Duration, Duration, f64) {
    let mut walls = Vec::new();
    let mut peak = 0.0f64;
    for run in 0..sizes.uncontended_runs {
        let mut cmd = bench.command(
            tool,
            &format!("uncontended-{run}"),
            2,
            &["true".to_string()],
        );
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        let started = Instant::now();
        let (status, rss) = run_measured(cmd);
        walls.push(started.elapsed());
        assert!(status == 0, "{} failed: {status}", tool.name());
        peak = peak.max(rss);
    }
    walls.sort();
    (walls[walls.len() / 2], percentile(&walls, 0.9), peak)
}

/// Runs `cmd` and returns its exit status and the largest peak RSS (MiB) of
/// it and the processes it waited for, from `wait4`.
fn run_measured(mut cmd: Command) -> (i32, f64) {
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

/// A holder and `waiters` waiters, each running this binary in child mode
/// for `child_sleep`; returns the sorted gaps between one's end and the
/// next one's start.
fn handoff(bench: &Bench, tool: Tool, sizes: &Sizes) -> Vec<Duration> {
    let name = format!("handoff-{}", tool.name().len());
    let log = bench.dir.join(format!("handoff-{}.log", tool.name().len()));
    let spawn = |i: usize| -> Child {
        let mut cmd = bench.command(tool, &name, 1, &self_command());
        cmd.env(CHILD_LOG_ENV, &log)
            .env(CHILD_SLEEP_ENV, sizes.child_sleep.as_millis().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd.spawn().unwrap();
        // Let each one queue before the next arrives.
        if i == 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
        child
    };
    let children: Vec<Child> = (0..=sizes.waiters).map(spawn).collect();
    for mut child in children {
        let status = child.wait().unwrap();
        assert!(status.success(), "{}: a contender failed", tool.name());
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

/// What starting the child costs by itself: spawn it and wait.
fn spawn_cost(sizes: &Sizes) -> Duration {
    let log = std::env::temp_dir().join(format!("consem-bench-spawn-{}", std::process::id()));
    let mut walls: Vec<Duration> = (0..sizes.uncontended_runs.min(50))
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
/// thread, from /proc schedstat, in nanoseconds) is read at the end.
fn waiter_cpu(bench: &Bench, tool: Tool, sizes: &Sizes) -> Duration {
    let name = format!("cpu-{}", tool.name().len());
    let hold = (sizes.waiting + Duration::from_secs(1)).as_secs_f64();
    let mut holder = bench
        .command(tool, &name, 1, &["sleep".to_string(), format!("{hold}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mut waiter = bench
        .command(tool, &name, 1, &["true".to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Start counting once the waiter is set up.
    std::thread::sleep(Duration::from_millis(300));
    let before = tree_cpu(waiter.id());
    std::thread::sleep(sizes.waiting);
    let after = tree_cpu(waiter.id());
    holder.wait().unwrap();
    waiter.wait().unwrap();
    after.saturating_sub(before)
}

/// CPU time of `pid`, its threads and its descendants (sem and the flock
/// script run helpers), from /proc.
fn tree_cpu(pid: u32) -> Duration {
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

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}
