//! Shared helpers for the integration tests: the Consul double and a wrapper
//! that runs the same tests against a real agent when
//! `CONSEM_TEST_CONSUL_ADDR` is set.

pub mod consul_lock;
pub mod double;
pub mod etcd;
pub mod local;
pub mod pki;
pub mod postgres;
pub mod proxy;
pub mod pty;
pub mod redis;
pub mod redis_cluster;
pub mod redis_sentinel;
pub mod world;
pub mod zookeeper;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde::Deserialize;

pub use double::{ConsulDouble, KvEntry};

use double::{Acl, Rights};
use pki::{CertKey, TestPki};
use world::{LeasedStore, ServerStore, TestStore};

/// Set to `host:port` of a real Consul agent to run the tests against it.
pub const REAL_CONSUL_ENV: &str = "CONSEM_TEST_CONSUL_ADDR";

/// The token the helpers of a `TestConsul::with_acls` double send: it may
/// do everything. Requests the double records with it came from the test's
/// helpers, not from consem.
pub const HELPER_TOKEN: &str = "consem-test-helper-token";

/// The Consul the tests talk to.
pub enum TestConsul {
    Double(ConsulDouble),
    Real(String),
    /// A double over TLS and/or with ACLs on; the helpers (`kv_entries`,
    /// `put`, `sessions`, ...) reach it with `Access`.
    Secured(ConsulDouble, Access),
}

/// What the helpers need to reach a secured double.
#[derive(Clone, Debug, Default)]
pub struct Access {
    /// PEM of the CA to trust (for an https double).
    pub ca_pem: Option<String>,
    /// Certificate and key to present (for an mTLS double).
    pub client: Option<CertKey>,
    /// Sent as `X-Consul-Token` (for a double with ACLs on).
    pub token: Option<String>,
}

impl Access {
    /// An agent trusting `ca_pem` (only it) and presenting `client`, if set.
    pub fn agent(&self) -> ureq::Agent {
        match &self.ca_pem {
            Some(ca_pem) => tls_agent(ca_pem, self.client.as_ref()),
            None => http_agent(),
        }
    }
}

impl TestConsul {
    /// A real agent if `CONSEM_TEST_CONSUL_ADDR` is set, else a new double.
    pub fn start() -> TestConsul {
        match std::env::var(REAL_CONSUL_ENV) {
            Ok(addr) if !addr.trim().is_empty() => TestConsul::Real(addr.trim().to_string()),
            _ => TestConsul::Double(ConsulDouble::start()),
        }
    }

    /// A double serving https with `pki`'s server certificate (and, with
    /// `mtls`, requiring a client certificate signed by its CA); the helpers
    /// trust the CA and present `pki.client`.
    pub fn start_tls(pki: &TestPki, mtls: bool) -> TestConsul {
        TestConsul::Secured(
            ConsulDouble::start_tls(pki.tls_server(mtls)),
            Access {
                ca_pem: Some(pki.ca_pem.clone()),
                client: mtls.then(|| pki.client.clone()),
                token: None,
            },
        )
    }

    /// Turns ACLs on in the double with `acl`'s tokens plus `HELPER_TOKEN`
    /// (all rights), which the helpers then send. Panics against a real agent.
    pub fn with_acls(self, acl: Acl) -> TestConsul {
        let (double, access) = match self {
            TestConsul::Double(double) => (double, Access::default()),
            TestConsul::Secured(double, access) => (double, access),
            TestConsul::Real(_) => panic!("with_acls needs the Consul double"),
        };
        double.enable_acls(acl.token(HELPER_TOKEN, Rights::all()));
        TestConsul::Secured(
            double,
            Access {
                token: Some(HELPER_TOKEN.to_string()),
                ..access
            },
        )
    }

    /// "host:port", without a scheme.
    pub fn addr(&self) -> String {
        match self {
            TestConsul::Double(double) | TestConsul::Secured(double, _) => double.addr(),
            TestConsul::Real(addr) => addr.clone(),
        }
    }

    /// "http://host:port" or "https://host:port".
    pub fn base_url(&self) -> String {
        match self {
            TestConsul::Double(double) | TestConsul::Secured(double, _) => double.url(),
            TestConsul::Real(addr) => format!("http://{addr}"),
        }
    }

    /// The double, for fault tests; `None` against a real agent.
    pub fn double(&self) -> Option<&ConsulDouble> {
        match self {
            TestConsul::Double(double) | TestConsul::Secured(double, _) => Some(double),
            TestConsul::Real(_) => None,
        }
    }

    /// How the helpers reach this Consul (default: plain HTTP, no token).
    pub fn access(&self) -> Access {
        match self {
            TestConsul::Secured(_, access) => access.clone(),
            _ => Access::default(),
        }
    }

    /// One request as the helpers make it (trusting the test CA, sending the
    /// helper token if any); `path_and_query` starts with `/`. Panics on
    /// transport errors. Returns (status, body).
    pub fn request(&self, method: &str, path_and_query: &str, body: &[u8]) -> (u16, String) {
        let access = self.access();
        let url = self.url(path_and_query);
        let answer = http_request(&access.agent(), method, &url, access.token.as_deref(), body)
            .unwrap_or_else(|e| panic!("{method} {url} failed: {e}"));
        (answer.status, answer.body)
    }

    fn url(&self, path_and_query: &str) -> String {
        format!("{}{}", self.base_url(), path_and_query)
    }

    /// Entries under `prefix` (over HTTP, `?recurse`); empty when there are none.
    pub fn kv_entries(&self, prefix: &str) -> Vec<KvEntry> {
        let path = format!("/v1/kv/{}?recurse", encode_key(prefix));
        let url = self.url(&path);
        let (status, body) = self.request("GET", &path, b"");
        match status {
            404 => Vec::new(),
            200 => {
                let wire: Vec<WireEntry> = serde_json::from_str(&body)
                    .unwrap_or_else(|e| panic!("bad KV listing from {url}: {e}: {body}"));
                wire.into_iter().map(WireEntry::into_entry).collect()
            }
            _ => panic!("GET {url} answered {status}: {body}"),
        }
    }

    /// A plain write with `flags`.
    pub fn put(&self, key: &str, value: &[u8], flags: u64) {
        let path = format!("/v1/kv/{}?flags={flags}", encode_key(key));
        let url = self.url(&path);
        let (status, body) = self.request("PUT", &path, value);
        assert!(
            status == 200 && body.trim() == "true",
            "PUT {url} answered {status}: {body}"
        );
    }

    /// Deletes every key under `prefix`.
    pub fn delete_tree(&self, prefix: &str) {
        let path = format!("/v1/kv/{}?recurse", encode_key(prefix));
        let url = self.url(&path);
        let (status, body) = self.request("DELETE", &path, b"");
        assert_eq!(status, 200, "DELETE {url} answered {status}: {body}");
    }

    /// Live sessions as (ID, Name).
    pub fn sessions(&self) -> Vec<(String, String)> {
        let url = self.url("/v1/session/list");
        let (status, body) = self.request("GET", "/v1/session/list", b"");
        assert_eq!(status, 200, "GET {url} answered {status}: {body}");
        let sessions: Vec<WireSession> = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("bad session list from {url}: {e}: {body}"));
        sessions.into_iter().map(|s| (s.id, s.name)).collect()
    }

    /// The sessions of consems on `prefix` (they are named after it); a
    /// double holds no others.
    pub fn sessions_of(&self, prefix: &str) -> Vec<(String, String)> {
        self.sessions()
            .into_iter()
            .filter(|(_, name)| self.double().is_some() || name.contains(prefix))
            .collect()
    }

    /// What `consem` gets as `CONSUL_HTTP_ADDR`: `host:port`, or the
    /// `https://` URL of a TLS double.
    pub fn http_addr(&self) -> String {
        match self.double() {
            Some(double) if double.is_tls() => double.url(),
            _ => self.addr(),
        }
    }

    pub fn destroy_session(&self, id: &str) {
        let path = format!("/v1/session/destroy/{}", encode_key(id));
        let url = self.url(&path);
        let (status, body) = self.request("PUT", &path, b"");
        assert_eq!(status, 200, "PUT {url} answered {status}: {body}");
    }
}

/// Consul is the store `consem` uses when given none: it is told the
/// agent's address in `CONSUL_HTTP_ADDR`.
impl TestStore for TestConsul {
    const NAME: &'static str = "consul";
    const HAS_LEASE: bool = true;

    fn point(&self, command: &mut std::process::Command) {
        command.env("CONSUL_HTTP_ADDR", self.http_addr());
    }

    /// Contender keys: every key under the prefix but `.lock`.
    fn contenders(&self, prefix: &str) -> usize {
        self.kv_entries(&format!("{prefix}/"))
            .iter()
            .filter(|e| !e.key.ends_with("/.lock"))
            .count()
    }

    fn assert_clean(&self, prefix: &str) {
        assert_eq!(
            self.kv_entries(&format!("{prefix}/")),
            vec![],
            "keys left under {prefix}"
        );
        assert_eq!(self.sessions_of(prefix), vec![], "sessions left behind");
    }
}

impl ServerStore for TestConsul {
    fn address(&self) -> String {
        self.addr()
    }

    fn point_through(&self, addr: &str, command: &mut std::process::Command) {
        command.env("CONSUL_HTTP_ADDR", addr);
    }
}

/// A slot's lease is its session's TTL.
impl LeasedStore for TestConsul {
    fn lease_seconds(&self, prefix: &str) -> Vec<f64> {
        let url = format!("http://{}/v1/session/list", self.addr());
        let (status, body) = http("GET", &url, b"");
        assert_eq!(status, 200, "{body}");
        let sessions: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
        sessions
            .iter()
            .filter(|s| {
                self.double().is_some() || s["Name"].as_str().is_some_and(|n| n.contains(prefix))
            })
            .map(|s| {
                go_duration(s["TTL"].as_str().unwrap_or_default())
                    .unwrap_or_else(|| panic!("a session TTL: {s}"))
            })
            .collect()
    }
}

/// A duration as Go writes it (`15s`, `15000ms`, `1m30s`), in seconds.
fn go_duration(text: &str) -> Option<f64> {
    let mut seconds = 0.0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, scale) = [("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)]
            .into_iter()
            .find(|(unit, _)| rest.starts_with(unit))?;
        rest = &rest[unit.len()..];
        seconds += number * scale;
    }
    (!text.is_empty()).then_some(seconds)
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct WireEntry {
    key: String,
    flags: u64,
    value: Option<String>,
    session: Option<String>,
    lock_index: u64,
    create_index: u64,
    modify_index: u64,
}

impl WireEntry {
    fn into_entry(self) -> KvEntry {
        let value = self.value.map_or_else(Vec::new, |encoded| {
            base64::engine::general_purpose::STANDARD
                .decode(&encoded)
                .unwrap_or_else(|e| panic!("bad base64 in {}: {e}", self.key))
        });
        KvEntry {
            key: self.key,
            value,
            flags: self.flags,
            session: self.session,
            lock_index: self.lock_index,
            create_index: self.create_index,
            modify_index: self.modify_index,
        }
    }
}

#[derive(Deserialize)]
struct WireSession {
    #[serde(rename = "ID")]
    id: String,
    #[serde(rename = "Name")]
    name: String,
}

/// An HTTP client that hands back error statuses instead of failing on them.
pub fn http_agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

/// An HTTPS client (error statuses handed back, no proxy) that trusts only
/// the CA certificates in `ca_pem` and, if given, presents `client`.
pub fn tls_agent(ca_pem: &str, client: Option<&CertKey>) -> ureq::Agent {
    use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig};
    let roots: Vec<Certificate<'static>> = ureq::tls::parse_pem(ca_pem.as_bytes())
        .filter_map(|item| match item {
            Ok(PemItem::Certificate(cert)) => Some(cert),
            Ok(_) => None,
            Err(e) => panic!("bad CA PEM: {e}"),
        })
        .collect();
    assert!(!roots.is_empty(), "no certificate in the CA PEM");
    let client_cert = client.map(|client| {
        let chain: Vec<Certificate<'static>> = ureq::tls::parse_pem(client.cert_pem.as_bytes())
            .filter_map(|item| match item {
                Ok(PemItem::Certificate(cert)) => Some(cert),
                _ => None,
            })
            .collect();
        let key = PrivateKey::from_pem(client.key_pem.as_bytes())
            .unwrap_or_else(|e| panic!("bad client key PEM: {e}"));
        ClientCert::new_with_certs(&chain, key)
    });
    let tls = TlsConfig::builder()
        .root_certs(RootCerts::Specific(Arc::new(roots)))
        .client_cert(client_cert)
        .build();
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .proxy(None)
        .tls_config(tls)
        .build()
        .into()
}

/// An answer read in full.
#[derive(Clone, Debug)]
pub struct HttpAnswer {
    pub status: u16,
    /// Header names lowercased.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpAnswer {
    /// The first value of a header (name matched case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One request with `agent`, sending `token` (if any) as `X-Consul-Token`.
/// Transport and TLS errors come back as `Err`; so do bodies that cannot
/// be read in full.
pub fn http_request(
    agent: &ureq::Agent,
    method: &str,
    url: &str,
    token: Option<&str>,
    body: &[u8],
) -> Result<HttpAnswer, ureq::Error> {
    let mut request = ureq::http::Request::builder().method(method).uri(url);
    if let Some(token) = token {
        request = request.header("X-Consul-Token", token);
    }
    let request = request
        .body(body.to_vec())
        .unwrap_or_else(|e| panic!("cannot build {method} {url}: {e}"));
    let mut response = agent.run(request)?;
    let headers = response
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_ascii_lowercase(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();
    let status = response.status().as_u16();
    let body = response.body_mut().read_to_string()?;
    Ok(HttpAnswer {
        status,
        headers,
        body,
    })
}

/// One request with a fresh agent; panics on transport errors. Returns
/// (status, body).
pub fn http(method: &str, url: &str, body: &[u8]) -> (u16, String) {
    let agent = http_agent();
    let result = match method {
        "GET" => agent.get(url).call(),
        "DELETE" => agent.delete(url).call(),
        "PUT" => agent.put(url).send(body),
        other => panic!("unsupported method {other}"),
    };
    let mut response = result.unwrap_or_else(|e| panic!("{method} {url} failed: {e}"));
    let status = response.status().as_u16();
    let text = response
        .body_mut()
        .read_to_string()
        .unwrap_or_else(|e| panic!("{method} {url}: reading the body failed: {e}"));
    (status, text)
}

/// A KV prefix no other test (or earlier run against a real agent) uses.
pub fn unique_prefix(test_name: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "consem-test/{test_name}-{}-{count}-{nanos}",
        std::process::id()
    )
}

/// Polls `condition` every 20 ms until it holds; panics naming `what` after `timeout`.
pub fn wait_until(timeout: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Percent-encodes a KV key for a URL path: keeps `A-Za-z0-9-._~` and `/`,
/// encodes every other UTF-8 byte as `%XX`.
pub fn encode_key(key: &str) -> String {
    let mut encoded = String::with_capacity(key.len());
    for byte in key.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~/".contains(&byte) {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// The exit status as a shell's `$?` shows it: the code, or 128 + the
/// signal that ended the process.
pub fn shell_status(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => unreachable!("a process ends with a code or a signal"),
    }
}
