//! Benchmark of the etcd store, side by side with `etcdctl lock` (etcd's own
//! mutex: limit 1, each waiter watching the key just ahead of it), on one
//! single-member etcd (3.4, Debian's etcd-server) the harness starts on free
//! loopback ports with a scratch data directory. Prints:
//!
//! - uncontended: wall time (median) and peak RSS of a run of `true`, and
//!   the etcd requests it takes;
//! - handoff gap at limit 1 with 12 waiters queued (8 rounds, the tools in
//!   turn), median, mean and p90; and the same while another client writes
//!   to etcd as fast as it can (a busy etcd, whose revision never rests);
//! - a waiter's CPU over 5 s of waiting;
//! - crowds: overhead per round at N=20 and N=100 contenders on limit 5
//!   (each runs 200 ms; consem only, `etcdctl lock` has no limit), and at
//!   limit 1 (each runs 50 ms) for both;
//! - etcd requests per contender in those crowds, from etcd's own counters
//!   (`grpc_server_msg_received_total` on its /metrics: consem speaks to the
//!   JSON gateway, which forwards each request to gRPC, so both tools are
//!   counted alike): constant in N means no herd.
//!
//! Run it with:
//!
//!     cargo bench --bench etcd
//!     CONSEM_BENCH_QUICK=1 cargo bench --profile dev --bench etcd   # tiny sizes (CI)
//!     CONSEM_BENCH_BIN=/path/to/older/consem cargo bench --bench etcd   # another build
//!     CONSEM_BENCH_ONLY=handoff cargo bench --bench etcd   # the handoff gap alone
//!
//! Nothing is asserted about the figures. The run is bounded (10 minutes,
//! 2 in quick mode): past that the harness kills what it started (by pid)
//! and exits 1. The two tools use names under different roots: both put
//! their contenders at `NAME/<lease hex>`, and `etcdctl lock` waits for
//! every older key under NAME, consem's `NAME/.limit` too.

mod common;

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;

use common::{consem_bin, ms, percentile, yes};

/// Set to 1 for tiny sizes (CI).
const QUICK_ENV: &str = "CONSEM_BENCH_QUICK";
/// Set to `handoff` to measure the handoff gap alone.
const ONLY_ENV: &str = "CONSEM_BENCH_ONLY";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tool {
    Consem,
    Etcdctl,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Consem => "consem --store etcd://",
            Tool::Etcdctl => "etcdctl lock",
        }
    }

    /// The root of this tool's names: the two never share a key. (Both put
    /// their contenders at `NAME/<lease hex>`, and `etcdctl lock` would wait
    /// for consem's `NAME/.limit` to go away.)
    fn root(self) -> &'static str {
        match self {
            Tool::Consem => "bench-consem",
            Tool::Etcdctl => "bench-etcdctl",
        }
    }
}

struct Server {
    port: u16,
    process: Child,
}

impl Server {
    /// Starts etcd on free loopback ports (a few tries: a port found free
    /// may be taken before etcd binds it) and waits until it answers.
    fn start(dir: &Path) -> Server {
        let log = dir.join("etcd.log");
        for attempt in 0.. {
            let [client, peer] = free_ports();
            let data = dir.join(format!("data-{attempt}"));
            let name = format!("consem-bench-{}", std::process::id());
            let client_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let process = Command::new("etcd")
                .args(["--name", &name])
                .arg("--data-dir")
                .arg(&data)
                .args(["--listen-client-urls", &client_url])
                .args(["--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &format!("{name}={peer_url}")])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .expect("etcd is needed (apt-get install etcd-server etcd-client)");
            let mut server = Server {
                port: client,
                process,
            };
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if server
                    .get("/health")
                    .is_some_and(|h| h.contains("\"health\":\"true\""))
                {
                    return server;
                }
                if server.process.try_wait().unwrap().is_some() {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "etcd did not answer within 30 s; its log: {}",
                    log.display()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(
                attempt < 3 && text.contains("address already in use"),
                "etcd exited at start; its log ({}):\n{text}",
                log.display()
            );
        }
        unreachable!()
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// How many contenders `tool` has queued under `name`: a key each, at
    /// `NAME/<lease hex>` (consem has its `NAME/.limit` too), and a watch
    /// each once it waits (consem's holder watches its own key, etcdctl's
    /// holder nothing). Only one tool's contenders run at a time.
    fn contenders(&self, tool: Tool, name: &str) -> usize {
        let prefix = format!("{}/{name}/", tool.root());
        let mut end = prefix.clone().into_bytes();
        *end.last_mut().unwrap() += 1;
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
        let body = format!(
            r#"{{"key":"{}","range_end":"{}","count_only":true}}"#,
            b64(prefix.as_bytes()),
            b64(&end)
        );
        let reply = self
            .request("POST", "/v3/kv/range", &body)
            .expect("etcd's range did not answer");
        let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
        let keys: usize = reply["count"]
            .as_str()
            .map_or(0, |count| count.parse().unwrap());
        let metrics = self
            .get("/metrics")
            .expect("etcd's /metrics did not answer");
        let watchers = metrics
            .lines()
            .find_map(|line| line.strip_prefix("etcd_debugging_mvcc_watcher_total "))
            .map_or(0, |value| value.trim().parse::<f64>().unwrap() as usize);
        match tool {
            Tool::Consem => keys.saturating_sub(1).min(watchers),
            Tool::Etcdctl => keys.min(watchers + 1),
        }
    }

    /// The body of a plain HTTP GET on the client port, if it answers 200.
    fn get(&self, path: &str) -> Option<String> {
        self.request("GET", path, "")
    }

    /// The body of a plain HTTP request on the client port, if it answers
    /// 200.
    fn request(&self, method: &str, path: &str, body: &str) -> Option<String> {
        request(self.port, method, path, body)
    }

    /// etcd's gRPC counters so far, by method: messages received (a unary
    /// call is one; each message on a stream, such as a watch's create
    /// request or a lease keep-alive, is one more) and messages sent.
    fn counters(&self) -> Counters {
        let text = self
            .get("/metrics")
            .expect("etcd's /metrics did not answer");
        let mut counters = Counters::default();
        for line in text.lines() {
            let (which, rest) =
                if let Some(rest) = line.strip_prefix("grpc_server_msg_received_total{") {
                    (0, rest)
                } else if let Some(rest) = line.strip_prefix("grpc_server_msg_sent_total{") {
                    (1, rest)
                } else {
                    continue;
                };
            let Some((labels, value)) = rest.split_once("} ") else {
                continue;
            };
            let Some(method) = labels
                .split(',')
                .find_map(|l| l.strip_prefix("grpc_method=\""))
                .and_then(|m| m.strip_suffix('"'))
            else {
                continue;
            };
            let value: f64 = value.trim().parse().unwrap_or(0.0);
            counters.by_method.entry(method.to_string()).or_default()[which] += value;
        }
        counters
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// Two ports nobody listens on now (both sockets stay open until both are
/// picked, so that they differ).
fn free_ports() -> [u16; 2] {
    let listeners = [(); 2].map(|_| TcpListener::bind("127.0.0.1:0").unwrap());
    listeners.map(|l| l.local_addr().unwrap().port())
}

#[derive(Default)]
struct Counters {
    /// Method -> [received, sent].
    by_method: BTreeMap<String, [f64; 2]>,
}

impl Counters {
    /// What happened between `before` and `self`, divided by `n`.
    fn per(&self, before: &Counters, n: usize) -> Counters {
        let mut out = Counters::default();
        for (method, now) in &self.by_method {
            let then = before.by_method.get(method).copied().unwrap_or([0.0; 2]);
            let delta = [(now[0] - then[0]) / n as f64, (now[1] - then[1]) / n as f64];
            if delta != [0.0; 2] {
                out.by_method.insert(method.clone(), delta);
            }
        }
        out
    }

    fn received(&self) -> f64 {
        self.by_method.values().map(|v| v[0]).sum()
    }

    fn keep_alives(&self) -> f64 {
        self.by_method.get("LeaseKeepAlive").map_or(0.0, |v| v[0])
    }

    fn watch_sent(&self) -> f64 {
        self.by_method.get("Watch").map_or(0.0, |v| v[1])
    }

    /// `Txn 2.0, Range 1.0, ...`: messages received by method.
    fn breakdown(&self) -> String {
        let mut parts: Vec<(&String, f64)> = self
            .by_method
            .iter()
            .filter(|(_, v)| v[0] > 0.0)
            .map(|(m, v)| (m, v[0]))
            .collect();
        parts.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
        parts
            .iter()
            .map(|(m, v)| format!("{m} {v:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn command(server: &Server, tool: Tool, name: &str, limit: usize, run: &[String]) -> Command {
    let name = format!("{}/{name}", tool.root());
    let mut cmd = match tool {
        Tool::Consem => {
            let mut cmd = Command::new(consem_bin());
            cmd.args([
                "run",
                "--store",
                &format!("etcd://127.0.0.1:{}", server.port),
                "--prefix",
                &name,
                "--limit",
                &limit.to_string(),
                "--",
            ])
            .args(run);
            cmd
        }
        Tool::Etcdctl => {
            let mut cmd = Command::new("etcdctl");
            cmd.arg(format!("--endpoints={}", server.url()))
                .args(["lock", &name, "--"])
                .args(run);
            cmd
        }
    };
    // The caller's ETCDCTL_* variables (both tools read them as defaults) do
    // not steer the measured runs.
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("ETCDCTL_") {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// The body of a plain HTTP request to etcd's client port, if it answers
/// 200.
fn request(port: u16, method: &str, path: &str, body: &str) -> Option<String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{}\r\nContent-Length: {}\r\n\r\n{body}",
        port,
        body.len()
    )
    .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.lines().next()?.split(' ').nth(1)?;
    (status == "200").then(|| body.to_string())
}

/// Another client of etcd writing one key as fast as it can, one write
/// after another: each write moves etcd's revision, which is global, as a
/// busy production etcd's moves. Its key is under neither tool's root.
struct Busy {
    stop: Arc<AtomicBool>,
    writer: std::thread::JoinHandle<usize>,
    started: Instant,
}

impl Busy {
    fn start(port: u16) -> Busy {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
        let writer = std::thread::spawn(move || {
            let mut writes = 0;
            while !stopped.load(Ordering::Relaxed) {
                let body = format!(
                    r#"{{"key":"{}","value":"{}"}}"#,
                    b64(b"bench-busy/other"),
                    b64(writes.to_string().as_bytes())
                );
                request(port, "POST", "/v3/kv/put", &body).expect("etcd's put did not answer");
                writes += 1;
            }
            writes
        });
        Busy {
            stop,
            writer,
            started: Instant::now(),
        }
    }

    /// Stops the writer; its writes per second.
    fn stop(self) -> f64 {
        self.stop.store(true, Ordering::Relaxed);
        let writes = self.writer.join().unwrap();
        writes as f64 / self.started.elapsed().as_secs_f64()
    }
}

/// Handoff rounds of both tools under `label`, the tools in turn (and
/// which goes first), so that what the machine does meanwhile weighs on
/// both alike; prints a row per tool.
fn handoffs(
    server: &Server,
    tools: &[Tool],
    dir: &Path,
    label: &str,
    (waiters, rounds, child_sleep): (usize, usize, Duration),
) -> Vec<Gaps> {
    println!("| tool | median | mean | p90 | max |");
    println!("|---|---|---|---|---|");
    let mut gap_lists: Vec<Vec<Duration>> = vec![Vec::new(); tools.len()];
    for round in 0..rounds {
        for turn in 0..tools.len() {
            let which = (turn + round) % tools.len();
            let tool = tools[which];
            let make =
                |name: &str, limit: usize, run: &[String]| command(server, tool, name, limit, run);
            let name = format!("{label}-{round}-{}", tool.root());
            let queued = |name: &str| server.contenders(tool, name);
            gap_lists[which].extend(common::handoff(
                &make,
                dir,
                &name,
                waiters,
                child_sleep,
                Some(&queued),
            ));
        }
    }
    let mut gaps = Vec::new();
    for (&tool, gap) in tools.iter().zip(&mut gap_lists) {
        gap.sort();
        let handoff = Gaps {
            median: gap[gap.len() / 2],
            mean: gap.iter().sum::<Duration>() / gap.len() as u32,
            p90: percentile(gap, 0.9),
        };
        println!(
            "| {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms |",
            tool.name(),
            ms(handoff.median),
            ms(handoff.mean),
            ms(handoff.p90),
            ms(*gap.last().unwrap())
        );
        gaps.push(handoff);
    }
    gaps
}

/// One tool's handoff gaps: the median is the typical handoff, the mean
/// what a queue loses per handoff, its slow ones included.
struct Gaps {
    median: Duration,
    mean: Duration,
    p90: Duration,
}

/// How much each section measures.
struct Sizes {
    /// Uncontended runs per tool.
    runs: usize,
    /// Waiters queued behind the holder in one handoff round.
    waiters: usize,
    handoff_rounds: usize,
    /// How long each command of the handoff runs.
    child_sleep: Duration,
    /// How long the waiter whose CPU is counted waits.
    waiting: Duration,
    /// Crowd sizes on limit 5 (consem) and on limit 1 (both tools).
    crowds5: Vec<usize>,
    crowds1: Vec<usize>,
}

struct Crowd {
    wall: Duration,
    ideal: Duration,
    overhead_per_round: Duration,
    per_contender: Counters,
}

/// N contenders started at once on `limit` slots, each running `sleep`:
/// the wall time against the ideal, and etcd's counters per contender.
fn crowd(server: &Server, tool: Tool, n: usize, limit: usize, sleep: Duration) -> Crowd {
    let before = server.counters();
    let make = |name: &str, limit: usize, run: &[String]| command(server, tool, name, limit, run);
    let (wall, overhead_per_round) =
        common::crowd(&make, &format!("crowd-{limit}-{n}"), n, limit, sleep);
    Crowd {
        wall,
        ideal: sleep * n.div_ceil(limit) as u32,
        overhead_per_round,
        per_contender: server.counters().per(&before, n),
    }
}

/// Past `limit`, kills every process this one started (by pid, deepest
/// first), removes the scratch directory and exits 1: a hung contender must
/// not hang CI.
fn watchdog(limit: Duration, dir: PathBuf) {
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        eprintln!(
            "etcd bench: not done after {:.0} s; killing what it started",
            limit.as_secs_f64()
        );
        let mut pids = Vec::new();
        let mut stack = vec![std::process::id()];
        while let Some(pid) = stack.pop() {
            let children = std::fs::read_dir(format!("/proc/{pid}/task"))
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
                .flat_map(|text| {
                    text.split_whitespace()
                        .filter_map(|c| c.parse::<u32>().ok())
                        .collect::<Vec<_>>()
                });
            for child in children {
                pids.push(child);
                stack.push(child);
            }
        }
        for pid in pids.into_iter().rev() {
            // SAFETY: kill(2) on a pid we just found among our descendants.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::process::exit(1);
    });
}

fn main() {
    if common::run_child_mode() {
        return;
    }
    let quick = std::env::var(QUICK_ENV).is_ok_and(|v| !v.is_empty());
    let sizes = if quick {
        Sizes {
            runs: 3,
            waiters: 3,
            handoff_rounds: 1,
            child_sleep: Duration::from_millis(20),
            waiting: Duration::from_millis(500),
            crowds5: vec![10],
            crowds1: vec![5],
        }
    } else {
        Sizes {
            runs: 30,
            waiters: 12,
            handoff_rounds: 8,
            child_sleep: Duration::from_millis(50),
            waiting: Duration::from_secs(5),
            crowds5: vec![20, 100],
            crowds1: vec![20, 100],
        }
    };
    let Sizes {
        runs,
        waiters,
        handoff_rounds,
        child_sleep,
        waiting,
        crowds5,
        crowds1,
    } = sizes;
    let (sleep5, sleep1) = (Duration::from_millis(200), Duration::from_millis(50));
    let dir: PathBuf =
        std::env::temp_dir().join(format!("consem-bench-etcd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    watchdog(
        Duration::from_secs(if quick { 120 } else { 600 }),
        dir.clone(),
    );
    let server = Server::start(&dir);
    let tools = [Tool::Consem, Tool::Etcdctl];
    println!(
        "# etcd store benchmark{}",
        if quick {
            " (quick: tiny sizes, figures only show the harness works)"
        } else {
            ""
        }
    );
    println!(
        "(one etcd member on 127.0.0.1:{}, started by the harness; consem: {}; \
         etcdctl lock: etcd's own mutex, limit 1, run as `etcdctl lock NAME -- CMD`)",
        server.port,
        consem_bin()
    );

    println!("\n## uncontended run of `true` ({runs} runs each)");
    println!("(wall time from spawn to exit; peak RSS of the tool and its command, from wait4;");
    println!("requests per run as counted in the crowds below)");
    println!("| tool | wall median | wall p90 | peak RSS | requests per run |");
    println!("|---|---|---|---|---|");
    let mut uncontended = Vec::new();
    for &tool in &tools {
        let make =
            |name: &str, limit: usize, run: &[String]| command(&server, tool, name, limit, run);
        let before = server.counters();
        let (median, p90, rss) = common::uncontended(&make, runs);
        let requests = server.counters().per(&before, runs);
        println!(
            "| {} | {:.2} ms | {:.2} ms | {:.1} MiB | {:.2}: {} |",
            tool.name(),
            ms(median),
            ms(p90),
            rss,
            requests.received(),
            requests.breakdown()
        );
        uncontended.push((median, rss));
    }

    println!("\n## handoff gap at limit 1, {waiters} waiters queued (one command's end to the next one's start)");
    println!(
        "(each command logs its own start and end; it runs {:.0} ms; {handoff_rounds} round(s), {} gaps per tool)",
        ms(child_sleep),
        handoff_rounds * waiters
    );
    let handoff_sizes = (waiters, handoff_rounds, child_sleep);
    let gaps = handoffs(&server, &tools, &dir, "handoff", handoff_sizes);
    println!("\n## the same on a busy etcd");
    println!("(another client writes one key under a third root as fast as it can, one write after another)");
    let busy = Busy::start(server.port);
    let busy_gaps = handoffs(&server, &tools, &dir, "busy", handoff_sizes);
    println!("(it wrote {:.0} times a second)", busy.stop());
    let spawn = common::spawn_cost(runs.min(50));
    println!("(starting the command alone, median: {:.2} ms)", ms(spawn));
    if std::env::var(ONLY_ENV).is_ok_and(|only| only == "handoff") {
        for (etcd, gaps) in [("quiet", &gaps), ("busy", &busy_gaps)] {
            println!(
                "consem / etcdctl lock, {etcd} etcd: median {:.2}, mean {:.2}, p90 {:.2}",
                ms(gaps[0].median) / ms(gaps[1].median),
                ms(gaps[0].mean) / ms(gaps[1].mean),
                ms(gaps[0].p90) / ms(gaps[1].p90)
            );
        }
        drop(server);
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }

    println!(
        "\n## a waiter's CPU over {:.1} s of waiting",
        waiting.as_secs_f64()
    );
    println!("(every thread and helper of the waiting tool, from /proc schedstat)");
    println!("| tool | CPU |");
    println!("|---|---|");
    let mut cpus = Vec::new();
    for &tool in &tools {
        let make =
            |name: &str, limit: usize, run: &[String]| command(&server, tool, name, limit, run);
        let cpu = common::waiter_cpu(&make, "cpu", waiting);
        println!("| {} | {:.2} ms |", tool.name(), ms(cpu));
        cpus.push(cpu);
    }

    println!("\n## crowds: N contenders started at once");
    println!(
        "(ideal: N/limit rounds of the command's sleep; overhead per round: the wall time beyond"
    );
    println!(
        "it, divided by the rounds. etcdctl lock has no limit: it is measured at limit 1 only.)"
    );
    let mut runs_of_crowds = Vec::new();
    for &n in &crowds5 {
        runs_of_crowds.push((Tool::Consem, 5, n, sleep5));
    }
    for &tool in &tools {
        for &n in &crowds1 {
            runs_of_crowds.push((tool, 1, n, sleep1));
        }
    }
    println!("| tool | limit | N | command sleeps | wall | ideal | overhead per round |");
    println!("|---|---|---|---|---|---|---|");
    let mut results = Vec::new();
    for &(tool, limit, n, sleep) in &runs_of_crowds {
        let result = crowd(&server, tool, n, limit, sleep);
        println!(
            "| {} | {limit} | {n} | {:.0} ms | {:.0} ms | {:.0} ms | {:.1} ms |",
            tool.name(),
            ms(sleep),
            ms(result.wall),
            ms(result.ideal),
            ms(result.overhead_per_round)
        );
        results.push(result);
    }
    println!("\n## etcd requests per contender in those crowds");
    println!("(from etcd's /metrics. Requests: gRPC messages etcd received, grpc_server_msg_received_total");
    println!(
        "summed over methods: a unary call is one, and so is each message on a stream (a watch's"
    );
    println!("create request, a lease keep-alive). consem's HTTP requests to the JSON gateway are");
    println!(
        "forwarded to gRPC, so both tools are counted alike. Keep-alives grow with the time a"
    );
    println!("contender waits, which grows with N; the rest should not. Watch responses: watch");
    println!("messages etcd sent (created, events, canceled): they grow with N when every waiter");
    println!("hears every change, the herd.)");
    println!("| tool | limit | N | requests | of which keep-alives | watch responses | requests by method |");
    println!("|---|---|---|---|---|---|---|");
    for (&(tool, limit, n, _), result) in runs_of_crowds.iter().zip(&results) {
        let c = &result.per_contender;
        println!(
            "| {} | {limit} | {n} | {:.2} | {:.2} | {:.2} | {} |",
            tool.name(),
            c.received(),
            c.keep_alives(),
            c.watch_sent(),
            c.breakdown()
        );
    }

    println!("\n## consem against etcdctl lock");
    println!("| measure | consem | etcdctl lock | consem / etcdctl |");
    println!("|---|---|---|---|");
    let row = |what: &str, ours: f64, theirs: f64, unit: &str| {
        let unit = if unit.is_empty() {
            String::new()
        } else {
            format!(" {unit}")
        };
        println!(
            "| {what} | {ours:.2}{unit} | {theirs:.2}{unit} | {:.2} |",
            ours / theirs
        );
    };
    row(
        "uncontended wall, median",
        ms(uncontended[0].0),
        ms(uncontended[1].0),
        "ms",
    );
    row(
        "uncontended peak RSS",
        uncontended[0].1,
        uncontended[1].1,
        "MiB",
    );
    for (etcd, gaps) in [("", &gaps), (" on a busy etcd", &busy_gaps)] {
        for (what, ours, theirs) in [
            ("median", gaps[0].median, gaps[1].median),
            ("mean", gaps[0].mean, gaps[1].mean),
            ("p90", gaps[0].p90, gaps[1].p90),
        ] {
            row(
                &format!("handoff gap{etcd}, {what}"),
                ms(ours),
                ms(theirs),
                "ms",
            );
        }
    }
    row("waiter's CPU", ms(cpus[0]), ms(cpus[1]), "ms");
    let at = |tool: Tool, limit: usize, n: usize| {
        runs_of_crowds
            .iter()
            .position(|&(t, l, m, _)| t == tool && l == limit && m == n)
            .map(|i| &results[i])
    };
    for &n in &crowds1 {
        if let (Some(ours), Some(theirs)) = (at(Tool::Consem, 1, n), at(Tool::Etcdctl, 1, n)) {
            row(
                &format!("requests per contender, limit 1, N={n}"),
                ours.per_contender.received(),
                theirs.per_contender.received(),
                "",
            );
            row(
                &format!("overhead per round, limit 1, N={n}"),
                ms(ours.overhead_per_round),
                ms(theirs.overhead_per_round),
                "ms",
            );
        }
    }

    println!("\n## goals");
    println!("| goal | figure | met |");
    println!("|---|---|---|");
    for (what, ours, theirs) in [
        ("median", gaps[0].median, gaps[1].median),
        ("mean", gaps[0].mean, gaps[1].mean),
        (
            "median, busy etcd",
            busy_gaps[0].median,
            busy_gaps[1].median,
        ),
        ("mean, busy etcd", busy_gaps[0].mean, busy_gaps[1].mean),
    ] {
        let ratio = ms(ours) / ms(theirs);
        println!(
            "| handoff gap ({what}) no longer than etcdctl lock's | {ratio:.2} of it | {} |",
            yes(ratio <= 1.0)
        );
    }
    let first = at(Tool::Consem, 5, crowds5[0]).unwrap();
    let last = at(Tool::Consem, 5, crowds5[crowds5.len() - 1]).unwrap();
    let sizes = format!("N={} to N={}", crowds5[0], crowds5[crowds5.len() - 1]);
    let besides = |c: &Crowd| c.per_contender.received() - c.per_contender.keep_alives();
    let (a, b) = (besides(first), besides(last));
    println!(
        "| requests per contender, keep-alives aside, constant in N (limit 5) | {a:.2} to {b:.2}, {sizes} | {} |",
        yes(b / a < 1.5)
    );
    let (a, b) = (
        first.per_contender.watch_sent(),
        last.per_contender.watch_sent(),
    );
    println!(
        "| watch responses per contender constant in N (limit 5) | {a:.2} to {b:.2}, {sizes} | {} |",
        yes(b / a.max(1.0) < 1.5)
    );
    if quick {
        println!("(quick mode: sizes too small to judge)");
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
