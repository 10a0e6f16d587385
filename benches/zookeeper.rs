//! Benchmark of the ZooKeeper store, side by side on one 3-server ensemble
//! with what a JVM shop runs today: a command runner on Apache Curator's
//! `InterProcessSemaphoreV2` (`benches/CuratorRunner.java`, compiled at
//! start against Debian's jars), one JVM per run as cron would start it,
//! with the start-up flags that suit such a JVM (`-XX:TieredStopAtLevel=1
//! -XX:+UseSerialGC -Xmx64m`). The harness starts the ensemble itself
//! (Debian's ZooKeeper jar, three JVMs on free loopback ports, scratch data
//! directories, `forceSync=no` so that the disk is not measured) and stops
//! it at the end. Both tools get the same connect string, all three
//! servers. Prints:
//!
//! - uncontended: wall time (median, p90) and peak RSS of a run of `true`;
//! - handoff gap at limit 1 with 12 waiters queued (one command's end to the
//!   next one's start, measured inside the commands);
//! - a waiter's CPU over 5 s of waiting, once it has queued;
//! - overhead per round of a crowd at N=100 contenders on limit 5 (each runs
//!   200 ms), and the most that ran at once;
//!
//! then the goals judged on them. Run it with:
//!
//!     cargo bench --bench zookeeper
//!     CONSEM_BENCH_QUICK=1 cargo bench --profile dev --bench zookeeper   # tiny sizes (CI)
//!
//! Nothing is asserted about the figures.

#[allow(dead_code)] // each harness uses a part of it
mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{consem_bin, ms, percentile, yes, CHILD_GO_ENV, CHILD_LOG_ENV};
use consem::store::zookeeper::client::{Connection, Session, ZkError, NO_NODE};
use consem::store::zookeeper::{semaphore_path, LEASES, LOCKS};

const QUICK_ENV: &str = "CONSEM_BENCH_QUICK";
const RUNNER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/CuratorRunner.java");

/// Debian's jars that a ZooKeeper server needs.
const SERVER_JARS: &[&str] = &[
    "zookeeper.jar",
    "zookeeper-jute.jar",
    "slf4j-api.jar",
    "slf4j-nop.jar",
    "netty-handler.jar",
    "netty-transport.jar",
    "netty-common.jar",
    "netty-buffer.jar",
    "netty-codec.jar",
    "netty-resolver.jar",
    "netty-transport-native-epoll.jar",
    "netty-transport-native-unix-common.jar",
    "commons-cli.jar",
    "metrics-core.jar",
    "snappy-java.jar",
];

/// And what Curator needs beside them.
const CURATOR_JARS: &[&str] = &[
    "curator-framework.jar",
    "curator-client.jar",
    "curator-recipes.jar",
    "guava.jar",
];

/// How the runner's JVM starts: the client compiler only and the serial
/// collector start a short-lived JVM fastest.
const RUNNER_JVM: &[&str] = &["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx64m"];

const SERVERS: usize = 3;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tool {
    Consem,
    Curator,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Consem => "consem --store zk://",
            Tool::Curator => "Curator InterProcessSemaphoreV2, one JVM per run",
        }
    }
}

fn jars(names: &[&str]) -> Vec<String> {
    names
        .iter()
        .map(|jar| format!("/usr/share/java/{jar}"))
        .collect()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A 3-server ensemble on loopback; stopped when dropped.
struct Ensemble {
    client_ports: Vec<u16>,
    processes: Vec<Child>,
}

impl Ensemble {
    fn start(dir: &Path) -> Ensemble {
        let client_ports: Vec<u16> = (0..SERVERS).map(|_| free_port()).collect();
        let peers: Vec<String> = (0..SERVERS)
            .map(|i| format!("server.{}=127.0.0.1:{}:{}", i + 1, free_port(), free_port()))
            .collect();
        let classpath = jars(SERVER_JARS).join(":");
        let mut processes = Vec::new();
        for (i, port) in client_ports.iter().enumerate() {
            let home = dir.join(format!("zk{}", i + 1));
            let data = home.join("data");
            std::fs::create_dir_all(&data).unwrap();
            std::fs::write(data.join("myid"), format!("{}\n", i + 1)).unwrap();
            let config = home.join("zoo.cfg");
            // tickTime 2000 gives sessions of 4 to 40 s; maxClientCnxns=0
            // lifts the limit of 60 connections from one address, which a
            // crowd on loopback passes.
            std::fs::write(
                &config,
                format!(
                    "tickTime=2000\ninitLimit=10\nsyncLimit=5\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\nmaxClientCnxns=0\nforceSync=no\nadmin.enableServer=false\n4lw.commands.whitelist=srvr\n{}\n",
                    data.display(),
                    peers.join("\n")
                ),
            )
            .unwrap();
            let log = std::fs::File::create(home.join("zookeeper.log")).unwrap();
            let mut command = Command::new("java");
            command
                .args(["-Xmx256m", "-cp", &classpath])
                .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log);
            // The servers die with the harness, even one that panicked.
            // SAFETY: prctl(2) is async-signal-safe; the closure allocates nothing.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
            processes.push(
                command
                    .spawn()
                    .expect("java is needed: apt-get install zookeeperd (scripts/test-servers)"),
            );
        }
        let ensemble = Ensemble {
            client_ports,
            processes,
        };
        // Each server serves once the ensemble has a leader and it has
        // caught up with it.
        let deadline = Instant::now() + Duration::from_secs(120);
        for port in &ensemble.client_ports {
            while Ensemble::session_on(&[format!("127.0.0.1:{port}")])
                .and_then(|mut session| {
                    session.exists("/", false)?;
                    session.close()
                })
                .is_err()
            {
                assert!(
                    Instant::now() < deadline,
                    "the ZooKeeper ensemble did not serve within 120 s (logs in {})",
                    dir.display()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        ensemble
    }

    fn session_on(servers: &[String]) -> Result<Session, ZkError> {
        Session::open(
            &Connection {
                servers: servers.to_vec(),
                chroot: String::new(),
                request_timeout: Duration::from_secs(5),
                digest: None,
                tls: None,
            },
            Duration::from_secs(10),
        )
    }

    fn servers(&self) -> Vec<String> {
        self.client_ports
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect()
    }

    /// The connect string: every server.
    fn connect(&self) -> String {
        self.servers().join(",")
    }

    /// Which server leads, from `srvr`.
    fn leader(&self) -> Option<usize> {
        use std::io::{Read as _, Write as _};
        self.client_ports.iter().position(|port| {
            let mut answer = String::new();
            std::net::TcpStream::connect(("127.0.0.1", *port))
                .and_then(|mut stream| {
                    stream.write_all(b"srvr")?;
                    stream.read_to_string(&mut answer)
                })
                .is_ok()
                && answer.contains("Mode: leader")
        })
    }

    /// Contenders under `name`, queued or holding: the sessions that own
    /// its lock and lease nodes (Curator names a contender's lock and
    /// lease nodes with two UUIDs, consem with one: the owner is what
    /// they share).
    fn contenders(&self, name: &str) -> usize {
        let Ok(mut session) = Ensemble::session_on(&self.servers()) else {
            return 0;
        };
        let path = semaphore_path(name);
        let mut owners: Vec<i64> = Vec::new();
        for parent in [LOCKS, LEASES] {
            let parent = format!("{path}/{parent}");
            let children = match session.children(&parent, false) {
                Ok(children) => children,
                Err(ZkError::Code(NO_NODE)) => continue,
                Err(error) => panic!("reading ZooKeeper: {error}"),
            };
            for node in children {
                // One deleted meanwhile has no owner left.
                if let Ok(Some(stat)) = session.exists(&format!("{parent}/{node}"), false) {
                    owners.push(stat.ephemeral_owner);
                }
            }
        }
        let _ = session.close();
        owners.sort_unstable();
        owners.dedup();
        owners.len()
    }
}

impl Drop for Ensemble {
    fn drop(&mut self) {
        for process in &mut self.processes {
            let _ = process.kill();
            let _ = process.wait();
        }
    }
}

/// `benches/CuratorRunner.java` compiled into `dir`: the runner's
/// classpath.
fn compile_runner(dir: &Path) -> String {
    let classes = dir.join("classes");
    std::fs::create_dir_all(&classes).unwrap();
    let jars: Vec<String> = jars(CURATOR_JARS)
        .into_iter()
        .chain(jars(SERVER_JARS))
        .collect();
    let compiled = Command::new("javac")
        .arg("-d")
        .arg(&classes)
        .args(["-cp", &jars.join(":"), RUNNER])
        .output()
        .expect("javac is needed: apt-get install default-jdk-headless libcurator-recipes-java (scripts/test-servers)");
    assert!(
        compiled.status.success(),
        "javac: {}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    format!("{}:{}", classes.display(), jars.join(":"))
}

fn command(
    ensemble: &Ensemble,
    classpath: &str,
    tool: Tool,
    name: &str,
    limit: usize,
    run: &[String],
) -> Command {
    match tool {
        Tool::Consem => {
            let mut command = Command::new(consem_bin());
            command
                .args(["run", "--store"])
                .arg(format!("zk://{}", ensemble.connect()))
                .args(["--prefix", name, "--limit", &limit.to_string(), "--"])
                .args(run)
                .env_remove("CONSEM_STORE");
            command
        }
        Tool::Curator => {
            let mut command = Command::new("java");
            command
                .args(RUNNER_JVM)
                .args(["-cp", classpath, "CuratorRunner", &ensemble.connect()])
                .arg(semaphore_path(name))
                .arg(limit.to_string())
                .args(run);
            command
        }
    }
}

/// One holder holds until the harness says; one waiter queues behind it;
/// its CPU time over `waiting` from once it has queued (a JVM takes longer
/// to queue than a fixed pause allows), thread by thread.
fn waiter_cpu(
    make: &common::Make,
    queued: &common::Queued,
    dir: &Path,
    name: &str,
    waiting: Duration,
) -> Duration {
    let go = dir.join(format!("{name}.go"));
    let until_queued = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while queued(name) < n {
            assert!(
                Instant::now() < deadline,
                "{name}: {n} contenders never queued"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let mut holder = make(name, 1, &common::self_command())
        .env(CHILD_LOG_ENV, dir.join(format!("{name}.log")))
        .env(CHILD_GO_ENV, &go)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    until_queued(1);
    let mut waiter = make(name, 1, &["true".to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    until_queued(2);
    // What queuing cost is not waiting's: let it settle.
    std::thread::sleep(Duration::from_millis(300));
    let before = thread_cpu(waiter.id());
    std::thread::sleep(waiting);
    let after = thread_cpu(waiter.id());
    std::fs::write(&go, "").unwrap();
    assert!(
        holder.wait().unwrap().success(),
        "{name}: the holder failed"
    );
    assert!(
        waiter.wait().unwrap().success(),
        "{name}: the waiter failed"
    );
    // Thread by thread: one that exits meanwhile (the JVM ends its idle
    // compiler threads) would take its time out of a sum of the two
    // looks. One that began since counts from its start; one that ended
    // before the second look is not counted (they end once idle).
    after
        .iter()
        .map(|(thread, &now)| now.saturating_sub(before.get(thread).copied().unwrap_or_default()))
        .sum()
}

/// The CPU time of each thread of `pid` and of its descendants, by
/// thread id, from /proc schedstat.
fn thread_cpu(pid: u32) -> HashMap<u32, Duration> {
    let mut threads = HashMap::new();
    let mut stack = vec![pid];
    while let Some(pid) = stack.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let Some(thread) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            if let Some(ns) = std::fs::read_to_string(task.path().join("schedstat"))
                .ok()
                .and_then(|text| text.split(' ').next()?.parse::<u64>().ok())
            {
                threads.insert(thread, Duration::from_nanos(ns));
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
    threads
}

/// A shell word of `text`.
fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

fn main() {
    if common::run_child_mode() {
        return;
    }
    let quick = std::env::var(QUICK_ENV).is_ok_and(|v| !v.is_empty());
    let (runs, waiters, crowd, child_sleep) = if quick {
        (3, 2, 10, Duration::from_millis(20))
    } else {
        (50, 12, 100, Duration::from_millis(50))
    };
    let dir: PathBuf =
        std::env::temp_dir().join(format!("consem-bench-zookeeper-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let classpath = compile_runner(&dir);
    let ensemble = Ensemble::start(&dir);
    let tools = [Tool::Consem, Tool::Curator];
    let queued = |name: &str| ensemble.contenders(name);
    println!(
        "# ZooKeeper store benchmark{}",
        if quick {
            " (quick: tiny sizes, figures only show the harness works)"
        } else {
            ""
        }
    );
    println!(
        "(a 3-server ZooKeeper ensemble, Debian's jar, at {}, started by the harness; server {} leads)",
        ensemble.connect(),
        ensemble.leader().map_or("?".to_string(), |i| (i + 1).to_string())
    );

    // The servers are JVMs that compile their hot paths as they serve:
    // warm them up before measuring.
    let warm_up = if quick { 3 } else { 200 };
    for tool in tools {
        let make = |name: &str, limit: usize, run: &[String]| {
            command(
                &ensemble,
                &classpath,
                tool,
                &format!("warm-{name}"),
                limit,
                run,
            )
        };
        let runs = if tool == Tool::Curator { 3 } else { warm_up };
        common::uncontended(&make, runs);
    }
    println!("(the ensemble warmed up by {warm_up} runs of consem and 3 of the Curator runner)");

    println!("\n## uncontended run of `true` ({runs} runs each)");
    println!("| tool | wall median | wall p90 | peak RSS |");
    println!("|---|---|---|---|");
    let mut uncontended = Vec::new();
    for tool in tools {
        let make = |name: &str, limit: usize, run: &[String]| {
            command(&ensemble, &classpath, tool, name, limit, run)
        };
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
    for (i, tool) in tools.into_iter().enumerate() {
        let make = |name: &str, limit: usize, run: &[String]| {
            command(&ensemble, &classpath, tool, name, limit, run)
        };
        let name = format!("handoff-{i}");
        let gaps = common::handoff(&make, &dir, &name, waiters, child_sleep, Some(&queued));
        let mean = gaps.iter().sum::<Duration>() / gaps.len() as u32;
        let median = gaps[gaps.len() / 2];
        handoffs.push((median, mean));
        println!(
            "| {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms |",
            tool.name(),
            ms(median),
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
        "\n## a waiter's CPU over {:.1} s of waiting, once queued",
        waiting.as_secs_f64()
    );
    println!("| tool | CPU |");
    println!("|---|---|");
    for (i, tool) in tools.into_iter().enumerate() {
        let make = |name: &str, limit: usize, run: &[String]| {
            command(&ensemble, &classpath, tool, name, limit, run)
        };
        let cpu = waiter_cpu(&make, &queued, &dir, &format!("cpu-{i}"), waiting);
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
    for (i, tool) in tools.into_iter().enumerate() {
        let name = format!("crowd-{i}");
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
                &ensemble,
                &classpath,
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

    let (consem, curator) = (uncontended[0], uncontended[1]);
    println!("\n## goals");
    println!("| goal | figure | met |");
    println!("|---|---|---|");
    println!(
        "| uncontended wall (median) at most 1/10 of the Curator runner's | {:.1} ms vs {:.1} ms (1/{:.1}) | {} |",
        ms(consem.0),
        ms(curator.0),
        curator.0.as_secs_f64() / consem.0.as_secs_f64(),
        yes(consem.0 * 10 <= curator.0)
    );
    println!(
        "| peak RSS at most 1/10 of the Curator runner's | {:.1} MiB vs {:.1} MiB (1/{:.1}) | {} |",
        consem.1,
        curator.1,
        curator.1 / consem.1,
        yes(consem.1 * 10.0 <= curator.1)
    );
    println!(
        "| handoff gap (median) at most the Curator runner's | {:.2} ms vs {:.2} ms ({:.2}×) | {} |",
        ms(handoffs[0].0),
        ms(handoffs[1].0),
        handoffs[0].0.as_secs_f64() / handoffs[1].0.as_secs_f64(),
        yes(handoffs[0].0 <= handoffs[1].0)
    );
    if quick {
        println!("(quick mode: sizes too small to judge)");
    }
    drop(ensemble);
    let _ = std::fs::remove_dir_all(&dir);
}
