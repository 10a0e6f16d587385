//! A test's world for running the real `consem` binary: a store (Consul,
//! double or real agent; the local store in a directory of its own; or a
//! Redis or etcd server of its own), a prefix of its own, a scratch
//! directory, and checks that nothing is left behind.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::Duration;

use super::double::Fault;
use super::{http, unique_prefix, wait_until, ConsulDouble, KvEntry, TestConsul};

pub const SEMAPHORE_FLAGS: u64 = 16210313421097356768;

/// The consul CLI's variables that consem reads besides `CONSUL_HTTP_ADDR`;
/// `World::consem` clears them so that a test sets exactly the ones it means.
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

/// One test's world: a store, a prefix of its own, a scratch directory.
pub struct World {
    pub consul: TestConsul,
    pub prefix: String,
    pub dir: PathBuf,
    /// `Some(dir)`: the local store in `dir` (every `consem` gets `--store
    /// local:<dir>`); `None`: the Consul in `consul`.
    pub local: Option<PathBuf>,
    /// `Some`: a Redis server of the world's own (every `consem` gets
    /// `--store redis://...`).
    pub redis: Option<super::redis::RedisServer>,
    /// `Some`: an etcd server of the world's own (every `consem` gets
    /// `--store etcd://...`).
    pub etcd: Option<super::etcd::EtcdServer>,
}

impl World {
    pub fn new(name: &str) -> World {
        World::with_consul(name, TestConsul::start())
    }

    /// A world around a Consul the test set up itself (a TLS double, one
    /// with ACLs, ...); `consem` addresses it by its URL when it speaks TLS.
    pub fn with_consul(name: &str, consul: TestConsul) -> World {
        let dir = std::env::temp_dir().join(unique_prefix(name).replace('/', "_"));
        std::fs::create_dir_all(&dir).unwrap();
        World {
            consul,
            prefix: unique_prefix(name),
            dir,
            local: None,
            redis: None,
            etcd: None,
        }
    }

    /// A world on a Redis server of its own.
    pub fn redis(name: &str) -> World {
        let mut world = World::with_consul(name, TestConsul::start());
        world.redis = Some(super::redis::RedisServer::start(
            &world.dir.join("redis"),
            &[],
        ));
        world
    }

    /// A world on an etcd server of its own.
    pub fn etcd(name: &str) -> World {
        let mut world = World::with_consul(name, TestConsul::start());
        world.etcd = Some(super::etcd::EtcdServer::start(&world.dir.join("etcd")));
        world
    }

    /// A world on the Consul double even when a real agent is given, for
    /// tests that inject faults or control time: they run against the
    /// double in every setting rather than skip.
    pub fn on_the_double(name: &str) -> World {
        World::with_consul(name, TestConsul::Double(ConsulDouble::start()))
    }

    /// The double of a world made by [`World::on_the_double`].
    pub fn the_double(&self) -> &ConsulDouble {
        self.consul
            .double()
            .expect("a world on the double (World::on_the_double)")
    }

    /// A world on the local store, in a directory of the scratch directory.
    pub fn local(name: &str) -> World {
        let mut world = World::with_consul(name, TestConsul::start());
        let base = world.dir.join("local-store");
        world.local = Some(base);
        world
    }

    /// Which store, as `status` names it.
    pub fn store_name(&self) -> &'static str {
        if self.local.is_some() {
            "local"
        } else if self.redis.is_some() {
            "redis"
        } else if self.etcd.is_some() {
            "etcd"
        } else {
            "consul"
        }
    }

    /// `--store ...` for a local, Redis or etcd world, nothing for Consul.
    pub fn store_args(&self) -> Vec<String> {
        if let Some(base) = &self.local {
            vec![format!("--store=local:{}", base.display())]
        } else if let Some(redis) = &self.redis {
            vec![format!("--store={}", redis.url())]
        } else if let Some(etcd) = &self.etcd {
            vec![format!("--store={}", etcd.url())]
        } else {
            Vec::new()
        }
    }

    /// `host:port` of the world's server (Redis, etcd or Consul); `None`
    /// for the local store.
    pub fn server_addr(&self) -> Option<String> {
        if self.local.is_some() {
            None
        } else if let Some(redis) = &self.redis {
            Some(redis.url().trim_start_matches("redis://").to_string())
        } else if let Some(etcd) = &self.etcd {
            Some(etcd.address())
        } else {
            Some(self.consul.addr())
        }
    }

    /// [`World::consem`], reaching the world's server at `addr` instead
    /// (a proxy in front of it).
    pub fn consem_via(&self, addr: &str, limit: u32, extra: &[&str], command: &[&str]) -> Command {
        let mut cmd = self.consem_command();
        let store = if self.redis.is_some() {
            Some(format!("--store=redis://{addr}"))
        } else if self.etcd.is_some() {
            Some(format!("--store=etcd://{addr}"))
        } else {
            cmd.env("CONSUL_HTTP_ADDR", addr);
            None
        };
        cmd.args([
            "run",
            "--prefix",
            &self.prefix,
            "--limit",
            &limit.to_string(),
        ])
        .args(store)
        .args(extra)
        .arg("--")
        .args(command);
        cmd
    }

    /// The `consem` binary with the world's Consul address and none of
    /// the caller's Consul or etcdctl variables: only what a test sets
    /// reaches consem, not the caller's shell.
    pub fn consem_command(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_consem"));
        cmd.env("CONSUL_HTTP_ADDR", self.http_addr());
        for name in CONSUL_ENV.iter().chain(&super::etcd::ETCDCTL_ENV) {
            cmd.env_remove(name);
        }
        cmd.stdin(Stdio::null());
        cmd
    }

    /// `consem <subcommand> --prefix <prefix> <extra>` (status, release,
    /// reset) against this world's store.
    pub fn admin(&self, subcommand: &str, extra: &[&str]) -> Command {
        let mut cmd = self.consem_command();
        cmd.arg(subcommand)
            .args(["--prefix", &self.prefix])
            .args(self.store_args())
            .args(extra);
        cmd
    }

    /// What `consem` gets as `CONSUL_HTTP_ADDR`: `host:port`, or the
    /// `https://` URL of a TLS double.
    pub fn http_addr(&self) -> String {
        match self.consul.double() {
            Some(double) if double.is_tls() => double.url(),
            _ => self.consul.addr(),
        }
    }

    pub fn with_prefix(name: &str, prefix: String) -> World {
        let mut world = World::new(name);
        world.prefix = prefix;
        world
    }

    /// `consem run --prefix <prefix> --limit <limit> <extra> -- <command>`.
    pub fn consem(&self, limit: u32, extra: &[&str], command: &[&str]) -> Command {
        let mut cmd = self.consem_command();
        cmd.args([
            "run",
            "--prefix",
            &self.prefix,
            "--limit",
            &limit.to_string(),
        ])
        .args(self.store_args())
        .args(extra)
        .arg("--")
        .args(command);
        cmd
    }

    pub fn spawn(&self, limit: u32, extra: &[&str], command: &[&str]) -> Child {
        self.consem(limit, extra, command)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
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

    pub fn entries(&self) -> Vec<KvEntry> {
        self.consul.kv_entries(&format!("{}/", self.prefix))
    }

    /// How many contenders (holders and waiters) the store holds: Consul's
    /// or etcd's contender keys, the local store's contender files, Redis's
    /// permits and queue.
    pub fn contender_keys(&self) -> usize {
        if let Some(redis) = &self.redis {
            return redis.contenders(&self.prefix);
        }
        if let Some(etcd) = &self.etcd {
            return etcd.contenders(&self.prefix);
        }
        if let Some(base) = &self.local {
            let Ok(prefixes) = std::fs::read_dir(base) else {
                return 0;
            };
            return prefixes
                .flat_map(|p| std::fs::read_dir(p.unwrap().path()).unwrap())
                .filter(|e| {
                    e.as_ref()
                        .unwrap()
                        .file_name()
                        .to_string_lossy()
                        .ends_with(".c")
                })
                .count();
        }
        self.entries()
            .iter()
            .filter(|e| !e.key.ends_with("/.lock"))
            .count()
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
        self.consul
            .sessions()
            .into_iter()
            .filter(|(_, name)| self.consul.double().is_some() || name.contains(&self.prefix))
            .collect()
    }

    pub fn assert_clean(&self) {
        if let Some(redis) = &self.redis {
            // The fence and ticket counters stay, so that they keep growing,
            // and the epoch, by which contenders tell that the keys were lost.
            let keys = redis.keys(&self.prefix);
            let left: Vec<&String> = keys
                .iter()
                .filter(|k| {
                    !k.ends_with(":fence") && !k.ends_with(":tickets") && !k.ends_with(":epoch")
                })
                .collect();
            assert!(left.is_empty(), "keys left on Redis: {left:?}");
            return;
        }
        if let Some(etcd) = &self.etcd {
            // The server is the world's own: any lease on it is one that
            // a consem left behind.
            assert_eq!(
                etcd.keys(&self.prefix),
                Vec::<String>::new(),
                "keys left on etcd"
            );
            assert_eq!(etcd.leases(), Vec::<String>::new(), "leases left on etcd");
            return;
        }
        if let Some(base) = &self.local {
            assert_local_clean(base);
            return;
        }
        assert_eq!(self.entries(), vec![], "keys left under {}", self.prefix);
        assert_eq!(self.sessions(), vec![], "sessions left behind");
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The local store keeps, per prefix, only its `meta` lock file and its
/// `state` record (the fence survives); no contender file, no holder, no
/// limit once everyone left.
pub fn assert_local_clean(base: &std::path::Path) {
    let Ok(prefixes) = std::fs::read_dir(base) else {
        return;
    };
    for prefix in prefixes {
        let dir = prefix.unwrap().path();
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert!(
            names.iter().all(|n| n == "meta" || n == "state"),
            "files left in {}: {names:?}",
            dir.display()
        );
        if let Ok(state) = std::fs::read(dir.join("state")) {
            let state: serde_json::Value = serde_json::from_slice(&state).unwrap();
            assert_eq!(state["holders"], serde_json::json!([]), "{state}");
            assert_eq!(state["limit"], serde_json::Value::Null, "{state}");
        }
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
pub fn hold_slot(world: &World, limit: u32, ready: &str, go: &str) -> Child {
    let holder = world.spawn(limit, &[], &strs(&world.held_until(ready, go, 0)));
    wait_until(PROMPT, "the holder's child to start", || {
        world.exists(ready)
    });
    holder
}

/// Plays a `consul lock -n 2` holder: a session, its contender key, and a
/// map-form `.lock` naming it.
pub fn consul_lock_holder(world: &World, limit: u32) -> String {
    let base = format!("http://{}", world.consul.addr());
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
        .consul
        .put(&world.key(".lock"), lock.as_bytes(), SEMAPHORE_FLAGS);
    id
}

/// Creates a session (TTL 15 s, behaviour `delete`) for a peer that the test
/// plays, as `consul lock` would, and returns its ID.
pub fn peer_session(world: &World, name: &str) -> String {
    let url = format!("http://{}/v1/session/create", world.consul.addr());
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
pub fn nudge(double: &ConsulDouble, world: &World) {
    assert!(double.rewrite(&world.key(".lock")), "no .lock to rewrite");
}

/// Holds a slot with `--monitor-retry 3`, makes the holder's watch meet
/// `faults` (three in all, within that budget) and checks that it rides them
/// out: it reads again until a good answer, the child ends normally, and
/// nothing is left.
pub fn holder_rides_out(world: &World, double: &ConsulDouble, faults: Vec<Fault>) {
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
pub fn read_pid(world: &World, name: &str) -> i32 {
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
pub fn spawn_verbose(
    world: &World,
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

pub fn log_text(world: &World, log: &str) -> String {
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
