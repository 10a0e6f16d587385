//! A client that behaves like `consul lock -n N` (the Go API's `Semaphore`)
//! on a prefix, for tests and the benchmark: a session (behaviour `delete`),
//! an empty contender value, a blocking listing of the prefix, and a CAS on
//! `.lock` whenever it sees fewer live holders than the limit, whoever
//! arrived first. It does not queue and does not relay. Leaving, it takes
//! itself out of `.lock` first, then deletes its key and its session.
//!
//! Used by the benchmark through `#[path]`, so it needs nothing but `ureq`,
//! `serde_json` and `base64`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use serde_json::{Map, Value};

const SEMAPHORE_FLAGS: u64 = 0xe0f69a2baa414de0;

/// One looping `consul lock` stand-in: acquire, hold for `hold`, release,
/// again, until stopped.
pub struct ConsulLockLoop {
    stop: Arc<AtomicBool>,
    runs: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl ConsulLockLoop {
    /// `base` is `http://host:port`; `holding`, if given, is set while a
    /// slot is held (for tests that look at who holds).
    #[allow(dead_code)] // the benchmark's (benches/handoff.rs includes this file)
    pub fn start(base: &str, prefix: &str, limit: u32, hold: Duration) -> ConsulLockLoop {
        ConsulLockLoop::start_watched(base, prefix, limit, hold, None)
    }

    pub fn start_watched(
        base: &str,
        prefix: &str,
        limit: u32,
        hold: Duration,
        holding: Option<Arc<AtomicBool>>,
    ) -> ConsulLockLoop {
        let stop = Arc::new(AtomicBool::new(false));
        let runs = Arc::new(AtomicU64::new(0));
        let peer = Peer {
            agent: ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(Duration::from_secs(30)))
                .build()
                .into(),
            base: base.to_string(),
            prefix: prefix.trim_end_matches('/').to_string(),
            limit,
        };
        let (stop_flag, counter) = (Arc::clone(&stop), Arc::clone(&runs));
        let thread = thread::spawn(move || {
            while !stop_flag.load(Ordering::SeqCst) {
                let Some(session) = peer.acquire(&stop_flag) else {
                    break;
                };
                if let Some(flag) = &holding {
                    flag.store(true, Ordering::SeqCst);
                }
                thread::sleep(hold);
                counter.fetch_add(1, Ordering::SeqCst);
                if let Some(flag) = &holding {
                    flag.store(false, Ordering::SeqCst);
                }
                peer.release(&session);
            }
        });
        ConsulLockLoop {
            stop,
            runs,
            thread: Some(thread),
        }
    }

    /// Runs completed so far.
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::SeqCst)
    }

    /// Stops after the current run (a waiter leaves within its wait) and
    /// returns the runs completed.
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the consul lock loop panicked");
        }
        self.runs()
    }
}

impl Drop for ConsulLockLoop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

struct Peer {
    agent: ureq::Agent,
    base: String,
    prefix: String,
    limit: u32,
}

impl Peer {
    fn call(&self, method: &str, path: &str, body: &[u8]) -> Option<(u16, u64, String)> {
        let request = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .body(body.to_vec())
            .ok()?;
        let mut response = self.agent.run(request).ok()?;
        let index = response
            .headers()
            .get("X-Consul-Index")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().ok()?;
        Some((status, index, text))
    }

    fn key(&self, name: &str) -> String {
        format!("/v1/kv/{}/{name}", self.prefix)
    }

    /// Joins and waits until a CAS puts us in `.lock`; `None` if stopped.
    fn acquire(&self, stop: &AtomicBool) -> Option<String> {
        let spec =
            r#"{"Name":"consul lock stand-in","TTL":"15s","Behavior":"delete","LockDelay":"0s"}"#;
        let (_, _, body) = self.call("PUT", "/v1/session/create", spec.as_bytes())?;
        let session = serde_json::from_str::<Value>(&body).ok()?["ID"]
            .as_str()?
            .to_string();
        let acquire = format!(
            "{}?acquire={session}&flags={SEMAPHORE_FLAGS}",
            self.key(&session)
        );
        self.call("PUT", &acquire, b"")?;
        let mut index = 0;
        loop {
            if stop.load(Ordering::SeqCst) {
                self.leave(&session);
                return None;
            }
            let listing = format!("/v1/kv/{}/?recurse&index={index}&wait=2s", self.prefix);
            let Some((status, new_index, body)) = self.call("GET", &listing, b"") else {
                thread::sleep(Duration::from_millis(100));
                continue;
            };
            index = new_index;
            let entries: Vec<Value> = if status == 200 {
                serde_json::from_str(&body).unwrap_or_default()
            } else {
                Vec::new()
            };
            let live = |id: &str| {
                entries.iter().any(|e| {
                    e["Key"].as_str() == Some(&format!("{}/{id}", self.prefix))
                        && e["Session"].as_str() == Some(id)
                })
            };
            let lock = entries
                .iter()
                .find(|e| e["Key"].as_str() == Some(&format!("{}/.lock", self.prefix)));
            let (cas, mut holders) = match lock {
                Some(entry) => {
                    let value = entry["Value"].as_str().unwrap_or_default();
                    let decoded = base64_decode(value);
                    let record: Value = serde_json::from_slice(&decoded).unwrap_or(Value::Null);
                    let holders: Map<String, Value> =
                        record["Holders"].as_object().cloned().unwrap_or_default();
                    (entry["ModifyIndex"].as_u64().unwrap_or(0), holders)
                }
                None => (0, Map::new()),
            };
            // Prune the dead, as the Go API does, then take a free slot.
            holders.retain(|id, _| live(id));
            if holders.len() >= self.limit as usize {
                continue;
            }
            holders.insert(session.clone(), Value::Bool(true));
            let value = serde_json::json!({"Limit": self.limit, "Holders": holders});
            let put = format!("{}?cas={cas}&flags={SEMAPHORE_FLAGS}", self.key(".lock"));
            if let Some((200, _, answer)) = self.call("PUT", &put, value.to_string().as_bytes()) {
                if answer.trim() == "true" {
                    return Some(session);
                }
            }
        }
    }

    /// Takes us out of `.lock` (CAS, retried), then deletes our key and
    /// session, in the Go API's order.
    fn release(&self, session: &str) {
        for _ in 0..20 {
            let Some((200, _, body)) = self.call("GET", &self.key(".lock"), b"") else {
                break;
            };
            let entries: Vec<Value> = serde_json::from_str(&body).unwrap_or_default();
            let Some(entry) = entries.first() else {
                break;
            };
            let decoded = base64_decode(entry["Value"].as_str().unwrap_or_default());
            let mut record: Value = serde_json::from_slice(&decoded).unwrap_or(Value::Null);
            let Some(holders) = record["Holders"].as_object_mut() else {
                break;
            };
            if holders.remove(session).is_none() {
                break;
            }
            let cas = entry["ModifyIndex"].as_u64().unwrap_or(0);
            let put = format!("{}?cas={cas}&flags={SEMAPHORE_FLAGS}", self.key(".lock"));
            if let Some((200, _, answer)) = self.call("PUT", &put, record.to_string().as_bytes()) {
                if answer.trim() == "true" {
                    break;
                }
            }
        }
        self.leave(session);
    }

    fn leave(&self, session: &str) {
        self.call("DELETE", &self.key(session), b"");
        self.call("PUT", &format!("/v1/session/destroy/{session}"), b"");
    }
}

/// Consul's KV values come base64-encoded.
fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap_or_default()
}
