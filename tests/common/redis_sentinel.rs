//! Redis Sentinel of the test's own: a primary, its replicas, and three
//! Sentinels on free loopback ports that agree on them, stopped when
//! dropped.

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::redis::{free_port, leftover, RedisServer};
use super::wait_until;
use super::world::{TestStore, World, PROMPT};

/// The name the Sentinels monitor the primary by.
pub const PRIMARY_NAME: &str = "jobs-primary";

/// How long a failover may take on loopback with the timeouts below.
pub const FAILOVER: Duration = Duration::from_secs(30);

struct SentinelProcess {
    port: u16,
    process: Child,
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

pub struct RedisSentinel {
    /// The primary, then its replicas; which is the primary changes with a
    /// failover.
    pub servers: Vec<RedisServer>,
    sentinels: Vec<SentinelProcess>,
}

impl RedisSentinel {
    /// A primary with `replicas` replicas, and three Sentinels.
    pub fn start(dir: &Path, replicas: usize) -> RedisSentinel {
        std::fs::create_dir_all(dir).unwrap();
        let primary = RedisServer::start(&dir.join("primary"), &[]);
        let primary_port = primary.port.to_string();
        let mut servers = vec![primary];
        for i in 0..replicas {
            servers.push(RedisServer::start(
                &dir.join(format!("replica-{i}")),
                &["--replicaof", "127.0.0.1", &primary_port],
            ));
        }
        let sentinels = (0..3)
            .map(|i| RedisSentinel::start_sentinel(dir, i, &primary_port))
            .collect();
        let setup = RedisSentinel { servers, sentinels };
        wait_until(
            PROMPT * 3,
            "the Sentinels to know each other and the replicas",
            || {
                setup.sentinels.iter().all(|s| {
                    let known = |what: &str| {
                        setup
                            .ask_sentinel::<Vec<redis::Value>>(
                                s.port,
                                redis::cmd("SENTINEL").arg(what).arg(PRIMARY_NAME),
                            )
                            .map_or(0, |list| list.len())
                    };
                    known("SENTINELS") == 2 && known("REPLICAS") == replicas
                }) && setup.servers[1..].iter().all(|replica| {
                    replica
                        .query::<String>(redis::cmd("INFO").arg("replication"))
                        .is_ok_and(|info| info.contains("master_link_status:up"))
                })
            },
        );
        setup
    }

    /// Sentinel `i` on a free port, answering PING: a port taken between
    /// the pick and the bind (the machine runs other tests) is picked
    /// again. It dies with the test's process, even killed.
    fn start_sentinel(dir: &Path, i: usize, primary_port: &str) -> SentinelProcess {
        loop {
            let port = free_port();
            let conf = dir.join(format!("sentinel-{i}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\n\
                     sentinel monitor {PRIMARY_NAME} 127.0.0.1 {primary_port} 2\n\
                     sentinel down-after-milliseconds {PRIMARY_NAME} 1000\n\
                     sentinel failover-timeout {PRIMARY_NAME} 10000\n",
                    dir.display(),
                ),
            )
            .unwrap();
            let mut command = Command::new("redis-server");
            command
                .arg(&conf)
                .arg("--sentinel")
                .arg("--logfile")
                .arg(dir.join(format!("sentinel-{i}.log")))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            // SAFETY: prctl is async-signal-safe.
            unsafe {
                command.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
            let process = command.spawn().expect(
                "redis-server is not installed: scripts/test installs it (apt-get install redis-server)",
            );
            let mut sentinel = SentinelProcess { port, process };
            let answering = || {
                redis::Client::open(format!("redis://127.0.0.1:{port}"))
                    .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(1)))
                    .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                    .is_ok()
            };
            let deadline = std::time::Instant::now() + PROMPT;
            while std::time::Instant::now() < deadline {
                if answering() {
                    return sentinel;
                }
                if sentinel.process.try_wait().unwrap().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(
                sentinel.process.try_wait().unwrap().is_some(),
                "Sentinel {i} neither answers nor exited within {PROMPT:?}; see its log in {}",
                dir.display()
            );
        }
    }

    fn ask_sentinel<T: redis::FromRedisValue>(
        &self,
        port: u16,
        command: &mut redis::Cmd,
    ) -> redis::RedisResult<T> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
        let mut connection = client.get_connection_with_timeout(Duration::from_secs(2))?;
        connection.set_read_timeout(Some(Duration::from_secs(2)))?;
        command.query(&mut connection)
    }

    /// `redis+sentinel://` URL naming every Sentinel and `primary`.
    pub fn url_for(&self, primary: &str) -> String {
        let sentinels: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis+sentinel://{}/{primary}", sentinels.join(","))
    }

    fn says_primary(server: &RedisServer) -> bool {
        server
            .query::<String>(redis::cmd("INFO").arg("replication"))
            .is_ok_and(|info| info.contains("role:master"))
    }

    /// Stops Sentinel `i` (SIGSTOP): it still takes connections, and
    /// answers nothing.
    pub fn freeze_sentinel(&self, i: usize) {
        let pid = self.sentinels[i].process.id() as libc::pid_t;
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    }

    /// `redis+sentinel://` URL naming Sentinel `i` alone.
    pub fn url_of_sentinel(&self, i: usize) -> String {
        format!(
            "redis+sentinel://127.0.0.1:{}/{PRIMARY_NAME}",
            self.sentinels[i].port
        )
    }

    /// The server that the Sentinels name and that says it is the primary.
    pub fn primary(&self) -> &RedisServer {
        let named = self.primary_port_by_sentinel();
        self.servers
            .iter()
            .find(|server| Some(server.port) == named && Self::says_primary(server))
            .expect("the Sentinels name one of the servers, which says it is the primary")
    }

    /// The port the Sentinels give for the primary now.
    pub fn primary_port_by_sentinel(&self) -> Option<u16> {
        // The first Sentinel that answers (a test may have frozen one).
        self.sentinels.iter().find_map(|sentinel| {
            let address: Option<(String, u16)> = self
                .ask_sentinel(
                    sentinel.port,
                    redis::cmd("SENTINEL")
                        .arg("GET-MASTER-ADDR-BY-NAME")
                        .arg(PRIMARY_NAME),
                )
                .ok()?;
            address.map(|(_, port)| port)
        })
    }

    /// Has the Sentinels fail the primary over to a replica (`SENTINEL
    /// FAILOVER`: at once, without the old primary's agreement), and waits
    /// until the replica says it is the primary, the Sentinels say so, and
    /// every other server, the old primary too, says it is a replica.
    pub fn fail_over(&self) {
        let old = self.primary().port;
        let _: String = self
            .ask_sentinel(
                self.sentinels[0].port,
                redis::cmd("SENTINEL").arg("FAILOVER").arg(PRIMARY_NAME),
            )
            .unwrap();
        wait_until(FAILOVER, "a replica to become the primary", || {
            self.primary_port_by_sentinel()
                .filter(|&port| port != old)
                .is_some_and(|new| {
                    self.servers
                        .iter()
                        .all(|server| Self::says_primary(server) == (server.port == new))
                })
        });
    }
}

impl TestStore for RedisSentinel {
    const NAME: &'static str = "redis";
    const HAS_LEASE: bool = true;

    fn point(&self, command: &mut Command) {
        command.arg(format!("--store={}", self.url_for(PRIMARY_NAME)));
    }

    fn contenders(&self, prefix: &str) -> usize {
        self.primary().contenders(prefix)
    }

    fn assert_clean(&self, prefix: &str) {
        let keys = self.primary().keys(prefix);
        let left = leftover(&keys);
        assert!(left.is_empty(), "keys left on the primary: {left:?}");
    }
}

impl World<RedisSentinel> {
    /// A world on a primary, a replica and three Sentinels of its own.
    pub fn redis_sentinel(name: &str) -> World<RedisSentinel> {
        World::with_store(name, |dir| RedisSentinel::start(&dir.join("sentinel"), 1))
    }
}
