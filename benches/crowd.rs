//! Benchmark of a crowd on one prefix, on every store: N contenders started
//! at once with `--limit 10`, each running the harness's child mode for
//! 50 ms (it logs when its command starts and ends), for N=100 and N=1,000.
//! Redis, etcd (one member) and ZooKeeper (standalone, Debian's jar) are
//! servers the harness starts on free loopback ports with scratch
//! directories; Consul is the real agent at
//! `CONSEM_BENCH_CONSUL_ADDR` if set, else the in-process test double.
//! Prints one table, then the goals judged on its figures:
//!
//! - finished (exit 0) / N, and the other exit codes with their counts;
//! - most at once: the most commands running together, from their log;
//! - out of arrival order: contenders whose command started at least one
//!   round (`limit` places) away from their place in spawn order;
//! - overhead per round: (wall − rounds × 50 ms) / rounds, rounds = N/limit;
//! - CPU per run: all the crowd's CPU (consem and its commands, from
//!   getrusage(RUSAGE_CHILDREN) around the crowd) divided by N.
//!
//! Nothing is asserted: a slow machine gives slow figures, not a failure.
//!
//!     cargo bench --bench crowd
//!     CONSEM_BENCH_QUICK=1 cargo bench --profile dev --bench crowd   # tiny sizes (CI)
//!     CONSEM_BENCH_ONLY=etcd cargo bench --bench crowd               # one store
//!     CONSEM_BENCH_BIN=/path/to/older/consem cargo bench --bench crowd

#[allow(dead_code)] // the benchmark uses a small part of the double
#[path = "../tests/common/double.rs"]
mod double;

#[allow(dead_code)] // each harness uses a part of it
mod common;

use std::collections::{BTreeMap, HashMap};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{consem_bin, ms, tree_cpu, yes, CHILD_GO_ENV, CHILD_LOG_ENV, CHILD_SLEEP_ENV};
use double::ConsulDouble;

const QUICK_ENV: &str = "CONSEM_BENCH_QUICK";
/// One store only: redis, local, etcd, consul or zookeeper.
const ONLY_ENV: &str = "CONSEM_BENCH_ONLY";
/// `host:port` of a real Consul agent to measure against.
const REAL_CONSUL_ENV: &str = "CONSEM_BENCH_CONSUL_ADDR";

const LIMIT: usize = 10;
const SLEEP: Duration = Duration::from_millis(50);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Store {
    Redis,
    Local,
    Etcd,
    Consul,
    Zookeeper,
}

impl Store {
    const ALL: [Store; 5] = [
        Store::Redis,
        Store::Local,
        Store::Etcd,
        Store::Consul,
        Store::Zookeeper,
    ];

    fn name(self) -> &'static str {
        match self {
            Store::Redis => "redis",
            Store::Local => "local",
            Store::Etcd => "etcd",
            Store::Consul => "consul",
            Store::Zookeeper => "zookeeper",
        }
    }
}

/// A server the harness started; killed when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until something listens on `port`, or panics after 30 s.
fn until_listening(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{what} did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn start_redis(dir: &Path) -> (Process, String) {
    let port = free_port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--maxclients", "10000"])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server is needed (apt-get install redis-server)");
    let process = Process(child);
    until_listening(port, "redis-server");
    (process, format!("redis://127.0.0.1:{port}"))
}

fn start_etcd(dir: &Path) -> (Process, String) {
    let (client, peer) = (free_port(), free_port());
    let name = format!("consem-crowd-{}", std::process::id());
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let child = Command::new("etcd")
        .args(["--name", &name])
        .arg("--data-dir")
        .arg(dir.join("etcd-data"))
        .args(["--listen-client-urls", &client_url])
        .args(["--advertise-client-urls", &client_url])
        .args(["--listen-peer-urls", &peer_url])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("{name}={peer_url}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("etcd.log")).unwrap())
        .spawn()
        .expect("etcd is needed (apt-get install etcd-server)");
    let process = Process(child);
    until_listening(client, "etcd");
    // Listening comes before the member is elected leader: wait for a put.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !Command::new("etcdctl")
        .args(["--endpoints", &client_url, "put", "consem-crowd-ready", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        assert!(Instant::now() < deadline, "etcd never took a put");
        std::thread::sleep(Duration::from_millis(50));
    }
    (process, format!("etcd://127.0.0.1:{client}"))
}

/// A standalone ZooKeeper from Debian's jar. maxClientCnxns=0 lifts its
/// limit of 60 connections from one address; forceSync=no keeps the disk
/// out of the figures, as in benches/zookeeper.rs.
fn start_zookeeper(dir: &Path) -> (Process, String) {
    let port = free_port();
    let data = dir.join("zookeeper-data");
    std::fs::create_dir_all(&data).unwrap();
    let config = dir.join("zoo.cfg");
    std::fs::write(
        &config,
        format!(
            "tickTime=2000\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\nmaxClientCnxns=0\nforceSync=no\nadmin.enableServer=false\n",
            data.display()
        ),
    )
    .unwrap();
    // Debian's jars that the server needs.
    let jars = "zookeeper zookeeper-jute slf4j-api slf4j-nop netty-handler netty-transport \
                netty-common netty-buffer netty-codec netty-resolver netty-transport-native-epoll \
                netty-transport-native-unix-common commons-cli metrics-core snappy-java";
    let classpath: Vec<String> = jars
        .split_whitespace()
        .map(|jar| format!("/usr/share/java/{jar}.jar"))
        .collect();
    let child = Command::new("java")
        .args(["-Xmx512m", "-cp", &classpath.join(":")])
        .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("zookeeper.log")).unwrap())
        .spawn()
        .expect("java is needed (apt-get install zookeeperd)");
    let process = Process(child);
    // It listens before it serves (and closes connections meanwhile):
    // wait for a run of consem to pass.
    let url = format!("zk://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !Command::new(consem_bin())
        .args(["run", "--store", &url, "--prefix", "consem-crowd-ready"])
        .args(["--limit", "1", "--", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        assert!(Instant::now() < deadline, "zookeeper never served");
        std::thread::sleep(Duration::from_millis(50));
    }
    (process, url)
}

/// Where the crowd's contenders find their store.
enum Target {
    /// `--store <url>`.
    Url(String),
    /// A Consul agent at `host:port`, given as CONSUL_HTTP_ADDR.
    Consul(String),
}

impl Target {
    /// A contender's command line; `verbose` adds `-v` (its events on
    /// stderr).
    fn command(&self, prefix: &str, verbose: bool) -> Command {
        let mut cmd = Command::new(consem_bin());
        cmd.arg("run");
        if verbose {
            cmd.arg("-v");
        }
        match self {
            Target::Url(url) => {
                cmd.args(["--store", url]);
            }
            Target::Consul(addr) => {
                cmd.env("CONSUL_HTTP_ADDR", addr)
                    .env_remove("CONSUL_HTTP_TOKEN")
                    .env_remove("CONSUL_HTTP_SSL");
            }
        }
        cmd.env_remove("CONSEM_STORE")
            .args(["--prefix", prefix, "--limit", &LIMIT.to_string(), "--"])
            .args(common::self_command());
        cmd
    }
}

/// One crowd's figures.
struct Crowd {
    n: usize,
    finished: usize,
    /// Exit codes other than 0 (128 + signal for a signal), with counts.
    others: BTreeMap<i32, usize>,
    most_at_once: usize,
    out_of_order: usize,
    wall: Duration,
    cpu: Duration,
    /// What the server spent, where the harness can tell.
    server_cpu: Option<Duration>,
}

/// One queue's figures: `n` waiters that joined one at a time behind
/// `LIMIT` holders.
struct Queue {
    n: usize,
    finished: usize,
    /// Exit codes other than 0, holders' included, with counts.
    others: BTreeMap<i32, usize>,
    out_of_order: usize,
    /// From the holders' letting go to the last waiter's exit.
    wall: Duration,
    /// The CPU of every contender's whole run, holders' included.
    cpu: Duration,
}

impl Queue {
    fn overhead_ms(&self) -> f64 {
        overhead_ms(self.wall, self.n)
    }
}

/// (wall − rounds × SLEEP) / rounds, rounds = n / LIMIT.
fn overhead_ms(wall: Duration, n: usize) -> f64 {
    let rounds = n.div_ceil(LIMIT) as u32;
    (wall.as_secs_f64() - SLEEP.as_secs_f64() * f64::from(rounds)) * 1000.0 / f64::from(rounds)
}

impl Crowd {
    fn overhead_ms(&self) -> f64 {
        overhead_ms(self.wall, self.n)
    }

    fn server_cpu_per_run_ms(&self) -> Option<f64> {
        self.server_cpu.map(|cpu| ms(cpu) / self.n as f64)
    }

    fn cpu_per_run_ms(&self) -> f64 {
        ms(self.cpu) / self.n as f64
    }
}

fn children_cpu() -> Duration {
    rusage_cpu(libc::RUSAGE_CHILDREN)
}

/// This process's own CPU: the harness, and the Consul double when it is
/// the double that answers.
fn own_cpu() -> Duration {
    rusage_cpu(libc::RUSAGE_SELF)
}

fn rusage_cpu(who: libc::c_int) -> Duration {
    // SAFETY: an all-zero rusage is valid; getrusage fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid `who` with a valid pointer.
    let rc = unsafe { libc::getrusage(who, &mut usage) };
    assert_eq!(rc, 0);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// What answers the crowd, for its CPU.
enum Server {
    /// A server process the harness started (its pid).
    Process(u32),
    /// The in-process double: the harness's own CPU, polling included.
    InProcess,
    /// Nothing (the local store), or an agent the harness did not start.
    Unmeasured,
}

impl Server {
    fn cpu(&self) -> Option<Duration> {
        match self {
            Server::Process(pid) => Some(tree_cpu(*pid)),
            Server::InProcess => Some(own_cpu()),
            Server::Unmeasured => None,
        }
    }
}

/// Contenders spawned by the harness, by pid, with their place in arrival
/// (spawn) order.
struct Contenders {
    pids: HashMap<u32, usize>,
    codes: Vec<Option<i32>>,
}

impl Contenders {
    fn new(n: usize) -> Contenders {
        Contenders {
            pids: HashMap::with_capacity(n),
            codes: vec![None; n],
        }
    }

    fn spawned(&mut self, place: usize, child: Child) {
        // Reaped with waitpid below; a Child dropped unwaited is left alone.
        self.pids.insert(child.id(), place);
    }

    fn running(&self) -> usize {
        self.codes.iter().filter(|c| c.is_none()).count()
    }

    /// Reaps every contender that has exited, without blocking: one
    /// waitpid per exit, not one per contender per look, which at a
    /// thousand contenders would take a core from the crowd.
    fn reap(&mut self) {
        loop {
            let mut status = 0;
            // SAFETY: waitpid with a valid pointer; -1 is any child.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                return;
            }
            if let Some(&place) = self.pids.get(&(pid as u32)) {
                let code = if libc::WIFEXITED(status) {
                    libc::WEXITSTATUS(status)
                } else {
                    128 + libc::WTERMSIG(status)
                };
                self.codes[place] = Some(code);
            }
        }
    }

    /// Whether contender `place` has exited.
    fn exited(&mut self, place: usize) -> bool {
        self.reap();
        self.codes[place].is_some()
    }

    /// Waits for every contender, killing those still running `deadline`
    /// after `started`; returns the wall time since `started`.
    fn wait_all(&mut self, started: Instant, deadline: Duration, prefix: &str) -> Duration {
        let mut killed = false;
        loop {
            self.reap();
            let wall = started.elapsed();
            let running = self.running();
            if running == 0 {
                return wall;
            }
            if !killed && wall > deadline {
                eprintln!(
                    "{prefix}: {running} contenders still running after {:.0} s: killed",
                    deadline.as_secs_f64()
                );
                for (&pid, &place) in &self.pids {
                    if self.codes[place].is_none() {
                        // SAFETY: a pid of ours, not yet reaped.
                        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                    }
                }
                killed = true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// How many of the contenders at `places` exited 0.
    fn finished(&self, places: std::ops::Range<usize>) -> usize {
        self.codes[places].iter().filter(|c| **c == Some(0)).count()
    }

    /// Exit codes other than 0 (128 + signal for a signal), with counts.
    fn others(&self) -> BTreeMap<i32, usize> {
        let mut others = BTreeMap::new();
        for code in self.codes.iter().flatten().filter(|&&c| c != 0) {
            *others.entry(*code).or_insert(0) += 1;
        }
        others
    }
}

/// The commands' runs, from their logs: (start, end, place in arrival
/// order), sorted by start.
fn runs(logs: &Path, places: std::ops::Range<usize>) -> Vec<(u128, u128, usize)> {
    let mut runs: Vec<(u128, u128, usize)> = places
        .filter_map(|i| {
            let text = std::fs::read_to_string(logs.join(i.to_string())).ok()?;
            let mut parts = text.split_whitespace().map(|p| p.parse::<u128>().ok());
            Some((parts.next()??, parts.next()??, i))
        })
        .collect();
    runs.sort();
    runs
}

/// Commands that started a round (`LIMIT` places) or more away from their
/// place in arrival order, counted from `first` (the first place judged).
fn out_of_order(runs: &[(u128, u128, usize)], first: usize) -> usize {
    runs.iter()
        .enumerate()
        .filter(|(rank, run)| (rank + first).abs_diff(run.2) >= LIMIT)
        .count()
}

/// The most commands running at once.
fn most_at_once(runs: &[(u128, u128, usize)]) -> usize {
    let mut events: Vec<(u128, i32)> = runs.iter().flat_map(|r| [(r.0, 1), (r.1, -1)]).collect();
    // An end sorts before a start at the same instant.
    events.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in events {
        now += step;
        most = most.max(now);
    }
    most as usize
}

/// Spawns `n` contenders one after the other as fast as they start, then
/// waits for them all (killing those still running at `deadline`).
fn crowd(target: &Target, server: &Server, dir: &Path, prefix: &str, n: usize) -> Crowd {
    let logs = dir.join(prefix.replace('/', "-"));
    std::fs::create_dir_all(&logs).unwrap();
    let cpu_before = children_cpu();
    let server_before = server.cpu();
    let started = Instant::now();
    let mut contenders = Contenders::new(n);
    for i in 0..n {
        let mut cmd = target.command(prefix, false);
        cmd.env(CHILD_LOG_ENV, logs.join(i.to_string()))
            .env(CHILD_SLEEP_ENV, SLEEP.as_millis().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        contenders.spawned(i, cmd.spawn().expect("spawn a contender"));
        contenders.reap();
    }
    let wall = contenders.wait_all(started, deadline_for(n), prefix);
    let cpu = children_cpu().saturating_sub(cpu_before);
    let server_cpu = server
        .cpu()
        .zip(server_before)
        .map(|(after, before)| after.saturating_sub(before));
    let runs = runs(&logs, 0..n);
    Crowd {
        n,
        finished: contenders.finished(0..n),
        others: contenders.others(),
        most_at_once: most_at_once(&runs),
        out_of_order: out_of_order(&runs, 0),
        wall,
        cpu,
        server_cpu,
    }
}

/// Ten times the ideal, plus two minutes: a stuck crowd is reported
/// (killed: 137), not waited for forever.
fn deadline_for(n: usize) -> Duration {
    SLEEP * n.div_ceil(LIMIT) as u32 * 10 + Duration::from_secs(120)
}

/// The order of arrival, judged where it is known: `LIMIT` holders take
/// the slots and hold them, then `n` waiters join one at a time, each
/// spawned once the one before has said (`-v`) that it waits, so that
/// their order of arrival is their spawn order. Then the holders let go.
fn queue(target: &Target, dir: &Path, prefix: &str, n: usize) -> Queue {
    let logs = dir.join(prefix.replace('/', "-"));
    std::fs::create_dir_all(&logs).unwrap();
    let go = logs.join("go");
    let total = LIMIT + n;
    let mut contenders = Contenders::new(total);
    let joined_by = Instant::now() + Duration::from_secs(60) + Duration::from_millis(60) * n as u32;
    for i in 0..total {
        let holder = i < LIMIT;
        let stderr = logs.join(format!("{i}.err"));
        let mut cmd = target.command(prefix, true);
        cmd.env(CHILD_LOG_ENV, logs.join(i.to_string()))
            .env(CHILD_SLEEP_ENV, SLEEP.as_millis().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap());
        if holder {
            cmd.env(CHILD_GO_ENV, &go);
        }
        contenders.spawned(i, cmd.spawn().expect("spawn a contender"));
        let said = if holder { " acquired " } else { " waiting " };
        loop {
            let text = std::fs::read_to_string(&stderr).unwrap_or_default();
            if text.contains(said) {
                break;
            }
            if contenders.exited(i) || Instant::now() > joined_by {
                eprintln!("{prefix}: contender {i} never said{said}(its log: {text:?})");
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let cpu_before = children_cpu();
    let started = Instant::now();
    std::fs::write(&go, "").unwrap();
    let wall = contenders.wait_all(started, deadline_for(n), prefix);
    let cpu = children_cpu().saturating_sub(cpu_before);
    let runs = runs(&logs, LIMIT..total);
    Queue {
        n,
        finished: contenders.finished(LIMIT..total),
        others: contenders.others(),
        out_of_order: out_of_order(&runs, LIMIT),
        wall,
        cpu,
    }
}

/// Raises the soft open-files limit to the hard one when it is below what
/// a crowd of `n` needs (the servers inherit it); says what it did.
fn raise_open_files(n: usize) -> String {
    let want = (4 * n + 1024) as libc::rlim_t;
    // SAFETY: an all-zero rlimit is valid; getrlimit fills it.
    let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: RLIMIT_NOFILE with a valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return "open-files limit unknown (getrlimit failed)".to_string();
    }
    if limit.rlim_cur >= want {
        return format!("open-files limit {} (enough: not raised)", limit.rlim_cur);
    }
    let before = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: RLIMIT_NOFILE with a valid pointer; soft up to hard is allowed.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } == 0 {
        format!(
            "open-files limit raised from {before} to {}",
            limit.rlim_cur
        )
    } else {
        format!("open-files limit {before}: raising it failed")
    }
}

fn exits(others: &BTreeMap<i32, usize>) -> String {
    if others.is_empty() {
        return "none".to_string();
    }
    others
        .iter()
        .map(|(code, count)| format!("{code}: {count}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn row(store: &str, c: &Crowd) -> String {
    let server = c
        .server_cpu_per_run_ms()
        .map_or("not measured".to_string(), |cpu| format!("{cpu:.1}"));
    format!(
        "| {store} | {} | {} / {} | {} | {} | {} | {:.1} | {:.1} | {server} |",
        c.n,
        c.finished,
        c.n,
        exits(&c.others),
        c.most_at_once,
        c.out_of_order,
        c.overhead_ms(),
        c.cpu_per_run_ms()
    )
}

fn queue_row(store: &str, q: &Queue) -> String {
    format!(
        "| {store} | {} | {} / {} | {} | {} | {:.1} | {:.1} |",
        q.n,
        q.finished,
        q.n,
        exits(&q.others),
        q.out_of_order,
        q.overhead_ms(),
        ms(q.cpu) / (q.n + LIMIT) as f64
    )
}

fn main() {
    if common::run_child_mode() {
        return;
    }
    let quick = std::env::var(QUICK_ENV).is_ok_and(|v| !v.is_empty());
    let sizes: [usize; 2] = if quick { [20, 40] } else { [100, 1000] };
    let only = std::env::var(ONLY_ENV).ok().filter(|s| !s.is_empty());
    let stores: Vec<Store> = Store::ALL
        .into_iter()
        .filter(|s| only.as_deref().is_none_or(|o| o == s.name()))
        .collect();
    assert!(
        !stores.is_empty(),
        "{ONLY_ENV} names one of redis, local, etcd, consul, zookeeper"
    );
    let dir: PathBuf =
        std::env::temp_dir().join(format!("consem-bench-crowd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let files = raise_open_files(sizes[1]);

    println!(
        "# A crowd on one prefix: N contenders at once, --limit {LIMIT}, each command sleeping {} ms{}",
        SLEEP.as_millis(),
        if quick {
            " (quick: tiny sizes, figures only show the harness works)"
        } else {
            ""
        }
    );
    println!("({files}; consem: {})", consem_bin());
    let mut results: Vec<(Store, Vec<Crowd>, Queue)> = Vec::new();
    let mut notes = Vec::new();
    for &store in &stores {
        // Servers and doubles live for this store's crowds only.
        let mut servers = Vec::new();
        let mut double = None;
        let mut server = Server::Unmeasured;
        let target = match store {
            Store::Redis => {
                let (process, url) = start_redis(&dir);
                server = Server::Process(process.0.id());
                servers.push(process);
                notes.push(format!(
                    "redis: redis-server at {url}, started by the harness"
                ));
                Target::Url(url)
            }
            Store::Local => {
                let path = dir.join("local");
                notes.push("local: a scratch directory".to_string());
                Target::Url(format!("local:{}", path.display()))
            }
            Store::Etcd => {
                let (process, url) = start_etcd(&dir);
                server = Server::Process(process.0.id());
                servers.push(process);
                notes.push(format!("etcd: one member at {url}, started by the harness"));
                Target::Url(url)
            }
            Store::Zookeeper => {
                let (process, url) = start_zookeeper(&dir);
                server = Server::Process(process.0.id());
                servers.push(process);
                notes.push(format!(
                    "zookeeper: one standalone server at {url}, started by the harness"
                ));
                Target::Url(url)
            }
            Store::Consul => match std::env::var(REAL_CONSUL_ENV) {
                Ok(addr) if !addr.trim().is_empty() => {
                    let addr = addr.trim();
                    let addr = addr.strip_prefix("http://").unwrap_or(addr);
                    notes.push(format!("consul: real agent at {addr} ({REAL_CONSUL_ENV})"));
                    Target::Consul(addr.trim_end_matches('/').to_string())
                }
                _ => {
                    let started = ConsulDouble::start();
                    let addr = started.addr();
                    double = Some(started);
                    server = Server::InProcess;
                    notes.push(format!(
                        "consul: the in-process test double (tests/common/double.rs) at {addr}; \
                         set {REAL_CONSUL_ENV} for a real agent"
                    ));
                    Target::Consul(addr)
                }
            },
        };
        let mut crowds = Vec::new();
        for &n in &sizes {
            eprintln!("{}: N={n}...", store.name());
            let prefix = format!("consem-crowd/{}-{n}-{}", store.name(), std::process::id());
            crowds.push(crowd(&target, &server, &dir, &prefix, n));
        }
        let n = sizes[1];
        eprintln!("{}: {n} queued one by one...", store.name());
        let prefix = format!("consem-queue/{}-{n}-{}", store.name(), std::process::id());
        let queued = queue(&target, &dir, &prefix, n);
        drop(double);
        drop(servers);
        results.push((store, crowds, queued));
    }

    println!();
    for note in &notes {
        println!("- {note}");
    }
    println!();
    println!("| store | N | finished (exit 0) / N | other exits (code: count) | most at once | out of spawn order | overhead per round (ms) | CPU per run (ms) | server CPU per run (ms) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (store, crowds, _) in &results {
        for c in crowds {
            println!("{}", row(store.name(), c));
        }
    }
    println!(
        "\nrounds = N/{LIMIT}; overhead per round = (wall − rounds × {} ms) / rounds; CPU per run = \
         the crowd's CPU (consem and its commands, getrusage(RUSAGE_CHILDREN)) / N; out of spawn \
         order = contenders whose command started at least {LIMIT} places (a round) away from their \
         place in spawn order (spawned at once, they reach the store in roughly that order); server \
         CPU = the server process's (the Consul double's: the harness's own, its polling included) / N.",
        SLEEP.as_millis()
    );

    println!(
        "\n## In order of arrival: {LIMIT} holders, then N waiters joining one at a time (each once \
         the one before says it waits)\n"
    );
    println!("| store | N waiting | finished (exit 0) / N | other exits (code: count) | out of arrival order | overhead per round after the holders let go (ms) | CPU per run (ms) |");
    println!("|---|---|---|---|---|---|---|");
    for (store, _, queued) in &results {
        println!("{}", queue_row(store.name(), queued));
    }

    println!("\n## goals");
    println!("| goal | figure | met |");
    println!("|---|---|---|");
    for (store, crowds, queued) in &results {
        let (small, large) = (&crowds[0], &crowds[1]);
        let name = store.name();
        let all = crowds.iter().all(|c| c.finished == c.n);
        println!(
            "| {name}: every contender finished | {} | {} |",
            crowds
                .iter()
                .map(|c| format!("{} of {}", c.finished, c.n))
                .collect::<Vec<_>>()
                .join(", "),
            yes(all)
        );
        println!(
            "| {name}: {} waiters take their slots in order of arrival | {} a round or more out of order | {} |",
            queued.n,
            queued.out_of_order,
            yes(queued.finished == queued.n && queued.out_of_order == 0)
        );
        let most = crowds.iter().map(|c| c.most_at_once).max().unwrap_or(0);
        println!(
            "| {name}: never more than {LIMIT} at once | at most {most} | {} |",
            yes(most <= LIMIT)
        );
        let overhead = large.overhead_ms() / small.overhead_ms();
        println!(
            "| {name}: overhead per round at N={} within 1.5× of N={} | {:.1} ms to {:.1} ms ({overhead:.2}×) | {} |",
            large.n,
            small.n,
            small.overhead_ms(),
            large.overhead_ms(),
            yes(overhead <= 1.5)
        );
        let cpu = large.cpu_per_run_ms() / small.cpu_per_run_ms();
        println!(
            "| {name}: CPU per run at N={} within 1.5× of N={} | {:.1} ms to {:.1} ms ({cpu:.2}×) | {} |",
            large.n,
            small.n,
            small.cpu_per_run_ms(),
            large.cpu_per_run_ms(),
            yes(cpu <= 1.5)
        );
    }
    let first = |store: Store| {
        results
            .iter()
            .find(|(s, _, _)| *s == store)
            .map(|(_, c, _)| c[0].overhead_ms())
    };
    if let (Some(etcd), Some(redis)) = (first(Store::Etcd), first(Store::Redis)) {
        println!(
            "| etcd's overhead per round at N={} at most twice Redis's | {etcd:.1} ms vs {redis:.1} ms ({:.2}×) | {} |",
            sizes[0],
            etcd / redis,
            yes(etcd <= 2.0 * redis)
        );
    }
    if quick {
        println!("(quick mode: sizes too small to judge)");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
