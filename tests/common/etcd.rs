//! A real etcd (3.4, Debian's etcd-server) for one test: a member on free
//! loopback ports with a scratch data directory, or a cluster of three;
//! killed when dropped. The helpers read etcd through its JSON gateway
//! (`POST /v3/...`) and act on it with etcdctl, as an operator would.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

use super::pki::PkiFiles;
use super::world::{LeasedStore, ServerStore, TestStore};
use super::{wait_until, Access};

/// The etcdctl variables consem reads as defaults; `World::consem` and the
/// etcdctl helper clear them so that only what a test sets counts.
pub const ETCDCTL_ENV: [&str; 6] = [
    "ETCDCTL_ENDPOINTS",
    "ETCDCTL_USER",
    "ETCDCTL_PASSWORD",
    "ETCDCTL_CACERT",
    "ETCDCTL_CERT",
    "ETCDCTL_KEY",
];

/// How long a member may take to answer `/health` after it started: a
/// loaded machine, and a cluster's first election.
const START_DEADLINE: Duration = Duration::from_secs(30);

/// `n` ports nobody listens on now (the kernel's picks for sockets that
/// stay open until all are picked, so that they differ).
pub fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: Vec<std::net::TcpListener> = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    std::array::from_fn(|i| listeners[i].local_addr().unwrap().port())
}

/// A key under a prefix as the range API returns it.
#[derive(Clone, Debug)]
pub struct EtcdEntry {
    pub key: String,
    pub value: String,
    /// The lease it is attached to, in lowercase hex as consem and
    /// etcdctl show it; `None` for a key without one.
    pub lease: Option<String>,
    pub create_revision: i64,
}

/// What a TLS member serves with, and what the helpers present to it.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// Signed the member's certificate (and the client's).
    pub ca: PathBuf,
    pub server: PathBuf,
    pub server_key: PathBuf,
    /// Certificate and key of a client. `Some`: the member asks clients
    /// for a certificate signed by `ca`, and the helpers present this one.
    pub client: Option<(PathBuf, PathBuf)>,
}

impl TlsFiles {
    /// The member serves `files.server` and asks clients for nothing.
    pub fn server_only(files: &PkiFiles) -> TlsFiles {
        TlsFiles {
            ca: files.ca.clone(),
            server: files.server.clone(),
            server_key: files.server_key.clone(),
            client: None,
        }
    }

    /// A CA of its own, written to `dir`, and the certificates it signs:
    /// the member's and a client's. etcd 3.4's JSON gateway calls the
    /// member's own gRPC server presenting the member's certificate (3.4
    /// has no --client-cert-file), so with client certificates asked
    /// for, the member's must be valid for client use too; the test PKI's
    /// server certificate is not, and every /v3 call would fail.
    pub fn mutual(dir: &Path) -> TlsFiles {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, DnType,
            ExtendedKeyUsagePurpose as Usage, IsCa, KeyPair,
        };
        std::fs::create_dir_all(dir).unwrap();
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "consem etcd test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let write = |name: &str, text: String| -> PathBuf {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let leaf = |name: &str, usages: Vec<Usage>| -> (PathBuf, PathBuf) {
            let mut params =
                CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
            params.distinguished_name.push(DnType::CommonName, name);
            params.extended_key_usages = usages;
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &ca).unwrap();
            (
                write(&format!("{name}.pem"), cert.pem()),
                write(&format!("{name}-key.pem"), key.serialize_pem()),
            )
        };
        let (server, server_key) = leaf("member", vec![Usage::ServerAuth, Usage::ClientAuth]);
        let client = leaf("client", vec![Usage::ClientAuth]);
        TlsFiles {
            ca: write("ca.pem", ca.pem()),
            server,
            server_key,
            client: Some(client),
        }
    }
}

/// One etcd member: a single server of a test's own, or one of a cluster's.
pub struct EtcdServer {
    port: u16,
    peer_port: u16,
    name: String,
    dir: PathBuf,
    /// Its `--initial-cluster`: itself alone, or the three members.
    initial_cluster: String,
    tls: Option<TlsFiles>,
    /// `None` once stopped.
    process: Option<Child>,
    /// Root's password once `enable_auth` turned authentication on: the
    /// helpers then sign in as root.
    root_password: Option<String>,
}

impl EtcdServer {
    /// A single member in `dir`, serving plain HTTP; waits until it answers.
    pub fn start(dir: &Path) -> EtcdServer {
        let [port, peer_port] = free_ports();
        let initial_cluster = format!("solo=http://127.0.0.1:{peer_port}");
        let mut server = EtcdServer::spawn("solo", port, peer_port, dir, initial_cluster, None);
        server.wait_ready();
        server
    }

    /// A single member serving https, as `tls` says.
    pub fn start_tls(dir: &Path, tls: TlsFiles) -> EtcdServer {
        let [port, peer_port] = free_ports();
        let initial_cluster = format!("solo=http://127.0.0.1:{peer_port}");
        let mut server =
            EtcdServer::spawn("solo", port, peer_port, dir, initial_cluster, Some(tls));
        server.wait_ready();
        server
    }

    fn spawn(
        name: &str,
        port: u16,
        peer_port: u16,
        dir: &Path,
        initial_cluster: String,
        tls: Option<TlsFiles>,
    ) -> EtcdServer {
        std::fs::create_dir_all(dir).unwrap();
        let mut server = EtcdServer {
            port,
            peer_port,
            name: name.to_string(),
            dir: dir.to_path_buf(),
            initial_cluster,
            tls,
            process: None,
            root_password: None,
        };
        server.launch();
        server
    }

    /// Starts the etcd process on the member's ports and data directory
    /// (a restart finds its data there and ignores the cluster flags).
    fn launch(&mut self) {
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        let mut command = Command::new("etcd");
        command
            .args(["--name", &self.name])
            .arg("--data-dir")
            .arg(self.dir.join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", "new"])
            // The member list as the cluster's token: the same for every
            // member, and members of other tests' clusters never take each
            // other's peers for their own should a port be reused.
            .args(["--initial-cluster-token", &self.initial_cluster])
            .args(["--logger", "zap", "--log-outputs", "stderr"]);
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.server)
                .arg("--key-file")
                .arg(&tls.server_key);
            if tls.client.is_some() {
                command
                    .arg("--client-cert-auth")
                    .arg("--trusted-ca-file")
                    .arg(&tls.ca);
            }
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        // The member dies with the test, even one that a deadline killed.
        // SAFETY: prctl(2) is async-signal-safe; the closure allocates nothing.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        self.process =
            Some(command.spawn().expect(
                "etcd is not installed: apt-get install etcd-server etcd-client (etcd 3.4)",
            ));
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("etcd.log")
    }

    /// The end of its log, for a panic message (the scratch directory goes
    /// with the test).
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// Waits until it answers `/health` (which needs a leader), failing
    /// at once with its log if it exits.
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if self.healthy() {
                return;
            }
            let process = self.process.as_mut().expect("a launched member");
            if let Some(status) = process.try_wait().unwrap() {
                panic!(
                    "etcd {} on port {} exited ({status}) before answering; its log ends:\n{}",
                    self.name,
                    self.port,
                    self.log_tail()
                );
            }
            if Instant::now() >= deadline {
                panic!(
                    "etcd {} on port {} did not answer /health within {START_DEADLINE:?}; its log ends:\n{}",
                    self.name,
                    self.port,
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn healthy(&self) -> bool {
        let url = format!("{}/health", self.endpoint());
        match self.access().agent().get(&url).call() {
            Ok(mut response) => {
                response.status() == 200
                    && response
                        .body_mut()
                        .read_to_string()
                        .is_ok_and(|body| body.contains(r#""health":"true""#))
            }
            Err(_) => false,
        }
    }

    /// `etcd://127.0.0.1:<port>`, or `etcds://` for a TLS member.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "etcds" } else { "etcd" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// `http://127.0.0.1:<port>` (or `https://`), as etcdctl takes it.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:<port>`, an endpoint in a store URL's list.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn access(&self) -> Access {
        match &self.tls {
            None => Access::default(),
            Some(tls) => Access {
                ca_pem: Some(std::fs::read_to_string(&tls.ca).unwrap()),
                client: tls.client.as_ref().map(|(cert, key)| super::pki::CertKey {
                    cert_pem: std::fs::read_to_string(cert).unwrap(),
                    key_pem: std::fs::read_to_string(key).unwrap(),
                }),
                token: None,
            },
        }
    }

    /// One call of the JSON gateway, signed in as root once auth is on.
    fn try_call(&self, path: &str, body: &Value) -> Result<Value, String> {
        let agent = self.access().agent();
        let url = format!("{}{path}", self.endpoint());
        let mut request = agent.post(&url);
        if let Some(password) = &self.root_password {
            let signed_in = EtcdServer::post(
                agent.post(format!("{}/v3/auth/authenticate", self.endpoint())),
                &json!({"name": "root", "password": password}),
            )?;
            let token = signed_in["token"].as_str().ok_or("no token")?.to_string();
            request = request.header("Authorization", token);
        }
        EtcdServer::post(request, body)
    }

    fn post(
        request: ureq::RequestBuilder<ureq::typestate::WithBody>,
        body: &Value,
    ) -> Result<Value, String> {
        let mut response = request.send(body.to_string()).map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .read_to_string()
            .map_err(|e| e.to_string())?;
        if status != 200 {
            return Err(format!("answered {status}: {text}"));
        }
        serde_json::from_str(&text).map_err(|e| format!("not JSON ({e}): {text}"))
    }

    fn call(&self, path: &str, body: &Value) -> Value {
        self.try_call(path, body)
            .unwrap_or_else(|e| panic!("POST {}{path} {body}: {e}", self.endpoint()))
    }

    /// A gauge or counter from etcd's `/metrics`.
    pub fn metric(&self, name: &str) -> f64 {
        let url = format!("{}/metrics", self.endpoint());
        let text = self
            .access()
            .agent()
            .get(&url)
            .call()
            .and_then(|mut response| response.body_mut().read_to_string())
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("etcd's /metrics has no {name}"))
            .trim()
            .parse()
            .unwrap()
    }

    /// Every key under `<prefix>/`, in key order.
    pub fn entries(&self, prefix: &str) -> Vec<EtcdEntry> {
        let answer = self.call(
            "/v3/kv/range",
            &json!({"key": b64(&format!("{prefix}/")), "range_end": b64(&format!("{prefix}0"))}),
        );
        let Some(kvs) = answer["kvs"].as_array() else {
            return Vec::new();
        };
        kvs.iter()
            .map(|kv| EtcdEntry {
                key: unb64(&kv["key"]),
                value: unb64(&kv["value"]),
                lease: kv["lease"].as_str().map(hex),
                create_revision: number(&kv["create_revision"]),
            })
            .collect()
    }

    /// The names of the keys under `<prefix>/`.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        self.entries(prefix).into_iter().map(|e| e.key).collect()
    }

    /// Contender keys (holders and waiters): every key under the prefix
    /// but the limit record.
    pub fn contenders(&self, prefix: &str) -> usize {
        let limit = format!("{prefix}/.limit");
        self.keys(prefix).iter().filter(|k| **k != limit).count()
    }

    /// Every lease the server holds, in hex.
    pub fn leases(&self) -> Vec<String> {
        let answer = self.call("/v3/lease/leases", &json!({}));
        let mut leases: Vec<String> = answer["leases"]
            .as_array()
            .map(|leases| {
                leases
                    .iter()
                    .map(|l| hex(l["ID"].as_str().unwrap()))
                    .collect()
            })
            .unwrap_or_default();
        leases.sort();
        leases
    }

    /// A lease's TTL as granted and what is left of it, in seconds (the
    /// rest is -1 once it ran out).
    pub fn time_to_live(&self, lease: &str) -> (i64, i64) {
        let id = i64::from_str_radix(lease, 16).unwrap();
        let answer = self.call("/v3/lease/timetolive", &json!({ "ID": id.to_string() }));
        (number(&answer["grantedTTL"]), number(&answer["TTL"]))
    }

    /// This member's ID and the leader's, as it sees them; `None` if it
    /// does not answer.
    fn member_and_leader(&self) -> Option<(String, String)> {
        let status = self.try_call("/v3/maintenance/status", &json!({})).ok()?;
        Some((
            status["header"]["member_id"].as_str()?.to_string(),
            status["leader"].as_str()?.to_string(),
        ))
    }

    /// Runs etcdctl against this member (signed in as root once auth is on).
    fn etcdctl(&self, args: &[&str]) -> Output {
        let mut command = Command::new("etcdctl");
        for name in ETCDCTL_ENV {
            command.env_remove(name);
        }
        command
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint()))
            .args(["--dial-timeout=5s", "--command-timeout=10s"]);
        if let Some(tls) = &self.tls {
            command.arg("--cacert").arg(&tls.ca);
            if let Some((cert, key)) = &tls.client {
                command.arg("--cert").arg(cert).arg("--key").arg(key);
            }
        }
        if let Some(password) = &self.root_password {
            command.arg(format!("--user=root:{password}"));
        }
        command
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("etcdctl is not installed: apt-get install etcd-client")
    }

    /// etcdctl that must succeed; returns its stdout.
    fn etcdctl_ok(&self, args: &[&str]) -> String {
        let output = self.etcdctl(args);
        assert!(
            output.status.success(),
            "etcdctl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// `etcdctl lease revoke <lease>`: an operator takes a slot away.
    pub fn revoke(&self, lease: &str) {
        self.etcdctl_ok(&["lease", "revoke", lease]);
    }

    /// `etcdctl put <key> <value>`.
    pub fn put(&self, key: &str, value: &str) {
        let put = self.etcdctl_ok(&["put", key, value]);
        assert_eq!(put.trim(), "OK", "etcdctl put {key}");
    }

    /// `etcdctl del <key>`, which must delete it.
    pub fn delete(&self, key: &str) {
        let deleted = self.etcdctl_ok(&["del", key]);
        assert_eq!(deleted.trim(), "1", "etcdctl del {key}");
    }

    /// Adds a user with no role: it may sign in, and touch no key.
    pub fn add_user(&self, name: &str, password: &str) {
        self.etcdctl_ok(&[
            "user",
            "add",
            &format!("{name}:{password}"),
            "--interactive=false",
        ]);
    }

    /// Adds root with `root_password` and turns authentication on; the
    /// helpers sign in as root from then on.
    pub fn enable_auth(&mut self, root_password: &str) {
        self.etcdctl_ok(&[
            "user",
            "add",
            &format!("root:{root_password}"),
            "--interactive=false",
        ]);
        self.etcdctl_ok(&["auth", "enable"]);
        self.root_password = Some(root_password.to_string());
    }

    /// Kills it (SIGKILL): what it wrote stays in its data directory.
    pub fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            let _ = process.kill();
            let _ = process.wait();
        }
    }

    pub fn is_running(&self) -> bool {
        self.process.is_some()
    }

    /// Sends `signal` to the running member.
    fn signal(&self, signal: i32) {
        let pid = self.process.as_ref().expect("a running member").id();
        // SAFETY: kill(2) on a child we spawned and have not reaped.
        assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0);
    }

    /// Kills it and starts it again on the same ports and data: the keys
    /// and leases it had are back.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
        self.wait_ready();
    }

    /// Stops it with SIGSTOP: connections are accepted and never answered.
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
    }

    pub fn thaw(&self) {
        self.signal(libc::SIGCONT);
    }
}

impl TestStore for EtcdServer {
    const NAME: &'static str = "etcd";
    const HAS_LEASE: bool = true;

    fn point(&self, command: &mut Command) {
        command.arg(format!("--store={}", self.url()));
    }

    fn contenders(&self, prefix: &str) -> usize {
        EtcdServer::contenders(self, prefix)
    }

    fn assert_clean(&self, prefix: &str) {
        // The server is the world's own: any lease on it is one that a
        // consem left behind.
        assert_eq!(self.keys(prefix), Vec::<String>::new(), "keys left on etcd");
        assert_eq!(self.leases(), Vec::<String>::new(), "leases left on etcd");
    }
}

impl ServerStore for EtcdServer {
    fn address(&self) -> String {
        EtcdServer::address(self)
    }

    fn point_through(&self, addr: &str, command: &mut Command) {
        command.arg(format!("--store=etcd://{addr}"));
    }
}

/// A slot's lease is an etcd lease: its TTL as granted.
impl LeasedStore for EtcdServer {
    fn lease_seconds(&self, _prefix: &str) -> Vec<f64> {
        self.leases()
            .iter()
            .map(|lease| self.time_to_live(lease).0 as f64)
            .collect()
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Three members on loopback, each with its own ports and data directory.
pub struct EtcdCluster {
    members: Vec<EtcdServer>,
}

impl EtcdCluster {
    /// Starts three members in subdirectories of `dir` and waits until
    /// each answers (the cluster has elected a leader).
    pub fn start(dir: &Path) -> EtcdCluster {
        let ports: [u16; 6] = free_ports();
        let names = ["m0", "m1", "m2"];
        let initial_cluster = (0..3)
            .map(|i| format!("{}=http://127.0.0.1:{}", names[i], ports[3 + i]))
            .collect::<Vec<_>>()
            .join(",");
        let mut members: Vec<EtcdServer> = (0..3)
            .map(|i| {
                EtcdServer::spawn(
                    names[i],
                    ports[i],
                    ports[3 + i],
                    &dir.join(names[i]),
                    initial_cluster.clone(),
                    None,
                )
            })
            .collect();
        for member in &mut members {
            member.wait_ready();
        }
        EtcdCluster { members }
    }

    /// `etcd://` with every member's address, `first` first.
    pub fn url_starting_with(&self, first: usize) -> String {
        let mut addresses = vec![self.members[first].address()];
        addresses.extend(
            (0..self.members.len())
                .filter(|&i| i != first)
                .map(|i| self.members[i].address()),
        );
        format!("etcd://{}", addresses.join(","))
    }

    /// The index of the leader, once the running members agree on one
    /// that runs (after a kill, once they elected another).
    pub fn leader(&self) -> usize {
        let mut leader = None;
        wait_until(START_DEADLINE, "the members to agree on a leader", || {
            let running: Vec<usize> = (0..self.members.len())
                .filter(|&i| self.members[i].is_running())
                .collect();
            let seen: Option<Vec<(String, String)>> = running
                .iter()
                .map(|&i| self.members[i].member_and_leader())
                .collect();
            leader = seen.and_then(|seen| {
                let (_, first_leader) = seen.first()?;
                if !seen.iter().all(|(_, leader)| leader == first_leader) {
                    return None;
                }
                let position = seen.iter().position(|(id, _)| id == first_leader)?;
                Some(running[position])
            });
            leader.is_some()
        });
        leader.unwrap()
    }

    /// A member that runs, for the helpers.
    pub fn any_running(&self) -> &EtcdServer {
        self.members
            .iter()
            .find(|m| m.is_running())
            .expect("a running member")
    }

    pub fn kill(&mut self, member: usize) {
        self.members[member].stop();
    }
}

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn unb64(value: &Value) -> String {
    let encoded = value.as_str().unwrap_or_default();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap_or_else(|e| panic!("bad base64 from etcd ({e}): {encoded}"));
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The gateway's 64-bit numbers come as decimal strings, and zero as no
/// field at all.
fn number(value: &Value) -> i64 {
    if value.is_null() {
        return 0;
    }
    value
        .as_str()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a number from etcd: {value}"))
}

/// A lease ID from the gateway (decimal) as consem and etcdctl show it.
fn hex(decimal: &str) -> String {
    format!("{:x}", decimal.parse::<i64>().unwrap())
}

/// A TCP proxy in front of a member that can forget every connection it
/// carries, as a NAT or a load balancer does: no FIN reaches the client,
/// whose next write on such a connection gets a reset.
pub struct ForgetfulProxy {
    pub port: u16,
    upstreams: Links,
}

/// The member's side of each connection, and whether it is forgotten.
type Links = std::sync::Arc<
    std::sync::Mutex<
        Vec<(
            std::net::TcpStream,
            std::sync::Arc<std::sync::atomic::AtomicBool>,
        )>,
    >,
>;

impl ForgetfulProxy {
    /// Listens on a free loopback port; forwards to `127.0.0.1:<to>`.
    pub fn start(to: u16) -> ForgetfulProxy {
        use std::io::{Read as _, Write as _};
        use std::net::{TcpListener, TcpStream};
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Mutex};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let upstreams = Arc::new(Mutex::new(Vec::new()));
        let links = Arc::clone(&upstreams);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(upstream) = TcpStream::connect(("127.0.0.1", to)) else {
                    continue;
                };
                let forgotten = Arc::new(AtomicBool::new(false));
                links
                    .lock()
                    .unwrap()
                    .push((upstream.try_clone().unwrap(), Arc::clone(&forgotten)));
                let (mut client_in, mut client_out) = (client.try_clone().unwrap(), client);
                let (mut upstream_in, mut upstream_out) = (upstream.try_clone().unwrap(), upstream);
                let up = Arc::clone(&forgotten);
                std::thread::spawn(move || {
                    let mut buffer = [0u8; 16384];
                    while let Ok(n @ 1..) = client_in.read(&mut buffer) {
                        if up.load(Ordering::SeqCst) {
                            // The last descriptor of the client's socket,
                            // closed with a zero linger: a reset.
                            let linger = libc::linger {
                                l_onoff: 1,
                                l_linger: 0,
                            };
                            // SAFETY: setsockopt reads the linger we own.
                            unsafe {
                                libc::setsockopt(
                                    std::os::fd::AsRawFd::as_raw_fd(&client_in),
                                    libc::SOL_SOCKET,
                                    libc::SO_LINGER,
                                    (&linger as *const libc::linger).cast(),
                                    std::mem::size_of::<libc::linger>() as libc::socklen_t,
                                )
                            };
                            return;
                        }
                        if upstream_out.write_all(&buffer[..n]).is_err() {
                            return;
                        }
                    }
                });
                std::thread::spawn(move || {
                    let mut buffer = [0u8; 16384];
                    while let Ok(n @ 1..) = upstream_in.read(&mut buffer) {
                        if client_out.write_all(&buffer[..n]).is_err() {
                            break;
                        }
                    }
                    // Forgotten: the client hears nothing; its descriptor
                    // here goes, the one reading it stays.
                    if !forgotten.load(Ordering::SeqCst) {
                        let _ = client_out.shutdown(std::net::Shutdown::Both);
                    }
                });
            }
        });
        ForgetfulProxy { port, upstreams }
    }

    /// Forgets every connection open now: closes them towards the member,
    /// and says nothing to the client.
    pub fn forget_all(&self) {
        for (upstream, forgotten) in self.upstreams.lock().unwrap().drain(..) {
            forgotten.store(true, std::sync::atomic::Ordering::SeqCst);
            let _ = upstream.shutdown(std::net::Shutdown::Both);
        }
    }
}
