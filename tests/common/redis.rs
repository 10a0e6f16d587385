//! A real `redis-server` for one test: a free loopback port, a scratch
//! directory, no persistence; stopped when dropped.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::world::{LeasedStore, ServerStore, TestStore};

pub struct RedisServer {
    pub port: u16,
    process: Child,
    dir: std::path::PathBuf,
    extra: Vec<String>,
}

/// A port nobody listens on now (the kernel's pick for a socket we close).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl RedisServer {
    /// Starts one in `dir` with `extra` arguments, and waits until it
    /// answers PING.
    pub fn start(dir: &Path, extra: &[&str]) -> RedisServer {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        // A port taken between the pick and the bind (the machine runs
        // other tests) is picked again.
        loop {
            if let Some(server) = RedisServer::try_start_on(free_port(), dir, extra.clone()) {
                return server;
            }
        }
    }

    /// Starts one on `port` (which the caller found free); `None` if the
    /// port was taken meanwhile.
    pub fn try_start_on_port(port: u16, dir: &Path, extra: &[&str]) -> Option<RedisServer> {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        RedisServer::try_start_on(port, dir, extra)
    }

    /// Sends `command` on a connection of its own.
    pub fn query<T: redis::FromRedisValue>(
        &self,
        command: &mut redis::Cmd,
    ) -> redis::RedisResult<T> {
        command.query(&mut self.connection()?)
    }

    fn start_on(port: u16, dir: &Path, extra: Vec<String>) -> RedisServer {
        RedisServer::try_start_on(port, dir, extra.clone()).unwrap_or_else(|| {
            panic!(
                "redis-server could not listen on port {port}; see {}",
                dir.join("redis.log").display()
            )
        })
    }

    /// Starts one on `port` and waits until it answers PING; `None` if it
    /// exited first (the port was taken).
    fn try_start_on(port: u16, dir: &Path, extra: Vec<String>) -> Option<RedisServer> {
        std::fs::create_dir_all(dir).unwrap();
        let process = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .args(&extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is not installed: scripts/test installs it (apt-get install redis-server)");
        let mut server = RedisServer {
            port,
            process,
            dir: dir.to_path_buf(),
            extra,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if server.ping() {
                return Some(server);
            }
            if server.process.try_wait().unwrap().is_some() {
                return None;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {port} did not answer within 20 s; see {}",
                dir.join("redis.log").display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Answers PING, or refuses us for want of a password (it is up).
    fn ping(&self) -> bool {
        match self
            .connection()
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
        {
            Ok(_) => true,
            Err(error) => error.code() == Some("NOAUTH"),
        }
    }

    /// Stops it (no save) and starts an empty one on the same port, as a
    /// server restarted without persistence.
    pub fn restart(&mut self) {
        self.stop();
        let fresh = RedisServer::start_on(self.port, &self.dir.clone(), self.extra.clone());
        let old = std::mem::replace(self, fresh);
        std::mem::forget(old);
    }

    /// A connection with no password (tests that set one connect by hand).
    pub fn connection(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(2))
    }

    /// Every key under `semaphore:<prefix>`.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let mut connection = self.connection().unwrap();
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("semaphore:{}*", glob_escape(prefix)))
            .query(&mut connection)
            .unwrap();
        keys.sort();
        keys
    }

    /// Holders plus waiters in the queue.
    pub fn contenders(&self, prefix: &str) -> usize {
        let mut connection = self.connection().unwrap();
        let holders: usize = redis::cmd("ZCARD")
            .arg(format!("semaphore:{prefix}"))
            .query(&mut connection)
            .unwrap();
        let waiters: usize = redis::cmd("ZCARD")
            .arg(format!("semaphore:{prefix}:queue"))
            .query(&mut connection)
            .unwrap();
        holders + waiters
    }

    /// Stops the server as an operator does, saving its data first
    /// (`SHUTDOWN SAVE`), so that [`RedisServer::start_again`] finds it.
    pub fn shut_down_saving(&mut self) {
        let mut connection = self.connection().unwrap();
        // The server closes the connection instead of answering.
        let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN").arg("SAVE").query(&mut connection);
        let _ = self.process.wait();
    }

    /// Starts the server again on its port and in its directory, with the
    /// data it saved.
    pub fn start_again(&mut self) {
        let fresh = RedisServer::start_on(self.port, &self.dir.clone(), self.extra.clone());
        let old = std::mem::replace(self, fresh);
        std::mem::forget(old);
    }

    /// A replica of `primary` (`--replicaof`), in `dir`, once `primary`
    /// counts it among its connected replicas.
    pub fn replica_of(primary: &RedisServer, dir: &Path) -> RedisServer {
        let port = primary.port.to_string();
        let replica = RedisServer::start(dir, &["--replicaof", "127.0.0.1", &port]);
        primary.wait_for_replicas(1);
        replica
    }

    /// Waits until `count` replicas are connected and have acknowledged
    /// every write so far (`WAIT` answers at once with `count`).
    pub fn wait_for_replicas(&self, count: i64) {
        let mut connection = self.connection().unwrap();
        super::wait_until(Duration::from_secs(20), "the replicas to connect", || {
            redis::cmd("WAIT")
                .arg(count)
                .arg(100)
                .query::<i64>(&mut connection)
                .unwrap()
                >= count
        });
    }

    /// Freezes the server (SIGSTOP): it neither answers nor acknowledges,
    /// and its connections stay open.
    pub fn freeze(&self) {
        super::world::signal(&self.process, libc::SIGSTOP);
    }

    /// Lets a frozen server run again (SIGCONT).
    pub fn thaw(&self) {
        super::world::signal(&self.process, libc::SIGCONT);
    }

    /// Stops the server now (as a crash: no save).
    pub fn stop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

fn glob_escape(text: &str) -> String {
    text.chars()
        .flat_map(|c| match c {
            '*' | '?' | '[' | ']' | '\\' => vec!['\\', c],
            other => vec![other],
        })
        .collect()
}

impl TestStore for RedisServer {
    const NAME: &'static str = "redis";
    const HAS_LEASE: bool = true;

    fn point(&self, command: &mut Command) {
        command.arg(format!("--store={}", self.url()));
    }

    fn contenders(&self, prefix: &str) -> usize {
        RedisServer::contenders(self, prefix)
    }

    fn assert_clean(&self, prefix: &str) {
        let keys = self.keys(prefix);
        let left = leftover(&keys);
        assert!(left.is_empty(), "keys left on Redis: {left:?}");
    }
}

/// The semaphore's keys that should be gone once everyone left: the fence
/// and ticket counters stay, so that they keep growing, and the epoch, by
/// which contenders tell that the keys were lost.
pub fn leftover(keys: &[String]) -> Vec<&String> {
    keys.iter()
        .filter(|k| !k.ends_with(":fence") && !k.ends_with(":tickets") && !k.ends_with(":epoch"))
        .collect()
}

impl ServerStore for RedisServer {
    fn address(&self) -> String {
        self.url().trim_start_matches("redis://").to_string()
    }

    fn point_through(&self, addr: &str, command: &mut Command) {
        command.arg(format!("--store=redis://{addr}"));
    }
}

/// A slot's lease is its permit, whose score is its expiry by the
/// server's clock: what is left of it, each renewal setting it from the
/// server's now.
impl LeasedStore for RedisServer {
    fn lease_seconds(&self, prefix: &str) -> Vec<f64> {
        let mut connection = self.connection().unwrap();
        let (seconds, micros): (f64, f64) = redis::cmd("TIME").query(&mut connection).unwrap();
        let now = seconds + micros / 1e6;
        let permits: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(format!("semaphore:{prefix}"))
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(&mut connection)
            .unwrap();
        permits.iter().map(|(_, expiry)| expiry - now).collect()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}
