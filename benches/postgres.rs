//! Benchmark of the PostgreSQL store, side by side on one server with what
//! people write today: a `psql` session that polls `pg_try_advisory_lock`
//! over the N keys (every 100 ms, in a `DO` loop) and then runs the command
//! with `\!` while it holds the lock, and one that waits in a blocking
//! `pg_advisory_lock` on one of the N keys (its slot picked in turn, as a
//! script that cannot wait for "any of N" does). The harness starts its own
//! server (PostgreSQL 15 as Debian installs it, as `nobody` when run as
//! root) on a free loopback port. Prints:
//!
//! - uncontended: wall time (median, p90) and peak RSS of a run of `true`;
//! - handoff gap at limit 1 with 12 waiters queued (one command's end to the
//!   next one's start, measured inside the commands);
//! - a waiter's CPU over 5 s of waiting;
//! - overhead per round of a crowd at N=100 contenders on limit 5 (each runs
//!   200 ms), and the most that ran at once.
//!
//! Run it with:
//!
//!     cargo bench --bench postgres
//!     CONSEM_BENCH_QUICK=1 cargo bench --profile dev --bench postgres   # tiny sizes
//!
//! Nothing is asserted about the figures.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{consem_bin, ms, percentile, yes};

const QUICK_ENV: &str = "CONSEM_BENCH_QUICK";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tool {
    Consem,
    PsqlPolling,
    PsqlBlocking,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Consem => "consem",
            Tool::PsqlPolling => "psql, pg_try_advisory_lock every 100 ms",
            Tool::PsqlBlocking => "psql, pg_advisory_lock on one slot",
        }
    }
}

/// The newest PostgreSQL installed as Debian installs it.
fn bin(name: &str) -> PathBuf {
    let mut versions: Vec<u32> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is needed (apt-get install postgresql)")
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    versions.sort_unstable();
    PathBuf::from(format!(
        "/usr/lib/postgresql/{}/bin/{name}",
        versions.last().expect("no /usr/lib/postgresql/<version>")
    ))
}

/// `program` as `nobody` when we are root (the server refuses root).
fn unprivileged(program: &Path) -> Command {
    let mut command = Command::new("setpriv");
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        command.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"]);
    }
    command.args(["--pdeathsig", "INT", "--"]).arg(program);
    command
}

struct Server {
    port: u16,
    process: Child,
}

impl Server {
    fn start(dir: &Path) -> Server {
        let data = dir.join("data");
        std::fs::create_dir_all(dir).unwrap();
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            let status = Command::new("chown")
                .args(["-R", "nobody:nogroup"])
                .arg(dir)
                .status()
                .unwrap();
            assert!(status.success());
        }
        let output = unprivileged(&bin("initdb"))
            .args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale",
                "C",
                "-D",
            ])
            .arg(&data)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let process = unprivileged(&bin("postgres"))
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-k"])
            .arg(dir)
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "max_connections=300",
            ])
            .args(["-c", "fsync=off", "-c", "log_min_messages=fatal"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let server = Server { port, process };
        let deadline = Instant::now() + Duration::from_secs(30);
        while server.sql("SELECT 1").is_none() {
            assert!(Instant::now() < deadline, "postgres did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    fn psql(&self) -> Command {
        let mut command = Command::new(bin("psql"));
        command.args([
            "-XAtq",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-d",
            "postgres",
        ]);
        command.args(["-p", &self.port.to_string()]);
        command
    }

    fn sql(&self, sql: &str) -> Option<String> {
        let output = self.psql().args(["-c", sql]).output().ok()?;
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our child, not yet reaped.
        unsafe { libc::kill(self.process.id() as i32, libc::SIGINT) };
        let _ = self.process.wait();
    }
}

/// The advisory key the psql tools use for a name, and consem's too (the
/// first key of a prefix, as docs/design.md says).
fn key(name: &str) -> i32 {
    name.bytes().fold(0x811c_9dc5u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    }) as i32
}

/// A shell word of `text`.
fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// Picks the blocking tool's slots in turn.
static NEXT_SLOT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn command(server: &Server, tool: Tool, name: &str, limit: usize, run: &[String]) -> Command {
    let k = key(name);
    let shell: Vec<String> = run.iter().map(|word| quoted(word)).collect();
    let shell = shell.join(" ");
    match tool {
        Tool::Consem => {
            let mut command = Command::new(consem_bin());
            command.args(["run", "--store"]);
            command.arg(format!(
                "postgres://postgres@127.0.0.1:{}/postgres",
                server.port
            ));
            command.args(["--prefix", name, "--limit", &limit.to_string(), "--"]);
            command.args(run);
            command
        }
        Tool::PsqlPolling => {
            let mut command = server.psql();
            command.args([
                "-c",
                &format!(
                    "DO $$ BEGIN LOOP FOR k IN 0..{} LOOP IF pg_try_advisory_lock({k}, k) THEN RETURN; END IF; END LOOP; PERFORM pg_sleep(0.1); END LOOP; END $$",
                    limit - 1
                ),
            ]);
            command.args(["-c", &format!("\\! {shell}")]);
            command
        }
        Tool::PsqlBlocking => {
            let slot = NEXT_SLOT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % limit;
            let mut command = server.psql();
            command.args(["-c", &format!("SELECT pg_advisory_lock({k}, {slot})")]);
            command.args(["-c", &format!("\\! {shell}")]);
            command
        }
    }
}

/// Sessions of `name`'s tool: with an advisory lock of its key (held or
/// awaited), or, for the polling tool, polling for one.
fn queued(server: &Server, name: &str) -> usize {
    let k = key(name);
    server
        .sql(&format!(
            "SELECT count(DISTINCT pid) FROM pg_stat_activity WHERE pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = {}) OR query LIKE '%pg_try_advisory_lock({k}, k)%'",
            k as u32
        ))
        .and_then(|count| count.parse().ok())
        .unwrap_or(0)
}

fn main() {
    if common::run_child_mode() {
        return;
    }
    let quick = std::env::var(QUICK_ENV).is_ok_and(|v| !v.is_empty());
    let (runs, waiters, crowd, child_sleep) = if quick {
        (5, 3, 10, Duration::from_millis(20))
    } else {
        (50, 12, 100, Duration::from_millis(50))
    };
    let dir = std::env::temp_dir().join(format!("consem-bench-postgres-{}", std::process::id()));
    let server = Server::start(&dir);
    let tools = [Tool::Consem, Tool::PsqlPolling, Tool::PsqlBlocking];
    println!(
        "# PostgreSQL store benchmark{}",
        if quick {
            " (quick: tiny sizes, figures only show the harness works)"
        } else {
            ""
        }
    );
    println!(
        "(PostgreSQL {} on 127.0.0.1:{}, started by the harness)",
        server.sql("SHOW server_version").unwrap_or_default(),
        server.port
    );

    println!("\n## uncontended run of `true` ({runs} runs each)");
    println!("| tool | wall median | wall p90 | peak RSS |");
    println!("|---|---|---|---|");
    let mut uncontended = Vec::new();
    for tool in tools {
        let make =
            |name: &str, limit: usize, run: &[String]| command(&server, tool, name, limit, run);
        let (median, p90, rss) = common::uncontended(&make, runs);
        uncontended.push((median, rss));
        println!(
            "| {} | {:.2} ms | {:.2} ms | {:.1} MiB |",
            tool.name(),
            ms(median),
            ms(p90),
            rss
        );
    }

    println!("\n## handoff gap at limit 1, {waiters} waiters queued (one command's end to the next one's start)");
    println!("| tool | median | mean | p90 | max |");
    println!("|---|---|---|---|---|");
    let mut handoffs = Vec::new();
    for tool in tools {
        let make =
            |name: &str, limit: usize, run: &[String]| command(&server, tool, name, limit, run);
        let name = format!("handoff-{}", tool.name().len());
        let count = |name: &str| queued(&server, name);
        let gaps = common::handoff(&make, &dir, &name, waiters, child_sleep, Some(&count));
        let mean = gaps.iter().sum::<Duration>() / gaps.len() as u32;
        handoffs.push(mean);
        println!(
            "| {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms |",
            tool.name(),
            ms(gaps[gaps.len() / 2]),
            ms(mean),
            ms(percentile(&gaps, 0.9)),
            ms(*gaps.last().unwrap())
        );
    }

    println!(
        "(starting the command alone, median: {:.2} ms)",
        ms(common::spawn_cost(runs.min(50)))
    );

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
    for tool in tools {
        let make =
            |name: &str, limit: usize, run: &[String]| command(&server, tool, name, limit, run);
        let cpu = common::waiter_cpu(&make, &format!("cpu-{}", tool.name().len()), waiting);
        println!("| {} | {:.2} ms |", tool.name(), ms(cpu));
    }

    let limit = 5;
    let sleep = Duration::from_millis(200);
    println!(
        "\n## a crowd: N={crowd} started at once on limit {limit}, each runs {} ms",
        sleep.as_millis()
    );
    println!("| tool | wall | overhead per round | most at once |");
    println!("|---|---|---|---|");
    for tool in tools {
        let name = format!("crowd-{}", tool.name().len());
        let log = dir.join(format!("{name}.log"));
        // Each command logs its start and end, so that the most at once
        // is counted from inside the commands.
        let make = |name: &str, limit: usize, _: &[String]| {
            let script = format!(
                "echo start >> {0}; sleep {1}; echo end >> {0}",
                quoted(&log.display().to_string()),
                sleep.as_secs_f64()
            );
            command(
                &server,
                tool,
                name,
                limit,
                &["sh".into(), "-c".into(), script],
            )
        };
        let (wall, overhead) = common::crowd(&make, &name, crowd, limit, sleep);
        let mut running = 0usize;
        let mut most = 0usize;
        for line in std::fs::read_to_string(&log).unwrap_or_default().lines() {
            if line == "start" {
                running += 1;
            } else {
                running = running.saturating_sub(1);
            }
            most = most.max(running);
        }
        println!(
            "| {} | {:.0} ms | {:.1} ms | {most} |",
            tool.name(),
            ms(wall),
            ms(overhead),
        );
    }
    println!("\n## goals");
    println!("| goal | met |");
    println!("|---|---|");
    println!(
        "| uncontended wall at most 1/3 of the polling psql's | {} |",
        yes(uncontended[0].0 * 3 <= uncontended[1].0)
    );
    println!(
        "| handoff gap (mean) at most 1/5 of the polling psql's | {} |",
        yes(handoffs[0] * 5 <= handoffs[1])
    );
    println!(
        "| peak RSS at most 6 MiB | {} |",
        yes(uncontended[0].1 <= 6.0)
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
