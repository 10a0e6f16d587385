//! Replays the recording of a real Consul 1.0 agent
//! (tests/fixtures/consul-1.0-transcript.json) against the double and checks
//! that it answers the same way: status, Content-Type family, X-Consul-Index
//! presence, body shape and values (session IDs and raft indexes mapped from
//! the recording's to the double's).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use crate::common::double::ConsulDouble;
use serde_json::Value as Json;

const TRANSCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/consul-1.0-transcript.json"
);

/// Blocking waits are replayed ten times shorter to keep the test fast.
const WAIT_SCALE: u32 = 10;

/// Object fields holding raft indexes: compared through the index mapping.
const INDEX_FIELDS: [&str; 2] = ["CreateIndex", "ModifyIndex"];
/// Fields that legitimately differ between agents.
const AGENT_SPECIFIC_FIELDS: [&str; 1] = ["Node"];

#[test]
fn double_answers_like_the_recorded_consul_agent() {
    let transcript: Vec<Json> =
        serde_json::from_str(&std::fs::read_to_string(TRANSCRIPT).expect("read the transcript"))
            .expect("parse the transcript");
    let double = ConsulDouble::start();
    let agent = crate::common::http_agent();
    let mut replay = Replay::default();

    for (number, exchange) in transcript.iter().enumerate() {
        let label = format!(
            "exchange #{number} ({}: {})",
            exchange["scenario"].as_str().unwrap_or(""),
            exchange["note"].as_str().unwrap_or("")
        );
        let Some(method) = exchange["method"].as_str() else {
            // The recording waited 20 s for a 10 s TTL to run out; expire it now.
            assert!(
                exchange["observed_expiry_s"].is_number(),
                "{label}: unknown entry"
            );
            assert_eq!(
                double.expire_sessions_idle_for(Duration::ZERO),
                1,
                "{label}: one TTL session should expire"
            );
            continue;
        };

        let (path, wait) = scale_wait(&replay.substitute_path(exchange["path"].as_str().unwrap()));
        let url = format!("http://{}{}", double.addr(), path);
        let body = exchange["request_body"]
            .as_str()
            .map(|b| replay.substitute_ids(b));
        let started = Instant::now();
        let result = match (method, body) {
            ("GET", _) => agent.get(&url).call(),
            ("DELETE", _) => agent.delete(&url).call(),
            ("PUT", Some(body)) => agent.put(&url).send(body.as_bytes()),
            ("PUT", None) => agent.put(&url).send_empty(),
            _ => panic!("{label}: unexpected method {method}"),
        };
        let mut response = result.unwrap_or_else(|e| panic!("{label}: {method} {url}: {e}"));
        let elapsed = started.elapsed();

        let status = response.status().as_u16();
        let headers: HashMap<String, String> = response
            .headers()
            .iter()
            .map(|(name, value)| {
                (
                    name.as_str().to_string(),
                    value.to_str().unwrap().to_string(),
                )
            })
            .collect();
        let header = |name: &str| headers.get(&name.to_ascii_lowercase()).cloned();
        let content_type = header("content-type");
        let index = header("x-consul-index");
        let text = response.body_mut().read_to_string().unwrap();
        let context = format!("{label}\n  {method} {path}\n  answered {status}: {text}");

        assert_eq!(
            Some(status),
            exchange["status"].as_u64().map(|s| s as u16),
            "{context}"
        );
        let recorded_headers = &exchange["headers"];
        assert_eq!(
            family(content_type.as_deref()),
            family(recorded_headers["Content-Type"].as_str()),
            "{context}: Content-Type"
        );
        match (recorded_headers["X-Consul-Index"].as_str(), index) {
            (Some(recorded), Some(actual)) => replay.map_index(
                recorded.parse().unwrap(),
                actual.parse().expect("numeric X-Consul-Index"),
                &context,
            ),
            (None, None) => {}
            (recorded, actual) => {
                panic!("{context}: X-Consul-Index recorded {recorded:?}, answered {actual:?}")
            }
        }
        for name in ["X-Consul-Knownleader", "X-Consul-Lastcontact"] {
            assert_eq!(
                header(name).as_deref(),
                recorded_headers[name].as_str(),
                "{context}: {name}"
            );
        }

        let recorded_body = &exchange["body"];
        let is_json = family(content_type.as_deref()) == Some("application/json");
        let actual_body = if is_json || !recorded_body.is_string() {
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{context}: not JSON: {e}"))
        } else {
            Json::String(text.clone())
        };
        // A session create teaches the mapping from the recorded ID to ours.
        if path.starts_with("/v1/session/create") && status == 200 {
            let recorded_id = recorded_body["ID"].as_str().unwrap();
            let actual_id = actual_body["ID"].as_str().unwrap();
            assert_eq!(actual_id.len(), 36, "{context}: session ID format");
            replay
                .ids
                .insert(recorded_id.to_string(), actual_id.to_string());
        }
        replay.compare(recorded_body, &actual_body, "body", is_json, &context);

        if let Some(wait) = wait {
            // Did the real agent hold this query for its (unscaled) wait?
            let recorded_elapsed = exchange["elapsed_s"].as_f64().unwrap();
            if recorded_elapsed >= (wait * WAIT_SCALE).as_secs_f64() {
                assert!(
                    elapsed >= wait,
                    "{context}: answered after {elapsed:?}, before its wait {wait:?}"
                );
            } else {
                assert!(
                    elapsed < wait,
                    "{context}: answered after {elapsed:?}, the agent answered at once"
                );
            }
        }
    }
}

#[derive(Default)]
struct Replay {
    /// Recorded session ID -> the double's.
    ids: HashMap<String, String>,
    /// Recorded raft index -> the double's; must stay consistent and ordered.
    indexes: BTreeMap<u64, u64>,
}

impl Replay {
    fn substitute_ids(&self, text: &str) -> String {
        self.ids
            .iter()
            .fold(text.to_string(), |text, (recorded, actual)| {
                text.replace(recorded, actual)
            })
    }

    /// Substitutes IDs, and maps `index=` / `cas=` values to the double's indexes.
    fn substitute_path(&self, path: &str) -> String {
        let path = self.substitute_ids(path);
        let Some((route, query)) = path.split_once('?') else {
            return path;
        };
        let query: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name @ ("index" | "cas"), value)) => match value.parse::<u64>() {
                    Ok(recorded) => format!("{name}={}", self.translate_index(recorded)),
                    Err(_) => pair.to_string(),
                },
                _ => pair.to_string(),
            })
            .collect();
        format!("{route}?{}", query.join("&"))
    }

    /// A recorded index the replay has seen maps directly; any other keeps its
    /// distance from the nearest known one below it (so "ahead of the store"
    /// stays ahead and a wrong cas stays wrong). 0 stays 0.
    fn translate_index(&self, recorded: u64) -> u64 {
        if recorded == 0 {
            return 0;
        }
        match self.indexes.range(..=recorded).next_back() {
            Some((known, actual)) => actual + (recorded - known),
            None => recorded,
        }
    }

    /// Records that recorded index `recorded` appeared as `actual`: the same
    /// recorded index must always map to the same actual one, and order must
    /// be kept.
    fn map_index(&mut self, recorded: u64, actual: u64, context: &str) {
        if let Some(&known) = self.indexes.get(&recorded) {
            assert_eq!(
                actual, known,
                "{context}: recorded index {recorded} appeared as {known} before, now {actual}"
            );
            return;
        }
        let below = self.indexes.range(..recorded).next_back();
        let above = self.indexes.range(recorded + 1..).next();
        assert!(
            below.is_none_or(|(_, &a)| a < actual) && above.is_none_or(|(_, &a)| a > actual),
            "{context}: recorded index {recorded} maps to {actual}, out of order with {below:?} / {above:?}"
        );
        self.indexes.insert(recorded, actual);
    }

    /// Same JSON types recursively, same object keys, same array lengths;
    /// strings equal after ID substitution (text bodies: errors, except Go's
    /// JSON decoder wording), numbers equal (indexes through the mapping).
    fn compare(&mut self, recorded: &Json, actual: &Json, at: &str, is_json: bool, context: &str) {
        match (recorded, actual) {
            (Json::Object(recorded), Json::Object(actual)) => {
                let recorded_keys: Vec<&String> = recorded.keys().collect();
                let actual_keys: Vec<&String> = actual.keys().collect();
                assert_eq!(recorded_keys, actual_keys, "{context}: keys of {at}");
                for (key, recorded_value) in recorded {
                    let here = format!("{at}.{key}");
                    let actual_value = &actual[key];
                    if INDEX_FIELDS.contains(&key.as_str()) {
                        self.map_index(
                            recorded_value.as_u64().unwrap(),
                            actual_value
                                .as_u64()
                                .unwrap_or_else(|| panic!("{context}: {here} not an index")),
                            &format!("{context}: {here}"),
                        );
                    } else if AGENT_SPECIFIC_FIELDS.contains(&key.as_str()) {
                        assert!(actual_value.is_string(), "{context}: {here} type");
                    } else {
                        self.compare(recorded_value, actual_value, &here, is_json, context);
                    }
                }
            }
            (Json::Array(recorded), Json::Array(actual)) => {
                assert_eq!(recorded.len(), actual.len(), "{context}: length of {at}");
                // Sessions list in ID order and entries in key order, and keys
                // may hold (random) session IDs: line the double's elements up
                // with the recording's by mapped ID or key.
                let identity = |element: &Json| {
                    ["ID", "Key"]
                        .iter()
                        .find_map(|field| element[field].as_str())
                        .map(|text| self.substitute_ids(text))
                };
                let mut actual: Vec<&Json> = actual.iter().collect();
                actual.sort_by_key(|a| {
                    let id = identity(a);
                    recorded
                        .iter()
                        .position(|r| id.is_some() && identity(r) == id)
                });
                for (i, (r, a)) in recorded.iter().zip(actual).enumerate() {
                    self.compare(r, a, &format!("{at}[{i}]"), is_json, context);
                }
            }
            (Json::String(recorded), Json::String(actual)) => {
                let expected = self.substitute_ids(recorded);
                const DECODE_FAILED: &str = "Request decode failed: ";
                if !is_json && expected.starts_with(DECODE_FAILED) {
                    // The detail after the prefix is Go's encoding/json wording.
                    assert!(actual.starts_with(DECODE_FAILED), "{context}: {at}");
                } else {
                    assert_eq!(actual, &expected, "{context}: {at}");
                }
            }
            (Json::Number(recorded), Json::Number(actual)) => {
                assert_eq!(recorded, actual, "{context}: {at}");
            }
            (recorded, actual) => assert_eq!(recorded, actual, "{context}: {at}"),
        }
    }
}

/// Content-Type without parameters ("text/plain; charset=utf-8" -> "text/plain").
fn family(content_type: Option<&str>) -> Option<&str> {
    content_type.map(|ct| ct.split(';').next().unwrap().trim())
}

/// Shortens `wait=` by WAIT_SCALE; returns the new path and the wait it asks for.
fn scale_wait(path: &str) -> (String, Option<Duration>) {
    let Some((route, query)) = path.split_once('?') else {
        return (path.to_string(), None);
    };
    let mut wait = None;
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.strip_prefix("wait=") {
            Some(text) => match parse_simple_duration(text) {
                Some(recorded) => {
                    let scaled = recorded / WAIT_SCALE;
                    wait = Some(scaled);
                    format!("wait={}ms", scaled.as_millis())
                }
                None => pair.to_string(), // a malformed wait is replayed as is
            },
            None => pair.to_string(),
        })
        .collect();
    (format!("{route}?{}", query.join("&")), wait)
}

/// "2s" / "1500ms" as recorded in the transcript.
fn parse_simple_duration(text: &str) -> Option<Duration> {
    if let Some(ms) = text.strip_suffix("ms") {
        return ms.parse().ok().map(Duration::from_millis);
    }
    text.strip_suffix('s')?
        .parse()
        .ok()
        .map(Duration::from_secs)
}
