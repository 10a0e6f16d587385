//! A real PostgreSQL server for one test: a copy of a cluster that
//! `initdb` made once for every test (trust authentication, the role
//! `postgres`), on a free loopback port with a socket directory of its
//! own; stopped (fast shutdown) when dropped. The server refuses to run as
//! root: as root, it runs as `nobody`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::redis::free_port;
use super::wait_until;
use super::world::{ServerStore, TestStore, PROMPT};

/// libpq's variables that consem reads; `World::consem_command` clears
/// them, so that a test sets exactly the ones it means.
pub const PG_ENV: [&str; 8] = [
    "PGHOST",
    "PGPORT",
    "PGUSER",
    "PGPASSWORD",
    "PGDATABASE",
    "PGSSLMODE",
    "PGSSLROOTCERT",
    "PGPASSFILE",
];

/// The newest PostgreSQL installed as Debian installs it.
pub fn bin(name: &str) -> PathBuf {
    let mut versions: Vec<u32> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is not installed: scripts/test-servers installs it (apt-get install postgresql)")
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    versions.sort_unstable();
    let version = versions.last().expect("no /usr/lib/postgresql/<version>");
    PathBuf::from(format!("/usr/lib/postgresql/{version}/bin/{name}"))
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `program` as the server's user (`nobody` when we are root), dying with
/// the thread that started it.
fn as_server_user(program: &Path) -> Command {
    let mut command = Command::new("setpriv");
    if is_root() {
        command.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"]);
    }
    command.args(["--pdeathsig", "INT", "--"]).arg(program);
    command
}

fn give_to_server_user(path: &Path) {
    if is_root() {
        let status = Command::new("chown")
            .args(["-R", "nobody:nogroup"])
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success(), "chown {}", path.display());
    }
}

/// The cluster every test copies, made once per machine and version
/// (under a lock: tests run in parallel processes).
fn template() -> PathBuf {
    let initdb = bin("initdb");
    let version = initdb
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let base = std::env::temp_dir().join(format!("consem-postgres-template-{version}"));
    let data = base.join("data");
    let lock = std::fs::File::create(
        std::env::temp_dir().join(format!("consem-postgres-template-{version}.lock")),
    )
    .unwrap();
    // SAFETY: flock on a descriptor we own; released when `lock` drops.
    assert_eq!(
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) },
        0
    );
    if !base.join("done").exists() {
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        give_to_server_user(&base);
        let output = as_server_user(&initdb)
            .args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
                "--no-instructions",
                "-E",
                "UTF8",
                "--locale",
                "C",
            ])
            .arg("-D")
            .arg(&data)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        std::fs::write(base.join("done"), b"").unwrap();
    }
    data
}

pub struct PostgresServer {
    pub port: u16,
    pub socket_dir: PathBuf,
    data: PathBuf,
    /// Settings given to the server (`-c name=value` each).
    settings: Vec<String>,
    log: PathBuf,
    process: Option<Child>,
}

impl PostgresServer {
    /// Starts one in `dir`, and waits until it takes connections.
    pub fn start(dir: &Path) -> PostgresServer {
        PostgresServer::start_with(dir, &[])
    }

    /// One that speaks TLS with the test PKI's server certificate
    /// (`localhost`, `127.0.0.1`), as well as plain text.
    pub fn start_tls(dir: &Path, files: &super::pki::PkiFiles) -> PostgresServer {
        let tls = dir.join("tls");
        std::fs::create_dir_all(&tls).unwrap();
        let (cert, key) = (tls.join("server.pem"), tls.join("server-key.pem"));
        std::fs::copy(&files.server, &cert).unwrap();
        std::fs::copy(&files.server_key, &key).unwrap();
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        PostgresServer::start_with(
            dir,
            &[
                "ssl=on".to_string(),
                format!("ssl_cert_file={}", cert.display()),
                format!("ssl_key_file={}", key.display()),
            ],
        )
    }

    /// Starts one in `dir` with `settings` (`name=value`).
    pub fn start_with(dir: &Path, settings: &[String]) -> PostgresServer {
        std::fs::create_dir_all(dir).unwrap();
        let data = dir.join("data");
        let status = Command::new("cp")
            .arg("-a")
            .arg(template())
            .arg(&data)
            .status()
            .unwrap();
        assert!(status.success(), "copying the template cluster");
        let socket_dir = dir.join("socket");
        std::fs::create_dir_all(&socket_dir).unwrap();
        give_to_server_user(dir);
        let mut server = PostgresServer {
            port: 0,
            socket_dir,
            data,
            settings: settings.to_vec(),
            log: dir.join("postgres.log"),
            process: None,
        };
        // A port taken between the pick and the bind is picked again.
        while !server.start_on(free_port()) {}
        server
    }

    /// Starts the server on `port`; false if it exited first (the port
    /// was taken).
    fn start_on(&mut self, port: u16) -> bool {
        self.port = port;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let process = as_server_user(&bin("postgres"))
            .arg("-D")
            .arg(&self.data)
            .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1"])
            .arg("-k")
            .arg(&self.socket_dir)
            .args([
                "-c",
                "fsync=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "shared_buffers=16MB",
            ])
            .args([
                "-c",
                "max_connections=200",
                "-c",
                "log_min_messages=warning",
            ])
            .args(
                self.settings
                    .iter()
                    .flat_map(|setting| ["-c", setting.as_str()]),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.process = Some(process);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.answers() {
                return true;
            }
            if self.process.as_mut().unwrap().try_wait().unwrap().is_some() {
                self.process = None;
                return false;
            }
            assert!(
                Instant::now() < deadline,
                "postgres on port {port} did not answer within 30 s; see {}",
                self.log.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn answers(&self) -> bool {
        Command::new(bin("pg_isready"))
            .args([
                "-q",
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-t",
                "1",
            ])
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Stops it (fast shutdown: sessions are ended) and starts it again on
    /// its port, with its data.
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    /// Starts it again on its port, with its data, after [`Self::stop`].
    pub fn start_again(&mut self) {
        let port = self.port;
        assert!(
            self.start_on(port),
            "postgres could not listen on {port} again"
        );
    }

    /// Stops it as a crash does (immediate shutdown: no checkpoint, what
    /// was not written out of the server's memory is lost) and starts it
    /// again, recovering from its log.
    pub fn crash_and_start_again(&mut self) {
        self.stop_with(libc::SIGQUIT);
        self.start_again();
    }

    /// Stops it (fast shutdown: sessions are ended).
    pub fn stop(&mut self) {
        self.stop_with(libc::SIGINT);
    }

    fn stop_with(&mut self, signal: i32) {
        if let Some(mut process) = self.process.take() {
            // SAFETY: kill(2) on our child, not yet reaped.
            unsafe { libc::kill(process.id() as i32, signal) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while process.try_wait().unwrap().is_none() {
                if Instant::now() > deadline {
                    let _ = process.kill();
                    let _ = process.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    /// Puts `line` first in pg_hba.conf (the first line that matches a
    /// connection decides) and reloads the configuration.
    pub fn hba_first(&self, line: &str) {
        let path = self.data.join("pg_hba.conf");
        let rest = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, format!("{line}\n{rest}")).unwrap();
        self.psql("SELECT pg_reload_conf()");
    }

    /// The address consem is given: TCP, so that its keepalives apply.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Runs `sql` with psql as the superuser and returns its output
    /// (unaligned, tuples only).
    pub fn psql(&self, sql: &str) -> String {
        let output = Command::new(bin("psql"))
            .args([
                "-XAtq",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-d",
                "postgres",
            ])
            .args(["-p", &self.port.to_string(), "-c", sql])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    /// The backends holding or waiting for an advisory lock of `prefix`.
    pub fn contender_pids(&self, prefix: &str) -> Vec<i32> {
        let text = self.psql(&format!(
            "SELECT DISTINCT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND classid = {} ORDER BY pid",
            prefix_classid(prefix)
        ));
        text.lines().filter_map(|line| line.parse().ok()).collect()
    }
}

/// The first key of `prefix`'s advisory locks as `pg_locks` shows it:
/// FNV-1a, 32 bits, as docs/design.md says.
pub fn prefix_classid(prefix: &str) -> u32 {
    prefix.bytes().fold(0x811c_9dc5u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl TestStore for PostgresServer {
    const NAME: &'static str = "postgres";
    const HAS_LEASE: bool = true;

    fn point(&self, command: &mut Command) {
        command.args(["--store", &self.url()]);
    }

    fn contenders(&self, prefix: &str) -> usize {
        self.contender_pids(prefix).len()
    }

    /// Nothing stays: a session that left is gone from pg_locks once its
    /// backend has exited, a moment after consem.
    fn assert_clean(&self, prefix: &str) {
        wait_until(PROMPT, "the contenders' sessions to end", || {
            self.contender_pids(prefix).is_empty()
        });
    }
}

impl ServerStore for PostgresServer {
    fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn point_through(&self, addr: &str, command: &mut Command) {
        command.args(["--store", &format!("postgres://postgres@{addr}/postgres")]);
    }
}

/// A PgBouncer in front of a [`PostgresServer`], pooling its `postgres`
/// database in `mode` (`session`, `transaction` or `statement`), trusting
/// every client; stopped when dropped.
pub struct PgBouncer {
    pub port: u16,
    process: Child,
}

impl PgBouncer {
    pub fn start(server: &PostgresServer, dir: &Path, mode: &str) -> PgBouncer {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").unwrap();
        loop {
            let port = free_port();
            let ini = dir.join("pgbouncer.ini");
            std::fs::write(
                &ini,
                format!(
                    "[databases]\npostgres = host=127.0.0.1 port={} dbname=postgres\n\
                     [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                     auth_type = trust\nauth_file = {}\npool_mode = {mode}\n\
                     logfile = {}\nmax_client_conn = 100\ndefault_pool_size = 20\n",
                    server.port,
                    dir.join("users.txt").display(),
                    dir.join("pgbouncer.log").display()
                ),
            )
            .unwrap();
            give_to_server_user(dir);
            let mut process = as_server_user(Path::new("pgbouncer"))
                .arg(&ini)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("pgbouncer is not installed: scripts/test-servers installs it");
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return PgBouncer { port, process };
                }
                if process.try_wait().unwrap().is_some() {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "pgbouncer did not listen within 20 s; see {}",
                    dir.join("pgbouncer.log").display()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}
