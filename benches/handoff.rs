//! Benchmark harness of the Consul store: runs the real `consem` binary against the
//! in-process Consul test double (or a real agent at
//! `CONSEM_BENCH_CONSUL_ADDR`) and prints one report on stdout:
//!
//! - uncontended `consem run ... -- true`: wall time, peak RSS, Consul
//!   requests and response bytes per run;
//! - handoff: N contenders started at once on `limit` slots, children
//!   sleeping a fixed time; overhead per round, requests, response bytes and
//!   CPU time per handoff;
//! - fairness: contenders started one by one with limit 1; grants out of
//!   arrival order, longest wait against the ideal;
//! - mixed clients: loops of consem and loops of `consul lock -n 2` on one
//!   prefix (the real CLI when a real agent is measured and `consul` is on
//!   PATH or at `CONSEM_BENCH_CONSUL_BIN`, else an in-process client that
//!   behaves like it, tests/common/consul_lock.rs); runs of each against
//!   their share of the contenders;
//! - beside `consul lock -n`, the same measures for both on the same agent
//!   (when a real agent is measured and a `consul` binary is found; consem
//!   alone otherwise): uncontended wall and peak RSS, the handoff gap at
//!   limit 1 with 12 waiters queued, a waiter's CPU, the overhead per round
//!   of N=100 on limit 5; the ratios, and the goals judged on them;
//! - the goals next to the figures.
//!
//! ```text
//! cargo bench --bench handoff                                      # full run
//! CONSEM_BENCH_QUICK=1 cargo bench --profile dev --bench handoff   # tiny sizes (CI)
//! CONSEM_BENCH_ONLY=mixed cargo bench --bench handoff              # one section
//! CONSEM_BENCH_ONLY=beside cargo bench --bench handoff             # (mixed, beside)
//! CONSEM_BENCH_BIN=/path/to/older/consem cargo bench --bench handoff # another build
//! ```
//!
//! Nothing is asserted: the report is for reading. Progress goes to stderr.
//! Every wait is bounded; a scenario that overruns its deadline has its
//! remaining consem processes killed (by pid) and says so.

#[allow(dead_code)] // the benchmark uses a small part of the double
#[path = "../tests/common/double.rs"]
mod double;

#[path = "../tests/common/consul_lock.rs"]
mod consul_lock;

#[allow(dead_code)] // each harness uses a part of it
mod common;

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{consem_bin, ms};
use double::ConsulDouble;

/// Set to `host:port` of a real Consul agent to measure against it.
const REAL_CONSUL_ENV: &str = "CONSEM_BENCH_CONSUL_ADDR";
/// Set to 1 for tiny sizes (CI).
const QUICK_ENV: &str = "CONSEM_BENCH_QUICK";
/// Set to a section's name (`mixed`, `beside`) to run that section alone.
const ONLY_ENV: &str = "CONSEM_BENCH_ONLY";
/// The `consul` binary whose `consul lock` the mixed section runs against a
/// real agent; by default `consul` on PATH.
const CONSUL_BIN_ENV: &str = "CONSEM_BENCH_CONSUL_BIN";

/// When set, this binary is a fairness child: it appends "<id> <unix ns>"
/// to the file named here, then sleeps.
const CHILD_LOG_ENV: &str = "HANDOFF_BENCH_CHILD_LOG";
const CHILD_ID_ENV: &str = "HANDOFF_BENCH_CHILD_ID";
const CHILD_SLEEP_ENV: &str = "HANDOFF_BENCH_CHILD_SLEEP_MS";

/// The consul CLI's variables besides `CONSUL_HTTP_ADDR`: cleared, so that
/// the caller's shell does not steer the measured runs.
const CONSUL_ENV: [&str; 12] = [
    "CONSUL_HTTP_TOKEN",
    "CONSUL_HTTP_TOKEN_FILE",
    "CONSUL_HTTP_AUTH",
    "CONSUL_HTTP_SSL",
    "CONSUL_HTTP_SSL_VERIFY",
    "CONSUL_CACERT",
    "CONSUL_CAPATH",
    "CONSUL_CLIENT_CERT",
    "CONSUL_CLIENT_KEY",
    "CONSUL_TLS_SERVER_NAME",
    "CONSUL_NAMESPACE",
    "CONSUL_PARTITION",
];

// consul lock -n figures the goals were set with (real agent on loopback, 2 cores).
const CONSUL_LOCK_WALL_MS: f64 = 19.0;
const CONSUL_LOCK_RSS_MIB: f64 = 18.6;
const GOAL_RSS_MIB: f64 = 5.0;
const GOAL_ROUND_MS: f64 = 5.0;

struct Sizes {
    uncontended_runs: usize,
    uncontended_warmup: usize,
    /// Extra uncontended runs through the byte-counting proxy.
    uncontended_proxied: usize,
    handoff: Vec<(usize, usize)>,
    child_sleep: Duration,
    fair_contenders: usize,
    fair_gap: Duration,
    fair_child: Duration,
    /// Loops of each kind, the limit, each run's command time, how long.
    mixed_loops: usize,
    mixed_limit: usize,
    mixed_child: Duration,
    mixed_for: Duration,
    beside: BesideSizes,
}

/// The sizes of the side-by-side section.
struct BesideSizes {
    runs: usize,
    waiters: usize,
    rounds: usize,
    child_sleep: Duration,
    waiting: Duration,
    /// N, the limit and each command's sleep of the crowd.
    crowd: (usize, usize, Duration),
}

impl Sizes {
    fn pick(quick: bool) -> Sizes {
        if quick {
            Sizes {
                uncontended_runs: 5,
                uncontended_warmup: 1,
                uncontended_proxied: 2,
                handoff: vec![(10, 2)],
                child_sleep: Duration::from_millis(50),
                fair_contenders: 5,
                fair_gap: Duration::from_millis(50),
                fair_child: Duration::from_millis(50),
                mixed_loops: 2,
                mixed_limit: 2,
                mixed_child: Duration::from_millis(50),
                mixed_for: Duration::from_secs(3),
                beside: BesideSizes {
                    runs: 3,
                    waiters: 3,
                    rounds: 1,
                    child_sleep: Duration::from_millis(20),
                    waiting: Duration::from_millis(500),
                    crowd: (10, 5, Duration::from_millis(50)),
                },
            }
        } else {
            Sizes {
                uncontended_runs: 50,
                uncontended_warmup: 3,
                uncontended_proxied: 10,
                // The goals' sizes, plus limit 5 at N = 20 and 200, so that
                // requests per handoff are compared across N at one limit.
                handoff: vec![
                    (20, 2),
                    (20, 5),
                    (50, 5),
                    (100, 5),
                    (200, 5),
                    (100, 1),
                    (200, 10),
                ],
                child_sleep: Duration::from_millis(200),
                fair_contenders: 20,
                fair_gap: Duration::from_millis(50),
                fair_child: Duration::from_millis(100),
                // What fault injection measured starvation with: ten loops
                // of each on limit 2 for 40 s.
                mixed_loops: 10,
                mixed_limit: 2,
                mixed_child: Duration::from_millis(100),
                mixed_for: Duration::from_secs(40),
                beside: BesideSizes {
                    runs: 30,
                    waiters: 12,
                    rounds: 4,
                    child_sleep: Duration::from_millis(50),
                    waiting: Duration::from_secs(5),
                    crowd: (100, 5, Duration::from_millis(200)),
                },
            }
        }
    }
}

fn main() {
    if let Ok(log) = std::env::var(CHILD_LOG_ENV) {
        fairness_child(&log);
        return;
    }
    if common::run_child_mode() {
        return;
    }
    let quick = std::env::var(QUICK_ENV).is_ok_and(|v| !v.is_empty() && v != "0");
    let sizes = Sizes::pick(quick);
    let bench = Bench::new();

    let mut out = String::new();
    out.push_str("consem handoff benchmark\n");
    out.push_str(&format!(
        "binary:  {} ({} bytes)\n",
        consem_bin(),
        file_size(&consem_bin())
    ));
    out.push_str(&format!(
        "profile: {}\n",
        if cfg!(debug_assertions) {
            "debug assertions on (dev/test profile): figures are not representative"
        } else {
            "bench (inherits [profile.release]: no debug assertions)"
        }
    ));
    out.push_str(&format!("consul:  {}\n", bench.describe()));
    out.push_str(&format!(
        "mode:    {}\n\n",
        if quick {
            "quick (CONSEM_BENCH_QUICK): tiny sizes, figures only show the harness works"
        } else {
            "full"
        }
    ));

    if std::env::var(ONLY_ENV).is_ok_and(|only| only == "mixed") {
        out.push_str(&mixed(&bench, &sizes).table());
        print!("{out}");
        return;
    }
    // Verdicts only mean something at full size with an optimized build.
    let judged = !quick && !cfg!(debug_assertions);
    if std::env::var(ONLY_ENV).is_ok_and(|only| only == "beside") {
        out.push_str(&beside(&bench, &sizes.beside).table(judged));
        print!("{out}");
        return;
    }

    let uncontended = uncontended(&bench, &sizes);
    out.push_str(&uncontended.table(&sizes));

    let baseline = sleep_baseline(&sizes);
    let mut handoffs = Vec::new();
    for &(n, limit) in &sizes.handoff {
        handoffs.push(handoff(&bench, n, limit, sizes.child_sleep));
    }
    out.push_str(&handoff_table(&handoffs, &sizes, &baseline));

    let fair = fairness(&bench, &sizes);
    out.push_str(&fair.table(&sizes));

    let mixed = mixed(&bench, &sizes);
    out.push_str(&mixed.table());

    out.push_str(&beside(&bench, &sizes.beside).table(judged));

    out.push_str(&goals(&uncontended, &handoffs, &fair, &mixed, judged));
    print!("{out}");
}

// ---------------------------------------------------------------------------
// The Consul under test, and a proxy that counts response bytes
// ---------------------------------------------------------------------------

enum Target {
    Double,
    Real(String),
}

struct Bench {
    target: Target,
    scratch: PathBuf,
    counter: AtomicU64,
}

/// One scenario's Consul: a fresh double (so that its request record is the
/// scenario's alone), or the real agent.
struct Consul {
    double: Option<ConsulDouble>,
    addr: String,
}

impl Consul {
    /// Requests the double has recorded so far; `None` against a real agent.
    fn requests(&self) -> Option<usize> {
        self.double.as_ref().map(|d| d.requests().len())
    }
}

impl Bench {
    fn new() -> Bench {
        let target = match std::env::var(REAL_CONSUL_ENV) {
            Ok(addr) if !addr.trim().is_empty() => {
                let addr = addr.trim();
                let addr = addr.strip_prefix("http://").unwrap_or(addr);
                Target::Real(addr.trim_end_matches('/').to_string())
            }
            _ => Target::Double,
        };
        let scratch = std::env::temp_dir().join(format!("consem-bench-{}", std::process::id()));
        std::fs::create_dir_all(&scratch).expect("create the scratch directory");
        Bench {
            target,
            scratch,
            counter: AtomicU64::new(0),
        }
    }

    fn describe(&self) -> String {
        match &self.target {
            Target::Double => {
                "in-process test double (tests/common/double.rs), 127.0.0.1, a fresh one per scenario"
                    .to_string()
            }
            Target::Real(addr) => format!(
                "real agent at {addr} ({REAL_CONSUL_ENV}); requests are not counted (n/a)"
            ),
        }
    }

    fn consul(&self) -> Consul {
        match &self.target {
            Target::Double => {
                let double = ConsulDouble::start();
                let addr = double.addr();
                Consul {
                    double: Some(double),
                    addr,
                }
            }
            Target::Real(addr) => Consul {
                double: None,
                addr: addr.clone(),
            },
        }
    }

    fn prefix(&self, scenario: &str) -> String {
        let count = self.counter.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        format!(
            "consem-bench/{scenario}-{}-{count}-{nanos}",
            std::process::id()
        )
    }

    fn path(&self, name: &str) -> PathBuf {
        self.scratch.join(name)
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

/// `consem run --prefix <prefix> --limit <limit> -- <command>` against
/// `addr`, stdin and stdout to /dev/null, stderr appended to `log`.
fn consem(addr: &str, prefix: &str, limit: usize, command: &[&str], log: &Path) -> Command {
    let mut cmd = consul_client(Path::new(&consem_bin()), addr, log);
    cmd.args(["run", "--prefix", prefix, "--limit", &limit.to_string()])
        .arg("--")
        .args(command);
    cmd
}

/// `program` as a client of the agent at `addr`, whatever the caller's
/// shell sets for the consul CLI; stdin and stdout to /dev/null, stderr
/// appended to `log`.
fn consul_client(program: &Path, addr: &str, log: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.env("CONSUL_HTTP_ADDR", addr);
    for name in CONSUL_ENV {
        cmd.env_remove(name);
    }
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("open the clients' log");
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
    cmd
}

/// A loopback TCP proxy in front of `upstream` that counts the bytes it
/// carries back to the clients (the responses). It adds a hop, so runs
/// through it are only used for byte counts, never for timing.
struct Proxy {
    addr: SocketAddr,
    down_bytes: Arc<AtomicU64>,
    stopping: Arc<AtomicBool>,
    acceptor: Option<thread::JoinHandle<()>>,
}

impl Proxy {
    fn start(upstream: &str) -> Proxy {
        let upstream: SocketAddr = upstream
            .to_socket_addrs()
            .ok()
            .and_then(|mut addrs| addrs.next())
            .unwrap_or_else(|| panic!("cannot resolve {upstream}"));
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let down_bytes = Arc::new(AtomicU64::new(0));
        let stopping = Arc::new(AtomicBool::new(false));
        let acceptor = {
            let down_bytes = Arc::clone(&down_bytes);
            let stopping = Arc::clone(&stopping);
            thread::spawn(move || {
                for client in listener.incoming() {
                    if stopping.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(client) = client else {
                        thread::sleep(Duration::from_millis(10));
                        continue;
                    };
                    let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(3))
                    else {
                        let _ = client.shutdown(Shutdown::Both);
                        continue;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (Ok(client2), Ok(server2)) = (client.try_clone(), server.try_clone())
                    else {
                        continue;
                    };
                    let up = Arc::new(AtomicU64::new(0));
                    thread::spawn(move || pump(client2, server2, &up));
                    let down = Arc::clone(&down_bytes);
                    thread::spawn(move || pump(server, client, &down));
                }
            })
        };
        Proxy {
            addr,
            down_bytes,
            stopping,
            acceptor: Some(acceptor),
        }
    }

    fn response_bytes(&self) -> u64 {
        self.down_bytes.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

/// Copies `from` to `to`, counting bytes, until either side ends; then shuts
/// both down so that the opposite pump ends too.
fn pump(mut from: TcpStream, mut to: TcpStream, count: &AtomicU64) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
                count.fetch_add(n as u64, Ordering::SeqCst);
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

// ---------------------------------------------------------------------------
// Spawning and reaping with rusage
// ---------------------------------------------------------------------------

struct Outcome {
    spawned: Instant,
    exited: Instant,
    /// Raw wait status.
    status: i32,
    /// User + system CPU time of the process and the children it reaped.
    cpu: Duration,
    /// ru_maxrss: the largest resident set of the process or of a child it
    /// reaped, KiB on Linux.
    maxrss_kib: u64,
}

impl Outcome {
    fn wall(&self) -> Duration {
        self.exited - self.spawned
    }

    fn ok(&self) -> bool {
        libc::WIFEXITED(self.status) && libc::WEXITSTATUS(self.status) == 0
    }
}

struct Batch {
    /// In spawn order.
    outcomes: Vec<Outcome>,
    pids: Vec<i32>,
    /// How many had to be killed at the deadline.
    killed: usize,
    started: Instant,
}

impl Batch {
    fn failures(&self) -> usize {
        self.outcomes.iter().filter(|o| !o.ok()).count()
    }

    fn drained(&self) -> Duration {
        self.outcomes
            .iter()
            .map(|o| o.exited)
            .max()
            .map_or(Duration::ZERO, |last| last - self.started)
    }
}

/// Spawns `commands` (waiting `gap` between two spawns), reaps each with
/// wait4 to get its rusage, and returns when all have exited. Whatever still
/// runs at `deadline` is sent SIGKILL (by pid, and only pids not reaped yet).
fn run_batch(commands: Vec<Command>, gap: Duration, deadline: Duration) -> Batch {
    let expected = commands.len();
    // Pids spawned and not yet reaped, with their spawn time. The reaper
    // reaps under this lock, so a pid in it can never have been reused.
    let running: Arc<Mutex<HashMap<i32, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    let (tx, rx) = mpsc::channel::<(i32, Outcome)>();
    let reaper = {
        let running = Arc::clone(&running);
        thread::spawn(move || reap(expected, &running, &tx))
    };
    let started = Instant::now();
    let mut pids = Vec::with_capacity(expected);
    for (i, mut command) in commands.into_iter().enumerate() {
        if i > 0 && !gap.is_zero() {
            thread::sleep(gap);
        }
        // Hold the lock across the spawn so the reaper never sees a pid it
        // does not know yet.
        let mut guard = running.lock().unwrap();
        let spawned = Instant::now();
        let child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                for pid in guard.keys() {
                    // SAFETY: kill(2) on a child of ours not reaped yet.
                    unsafe { libc::kill(*pid, libc::SIGKILL) };
                }
                panic!("cannot spawn {command:?}: {e}");
            }
        };
        let pid = child.id() as i32;
        guard.insert(pid, spawned);
        pids.push(pid);
        // The std handle is dropped without waiting: the reaper waits.
    }
    let mut outcomes: HashMap<i32, Outcome> = HashMap::new();
    let hard_deadline = started + deadline;
    let mut killed = None;
    while outcomes.len() < expected {
        let wait = match killed {
            None => hard_deadline.saturating_duration_since(Instant::now()),
            Some(_) => Duration::from_secs(15),
        };
        match rx.recv_timeout(wait) {
            Ok((pid, outcome)) => {
                outcomes.insert(pid, outcome);
            }
            Err(mpsc::RecvTimeoutError::Timeout) if killed.is_none() => {
                let guard = running.lock().unwrap();
                eprintln!(
                    "  deadline of {deadline:?} passed: killing the {} processes still running",
                    guard.len()
                );
                for pid in guard.keys() {
                    // SAFETY: kill(2) on a child of ours not reaped yet (the
                    // reaper removes pids under this lock as it reaps them).
                    unsafe { libc::kill(*pid, libc::SIGKILL) };
                }
                killed = Some(guard.len());
            }
            Err(_) => panic!("children did not exit even after SIGKILL"),
        }
    }
    let killed = killed.unwrap_or(0);
    reaper.join().expect("the reaper thread");
    let outcomes = pids
        .iter()
        .map(|pid| outcomes.remove(pid).expect("every pid reaped"))
        .collect();
    Batch {
        outcomes,
        pids,
        killed,
        started,
    }
}

fn reap(
    expected: usize,
    running: &Mutex<HashMap<i32, Instant>>,
    tx: &mpsc::Sender<(i32, Outcome)>,
) {
    let mut reaped = 0;
    while reaped < expected {
        // Wait for any child to exit, without reaping it yet.
        // SAFETY: a zeroed siginfo_t is a valid out-parameter for waitid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid with a valid pointer.
        let rc = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                // Nothing spawned yet (or between spawns): look again soon.
                Some(libc::ECHILD) => {
                    thread::sleep(Duration::from_millis(1));
                    continue;
                }
                _ => panic!("waitid: {err}"),
            }
        }
        let exited = Instant::now();
        // SAFETY: waitid filled in a child's siginfo.
        let pid = unsafe { info.si_pid() };
        let mut guard = running.lock().unwrap();
        let mut status = 0;
        // SAFETY: a zeroed rusage is a valid out-parameter for wait4.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: wait4 on a child that has exited (waitid said so).
        let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if rc != pid {
            continue;
        }
        let Some(spawned) = guard.remove(&pid) else {
            continue; // not one of this batch's (cannot happen: we are the only parent)
        };
        drop(guard);
        let cpu = timeval(usage.ru_utime) + timeval(usage.ru_stime);
        let outcome = Outcome {
            spawned,
            exited,
            status,
            cpu,
            maxrss_kib: usage.ru_maxrss.max(0) as u64,
        };
        reaped += 1;
        if tx.send((pid, outcome)).is_err() {
            return;
        }
    }
}

/// User + system CPU time of this process so far (all its threads).
fn own_cpu() -> Duration {
    // SAFETY: a zeroed rusage is a valid out-parameter for getrusage.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage with a valid pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    timeval(usage.ru_utime) + timeval(usage.ru_stime)
}

fn timeval(tv: libc::timeval) -> Duration {
    Duration::from_secs(tv.tv_sec.max(0) as u64) + Duration::from_micros(tv.tv_usec.max(0) as u64)
}

// ---------------------------------------------------------------------------
// Uncontended runs
// ---------------------------------------------------------------------------

struct Uncontended {
    runs: usize,
    walls: Vec<Duration>,
    rss_kib: Vec<u64>,
    requests_per_run: Option<f64>,
    response_bytes_per_run: f64,
    failures: usize,
}

fn uncontended(bench: &Bench, sizes: &Sizes) -> Uncontended {
    eprintln!(
        "uncontended: {} runs (+{} warm-up, +{} through the byte-counting proxy)",
        sizes.uncontended_runs, sizes.uncontended_warmup, sizes.uncontended_proxied
    );
    let consul = bench.consul();
    let prefix = bench.prefix("uncontended");
    let log = bench.path("uncontended.log");
    let one = |addr: &str| {
        let batch = run_batch(
            vec![consem(addr, &prefix, 1, &["true"], &log)],
            Duration::ZERO,
            Duration::from_secs(30),
        );
        batch.outcomes.into_iter().next().expect("one outcome")
    };
    for _ in 0..sizes.uncontended_warmup {
        one(&consul.addr);
    }
    let before = consul.requests();
    let mut walls = Vec::new();
    let mut rss_kib = Vec::new();
    let mut failures = 0;
    for _ in 0..sizes.uncontended_runs {
        let outcome = one(&consul.addr);
        failures += usize::from(!outcome.ok());
        walls.push(outcome.wall());
        rss_kib.push(outcome.maxrss_kib);
    }
    let requests_per_run = match (before, consul.requests()) {
        (Some(before), Some(after)) => {
            Some((after - before) as f64 / sizes.uncontended_runs as f64)
        }
        _ => None,
    };
    let proxy = Proxy::start(&consul.addr);
    let proxy_addr = proxy.addr.to_string();
    for _ in 0..sizes.uncontended_proxied {
        let outcome = one(&proxy_addr);
        failures += usize::from(!outcome.ok());
    }
    let response_bytes_per_run = proxy.response_bytes() as f64 / sizes.uncontended_proxied as f64;
    drop(proxy);
    report_failures("uncontended", failures, &log);
    Uncontended {
        runs: sizes.uncontended_runs,
        walls,
        rss_kib,
        requests_per_run,
        response_bytes_per_run,
        failures,
    }
}

impl Uncontended {
    fn wall_median_ms(&self) -> f64 {
        ms(percentile(&self.walls, 0.5))
    }

    fn peak_rss_mib(&self) -> f64 {
        self.rss_kib.iter().copied().max().unwrap_or(0) as f64 / 1024.0
    }

    fn table(&self, sizes: &Sizes) -> String {
        let mut rss = self.rss_kib.clone();
        rss.sort_unstable();
        let rss_median = rss.get(rss.len() / 2).copied().unwrap_or(0) as f64 / 1024.0;
        let mut t = String::new();
        t.push_str(&format!(
            "## Uncontended: `consem run --limit 1 -- true`, {} runs ({} warm-up runs not counted)\n\n",
            self.runs, sizes.uncontended_warmup
        ));
        t.push_str(
            "| wall median | wall p90 | wall max | peak RSS median | peak RSS max | requests/run | response bytes/run | failed runs |\n",
        );
        t.push_str("|---|---|---|---|---|---|---|---|\n");
        t.push_str(&format!(
            "| {:.2} ms | {:.2} ms | {:.2} ms | {:.2} MiB | {:.2} MiB | {} | {:.0} | {} |\n\n",
            self.wall_median_ms(),
            ms(percentile(&self.walls, 0.9)),
            ms(self.walls.iter().copied().max().unwrap_or_default()),
            rss_median,
            self.peak_rss_mib(),
            self.requests_per_run
                .map_or("n/a".to_string(), |r| format!("{r:.1}")),
            self.response_bytes_per_run,
            self.failures,
        ));
        t.push_str(
            "Wall: from spawning consem to reaping it (includes exec of consem and of `true`). \
             Peak RSS: ru_maxrss from wait4 (the larger of consem and the child it reaped). \
             Response bytes: everything the Consul side sent back (headers and bodies), counted \
             by a loopback proxy on separate runs that are not timed.\n\n",
        );
        t
    }
}

// ---------------------------------------------------------------------------
// Handoff
// ---------------------------------------------------------------------------

/// CPU time and peak RSS of the child alone (`sleep S` run directly), to
/// take out of consem's figures (wait4 counts the child consem reaped).
struct Baseline {
    cpu: Duration,
}

fn sleep_baseline(sizes: &Sizes) -> Baseline {
    let runs = 10;
    let secs = format!("{}", sizes.child_sleep.as_secs_f64());
    let commands = (0..runs)
        .map(|_| {
            let mut cmd = Command::new("sleep");
            cmd.arg(&secs).stdin(Stdio::null()).stdout(Stdio::null());
            cmd
        })
        .collect();
    let batch = run_batch(commands, Duration::ZERO, Duration::from_secs(30));
    let total: Duration = batch.outcomes.iter().map(|o| o.cpu).sum();
    Baseline { cpu: total / runs }
}

struct Handoff {
    n: usize,
    limit: usize,
    sleep: Duration,
    spawn_time: Duration,
    drained: Duration,
    requests: Option<usize>,
    response_bytes: u64,
    cpu_total: Duration,
    /// CPU time of this process (the in-process double, mostly) during the
    /// timed run.
    own_cpu: Duration,
    peak_rss_kib: u64,
    failures: usize,
    killed: usize,
}

impl Handoff {
    fn rounds(&self) -> usize {
        self.n.div_ceil(self.limit)
    }

    fn overhead_per_round_ms(&self) -> f64 {
        let rounds = self.rounds() as f64;
        (ms(self.drained) - rounds * ms(self.sleep)) / rounds
    }

    fn requests_per_handoff(&self) -> Option<f64> {
        self.requests.map(|r| r as f64 / self.n as f64)
    }
}

fn handoff(bench: &Bench, n: usize, limit: usize, sleep: Duration) -> Handoff {
    let rounds = n.div_ceil(limit);
    // Generous: the children's own time, plus half a second a round.
    let deadline = sleep * rounds as u32
        + Duration::from_millis(500) * rounds as u32
        + Duration::from_secs(30);
    let secs = format!("{}", sleep.as_secs_f64());
    let log = bench.path(&format!("handoff-{n}-{limit}.log"));

    eprintln!("handoff N={n} limit={limit}: timed run ({rounds} rounds of {secs} s)");
    let consul = bench.consul();
    let prefix = bench.prefix(&format!("handoff-{n}-{limit}"));
    let commands = (0..n)
        .map(|_| consem(&consul.addr, &prefix, limit, &["sleep", &secs], &log))
        .collect();
    let before = consul.requests();
    let own_before = own_cpu();
    let batch = run_batch(commands, Duration::ZERO, deadline);
    let own_cpu = own_cpu().saturating_sub(own_before);
    let requests = match (before, consul.requests()) {
        (Some(before), Some(after)) => Some(after - before),
        _ => None,
    };
    drop(consul);

    eprintln!("handoff N={n} limit={limit}: run through the byte-counting proxy");
    let consul = bench.consul();
    let proxy = Proxy::start(&consul.addr);
    let proxy_addr = proxy.addr.to_string();
    let prefix = bench.prefix(&format!("handoff-bytes-{n}-{limit}"));
    let commands = (0..n)
        .map(|_| consem(&proxy_addr, &prefix, limit, &["sleep", &secs], &log))
        .collect();
    let counted = run_batch(commands, Duration::ZERO, deadline);
    let response_bytes = proxy.response_bytes();
    drop(proxy);
    drop(consul);

    let failures = batch.failures() + counted.failures();
    report_failures(&format!("handoff N={n} limit={limit}"), failures, &log);
    let spawn_time = batch
        .outcomes
        .last()
        .map_or(Duration::ZERO, |o| o.spawned - batch.started);
    Handoff {
        n,
        limit,
        sleep,
        spawn_time,
        drained: batch.drained(),
        requests,
        response_bytes,
        cpu_total: batch.outcomes.iter().map(|o| o.cpu).sum(),
        own_cpu,
        peak_rss_kib: batch
            .outcomes
            .iter()
            .map(|o| o.maxrss_kib)
            .max()
            .unwrap_or(0),
        failures,
        killed: batch.killed + counted.killed,
    }
}

fn handoff_table(handoffs: &[Handoff], sizes: &Sizes, baseline: &Baseline) -> String {
    let mut t = String::new();
    t.push_str(&format!(
        "## Handoff: N contenders started at once, children `sleep {}`\n\n",
        sizes.child_sleep.as_secs_f64()
    ));
    t.push_str(
        "| N | limit | rounds | spawning N | drain time | overhead/round | requests/handoff | response bytes/handoff | consem CPU/handoff | harness CPU/handoff | peak RSS | failed | killed |\n",
    );
    t.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for h in handoffs {
        let cpu_per = h.cpu_total.saturating_sub(baseline.cpu * h.n as u32) / h.n as u32;
        t.push_str(&format!(
            "| {} | {} | {} | {:.0} ms | {:.0} ms | {:.1} ms | {} | {:.0} | {:.2} ms | {:.2} ms | {:.2} MiB | {} | {} |\n",
            h.n,
            h.limit,
            h.rounds(),
            ms(h.spawn_time),
            ms(h.drained),
            h.overhead_per_round_ms(),
            h.requests_per_handoff()
                .map_or("n/a".to_string(), |r| format!("{r:.1}")),
            h.response_bytes as f64 / h.n as f64,
            ms(cpu_per),
            ms(h.own_cpu / h.n as u32),
            h.peak_rss_kib as f64 / 1024.0,
            h.failures,
            h.killed,
        ));
    }
    t.push_str(&format!(
        "\nDrain time: from the first spawn to reaping the last consem. Overhead/round = (drain time - rounds x {} s) / rounds, \
         rounds = ceil(N/limit); it includes spawning the N processes. Requests/handoff: requests the double recorded during \
         the run / N. Response bytes/handoff: from a second run of the same size through the counting proxy / N. \
         CPU/handoff: user+system time of every consem (wait4), minus the child's own ({:.2} ms, measured on `sleep` run \
         directly), / N. Harness CPU/handoff: CPU time of the benchmark process itself during the timed run (the \
         in-process double answering, and the reaper) / N; it competes with consem for the same cores. \
         Peak RSS: the largest ru_maxrss among the N.\n\n",
        sizes.child_sleep.as_secs_f64(),
        ms(baseline.cpu),
    ));
    t
}

// ---------------------------------------------------------------------------
// Fairness
// ---------------------------------------------------------------------------

/// The child of a fairness contender: notes when it got the slot.
fn fairness_child(log: &str) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos();
    let id = std::env::var(CHILD_ID_ENV).unwrap_or_default();
    let sleep_ms: u64 = std::env::var(CHILD_SLEEP_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // One short append per line: never interleaved with another child's.
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("open the fairness log");
    file.write_all(format!("{id} {now}\n").as_bytes())
        .expect("write the fairness log");
    drop(file);
    thread::sleep(Duration::from_millis(sleep_ms));
}

struct Fairness {
    contenders: usize,
    arrival_source: &'static str,
    /// Contenders granted before one that arrived earlier.
    overtakers: usize,
    /// Grants whose position differs from the arrival position.
    displaced: usize,
    max_wait: Duration,
    max_excess: Duration,
    grant_order: Vec<usize>,
    failures: usize,
    killed: usize,
}

fn fairness(bench: &Bench, sizes: &Sizes) -> Fairness {
    let n = sizes.fair_contenders;
    eprintln!(
        "fairness: {n} contenders, limit 1, started {:?} apart, children {:?}",
        sizes.fair_gap, sizes.fair_child
    );
    let consul = bench.consul();
    let prefix = bench.prefix("fairness");
    let log = bench.path("fairness.log");
    let grants = bench.path("fairness-grants.log");
    let me = std::env::current_exe().expect("path of this benchmark binary");
    let me = me.to_str().expect("a UTF-8 path");
    let commands = (0..n)
        .map(|i| {
            let mut cmd = consem(&consul.addr, &prefix, 1, &[me], &log);
            cmd.env(CHILD_LOG_ENV, &grants)
                .env(CHILD_ID_ENV, i.to_string())
                .env(CHILD_SLEEP_ENV, sizes.fair_child.as_millis().to_string());
            cmd
        })
        .collect();
    let deadline = (sizes.fair_gap + sizes.fair_child + Duration::from_millis(500)) * n as u32
        + Duration::from_secs(30);
    let batch = run_batch(commands, sizes.fair_gap, deadline);
    let failures = batch.failures();
    report_failures("fairness", failures, &log);

    // Arrival: the order of the contenders' first acquire of their contender
    // key as the double saw it (their CreateIndex order); spawn order
    // against a real agent.
    let pid_index: HashMap<u64, usize> = batch
        .pids
        .iter()
        .enumerate()
        .map(|(i, pid)| (*pid as u64, i))
        .collect();
    let mut arrival: Vec<usize> = Vec::new();
    let mut arrival_source = "spawn order (50 ms apart)";
    if let Some(double) = &consul.double {
        let mut seen = HashSet::new();
        for request in double.requests() {
            if request.method == "PUT" && request.query_value("acquire").is_some() {
                let pid = serde_json::from_slice::<serde_json::Value>(&request.body)
                    .ok()
                    .and_then(|v| v.get("Pid").and_then(serde_json::Value::as_u64));
                if let Some(&i) = pid.and_then(|pid| pid_index.get(&pid)) {
                    if seen.insert(i) {
                        arrival.push(i);
                    }
                }
            }
        }
        if arrival.len() == n {
            arrival_source = "first acquire of each contender key, as the double recorded it";
        } else {
            arrival = (0..n).collect();
        }
    } else {
        arrival = (0..n).collect();
    }
    drop(consul);

    // Grants: (contender, unix ns) in the order the children started.
    let text = std::fs::read_to_string(&grants).unwrap_or_default();
    let mut granted: Vec<(usize, u128)> = text
        .lines()
        .filter_map(|line| {
            let (id, ns) = line.split_once(' ')?;
            Some((id.parse().ok()?, ns.parse().ok()?))
        })
        .collect();
    granted.sort_by_key(|&(_, ns)| ns);
    let grant_order: Vec<usize> = granted.iter().map(|&(i, _)| i).collect();

    let arrival_pos: HashMap<usize, usize> = arrival
        .iter()
        .enumerate()
        .map(|(pos, &i)| (i, pos))
        .collect();
    let mut overtakers = 0;
    let mut displaced = 0;
    for (pos, &i) in grant_order.iter().enumerate() {
        let mine = arrival_pos.get(&i).copied().unwrap_or(usize::MAX);
        if mine != pos {
            displaced += 1;
        }
        // Some contender that arrived before i is granted after it.
        if grant_order[pos + 1..]
            .iter()
            .any(|j| arrival_pos.get(j).copied().unwrap_or(usize::MAX) < mine)
        {
            overtakers += 1;
        }
    }

    // Waits: from spawn (as unix time) to the child's start. The ideal is a
    // FIFO queue with no overhead: start = max(spawn, previous ideal start +
    // child time), in arrival order.
    let unix_now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    let instant_now = Instant::now();
    let spawn_unix =
        |i: usize| -> Duration { unix_now - (instant_now - batch.outcomes[i].spawned) };
    let start_of: HashMap<usize, Duration> = granted
        .iter()
        .map(|&(i, ns)| (i, Duration::from_nanos(ns as u64)))
        .collect();
    let mut ideal_prev: Option<Duration> = None;
    let mut max_wait = Duration::ZERO;
    let mut max_excess = Duration::ZERO;
    for &i in &arrival {
        let spawned = spawn_unix(i);
        let ideal = match ideal_prev {
            Some(prev) => (prev + sizes.fair_child).max(spawned),
            None => spawned,
        };
        ideal_prev = Some(ideal);
        if let Some(&start) = start_of.get(&i) {
            let wait = start.saturating_sub(spawned);
            max_wait = max_wait.max(wait);
            max_excess = max_excess.max(start.saturating_sub(ideal));
        }
    }
    Fairness {
        contenders: n,
        arrival_source,
        overtakers,
        displaced,
        max_wait,
        max_excess,
        grant_order,
        failures,
        killed: batch.killed,
    }
}

impl Fairness {
    fn table(&self, sizes: &Sizes) -> String {
        let mut t = String::new();
        t.push_str(&format!(
            "## Fairness: {} contenders, limit 1, started one by one {} ms apart, children run {} ms\n\n",
            self.contenders,
            sizes.fair_gap.as_millis(),
            sizes.fair_child.as_millis()
        ));
        t.push_str(
            "| granted | out of order (overtook an earlier arrival) | not at their arrival position | longest wait | longest wait beyond the ideal | failed | killed |\n",
        );
        t.push_str("|---|---|---|---|---|---|---|\n");
        t.push_str(&format!(
            "| {} / {} | {} | {} | {:.0} ms | {:.0} ms | {} | {} |\n\n",
            self.grant_order.len(),
            self.contenders,
            self.overtakers,
            self.displaced,
            ms(self.max_wait),
            ms(self.max_excess),
            self.failures,
            self.killed,
        ));
        t.push_str(&format!(
            "Grant order (contenders numbered in spawn order): {:?}. Arrival order: {}. Ideal: FIFO with no \
             overhead, a contender starts at max(its spawn, the previous one's ideal start + {} ms).\n\n",
            self.grant_order,
            self.arrival_source,
            sizes.fair_child.as_millis()
        ));
        t
    }
}

// ---------------------------------------------------------------------------
// Goals
// ---------------------------------------------------------------------------

fn goals(u: &Uncontended, handoffs: &[Handoff], f: &Fairness, m: &Mixed, judged: bool) -> String {
    let verdict = |met: bool| match (judged, met) {
        (false, _) => "not judged (quick mode or debug build)",
        (true, true) => "met",
        (true, false) => "NOT met",
    };
    let mut t = String::new();
    t.push_str(
        "## Goals (on this Consul; consul lock's figures were measured on a real agent)\n\n",
    );
    t.push_str("| goal | target | consem here | consul lock (real agent) | verdict |\n");
    t.push_str("|---|---|---|---|---|\n");
    let wall = u.wall_median_ms();
    t.push_str(&format!(
        "| uncontended wall (median) | <= {:.1} ms (a third of consul lock's) | {wall:.2} ms | {CONSUL_LOCK_WALL_MS:.0} ms | {} |\n",
        CONSUL_LOCK_WALL_MS / 3.0,
        verdict(wall <= CONSUL_LOCK_WALL_MS / 3.0)
    ));
    let rss = u.peak_rss_mib();
    t.push_str(&format!(
        "| uncontended peak RSS (max) | <= {GOAL_RSS_MIB:.0} MiB | {rss:.2} MiB | {CONSUL_LOCK_RSS_MIB} MiB | {} |\n",
        verdict(rss <= GOAL_RSS_MIB)
    ));
    match handoffs.iter().find(|h| h.n == 100 && h.limit == 5) {
        Some(h) => {
            let round = h.overhead_per_round_ms();
            t.push_str(&format!(
                "| handoff overhead/round, N=100 limit 5 | <= {GOAL_ROUND_MS:.0} ms | {round:.1} ms | about 103 ms | {} |\n",
                verdict(round <= GOAL_ROUND_MS)
            ));
        }
        None => t.push_str(
            "| handoff overhead/round, N=100 limit 5 | <= 5 ms | not run in this mode | about 103 ms | n/a |\n",
        ),
    }
    let per: Vec<(usize, usize, f64)> = handoffs
        .iter()
        .filter_map(|h| h.requests_per_handoff().map(|r| (h.n, h.limit, r)))
        .collect();
    // Constant in N: compared among the sizes that share a limit (each
    // holder wakes for every `.lock` write, so the limit adds its share).
    let mut spreads = Vec::new();
    let mut limits: Vec<usize> = per.iter().map(|p| p.1).collect();
    limits.sort_unstable();
    limits.dedup();
    for limit in limits {
        let at: Vec<&(usize, usize, f64)> = per.iter().filter(|p| p.1 == limit).collect();
        if at.len() < 2 {
            continue;
        }
        let min = at.iter().map(|p| p.2).fold(f64::INFINITY, f64::min);
        let max = at.iter().map(|p| p.2).fold(0.0, f64::max);
        let listed: Vec<String> = at
            .iter()
            .map(|(n, _, r)| format!("{r:.1} at N={n}"))
            .collect();
        spreads.push((
            max / min,
            format!(
                "limit {limit}: {} (max/min {:.2})",
                listed.join(", "),
                max / min
            ),
        ));
    }
    if spreads.is_empty() {
        t.push_str(
            "| requests per handoff constant in N | max/min <= 1.25 among sizes of one limit | n/a (no two sizes share a limit, or a real agent) | grows with N | n/a |\n",
        );
    } else {
        let worst = spreads.iter().map(|s| s.0).fold(0.0, f64::max);
        let shown: Vec<String> = spreads.into_iter().map(|s| s.1).collect();
        t.push_str(&format!(
            "| requests per handoff constant in N | max/min <= 1.25 among sizes of one limit | {} | grows with N | {} |\n",
            shown.join("; "),
            verdict(worst <= 1.25)
        ));
    }
    t.push_str(&format!(
        "| fairness: out-of-order grants | 0 | {} of {} | random order | {} |\n",
        f.overtakers,
        f.contenders,
        verdict(f.overtakers == 0 && f.grant_order.len() == f.contenders)
    ));
    t.push_str(&format!(
        "| beside consul lock: consem's share of runs | >= its share of contenders ({:.0} %) | {:.1} % | takes {:.1} % | {} |\n",
        m.consem_share_of_contenders() * 100.0,
        m.consem_share_of_runs() * 100.0,
        (1.0 - m.consem_share_of_runs()) * 100.0,
        verdict(m.consem_share_of_runs() >= m.consem_share_of_contenders())
    ));
    t
}

// ---------------------------------------------------------------------------
// Beside consul lock: the same measures for both tools
// ---------------------------------------------------------------------------

/// One tool's figures in the side-by-side section.
struct Figures {
    tool: String,
    wall: Duration,
    rss_mib: f64,
    gap: Duration,
    gap_p90: Duration,
    waiter_cpu: Duration,
    crowd_overhead: Duration,
}

struct Beside {
    runs: usize,
    waiters: usize,
    rounds: usize,
    crowd: (usize, usize, Duration),
    spawn: Duration,
    /// consem's, then consul lock's when it was measured.
    figures: Vec<Figures>,
    /// Why consul lock was not measured.
    alone: Option<&'static str>,
}

/// `consul lock -n <limit> -shell=false <prefix> <command>` against `addr`,
/// as consem's `run` is set up.
fn consul_lock(
    cli: &Path,
    addr: &str,
    prefix: &str,
    limit: usize,
    command: &[String],
    log: &Path,
) -> Command {
    let mut cmd = consul_client(cli, addr, log);
    cmd.args(["lock", "-n", &limit.to_string(), "-shell=false", prefix])
        .args(command);
    cmd
}

/// The same measures for consem and, on a real agent with a `consul`
/// binary at hand, for `consul lock -n`, one tool after the other, each
/// under prefixes of its own.
fn beside(bench: &Bench, sizes: &BesideSizes) -> Beside {
    let consul = bench.consul();
    let log = bench.path("beside.log");
    let cli = match bench.target {
        Target::Real(_) => consul_cli(),
        Target::Double => None,
    };
    let alone = match (&bench.target, &cli) {
        (Target::Double, _) => Some("the test double: consul lock needs a real agent"),
        (Target::Real(_), None) => Some("no consul binary on PATH or at CONSEM_BENCH_CONSUL_BIN"),
        _ => None,
    };
    let root = bench.prefix("beside");
    let mut figures = Vec::new();
    let tools: Vec<(&str, Option<&Path>)> = std::iter::once(("consem", None))
        .chain(cli.as_deref().map(|cli| ("consul lock", Some(cli))))
        .collect();
    for (tool, cli) in tools {
        eprintln!("beside: {tool}");
        let make = |name: &str, limit: usize, run: &[String]| -> Command {
            let prefix = format!("{root}/{}/{name}", tool.replace(' ', "-"));
            match cli {
                Some(cli) => consul_lock(cli, &consul.addr, &prefix, limit, run, &log),
                None => {
                    let run: Vec<&str> = run.iter().map(String::as_str).collect();
                    consem(&consul.addr, &prefix, limit, &run, &log)
                }
            }
        };
        let (wall, _, rss_mib) = common::uncontended(&make, sizes.runs);
        let mut gaps: Vec<Duration> = (0..sizes.rounds)
            .flat_map(|round| {
                common::handoff(
                    &make,
                    &bench.scratch,
                    &format!("handoff-{round}"),
                    sizes.waiters,
                    sizes.child_sleep,
                    None,
                )
            })
            .collect();
        gaps.sort();
        let waiter_cpu = common::waiter_cpu(&make, "waiter-cpu", sizes.waiting);
        let (n, limit, sleep) = sizes.crowd;
        let (_, crowd_overhead) = common::crowd(&make, "crowd", n, limit, sleep);
        figures.push(Figures {
            tool: match cli {
                Some(cli) => format!("consul lock ({})", cli.display()),
                None => "consem".to_string(),
            },
            wall,
            rss_mib,
            gap: gaps[gaps.len() / 2],
            gap_p90: common::percentile(&gaps, 0.9),
            waiter_cpu,
            crowd_overhead,
        });
    }
    Beside {
        runs: sizes.runs,
        waiters: sizes.waiters,
        rounds: sizes.rounds,
        crowd: sizes.crowd,
        spawn: common::spawn_cost(sizes.runs.min(50)),
        figures,
        alone,
    }
}

impl Beside {
    fn table(&self, judged: bool) -> String {
        let (runs, waiters, rounds) = (self.runs, self.waiters, self.rounds);
        let (n, limit, sleep) = self.crowd;
        let mut t = String::from("## Beside consul lock\n\n");
        if let Some(why) = self.alone {
            t.push_str(&format!("consem alone: {why}.\n\n"));
        }
        t.push_str(&format!(
            "(uncontended: {runs} runs of `true`, wall median and peak RSS; handoff gap: limit 1, \
             {waiters} waiters queued, {rounds} round(s), one command's end to the next one's \
             start as the commands log them (starting the command alone takes {:.2} ms); \
             a waiter's CPU: every thread and helper, over its wait; crowd: N={n} started at \
             once on limit {limit}, each command sleeping {:.0} ms, overhead per round beyond \
             the sleeping)\n\n",
            ms(self.spawn),
            ms(sleep)
        ));
        t.push_str("| tool | uncontended wall | peak RSS | handoff gap median | p90 | waiter CPU | crowd overhead per round |\n");
        t.push_str("|---|---|---|---|---|---|---|\n");
        for f in &self.figures {
            t.push_str(&format!(
                "| {} | {:.2} ms | {:.2} MiB | {:.2} ms | {:.2} ms | {:.2} ms | {:.1} ms |\n",
                f.tool,
                ms(f.wall),
                f.rss_mib,
                ms(f.gap),
                ms(f.gap_p90),
                ms(f.waiter_cpu),
                ms(f.crowd_overhead)
            ));
        }
        let ours = &self.figures[0];
        let verdict = |met: bool| match (judged, met) {
            (false, _) => "not judged (quick mode or debug build)",
            (true, true) => "met",
            (true, false) => "NOT met",
        };
        t.push_str("\n| goal | consem / consul lock | verdict |\n|---|---|---|\n");
        t.push_str(&format!(
            "| peak RSS at most {GOAL_RSS_MIB:.0} MiB | {:.2} MiB | {} |\n",
            ours.rss_mib,
            verdict(ours.rss_mib <= GOAL_RSS_MIB)
        ));
        let Some(theirs) = self.figures.get(1) else {
            t.push_str("| the ratios to consul lock | not measured | n/a |\n\n");
            return t;
        };
        let ratio = |a: Duration, b: Duration| ms(a) / ms(b);
        for (what, ours, theirs, most) in [
            (
                "handoff gap (median) at most 1/2 of consul lock's",
                ours.gap,
                theirs.gap,
                0.5,
            ),
            (
                "crowd overhead per round at most 1/20 of consul lock's",
                ours.crowd_overhead,
                theirs.crowd_overhead,
                0.05,
            ),
            (
                "uncontended wall at most 1/5 of consul lock's",
                ours.wall,
                theirs.wall,
                0.2,
            ),
        ] {
            let r = ratio(ours, theirs);
            t.push_str(&format!("| {what} | {r:.3} | {} |\n", verdict(r <= most)));
        }
        // A consul lock waiter sleeps in one blocking query: its CPU can
        // be nil, and a ratio to it says nothing.
        t.push_str(&format!(
            "| (a waiter's CPU, for reading) | {:.2} ms against {:.2} ms | |\n\n",
            ms(ours.waiter_cpu),
            ms(theirs.waiter_cpu)
        ));
        t
    }
}

// ---------------------------------------------------------------------------
// Mixed clients: consem beside consul lock on one prefix
// ---------------------------------------------------------------------------

struct Mixed {
    loops: usize,
    limit: usize,
    child: Duration,
    ran_for: Duration,
    peer: String,
    consem_runs: u64,
    consem_failures: u64,
    peer_runs: u64,
}

impl Mixed {
    fn consem_share_of_contenders(&self) -> f64 {
        0.5
    }

    fn consem_share_of_runs(&self) -> f64 {
        let all = self.consem_runs + self.peer_runs;
        if all == 0 {
            0.0
        } else {
            self.consem_runs as f64 / all as f64
        }
    }

    fn table(&self) -> String {
        let mut t = String::new();
        t.push_str(&format!(
            "## Mixed clients ({} loops of consem and {} of {}, limit {}, commands of {} ms, {:.0} s)\n\n",
            self.loops,
            self.loops,
            self.peer,
            self.limit,
            self.child.as_millis(),
            self.ran_for.as_secs_f64()
        ));
        t.push_str(
            "| client | runs | runs per loop per minute | share of runs | share of contenders |\n",
        );
        t.push_str("|---|---|---|---|---|\n");
        let per_minute =
            |runs: u64| runs as f64 / self.loops as f64 / self.ran_for.as_secs_f64() * 60.0;
        let share = self.consem_share_of_runs();
        t.push_str(&format!(
            "| consem | {} | {:.1} | {:.1} % | 50 % |\n",
            self.consem_runs,
            per_minute(self.consem_runs),
            share * 100.0
        ));
        t.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} % | 50 % |\n",
            self.peer,
            self.peer_runs,
            per_minute(self.peer_runs),
            (1.0 - share) * 100.0
        ));
        if self.consem_failures > 0 {
            t.push_str(&format!(
                "\n{} consem runs failed (see the log)\n",
                self.consem_failures
            ));
        }
        t.push('\n');
        t
    }
}

/// The `consul` binary for `consul lock`, when a real agent is measured.
fn consul_cli() -> Option<PathBuf> {
    if let Ok(path) = std::env::var(CONSUL_BIN_ENV) {
        return Some(PathBuf::from(path));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("consul"))
            .find(|path| path.is_file())
    })
}

/// Loops of consem and loops of `consul lock -n <limit>` on one prefix for
/// a while; counts the runs each got.
fn mixed(bench: &Bench, sizes: &Sizes) -> Mixed {
    let consul = bench.consul();
    let prefix = bench.prefix("mixed");
    let log = bench.path("mixed.log");
    let child_secs = format!("{:.3}", sizes.mixed_child.as_secs_f64());
    let cli = match bench.target {
        Target::Real(_) => consul_cli(),
        Target::Double => None,
    };
    let peer = match &cli {
        Some(path) => format!("consul lock ({})", path.display()),
        None => "a consul lock stand-in (in-process)".to_string(),
    };
    eprintln!(
        "mixed: {} loops of consem and {} of {peer}, limit {}, {:?}",
        sizes.mixed_loops, sizes.mixed_loops, sizes.mixed_limit, sizes.mixed_for
    );
    let stop = Arc::new(AtomicBool::new(false));
    let consem_runs = Arc::new(AtomicU64::new(0));
    let consem_failures = Arc::new(AtomicU64::new(0));
    let peer_runs = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    let mut stand_ins = Vec::new();
    let started = Instant::now();
    for _ in 0..sizes.mixed_loops {
        let (stopped, runs, failures) = (
            Arc::clone(&stop),
            Arc::clone(&consem_runs),
            Arc::clone(&consem_failures),
        );
        let mut command = consem(
            &consul.addr,
            &prefix,
            sizes.mixed_limit,
            &["sleep", &child_secs],
            &log,
        );
        threads.push(thread::spawn(move || {
            while !stopped.load(Ordering::SeqCst) {
                match command.status() {
                    Ok(status) if status.success() => runs.fetch_add(1, Ordering::SeqCst),
                    _ => failures.fetch_add(1, Ordering::SeqCst),
                };
            }
        }));
        match &cli {
            Some(path) => {
                let (stopped, runs) = (Arc::clone(&stop), Arc::clone(&peer_runs));
                let mut command = Command::new(path);
                command
                    .env("CONSUL_HTTP_ADDR", &consul.addr)
                    .args(["lock", "-n", &sizes.mixed_limit.to_string(), &prefix])
                    .args(["sleep", &child_secs])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null());
                for name in CONSUL_ENV {
                    command.env_remove(name);
                }
                threads.push(thread::spawn(move || {
                    while !stopped.load(Ordering::SeqCst) {
                        if command.status().is_ok_and(|s| s.success()) {
                            runs.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }));
            }
            None => stand_ins.push(consul_lock::ConsulLockLoop::start(
                &format!("http://{}", consul.addr),
                &prefix,
                sizes.mixed_limit as u32,
                sizes.mixed_child,
            )),
        }
    }
    thread::sleep(sizes.mixed_for);
    // Runs that end after this moment do not count: the loops stop at
    // different times.
    let (consem_at_end, peer_at_end) = (
        consem_runs.load(Ordering::SeqCst),
        peer_runs.load(Ordering::SeqCst) + stand_ins.iter().map(|s| s.runs()).sum::<u64>(),
    );
    let ran_for = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    for stand_in in stand_ins {
        stand_in.stop();
    }
    for thread in threads {
        let _ = thread.join();
    }
    report_failures(
        "mixed",
        consem_failures.load(Ordering::SeqCst) as usize,
        &log,
    );
    Mixed {
        loops: sizes.mixed_loops,
        limit: sizes.mixed_limit,
        child: sizes.mixed_child,
        ran_for,
        peer,
        consem_runs: consem_at_end,
        consem_failures: consem_failures.load(Ordering::SeqCst),
        peer_runs: peer_at_end,
    }
}

// ---------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------

/// Nearest-rank percentile (`q` in 0..=1).
fn percentile(values: &[Duration], q: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn file_size(path: &str) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// On failures, tells stderr and shows the end of the consem log.
fn report_failures(what: &str, failures: usize, log: &Path) {
    if failures == 0 {
        return;
    }
    eprintln!("{what}: {failures} consem runs did not exit 0; end of their stderr:");
    let mut text = String::new();
    if let Ok(mut file) = File::open(log) {
        let _ = file.read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().collect();
    for line in &lines[lines.len().saturating_sub(20)..] {
        eprintln!("  {line}");
    }
}
