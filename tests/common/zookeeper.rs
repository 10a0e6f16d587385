//! A real ZooKeeper server for one test (Debian's `zookeeperd`, run
//! standalone): a free loopback port, a scratch data directory, a tick of
//! 500 ms so that sessions expire promptly, session timeouts of 1 s to an
//! hour; killed with the test, stopped when dropped. Or an ensemble of
//! three such servers, each with its quorum and election ports, which a
//! test can kill, restart or freeze one by one. The checks read them with
//! consem's own client.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use consem::store::zookeeper::client::{Connection, Digest, Session, ZkError, NO_NODE};
use consem::store::zookeeper::{semaphore_path, LEASES, LOCKS};

use super::etcd::free_ports;
use super::redis::free_port;
use super::wait_until;
use super::world::{LeasedStore, ServerStore, TestStore};

/// Debian's jars that the standalone server needs.
const CLASSPATH: &[&str] = &[
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

/// A JVM on a loaded 2-core machine.
const START_DEADLINE: Duration = Duration::from_secs(60);

pub struct ZkServer {
    pub port: u16,
    /// Its maxSessionTimeout.
    max_session: Duration,
    dir: PathBuf,
    /// Set for a member of an ensemble.
    member: Option<Member>,
    process: Option<Child>,
    /// Its TLS port (`secureClientPort`), if it serves one.
    pub secure: Option<SecurePort>,
}

/// A TLS port beside the plain one: the server's certificate and the CA
/// it trusts for clients' certificates, PEM, and whether it wants one.
pub struct SecurePort {
    pub port: u16,
    keystore: PathBuf,
    truststore: PathBuf,
    client_auth: bool,
}

/// What makes a server a member of an ensemble.
struct Member {
    /// Its `myid`, 1 to 3.
    id: usize,
    /// The ensemble's `server.<id>=127.0.0.1:<quorum>:<election>` lines.
    servers: String,
}

/// An ensemble's timing: a tick of 250 ms, so that a session expires
/// within a quarter second of its timeout; a member that says nothing for
/// `syncLimit` ticks (2 s) is left by the others, and a member has
/// `initLimit` ticks (5 s) to catch up with a new leader, room for a JVM on
/// a loaded machine.
const ENSEMBLE_TIMING: &str = "tickTime=250\ninitLimit=20\nsyncLimit=8\n";

impl ZkServer {
    /// Starts one in `dir` and waits until it serves sessions.
    pub fn start(dir: &Path) -> ZkServer {
        ZkServer::start_granting(dir, Duration::from_secs(3600))
    }

    /// One whose sessions last `max_session` at most.
    pub fn start_granting(dir: &Path, max_session: Duration) -> ZkServer {
        ZkServer::start_with(dir, max_session, None)
    }

    /// One with a TLS port too (Netty's connection factory, PEM stores),
    /// its certificate `server` (certificate, key), trusting `ca` for
    /// clients' certificates; with `client_auth`, it wants one
    /// (`ssl.clientAuth=need`, its default), else none.
    pub fn start_tls(dir: &Path, server: (&Path, &Path), ca: &Path, client_auth: bool) -> ZkServer {
        std::fs::create_dir_all(dir).unwrap();
        let keystore = dir.join("keystore.pem");
        let mut pem = std::fs::read_to_string(server.0).unwrap();
        pem.push_str(&std::fs::read_to_string(server.1).unwrap());
        std::fs::write(&keystore, pem).unwrap();
        let secure = SecurePort {
            port: free_port(),
            keystore,
            truststore: ca.to_path_buf(),
            client_auth,
        };
        ZkServer::start_with(dir, Duration::from_secs(3600), Some(secure))
    }

    fn start_with(dir: &Path, max_session: Duration, secure: Option<SecurePort>) -> ZkServer {
        let mut server = ZkServer::new(dir, free_port(), max_session, None);
        server.secure = secure;
        server.launch();
        server.wait_ready();
        server
    }

    fn new(dir: &Path, port: u16, max_session: Duration, member: Option<Member>) -> ZkServer {
        std::fs::create_dir_all(dir.join("data")).unwrap();
        ZkServer {
            port,
            max_session,
            dir: dir.to_path_buf(),
            member,
            process: None,
            secure: None,
        }
    }

    /// Starts it again on its port and data (after [`ZkServer::stop`]):
    /// it restores the sessions it had, and expires them if nobody
    /// resumes them within their timeout.
    pub fn restart(&mut self) {
        self.launch();
        self.wait_ready();
    }

    fn launch(&mut self) {
        let (dir, port) = (self.dir.clone(), self.port);
        let config = dir.join("zoo.cfg");
        let mut settings = format!(
            "dataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\n4lw.commands.whitelist=cons,ruok,srvr\nminSessionTimeout=1000\nmaxSessionTimeout={}\n",
            dir.join("data").display(),
            self.max_session.as_millis()
        );
        let main = match &self.member {
            None => {
                settings.push_str("tickTime=500\n");
                "org.apache.zookeeper.server.ZooKeeperServerMain"
            }
            Some(member) => {
                std::fs::write(dir.join("data").join("myid"), format!("{}\n", member.id)).unwrap();
                settings.push_str(ENSEMBLE_TIMING);
                settings.push_str(&member.servers);
                "org.apache.zookeeper.server.quorum.QuorumPeerMain"
            }
        };
        if let Some(secure) = &self.secure {
            settings.push_str(&format!(
                "secureClientPort={}\nsecureClientPortAddress=127.0.0.1\nserverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\nssl.keyStore.location={}\nssl.keyStore.type=PEM\nssl.trustStore.location={}\nssl.trustStore.type=PEM\nssl.clientAuth={}\n",
                secure.port,
                secure.keystore.display(),
                secure.truststore.display(),
                if secure.client_auth { "need" } else { "none" }
            ));
        }
        std::fs::write(&config, settings).unwrap();
        let classpath: Vec<String> = CLASSPATH
            .iter()
            .map(|jar| format!("/usr/share/java/{jar}"))
            .collect();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("zookeeper.log"))
            .unwrap();
        let mut command = Command::new("java");
        command
            // A small server that starts fast: the client compiler only,
            // the serial collector, a small heap.
            .args(["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx128m"])
            .args(["-cp", &classpath.join(":")])
            .arg(main)
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        // The server dies with the test, even one that a deadline killed.
        // SAFETY: prctl(2) is async-signal-safe; the closure allocates nothing.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        self.process =
            Some(command.spawn().expect(
                "java is not installed: apt-get install zookeeperd (scripts/test-servers)",
            ));
    }

    fn signal(&self, signal: i32) {
        let process = self.process.as_ref().expect("a running server");
        // SAFETY: kill(2) on a child we spawned and have not reaped.
        assert_eq!(unsafe { libc::kill(process.id() as i32, signal) }, 0);
    }

    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
    }

    pub fn thaw(&self) {
        self.signal(libc::SIGCONT);
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if self.session().is_ok() {
                return;
            }
            let process = self.process.as_mut().expect("a started server");
            if let Some(status) = process.try_wait().unwrap() {
                panic!(
                    "ZooKeeper on port {} exited ({status}) before serving; its log: {}",
                    self.port,
                    std::fs::read_to_string(self.dir.join("zookeeper.log")).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "ZooKeeper on port {} did not serve within {START_DEADLINE:?}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `zk://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("zk://127.0.0.1:{}", self.port)
    }

    /// A session of the test's own.
    pub fn session(&self) -> Result<Session, ZkError> {
        self.session_as(None)
    }

    /// A session of the test's own signed in with `digest` (`user:password`).
    pub fn session_as(&self, digest: Option<&str>) -> Result<Session, ZkError> {
        let digest = digest.map(|text| {
            let (user, password) = text.split_once(':').expect("user:password");
            Digest {
                user: user.to_string(),
                password: password.to_string(),
            }
        });
        Session::open(
            &Connection {
                servers: vec![format!("127.0.0.1:{}", self.port)],
                request_timeout: Duration::from_secs(5),
                digest,
                ..Connection::default()
            },
            Duration::from_secs(10),
        )
    }

    /// The children of `<prefix's path>/<parent>`; none if it is missing.
    pub fn children(&self, prefix: &str, parent: &str) -> Vec<String> {
        self.children_as(None, prefix, parent)
    }

    /// [`ZkServer::children`], read by a session signed in with `digest`.
    pub fn children_as(&self, digest: Option<&str>, prefix: &str, parent: &str) -> Vec<String> {
        let mut session = self.session_as(digest).unwrap();
        let children =
            match session.children(&format!("{}/{parent}", semaphore_path(prefix)), false) {
                Ok(children) => children,
                Err(ZkError::Code(NO_NODE)) => Vec::new(),
                Err(error) => panic!("reading ZooKeeper: {error}"),
            };
        let _ = session.close();
        children
    }

    /// The server's `cons`: one line per connection, with its session's
    /// id (`sid=0x…`) and granted timeout (`to=…` ms).
    fn connections(&self) -> String {
        self.four_letter_word("cons")
            .unwrap_or_else(|| panic!("ZooKeeper on port {} did not answer cons", self.port))
    }

    /// The server's answer to a four-letter word; `None` from one that
    /// does not answer within a second (stopped, frozen).
    fn four_letter_word(&self, word: &str) -> Option<String> {
        use std::io::{Read as _, Write as _};
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        let mut stream =
            std::net::TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        stream.write_all(word.as_bytes()).ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        Some(answer)
    }

    /// What a member of an ensemble is (`leader`, `follower`), as `srvr`
    /// says; `None` while it serves no one (electing, frozen, stopped).
    fn mode(&self) -> Option<String> {
        let answer = self.four_letter_word("srvr")?;
        let line = answer.lines().find(|line| line.starts_with("Mode: "))?;
        Some(line["Mode: ".len()..].trim().to_string())
    }

    /// Whether its process runs (it may be frozen).
    pub fn is_running(&self) -> bool {
        self.process.is_some()
    }

    pub fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            let _ = process.kill();
            let _ = process.wait();
        }
    }
}

impl TestStore for ZkServer {
    const NAME: &'static str = "zookeeper";
    const HAS_LEASE: bool = true;

    fn point(&self, command: &mut Command) {
        command.arg(format!("--store={}", self.url()));
    }

    /// Each contender's nodes carry its UUID (the protected prefix
    /// `_c_<uuid>-`): the head of the mutex's line has a lock node and a
    /// lease node.
    fn contenders(&self, prefix: &str) -> usize {
        let mut contenders: Vec<String> = self
            .children(prefix, LEASES)
            .into_iter()
            .chain(self.children(prefix, LOCKS))
            .map(|node| node.get(..39).unwrap_or(&node).to_string())
            .collect();
        contenders.sort();
        contenders.dedup();
        contenders.len()
    }

    /// Curator's layout keeps its empty parents: only the contenders'
    /// nodes must go.
    fn assert_clean(&self, prefix: &str) {
        assert_eq!(
            self.children(prefix, LEASES),
            Vec::<String>::new(),
            "lease nodes left"
        );
        assert_eq!(
            self.children(prefix, LOCKS),
            Vec::<String>::new(),
            "lock nodes left"
        );
    }
}

impl ServerStore for ZkServer {
    fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn point_through(&self, addr: &str, command: &mut Command) {
        command.arg(format!("--store=zk://{addr}"));
    }
}

/// A slot's lease is its holder's session: its timeout as the server
/// granted it, for the sessions that own lease nodes under the prefix.
impl LeasedStore for ZkServer {
    fn lease_seconds(&self, prefix: &str) -> Vec<f64> {
        let mut session = self.session().unwrap();
        let leases = format!("{}/{LEASES}", semaphore_path(prefix));
        let owners: Vec<i64> = self
            .children(prefix, LEASES)
            .iter()
            .filter_map(|node| session.exists(&format!("{leases}/{node}"), false).unwrap())
            .map(|stat| stat.ephemeral_owner)
            .collect();
        let _ = session.close();
        let connections = self.connections();
        owners
            .iter()
            .filter_map(|owner| {
                let line = connections
                    .lines()
                    .find(|line| line.contains(&format!("sid=0x{owner:x},")))?;
                let timeout = line.split("to=").nth(1)?.split([',', ')']).next()?;
                Some(timeout.parse::<f64>().ok()? / 1000.0)
            })
            .collect()
    }
}

impl Drop for ZkServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Three servers in one ensemble on loopback, each with its client,
/// quorum and election ports and its data directory, stopped when dropped.
/// A test kills, restarts, freezes or thaws one member at a time, and finds
/// the leader with `srvr`.
pub struct ZkEnsemble {
    members: Vec<ZkServer>,
    /// Which members the test froze (SIGSTOP): no check asks them.
    frozen: Vec<bool>,
}

impl ZkEnsemble {
    /// Starts three members in subdirectories of `dir` and waits until each
    /// serves sessions (they have elected a leader).
    pub fn start(dir: &Path) -> ZkEnsemble {
        let ports: [u16; 9] = free_ports();
        let servers: String = (0..3)
            .map(|i| {
                format!(
                    "server.{}=127.0.0.1:{}:{}\n",
                    i + 1,
                    ports[3 + i],
                    ports[6 + i]
                )
            })
            .collect();
        let mut members: Vec<ZkServer> = (0..3)
            .map(|i| {
                let mut member = ZkServer::new(
                    &dir.join(format!("member-{}", i + 1)),
                    ports[i],
                    Duration::from_secs(3600),
                    Some(Member {
                        id: i + 1,
                        servers: servers.clone(),
                    }),
                );
                member.launch();
                member
            })
            .collect();
        for member in &mut members {
            member.wait_ready();
        }
        ZkEnsemble {
            members,
            frozen: vec![false; 3],
        }
    }

    pub fn member(&self, member: usize) -> &ZkServer {
        &self.members[member]
    }

    /// `127.0.0.1:<client port>` of `member`.
    pub fn address(&self, member: usize) -> String {
        self.members[member].address()
    }

    /// `zk://` with every member's address, `first` first: consem talks to
    /// the first that answers, and moves on in the list's order.
    pub fn url_starting_with(&self, first: usize) -> String {
        let count = self.members.len();
        let addresses: Vec<String> = (0..count)
            .map(|step| self.address((first + step) % count))
            .collect();
        format!("zk://{}", addresses.join(","))
    }

    /// The index of the leader, once the members that run (and are not
    /// frozen) agree: one leads, the others follow (after a kill, once
    /// they elected another).
    pub fn leader(&self) -> usize {
        let mut leader = None;
        wait_until(START_DEADLINE, "the members to agree on a leader", || {
            let mut leaders = Vec::new();
            for member in self.asked() {
                match self.members[member].mode().as_deref() {
                    Some("leader") => leaders.push(member),
                    Some("follower") => {}
                    _ => return false,
                }
            }
            leader = (leaders.len() == 1).then(|| leaders[0]);
            leader.is_some()
        });
        leader.unwrap()
    }

    /// The members a check may ask: running and not frozen.
    fn asked(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&i| self.members[i].is_running() && !self.frozen[i])
            .collect()
    }

    /// A member that serves, for the checks (call [`ZkEnsemble::leader`]
    /// first after a kill: none serves during an election).
    pub fn serving(&self) -> &ZkServer {
        let member = self
            .asked()
            .into_iter()
            .find(|&i| self.members[i].mode().is_some())
            .expect("a member that serves");
        &self.members[member]
    }

    /// The ids of the sessions connected to the members that serve, as
    /// `cons` lists them.
    pub fn connected_sessions(&self) -> Vec<i64> {
        self.asked()
            .into_iter()
            .flat_map(|i| {
                self.members[i]
                    .connections()
                    .lines()
                    .filter_map(|line| {
                        let id = line.split("sid=0x").nth(1)?.split([',', ')']).next()?;
                        i64::from_str_radix(id, 16).ok()
                    })
                    .collect::<Vec<i64>>()
            })
            .collect()
    }

    /// The session that owns each node under `<prefix's path>/<parent>`,
    /// by name.
    pub fn owners(&self, prefix: &str, parent: &str) -> Vec<(String, i64)> {
        let member = self.serving();
        let mut session = member.session().unwrap();
        let path = format!("{}/{parent}", semaphore_path(prefix));
        let owners = member
            .children(prefix, parent)
            .into_iter()
            .filter_map(|node| {
                let stat = session.exists(&format!("{path}/{node}"), false).unwrap()?;
                Some((node, stat.ephemeral_owner))
            })
            .collect();
        let _ = session.close();
        owners
    }

    /// Kills `member` (SIGKILL): its connections close at once.
    pub fn kill(&mut self, member: usize) {
        self.members[member].stop();
    }

    /// Starts `member` again on its ports and data, and waits until it
    /// serves (it has joined the others).
    pub fn restart(&mut self, member: usize) {
        self.members[member].restart();
    }

    /// Freezes `member` (SIGSTOP): its connections stay open, and it
    /// answers nobody, clients and members alike.
    pub fn freeze(&mut self, member: usize) {
        self.members[member].freeze();
        self.frozen[member] = true;
    }

    pub fn thaw(&mut self, member: usize) {
        self.members[member].thaw();
        self.frozen[member] = false;
    }
}

/// consem pointed at every member, the first first.
impl TestStore for ZkEnsemble {
    const NAME: &'static str = "zookeeper";
    const HAS_LEASE: bool = true;

    fn point(&self, command: &mut Command) {
        command.arg(format!("--store={}", self.url_starting_with(0)));
    }

    fn contenders(&self, prefix: &str) -> usize {
        self.serving().contenders(prefix)
    }

    fn assert_clean(&self, prefix: &str) {
        self.serving().assert_clean(prefix);
    }
}

/// Debian's jars of Apache Curator and what it needs beside the server's.
const CURATOR_CLASSPATH: &[&str] = &[
    "curator-framework.jar",
    "curator-client.jar",
    "curator-recipes.jar",
    "guava.jar",
];

/// tests/fixtures/curator/CuratorHolder.java compiled into `dir` with
/// Debian's Curator jars (`libcurator-recipes-java`): a JVM holding one
/// lease of `InterProcessSemaphoreV2`.
pub struct CuratorHolder {
    classpath: String,
}

impl CuratorHolder {
    pub fn compile(dir: &Path) -> CuratorHolder {
        let classes = dir.join("curator-classes");
        std::fs::create_dir_all(&classes).unwrap();
        let jars: Vec<String> = CURATOR_CLASSPATH
            .iter()
            .chain(CLASSPATH)
            .map(|jar| format!("/usr/share/java/{jar}"))
            .collect();
        let source =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/curator/CuratorHolder.java");
        let compiled = Command::new("javac")
            .arg("-d")
            .arg(&classes)
            .args(["-cp", &jars.join(":")])
            .arg(&source)
            .output()
            .expect("javac is not installed: apt-get install default-jdk-headless libcurator-recipes-java (scripts/test-servers)");
        assert!(
            compiled.status.success(),
            "javac: {}",
            String::from_utf8_lossy(&compiled.stderr)
        );
        CuratorHolder {
            classpath: format!("{}:{}", classes.display(), jars.join(":")),
        }
    }

    /// A JVM that takes one lease of `max_leases` at `path` on `server`
    /// (`host:port`), logs `start <epoch ns>` to `log`, holds it for
    /// `hold`, logs `end <epoch ns>` and returns it.
    pub fn spawn(
        &self,
        server: &str,
        path: &str,
        max_leases: u32,
        hold: Duration,
        log: &Path,
    ) -> Child {
        self.spawn_as(server, path, max_leases, hold, log, None)
    }

    /// [`CuratorHolder::spawn`] signed in with `digest` (`user:password`,
    /// Curator's `authorization("digest", ...)`).
    pub fn spawn_as(
        &self,
        server: &str,
        path: &str,
        max_leases: u32,
        hold: Duration,
        log: &Path,
        digest: Option<&str>,
    ) -> Child {
        let mut command = Command::new("java");
        command
            .args(["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx64m"])
            .args(["-cp", &self.classpath, "CuratorHolder", server, path])
            .arg(max_leases.to_string())
            .arg(hold.as_millis().to_string())
            .arg(log)
            .args(digest)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: prctl(2) is async-signal-safe; the closure allocates nothing.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        command.spawn().unwrap()
    }
}
