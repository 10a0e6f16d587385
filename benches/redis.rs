//! Benchmark of the Redis store, side by side with the basic sorted-set
//! semaphore that applications copy (`benches/redis_semaphore.py`: expire,
//! count, add, else sleep 100 ms; Python's `redis` package), on one
//! redis-server the harness starts on a free loopback port, with one
//! replica (`--replicaof`) so that `--redis-wait-replicas 1` can be
//! measured on the same primary. Prints:
//!
//! - uncontended: wall time (median) and peak RSS of a run of `true`;
//! - handoff gap at limit 1 with 12 waiters queued, median and p90;
//! - both again with `--redis-wait-replicas 1` (a `WAIT` for the replica
//!   after each grant and renewal): the option's cost;
//! - overhead per round at N=100 contenders on limit 5 (each runs 200 ms);
//! - a waiter's CPU over 5 s of waiting;
//! - Redis commands per contender (from `INFO commandstats`, scripts' own
//!   commands included) at N=20 and N=100 on limit 5: constant in N means
//!   no herd.
//!
//! Run it with:
//!
//!     cargo bench --bench redis
//!     CONSEM_BENCH_QUICK=1 cargo bench --profile dev --bench redis   # tiny sizes (CI)

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{consem_bin, ms, percentile, yes};

const QUICK_ENV: &str = "CONSEM_BENCH_QUICK";
const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/redis_semaphore.py");

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tool {
    Consem,
    /// consem with `--redis-wait-replicas 1`.
    ConsemWaiting,
    Python,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Consem => "consem --store redis://",
            Tool::ConsemWaiting => "consem --store redis:// --redis-wait-replicas 1",
            Tool::Python => "basic client, polling 100 ms",
        }
    }
}

struct Server {
    port: u16,
    process: Child,
}

impl Server {
    fn start(dir: &Path, extra: &[&str]) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let process = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(dir)
            .args(extra)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server is needed (apt-get install redis-server)");
        let server = Server { port, process };
        let deadline = Instant::now() + Duration::from_secs(20);
        while server.redis(&["PING"]).is_none() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// A replica of this server, once this server counts it acknowledged.
    fn replica(&self, dir: &Path) -> Server {
        std::fs::create_dir_all(dir).unwrap();
        let replica = Server::start(dir, &["--replicaof", "127.0.0.1", &self.port.to_string()]);
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.redis(&["WAIT", "1", "100"]).as_deref().map(str::trim) != Some("1") {
            assert!(Instant::now() < deadline, "the replica did not connect");
        }
        replica
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn redis(&self, args: &[&str]) -> Option<String> {
        let output = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .ok()?;
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Calls of every command so far.
    fn commands(&self) -> u64 {
        self.redis(&["INFO", "commandstats"])
            .unwrap_or_default()
            .lines()
            .filter_map(|line| {
                line.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

fn command(server: &Server, tool: Tool, name: &str, limit: usize, run: &[String]) -> Command {
    match tool {
        Tool::Consem | Tool::ConsemWaiting => {
            let mut cmd = Command::new(consem_bin());
            cmd.args([
                "run",
                "--store",
                &server.url(),
                "--prefix",
                name,
                "--limit",
                &limit.to_string(),
            ]);
            if tool == Tool::ConsemWaiting {
                cmd.args(["--redis-wait-replicas", "1"]);
            }
            cmd.arg("--").args(run);
            cmd
        }
        Tool::Python => {
            let mut cmd = Command::new("python3");
            cmd.args([CLIENT, &server.url(), name, &limit.to_string()])
                .args(run);
            cmd
        }
    }
}

/// N contenders started at once on `limit` slots, each running `sleep`:
/// the overhead per round beyond the sleeping, and the commands per
/// contender.
fn crowd(server: &Server, tool: Tool, n: usize, limit: usize, sleep: Duration) -> (Duration, f64) {
    let before = server.commands();
    let make = |name: &str, limit: usize, run: &[String]| command(server, tool, name, limit, run);
    let name = format!("crowd-{n}-{}", tool.name().len());
    let (_, overhead) = common::crowd(&make, &name, n, limit, sleep);
    let commands = (server.commands() - before) as f64 / n as f64;
    (overhead, commands)
}

fn python_available() -> bool {
    Command::new("python3")
        .args(["-c", "import redis"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn main() {
    if common::run_child_mode() {
        return;
    }
    let quick = std::env::var(QUICK_ENV).is_ok_and(|v| !v.is_empty());
    let (runs, waiters, crowd_sizes, child_sleep) = if quick {
        (5, 3, vec![10], Duration::from_millis(20))
    } else {
        (100, 12, vec![20, 100], Duration::from_millis(50))
    };
    let dir: PathBuf =
        std::env::temp_dir().join(format!("consem-bench-redis-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let server = Server::start(&dir, &[]);
    let replica = server.replica(&dir.join("replica"));
    let mut tools = vec![Tool::Consem, Tool::ConsemWaiting];
    println!(
        "# Redis store benchmark{}",
        if quick {
            " (quick: tiny sizes, figures only show the harness works)"
        } else {
            ""
        }
    );
    println!(
        "(redis-server on 127.0.0.1:{}, with a replica on 127.0.0.1:{}, started by the harness)",
        server.port, replica.port
    );
    if python_available() {
        tools.push(Tool::Python);
    } else {
        println!("(Python's redis package is missing: pip install redis to compare with the basic client)");
    }

    println!("\n## uncontended run of `true` ({runs} runs each)");
    println!("| tool | wall median | wall p90 | peak RSS |");
    println!("|---|---|---|---|");
    for &tool in &tools {
        let make =
            |name: &str, limit: usize, run: &[String]| command(&server, tool, name, limit, run);
        let (median, p90, rss) = common::uncontended(&make, runs);
        println!(
            "| {} | {:.2} ms | {:.2} ms | {:.1} MiB |",
            tool.name(),
            ms(median),
            ms(p90),
            rss
        );
    }

    println!("\n## handoff gap at limit 1, {waiters} waiters queued (one command's end to the next one's start)");
    println!("| tool | median | p90 | max |");
    println!("|---|---|---|---|");
    let mut gaps = Vec::new();
    for &tool in &tools {
        let make =
            |name: &str, limit: usize, run: &[String]| command(&server, tool, name, limit, run);
        let name = format!("handoff-{}", tool.name().len());
        let gap = common::handoff(&make, &dir, &name, waiters, child_sleep, None);
        println!(
            "| {} | {:.2} ms | {:.2} ms | {:.2} ms |",
            tool.name(),
            ms(gap[gap.len() / 2]),
            ms(percentile(&gap, 0.9)),
            ms(*gap.last().unwrap())
        );
        gaps.push((tool, gap[gap.len() / 2]));
    }
    let spawn = common::spawn_cost(runs.min(50));
    println!("(starting the command alone, median: {:.2} ms)", ms(spawn));

    let waiting = if quick {
        Duration::from_millis(500)
    } else {
        Duration::from_secs(5)
    };
    println!(
        "\n## a waiter's CPU over {:.1} s of waiting",
        waiting.as_secs_f64()
    );
    println!("| tool | CPU |");
    println!("|---|---|");
    // A waiter sends no WAIT: the option changes nothing here.
    for &tool in tools.iter().filter(|&&tool| tool != Tool::ConsemWaiting) {
        let make =
            |name: &str, limit: usize, run: &[String]| command(&server, tool, name, limit, run);
        let cpu = common::waiter_cpu(&make, &format!("cpu-{}", tool.name().len()), waiting);
        println!("| {} | {:.2} ms |", tool.name(), ms(cpu));
    }

    println!("\n## crowds on limit 5, each contender sleeping 200 ms");
    println!("| tool | N | overhead per round | Redis commands per contender |");
    println!("|---|---|---|---|");
    let mut per_contender = Vec::new();
    for &tool in &tools {
        for &n in &crowd_sizes {
            let (overhead, commands) = crowd(&server, tool, n, 5, Duration::from_millis(200));
            println!(
                "| {} | {n} | {:.1} ms | {commands:.1} |",
                tool.name(),
                ms(overhead)
            );
            if tool == Tool::Consem {
                per_contender.push(commands);
            }
        }
    }

    let of = |tool: Tool| gaps.iter().find(|(t, _)| *t == tool).map(|(_, g)| *g);
    println!("\n## goals");
    println!("| goal | figure | met |");
    println!("|---|---|---|");
    if let (Some(ours), Some(theirs)) = (of(Tool::Consem), of(Tool::Python)) {
        let ratio = ms(ours) / ms(theirs);
        println!(
            "| handoff gap at most a fifth of the polling client's | {ratio:.2} of it | {} |",
            yes(ratio <= 0.2)
        );
    }
    if let Some(ours) = of(Tool::Consem) {
        let over = ms(ours) - ms(spawn);
        println!("| handoff gap under 2 ms plus starting the command | {over:.2} ms over the start | {} |", yes(over < 2.0));
    }
    if let (Some(first), Some(last)) = (per_contender.first(), per_contender.last()) {
        let growth = last / first;
        println!(
            "| commands per contender constant in N | {first:.1} at N={} to {last:.1} at N={} | {} |",
            crowd_sizes[0],
            crowd_sizes[crowd_sizes.len() - 1],
            yes(growth < 1.5)
        );
    }
    if quick {
        println!("(quick mode: sizes too small to judge)");
    }
    drop(replica);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
