//! Shared helpers for the integration tests: the Consul double and a wrapper
//! that runs the same tests against a real agent when
//! `CONSEM_TEST_CONSUL_ADDR` is set.
#![allow(dead_code)] // each test crate uses a different part of this module

pub mod double;
pub mod pty;
pub mod world;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde::Deserialize;

pub use double::{ConsulDouble, KvEntry};

/// Set to `host:port` of a real Consul agent to run the tests against it.
pub const REAL_CONSUL_ENV: &str = "CONSEM_TEST_CONSUL_ADDR";

/// The Consul the tests talk to.
pub enum TestConsul {
    Double(ConsulDouble),
    Real(String),
}

impl TestConsul {
    /// A real agent if `CONSEM_TEST_CONSUL_ADDR` is set, else a new double.
    pub fn start() -> TestConsul {
        match std::env::var(REAL_CONSUL_ENV) {
            Ok(addr) if !addr.trim().is_empty() => TestConsul::Real(addr.trim().to_string()),
            _ => TestConsul::Double(ConsulDouble::start()),
        }
    }

    pub fn addr(&self) -> String {
        match self {
            TestConsul::Double(double) => double.addr(),
            TestConsul::Real(addr) => addr.clone(),
        }
    }

    /// The double, for fault tests; `None` against a real agent (such tests
    /// print that they are skipped and return).
    pub fn double(&self) -> Option<&ConsulDouble> {
        match self {
            TestConsul::Double(double) => Some(double),
            TestConsul::Real(_) => None,
        }
    }

    fn url(&self, path_and_query: &str) -> String {
        format!("http://{}{}", self.addr(), path_and_query)
    }

    /// Entries under `prefix` (over HTTP, `?recurse`); empty when there are none.
    pub fn kv_entries(&self, prefix: &str) -> Vec<KvEntry> {
        let url = self.url(&format!("/v1/kv/{}?recurse", encode_key(prefix)));
        let (status, body) = http("GET", &url, b"");
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
        let url = self.url(&format!("/v1/kv/{}?flags={flags}", encode_key(key)));
        let (status, body) = http("PUT", &url, value);
        assert!(
            status == 200 && body.trim() == "true",
            "PUT {url} answered {status}: {body}"
        );
    }

    /// Deletes every key under `prefix`.
    pub fn delete_tree(&self, prefix: &str) {
        let url = self.url(&format!("/v1/kv/{}?recurse", encode_key(prefix)));
        let (status, body) = http("DELETE", &url, b"");
        assert_eq!(status, 200, "DELETE {url} answered {status}: {body}");
    }

    /// Live sessions as (ID, Name).
    pub fn sessions(&self) -> Vec<(String, String)> {
        let url = self.url("/v1/session/list");
        let (status, body) = http("GET", &url, b"");
        assert_eq!(status, 200, "GET {url} answered {status}: {body}");
        let sessions: Vec<WireSession> = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("bad session list from {url}: {e}: {body}"));
        sessions.into_iter().map(|s| (s.id, s.name)).collect()
    }

    pub fn destroy_session(&self, id: &str) {
        let url = self.url(&format!("/v1/session/destroy/{}", encode_key(id)));
        let (status, body) = http("PUT", &url, b"");
        assert_eq!(status, 200, "PUT {url} answered {status}: {body}");
    }
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
