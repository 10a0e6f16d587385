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
use std::process::{Command, Stdio};
use std::time::Duration;

#[allow(dead_code)] // each harness uses a part of it
mod common;

use common::{consem_bin, ms, percentile, yes};

const QUICK_ENV: &str = "CONSEM_BENCH_QUICK";
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
                let mut cmd = Command::new(consem_bin());
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
    if common::run_child_mode() {
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
        let make = |name: &str, limit: usize, command: &[String]| {
            bench.command(tool, name, limit, command)
        };
        let (median, p90, rss) = common::uncontended(&make, sizes.uncontended_runs);
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
        let make = |name: &str, limit: usize, command: &[String]| {
            bench.command(tool, name, limit, command)
        };
        let name = format!("handoff-{}", tool.name().len());
        let gap = common::handoff(
            &make,
            &bench.dir,
            &name,
            sizes.waiters,
            sizes.child_sleep,
            None,
        );
        println!(
            "| {} | {:.2} ms | {:.2} ms | {:.2} ms |",
            tool.name(),
            ms(gap[gap.len() / 2]),
            ms(percentile(&gap, 0.9)),
            ms(*gap.last().unwrap())
        );
        gaps.push((tool, gap[gap.len() / 2]));
    }
    let spawn = common::spawn_cost(sizes.uncontended_runs.min(50));
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
        let make = |name: &str, limit: usize, command: &[String]| {
            bench.command(tool, name, limit, command)
        };
        let cpu = common::waiter_cpu(&make, &format!("cpu-{}", tool.name().len()), sizes.waiting);
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
