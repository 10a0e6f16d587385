//! A test's world for running the real `consem` binary: a Consul (double or
//! real agent), a prefix of its own, a scratch directory, and checks that
//! nothing is left behind.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use super::{http, unique_prefix, wait_until, ConsulDouble, KvEntry, TestConsul};

pub const SEMAPHORE_FLAGS: u64 = 16210313421097356768;

/// Generous bound for things that should happen promptly: the suite must
/// stay stable on a loaded 2-core machine.
pub const PROMPT: Duration = Duration::from_secs(10);

/// One test's world: a Consul, a prefix of its own, a scratch directory.
pub struct World {
    pub consul: TestConsul,
    pub prefix: String,
    pub dir: PathBuf,
}

impl World {
    pub fn new(name: &str) -> World {
        let dir = std::env::temp_dir().join(unique_prefix(name).replace('/', "_"));
        std::fs::create_dir_all(&dir).unwrap();
        World {
            consul: TestConsul::start(),
            prefix: unique_prefix(name),
            dir,
        }
    }

    pub fn with_prefix(name: &str, prefix: String) -> World {
        let mut world = World::new(name);
        world.prefix = prefix;
        world
    }

    /// `consem run --prefix <prefix> --limit <limit> <extra> -- <command>`.
    pub fn consem(&self, limit: u32, extra: &[&str], command: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_consem"));
        cmd.env("CONSUL_HTTP_ADDR", self.consul.addr())
            .env_remove("CONSUL_HTTP_TOKEN")
            .env_remove("CONSUL_HTTP_TOKEN_FILE")
            .args([
                "run",
                "--prefix",
                &self.prefix,
                "--limit",
                &limit.to_string(),
            ])
            .args(extra)
            .arg("--")
            .args(command)
            .stdin(Stdio::null());
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

    pub fn contender_keys(&self) -> usize {
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
        assert_eq!(self.entries(), vec![], "keys left under {}", self.prefix);
        assert_eq!(self.sessions(), vec![], "sessions left behind");
    }
}

impl Drop for World {
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

pub fn skip_without_double(world: &World) -> Option<&ConsulDouble> {
    let double = world.consul.double();
    if double.is_none() {
        eprintln!("skipped: needs the Consul double's fault injection");
    }
    double
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
    let (status, body) = http(
        "PUT",
        &format!("{base}/v1/session/create"),
        br#"{"Name":"consul lock peer","TTL":"15s","Behavior":"delete"}"#,
    );
    assert_eq!(status, 200, "{body}");
    let id = serde_json::from_str::<serde_json::Value>(&body).unwrap()["ID"]
        .as_str()
        .unwrap()
        .to_string();
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

/// Wakes the holder's blocking watch by writing a key below the prefix that
/// is not a contender key.
pub fn nudge(world: &World) {
    world.consul.put(&world.key("nudge/x"), b"", 0);
}
