//! A test's world for running the real `consem` binary: a store (see
//! [`TestStore`]: Consul, double or real agent; the local store in a
//! directory of its own; or a Redis or etcd server of its own), a prefix of
//! its own, a scratch directory, and checks that nothing is left behind.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::Duration;

pub use super::etcd::EtcdServer;
pub use super::local::LocalStore;
pub use super::postgres::PostgresServer;
pub use super::redis::RedisServer;
pub use super::zookeeper::{ZkEnsemble, ZkServer};
pub use super::TestConsul;

use super::double::Fault;
use super::{http, unique_prefix, wait_until, ConsulDouble, KvEntry};

pub const SEMAPHORE_FLAGS: u64 = 16210313421097356768;

/// The consul CLI's variables that consem reads besides `CONSUL_HTTP_ADDR`;
/// `World::consem_command` clears them so that a test sets exactly the ones
/// it means.
pub const CONSUL_ENV: [&str; 12] = [
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

/// Generous bound for things that should happen promptly: the suite must
/// stay stable on a loaded 2-core machine.
pub const PROMPT: Duration = Duration::from_secs(10);

/// A store a world runs `consem` against: how `consem` is pointed at it,
/// and what the checks read of it. Each store's helpers implement it.
pub trait TestStore {
    /// The store's name, as `status` shows it.
    const NAME: &'static str;
    /// Whether a slot has a lease on the server, which `--ttl` sets; the
    /// local store's slot lasts as long as consem does, and it refuses
    /// `--ttl`.
    const HAS_LEASE: bool;
    /// Points `command` (a `consem` subcommand, its options being given)
    /// at this store: `--store ...`, or Consul's address in the
    /// environment.
    fn point(&self, command: &mut Command);
    /// How many contenders (holders and waiters) the store holds under
    /// `prefix`.
    fn contenders(&self, prefix: &str) -> usize;
    /// Panics if more than what is meant to stay is left under `prefix`
    /// once everyone left.
    fn assert_clean(&self, prefix: &str);
}

/// A store on a server that a test can put a proxy in front of.
pub trait ServerStore: TestStore {
    /// `host:port` of the server.
    fn address(&self) -> String;
    /// Points `command` at this store through `addr` (a proxy in front of
    /// the server) instead.
    fn point_through(&self, addr: &str, command: &mut Command);
}

/// A store whose slot outlives a dead consem until its lease runs out on
/// the server (Consul's session, a Redis permit, an etcd lease).
pub trait LeasedStore: TestStore {
    /// What the server keeps each holder's slot under `prefix` for after
    /// each renewal, in seconds, as it stands: Consul's session TTL and
    /// etcd's granted TTL, or the time left on a Redis permit, whose expiry
    /// each renewal sets from the server's clock (at most the TTL, at least
    /// the TTL less a renewal period and the time since).
    fn lease_seconds(&self, prefix: &str) -> Vec<f64>;
}

/// The store of a world whose test starts and names its store itself (an
/// etcd cluster, a server over TLS, an address nobody answers at).
pub struct NoStore;

/// One test's world: a store, a prefix of its own, a scratch directory.
pub struct World<S> {
    pub store: S,
    pub prefix: String,
    pub dir: PathBuf,
}

impl<S> World<S> {
    /// A world whose store `start` sets up in the world's scratch
    /// directory.
    pub fn with_store(name: &str, start: impl FnOnce(&Path) -> S) -> World<S> {
        let dir = std::env::temp_dir().join(unique_prefix(name).replace('/', "_"));
        std::fs::create_dir_all(&dir).unwrap();
        World {
            store: start(&dir),
            prefix: unique_prefix(name),
            dir,
        }
    }

    /// The `consem` binary with none of the caller's Consul or etcdctl
    /// variables: only what a test sets reaches consem, not the caller's
    /// shell.
    pub fn consem_command(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_consem"));
        cmd.env_remove("CONSUL_HTTP_ADDR");
        for name in CONSUL_ENV
            .iter()
            .chain(&super::etcd::ETCDCTL_ENV)
            .chain(&super::postgres::PG_ENV)
        {
            cmd.env_remove(name);
        }
        cmd.stdin(Stdio::null());
        cmd
    }

    pub fn path(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_string()
    }

    /// A child that says it started (creates `ready`) and runs until the
    /// test creates `go`, then exits with `code`.
    pub fn held_until(&self, ready: &str, go: &str, code: i32) -> Vec<String> {
        let script = format!(
            "touch '{}'; while [ ! -e '{}' ]; do sleep 0.02; done; exit {code}",
            self.path(ready),
            self.path(go)
        );
        vec!["sh".into(), "-c".into(), script]
    }

    pub fn touch(&self, name: &str) {
        std::fs::write(self.dir.join(name), b"").unwrap();
    }

    pub fn exists(&self, name: &str) -> bool {
        self.dir.join(name).exists()
    }

    pub fn key(&self, name: &str) -> String {
        format!("{}/{name}", self.prefix)
    }

    /// `consem run --prefix <prefix> --limit <limit>`, pointed by `point`.
    fn run_command(&self, limit: u32, point: impl FnOnce(&mut Command)) -> Command {
        let mut cmd = self.consem_command();
        cmd.args([
            "run",
            "--prefix",
            &self.prefix,
            "--limit",
            &limit.to_string(),
        ]);
        point(&mut cmd);
        cmd
    }
}

impl<S: TestStore> World<S> {
    /// Which store, as `status` names it.
    pub fn store_name(&self) -> &'static str {
        S::NAME
    }

    /// `consem run --prefix <prefix> --limit <limit> <extra> -- <command>`.
    pub fn consem(&self, limit: u32, extra: &[&str], command: &[&str]) -> Command {
        let mut cmd = self.run_command(limit, |cmd| self.store.point(cmd));
        cmd.args(extra).arg("--").args(command);
        cmd
    }

    /// `consem <subcommand> --prefix <prefix> <extra>` (status, release,
    /// reset) against this world's store.
    pub fn admin(&self, subcommand: &str, extra: &[&str]) -> Command {
        let mut cmd = self.consem_command();
        cmd.arg(subcommand).args(["--prefix", &self.prefix]);
        self.store.point(&mut cmd);
        cmd.args(extra);
        cmd
    }

    pub fn spawn(&self, limit: u32, extra: &[&str], command: &[&str]) -> Child {
        self.consem(limit, extra, command)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// How many contenders (holders and waiters) the store holds: Consul's
    /// or etcd's contender keys, the local store's contender files, Redis's
    /// permits and queue.
    pub fn contender_keys(&self) -> usize {
        self.store.contenders(&self.prefix)
    }

    pub fn assert_clean(&self) {
        self.store.assert_clean(&self.prefix);
    }
}

impl<S: ServerStore> World<S> {
    /// `host:port` of the world's server.
    pub fn server_addr(&self) -> String {
        self.store.address()
    }

    /// [`World::consem`], reaching the world's server at `addr` instead
    /// (a proxy in front of it).
    pub fn consem_via(&self, addr: &str, limit: u32, extra: &[&str], command: &[&str]) -> Command {
        let mut cmd = self.run_command(limit, |cmd| self.store.point_through(addr, cmd));
        cmd.args(extra).arg("--").args(command);
        cmd
    }
}

impl World<TestConsul> {
    /// A world on a real Consul agent if `CONSEM_TEST_CONSUL_ADDR` is set,
    /// else on a new double.
    pub fn consul(name: &str) -> World<TestConsul> {
        World::with_consul(name, TestConsul::start())
    }

    /// A world around a Consul the test set up itself (a TLS double, one
    /// with ACLs, ...); `consem` addresses it by its URL when it speaks TLS.
    pub fn with_consul(name: &str, consul: TestConsul) -> World<TestConsul> {
        World::with_store(name, |_| consul)
    }

    /// A world on the Consul double even when a real agent is given, for
    /// tests that inject faults or control time: they run against the
    /// double in every setting rather than skip.
    pub fn on_the_double(name: &str) -> World<TestConsul> {
        World::with_consul(name, TestConsul::Double(ConsulDouble::start()))
    }

    /// The double of a world made by [`World::on_the_double`].
    pub fn the_double(&self) -> &ConsulDouble {
        self.store
            .double()
            .expect("a world on the double (World::on_the_double)")
    }

    /// What `consem` gets as `CONSUL_HTTP_ADDR`: `host:port`, or the
    /// `https://` URL of a TLS double.
    pub fn http_addr(&self) -> String {
        self.store.http_addr()
    }

    pub fn entries(&self) -> Vec<KvEntry> {
        self.store.kv_entries(&format!("{}/", self.prefix))
    }

    pub fn lock_value(&self) -> Option<serde_json::Value> {
        let key = self.key(".lock");
        self.entries()
            .into_iter()
            .find(|e| e.key == key)
            .map(|e| serde_json::from_slice(&e.value).unwrap())
    }

    /// Our sessions are named after the prefix; a double holds no others.
    pub fn sessions(&self) -> Vec<(String, String)> {
        self.store.sessions_of(&self.prefix)
    }
}

impl World<LocalStore> {
    /// A world on the local store, in a directory of the scratch directory.
    pub fn local(name: &str) -> World<LocalStore> {
        World::with_store(name, |dir| LocalStore {
            base: dir.join("local-store"),
        })
    }
}

impl World<RedisServer> {
    /// A world on a Redis server of its own.
    pub fn redis(name: &str) -> World<RedisServer> {
        World::with_store(name, |dir| RedisServer::start(&dir.join("redis"), &[]))
    }
}

impl World<EtcdServer> {
    /// A world on an etcd server of its own.
    pub fn etcd(name: &str) -> World<EtcdServer> {
        World::with_store(name, |dir| EtcdServer::start(&dir.join("etcd")))
    }
}

impl World<PostgresServer> {
    /// A world on a PostgreSQL server of its own.
    pub fn postgres(name: &str) -> World<PostgresServer> {
        World::with_store(name, |dir| PostgresServer::start(&dir.join("postgres")))
    }
}

impl World<ZkServer> {
    /// A world on a ZooKeeper server of its own.
    pub fn zookeeper(name: &str) -> World<ZkServer> {
        World::with_store(name, |dir| ZkServer::start(&dir.join("zookeeper")))
    }
}

impl World<ZkEnsemble> {
    /// A world on a ZooKeeper ensemble of its own, three members.
    pub fn zookeeper_ensemble(name: &str) -> World<ZkEnsemble> {
        World::with_store(name, |dir| ZkEnsemble::start(&dir.join("zookeeper")))
    }
}

impl World<NoStore> {
    /// A prefix and a scratch directory, for a test that starts its store
    /// itself and names it to `consem`.
    pub fn without_store(name: &str) -> World<NoStore> {
        World::with_store(name, |_| NoStore)
    }
}

impl<S> Drop for World<S> {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

pub fn finish(child: Child) -> Output {
    child.wait_with_output().unwrap()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

pub fn signal(child: &Child, signal: i32) {
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
}

/// Holds a slot with a first consem whose child waits for `go`, and returns it
/// once the child runs.
/// In a log of commands that wrote `start` when they began and something
/// else when they ended: how many began, and the most that ran at once.
pub fn starts_and_most_at_once(log: &str) -> (usize, usize) {
    let (mut starts, mut running, mut most) = (0, 0usize, 0);
    for line in log.lines() {
        if line == "start" {
            starts += 1;
            running += 1;
        } else {
            running = running.saturating_sub(1);
        }
        most = most.max(running);
    }
    (starts, most)
}

pub fn hold_slot<S: TestStore>(world: &World<S>, limit: u32, ready: &str, go: &str) -> Child {
    let holder = world.spawn(limit, &[], &strs(&world.held_until(ready, go, 0)));
    wait_until(PROMPT, "the holder's child to start", || {
        world.exists(ready)
    });
    holder
}

/// Plays a `consul lock -n 2` holder: a session, its contender key, and a
/// map-form `.lock` naming it.
pub fn consul_lock_holder(world: &World<TestConsul>, limit: u32) -> String {
    let base = format!("http://{}", world.store.addr());
    let id = peer_session(world, "consul lock peer");
    let contender = super::encode_key(&world.key(&id));
    let (status, body) = http(
        "PUT",
        &format!("{base}/v1/kv/{contender}?acquire={id}&flags={SEMAPHORE_FLAGS}"),
        b"",
    );
    assert_eq!((status, body.trim()), (200, "true"));
    let lock = format!(r#"{{"Limit":{limit},"Holders":{{"{id}":true}}}}"#);
    world
        .store
        .put(&world.key(".lock"), lock.as_bytes(), SEMAPHORE_FLAGS);
    id
}

/// Creates a session (TTL 15 s, behaviour `delete`) for a peer that the test
/// plays, as `consul lock` would, and returns its ID.
pub fn peer_session(world: &World<TestConsul>, name: &str) -> String {
    let url = format!("http://{}/v1/session/create", world.store.addr());
    let spec = serde_json::json!({"Name": name, "TTL": "15s", "Behavior": "delete"});
    let (status, body) = http("PUT", &url, spec.to_string().as_bytes());
    assert_eq!(status, 200, "{body}");
    serde_json::from_str::<serde_json::Value>(&body).unwrap()["ID"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Wakes the holders' blocking watch of `.lock` by rewriting it unchanged
/// (the double does it in one step, like a CAS write of what was read, and
/// without a read that faults injected on reads would meet).
pub fn nudge(double: &ConsulDouble, world: &World<TestConsul>) {
    assert!(double.rewrite(&world.key(".lock")), "no .lock to rewrite");
}

/// Holds a slot with `--monitor-retry 3`, makes the holder's watch meet
/// `faults` (three in all, within that budget) and checks that it rides them
/// out: it reads again until a good answer, the child ends normally, and
/// nothing is left.
pub fn holder_rides_out(world: &World<TestConsul>, double: &ConsulDouble, faults: Vec<Fault>) {
    let holder = world.spawn(
        1,
        &["--monitor-retry", "3"],
        &strs(&world.held_until("ready", "go", 0)),
    );
    wait_until(PROMPT, "the child to start", || world.exists("ready"));
    let reads_before = double.requests().len();
    for fault in faults {
        double.inject(fault);
    }
    nudge(double, world);
    wait_until(PROMPT, "three faulty answers and a good one", || {
        double.requests()[reads_before..]
            .iter()
            .filter(|r| r.method == "GET" && r.path.starts_with("/v1/kv/"))
            .count()
            >= 4
    });
    world.touch("go");
    let output = finish(holder);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    world.assert_clean();
}

/// Waits for the pid a child wrote to `name` in the scratch directory with
/// `echo $$ > name` (a whole line, so never half-written) and reads it.
pub fn read_pid<S>(world: &World<S>, name: &str) -> i32 {
    let path = world.path(name);
    let mut pid = None;
    wait_until(PROMPT, "the child to write its pid", || {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        pid = text
            .strip_suffix('\n')
            .and_then(|line| line.trim().parse().ok());
        pid.is_some()
    });
    pid.unwrap()
}

/// The state letter of `pid` in /proc/<pid>/stat (`R`, `S`, `T` for
/// stopped, `Z`, ...); `None` once the process is gone. Linux only.
pub fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ...": the state follows the last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

/// True while `pid` is stopped (job control or SIGSTOP). Linux only.
pub fn is_stopped(pid: i32) -> bool {
    process_state(pid) == Some('T')
}

/// True once `pid` no longer runs. An orphan that exited stays a zombie until
/// whoever adopted it (init, or a subreaper) reaps it, and a zombie still
/// answers kill(pid, 0); on Linux its state in /proc counts as gone.
pub fn process_gone(pid: i32) -> bool {
    // SAFETY: signal 0 only asks whether the process exists.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return true;
    }
    if cfg!(target_os = "linux") {
        return matches!(process_state(pid), None | Some('Z' | 'X'));
    }
    false
}

/// Waits for `child` to exit, with a deadline (it is killed if it passes).
pub fn wait_with_deadline(child: &mut Child, within: Duration, what: &str) -> ExitStatus {
    let mut status = None;
    let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_until(within, what, || {
            status = child.try_wait().unwrap();
            status.is_some()
        })
    }));
    if let Err(panic) = polled {
        let _ = child.kill();
        let _ = child.wait();
        std::panic::resume_unwind(panic);
    }
    status.unwrap()
}

/// Spawns consem with `-v`, its stderr going to a file in the scratch
/// directory so that the test can follow its events as they happen.
pub fn spawn_verbose<S: TestStore>(
    world: &World<S>,
    limit: u32,
    extra: &[&str],
    command: &[&str],
    log: &str,
) -> Child {
    let mut args = vec!["-v"];
    args.extend_from_slice(extra);
    world
        .consem(limit, &args, command)
        .stdout(Stdio::piped())
        .stderr(File::create(world.path(log)).unwrap())
        .spawn()
        .unwrap()
}

pub fn log_text<S>(world: &World<S>, log: &str) -> String {
    std::fs::read_to_string(world.path(log)).unwrap_or_default()
}

/// consem's children other than `except`, from /proc (the watchdog, once
/// the command runs).
pub fn children_besides(consem: &Child, except: i32) -> Vec<i32> {
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", consem.id()))
        .unwrap_or_default();
    children
        .split_whitespace()
        .filter_map(|pid| pid.parse().ok())
        .filter(|&pid| pid != except && !process_gone(pid))
        .collect()
}
