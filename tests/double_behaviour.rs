//! Focused tests of the Consul double's behaviour: blocking queries, indexes,
//! session expiry and invalidation, restart, faults and HTTP details.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::double::{ConsulDouble, Fault, FaultAction, Match};
use crate::common::{encode_key, wait_until, TestConsul};
use serde_json::Value as Json;

/// The semaphore flag of the Go API: does not fit an i64.
const SEMAPHORE_FLAGS: u64 = 16210313421097356768;
const SOON: Duration = Duration::from_secs(5);

struct Reply {
    status: u16,
    index: Option<u64>,
    content_type: Option<String>,
    body: String,
}

impl Reply {
    fn json(&self) -> Json {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

fn agent_with_timeout(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .build()
        .into()
}

/// One request; `Err` carries the transport error (dropped connection, timeout).
fn try_request(
    agent: &ureq::Agent,
    method: &str,
    url: &str,
    body: &[u8],
) -> Result<Reply, ureq::Error> {
    let mut response = match method {
        "GET" => agent.get(url).call()?,
        "DELETE" => agent.delete(url).call()?,
        "PUT" => agent.put(url).send(body)?,
        other => panic!("unsupported method {other}"),
    };
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let index = header("x-consul-index").map(|i| i.parse().unwrap());
    let content_type = header("content-type");
    Ok(Reply {
        status: response.status().as_u16(),
        index,
        content_type,
        body: response.body_mut().read_to_string()?,
    })
}

fn request(double: &ConsulDouble, method: &str, path: &str, body: &[u8]) -> Reply {
    let url = format!("http://{}{}", double.addr(), path);
    try_request(&crate::common::http_agent(), method, &url, body)
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"))
}

fn get(double: &ConsulDouble, path: &str) -> Reply {
    request(double, "GET", path, b"")
}

fn put(double: &ConsulDouble, path: &str, body: &[u8]) -> Reply {
    request(double, "PUT", path, body)
}

fn create_session(double: &ConsulDouble, spec: &str) -> String {
    let reply = put(double, "/v1/session/create", spec.as_bytes());
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.json()["ID"].as_str().unwrap().to_string()
}

/// Runs a GET on another thread, so the test can act while it blocks.
fn spawn_get(
    double: &ConsulDouble,
    path: &str,
) -> mpsc::Receiver<(Result<Reply, String>, Duration)> {
    let url = format!("http://{}{}", double.addr(), path);
    let (sender, receiver) = mpsc::channel();
    thread::spawn(move || {
        let started = Instant::now();
        let result =
            try_request(&crate::common::http_agent(), "GET", &url, b"").map_err(|e| e.to_string());
        let _ = sender.send((result, started.elapsed()));
    });
    receiver
}

/// Waits until the double has read a request whose target matches.
fn wait_for_request(double: &ConsulDouble, path: &str, query_key: &str) {
    wait_until(
        SOON,
        &format!("the double to receive {path}?{query_key}"),
        || {
            double
                .requests()
                .iter()
                .any(|r| r.path == path && r.query_value(query_key).is_some())
        },
    );
}

#[test]
fn blocking_query_wakes_on_a_write_under_its_prefix_only() {
    let double = ConsulDouble::start();
    double.put_raw("watched/a", b"1", 0);
    let index = get(&double, "/v1/kv/watched?recurse").index.unwrap();

    // A write outside the prefix: the query runs its full wait and answers
    // the same index.
    double.put_raw("watchedness", b"not under watched/", 0);
    let started = Instant::now();
    let reply = get(
        &double,
        &format!("/v1/kv/watched/?recurse&index={index}&wait=300ms"),
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(reply.index, Some(index));

    // A write under the prefix wakes it long before its wait.
    let pending = spawn_get(
        &double,
        &format!("/v1/kv/watched/?recurse&index={index}&wait=20s"),
    );
    wait_for_request(&double, "/v1/kv/watched/", "wait");
    double.put_raw("watched/b", b"2", 0);
    let (reply, elapsed) = pending.recv_timeout(SOON).expect("the blocking query woke");
    let reply = reply.unwrap();
    assert!(elapsed < Duration::from_secs(10), "woke after {elapsed:?}");
    assert!(reply.index.unwrap() > index);
    assert_eq!(reply.json().as_array().unwrap().len(), 2);
}

/// A blocking read of one key wakes on that key's changes only, as a
/// Consul agent's does (checked on Consul 1.0.8: writes to its siblings do
/// not answer it): a crowd of waiters each blocked on its own key must not
/// all wake on every write under the prefix.
#[test]
fn blocking_read_of_a_key_wakes_on_that_key_only() {
    let double = ConsulDouble::start();
    double.put_raw("crowd/a", b"1", 0);
    double.put_raw("crowd/b", b"1", 0);
    let index = get(&double, "/v1/kv/crowd/a").index.unwrap();
    let pending = spawn_get(&double, &format!("/v1/kv/crowd/a?index={index}&wait=20s"));
    wait_until(SOON, "the read of crowd/a to block", || {
        double.blocked_queries() == 1
    });
    let before = double.query_wakeups();
    for _ in 0..5 {
        double.put_raw("crowd/b", b"2", 0);
    }
    double.put_raw("crowd/c", b"3", 0);
    double.put_raw("crowd/a", b"2", 0);
    let (reply, _) = pending.recv_timeout(SOON).expect("the blocking read woke");
    assert!(reply.unwrap().index.unwrap() > index);
    assert_eq!(
        double.query_wakeups() - before,
        1,
        "woken by writes to other keys"
    );
}

#[test]
fn blocking_session_info_wakes_when_the_session_is_destroyed() {
    let double = ConsulDouble::start();
    let id = create_session(&double, r#"{"Name": "watched"}"#);
    let info = get(&double, &format!("/v1/session/info/{id}"));
    let index = info.index.unwrap();
    let pending = spawn_get(
        &double,
        &format!("/v1/session/info/{id}?index={index}&wait=20s"),
    );
    wait_for_request(&double, &format!("/v1/session/info/{id}"), "wait");
    double.destroy_session(&id);
    let (reply, _) = pending.recv_timeout(SOON).expect("the blocking query woke");
    let reply = reply.unwrap();
    assert!(reply.index.unwrap() > index);
    assert_eq!(reply.body, "[]");
}

#[test]
fn index_ahead_of_the_store_blocks_for_the_wait_then_answers_the_lower_index() {
    let double = ConsulDouble::start();
    double.put_raw("ahead/a", b"", 0);
    let current = get(&double, "/v1/kv/ahead?recurse").index.unwrap();
    let started = Instant::now();
    let reply = get(
        &double,
        &format!("/v1/kv/ahead?recurse&index={}&wait=250ms", current + 1000),
    );
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(250),
        "answered after {elapsed:?}"
    );
    assert_eq!(reply.status, 200);
    assert_eq!(reply.index, Some(current));
}

#[test]
fn malformed_blocking_parameters_answer_400() {
    let double = ConsulDouble::start();
    let reply = get(&double, "/v1/kv/x?recurse&index=-1");
    assert_eq!((reply.status, reply.body.as_str()), (400, "Invalid index"));
    let reply = get(&double, "/v1/session/list?index=1&wait=5parsecs");
    assert_eq!(
        (reply.status, reply.body.as_str()),
        (400, "Invalid wait time")
    );
}

#[test]
fn tombstones_keep_the_index_from_going_back() {
    let double = ConsulDouble::start();
    double.put_raw("tomb/a", b"a", 0);
    double.put_raw("tomb/b", b"b", 0);
    let before = get(&double, "/v1/kv/tomb?recurse").index.unwrap();
    let reply = request(&double, "DELETE", "/v1/kv/tomb/b", b"");
    assert_eq!(reply.body, "true");
    let after_delete = get(&double, "/v1/kv/tomb?recurse");
    assert!(
        after_delete.index.unwrap() > before,
        "a delete must raise the index"
    );
    assert_eq!(after_delete.json().as_array().unwrap().len(), 1);

    // The missing key itself reports its delete index too.
    let missing = get(&double, "/v1/kv/tomb/b");
    assert_eq!((missing.status, missing.body.as_str()), (404, ""));
    assert_eq!(missing.index, after_delete.index);

    let reply = request(&double, "DELETE", "/v1/kv/tomb?recurse", b"");
    assert_eq!(reply.body, "true");
    let emptied = get(&double, "/v1/kv/tomb?recurse");
    assert_eq!(emptied.status, 404);
    assert!(emptied.index.unwrap() > after_delete.index.unwrap());
    // An unrelated, never-written prefix answers the floor index of 1.
    assert_eq!(get(&double, "/v1/kv/never?recurse").index, Some(1));
}

#[test]
fn ttl_expiry_applies_delete_behaviour_and_wakes_a_blocking_query() {
    let double = ConsulDouble::start();
    let id = create_session(
        &double,
        r#"{"Name": "short", "TTL": "10s", "Behavior": "delete", "LockDelay": "0s"}"#,
    );
    let key = format!("ttl/{id}");
    let reply = put(
        &double,
        &format!("/v1/kv/{key}?acquire={id}&flags={SEMAPHORE_FLAGS}"),
        b"",
    );
    assert_eq!(reply.body, "true");
    let index = get(&double, "/v1/kv/ttl?recurse").index.unwrap();
    let pending = spawn_get(
        &double,
        &format!("/v1/kv/ttl?recurse&index={index}&wait=20s"),
    );
    wait_for_request(&double, "/v1/kv/ttl", "wait");

    // 10 s x 0.03 = 300 ms without a renewal.
    double.set_ttl_multiplier(0.03);
    let (reply, elapsed) = pending.recv_timeout(SOON).expect("expiry woke the query");
    let reply = reply.unwrap();
    assert!(elapsed < Duration::from_secs(10), "woke after {elapsed:?}");
    assert_eq!(reply.status, 404, "the delete behaviour removed the key");
    assert!(reply.index.unwrap() > index);
    assert!(double.sessions().is_empty());
    assert!(double.entries("ttl/").is_empty());
}

#[test]
fn renewals_keep_a_session_alive_and_are_counted() {
    let double = ConsulDouble::start();
    double.set_ttl_multiplier(0.05); // 10 s TTL -> 500 ms
    let id = create_session(&double, r#"{"Name": "kept", "TTL": "10s"}"#);
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(900) {
        let reply = put(&double, &format!("/v1/session/renew/{id}"), b"");
        assert_eq!(reply.status, 200, "renewed in time: {}", reply.body);
        thread::sleep(Duration::from_millis(100)); // the renew period under test
    }
    let sessions = double.sessions();
    assert_eq!(sessions.len(), 1);
    assert!(sessions[0].renewals >= 5);
    assert_eq!(sessions[0].ttl, Some(Duration::from_secs(10)));
    wait_until(SOON, "the unrenewed session to expire", || {
        double.sessions().is_empty()
    });
    let reply = put(&double, &format!("/v1/session/renew/{id}"), b"");
    assert_eq!(reply.status, 404);
    assert_eq!(reply.body, format!("Session id '{id}' not found"));
}

#[test]
fn release_behaviour_clears_the_holder_and_starts_the_lock_delay() {
    let double = ConsulDouble::start();
    let holder = create_session(&double, r#"{"Name": "holder", "LockDelay": "15s"}"#);
    let quick = create_session(&double, r#"{"Name": "quick", "LockDelay": "0s"}"#);
    let reply = put(&double, &format!("/v1/kv/rel/k?acquire={holder}"), b"v");
    assert_eq!(reply.body, "true");
    let reply = put(&double, &format!("/v1/kv/rel/free?acquire={quick}"), b"");
    assert_eq!(reply.body, "true");
    let before = double.entries("rel/k").remove(0);

    double.invalidate_all_sessions();
    let after = double.entries("rel/k").remove(0);
    assert_eq!(after.session, None);
    assert_eq!(after.lock_index, before.lock_index);
    assert!(after.modify_index > before.modify_index);
    assert_eq!(after.value, b"v");
    assert!(double.sessions().is_empty());

    // Lock-delay: a new session cannot take the key yet.
    let fresh = create_session(&double, r#"{"Name": "fresh"}"#);
    let reply = put(&double, &format!("/v1/kv/rel/k?acquire={fresh}"), b"");
    assert_eq!(reply.body, "false");
    // A key whose holder had no lock-delay is free at once.
    let reply = put(&double, &format!("/v1/kv/rel/free?acquire={fresh}"), b"");
    assert_eq!(reply.body, "true");
}

#[test]
fn acquire_and_release_follow_consul_rules() {
    let double = ConsulDouble::start();
    let a = create_session(&double, r#"{"Name": "a"}"#);
    let b = create_session(&double, r#"{"Name": "b"}"#);
    let path = |op: &str, id: &str| format!("/v1/kv/rules/k?{op}={id}&flags=7");
    assert_eq!(put(&double, &path("acquire", &a), b"one").body, "true");
    assert_eq!(put(&double, &path("acquire", &b), b"").body, "false");
    assert_eq!(put(&double, &path("release", &b), b"").body, "false");
    // A plain write keeps the holder.
    assert_eq!(put(&double, "/v1/kv/rules/k", b"plain").body, "true");
    let entry = double.entries("rules/k").remove(0);
    assert_eq!(entry.session.as_deref(), Some(a.as_str()));
    assert_eq!((entry.flags, entry.lock_index), (0, 1));

    assert_eq!(put(&double, &path("release", &a), b"released").body, "true");
    let entry = double.entries("rules/k").remove(0);
    assert_eq!(entry.session, None);
    assert_eq!(entry.value, b"released");
    assert_eq!(put(&double, &path("acquire", &b), b"").body, "true");
    assert_eq!(double.entries("rules/k")[0].lock_index, 2);

    let reply = put(&double, "/v1/kv/rules/x?acquire=", b"");
    assert_eq!(
        (reply.status, reply.body.as_str()),
        (500, "missing session")
    );
    let reply = put(&double, "/v1/kv/rules/x?flags=-1", b"");
    assert_eq!(reply.status, 500);
    assert_eq!(
        reply.body,
        r#"strconv.ParseUint: parsing "-1": invalid syntax"#
    );
}

#[test]
fn entries_serialize_in_consul_field_order_with_u64_flags() {
    let double = ConsulDouble::start();
    let id = create_session(&double, r#"{"Name": "order"}"#);
    put(
        &double,
        &format!("/v1/kv/order/k?acquire={id}&flags={SEMAPHORE_FLAGS}"),
        b"",
    );
    let reply = get(&double, "/v1/kv/order/k");
    assert_eq!(reply.content_type.as_deref(), Some("application/json"));
    let index = reply.index.unwrap();
    assert_eq!(
        reply.body,
        format!(
            r#"[{{"LockIndex":1,"Key":"order/k","Flags":{SEMAPHORE_FLAGS},"Value":null,"Session":"{id}","CreateIndex":{index},"ModifyIndex":{index}}}]"#
        )
    );
    let reply = get(&double, "/v1/kv/order?keys&separator=/");
    assert_eq!(reply.body, r#"["order/"]"#);
}

#[test]
fn restart_drops_connections_and_resets_the_index() {
    let double = ConsulDouble::start();
    for i in 0..20 {
        double.put_raw(&format!("restart/{i}"), b"x", 0);
    }
    create_session(&double, r#"{"Name": "lost"}"#);
    let index = get(&double, "/v1/kv/restart?recurse").index.unwrap();
    let pending = spawn_get(
        &double,
        &format!("/v1/kv/restart?recurse&index={index}&wait=20s"),
    );
    wait_for_request(&double, "/v1/kv/restart", "wait");

    double.restart();
    let (result, elapsed) = pending.recv_timeout(SOON).expect("the open query ended");
    assert!(result.is_err(), "the connection should drop, got an answer");
    assert!(elapsed < Duration::from_secs(10));

    let reply = get(&double, "/v1/kv/restart?recurse");
    assert_eq!(reply.status, 404);
    assert!(reply.index.unwrap() < index, "the index starts over");
    assert!(double.sessions().is_empty());
    assert!(double.entries("").is_empty());
}

#[test]
fn status_faults_answer_in_order_and_count_down() {
    let double = ConsulDouble::start();
    double.inject(Fault::status(500, "No cluster leader", 2).on(Match::path("/v1/kv/")));
    double.inject(Fault {
        matcher: Match::method_path("PUT", "/v1/session/"),
        action: FaultAction::Status(403, "Permission denied".to_string()),
        count: 1,
    });

    // Not matched: a different route.
    assert_eq!(
        get(&double, "/v1/status/leader").body,
        r#""127.0.0.1:8300""#
    );
    for _ in 0..2 {
        let reply = get(&double, "/v1/kv/f?recurse");
        assert_eq!(
            (reply.status, reply.body.as_str()),
            (500, "No cluster leader")
        );
        assert_eq!(
            reply.content_type.as_deref(),
            Some("text/plain; charset=utf-8")
        );
    }
    assert_eq!(
        get(&double, "/v1/kv/f?recurse").status,
        404,
        "count used up"
    );
    assert_eq!(
        get(&double, "/v1/session/list").status,
        200,
        "GET does not match"
    );
    assert_eq!(put(&double, "/v1/session/create", b"").status, 403);
    assert_eq!(put(&double, "/v1/session/create", b"").status, 200);

    double.inject(Fault::status(503, "again", 5));
    double.clear_faults();
    assert_eq!(
        get(&double, "/v1/agent/self").json()["Config"]["Datacenter"],
        "dc1"
    );
}

#[test]
fn drop_fault_closes_the_connection_without_an_answer() {
    let double = ConsulDouble::start();
    double.inject(Fault::drop_connection(1).on(Match::path("acquire=")));
    let url = format!("http://{}/v1/kv/d/k?acquire=x", double.addr());
    assert!(try_request(&crate::common::http_agent(), "PUT", &url, b"").is_err());
    // Used up: the same request now reaches the store.
    assert_eq!(put(&double, "/v1/kv/d/k?acquire=x", b"").status, 500);
}

#[test]
fn delay_fault_answers_normally_after_the_delay() {
    let double = ConsulDouble::start();
    double.inject(Fault::delay(Duration::from_millis(300), 1));
    let started = Instant::now();
    let reply = get(&double, "/v1/status/leader");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(reply.status, 200);
}

#[test]
fn stall_fault_never_answers_until_the_client_gives_up() {
    let double = ConsulDouble::start();
    double.inject(Fault::stall(1).on(Match::method_path("GET", "/v1/kv/stall")));
    let url = format!("http://{}/v1/kv/stall?recurse", double.addr());
    let started = Instant::now();
    let result = try_request(
        &agent_with_timeout(Duration::from_millis(300)),
        "GET",
        &url,
        b"",
    );
    assert!(result.is_err(), "a stalled request must time out");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(get(&double, "/v1/kv/stall?recurse").status, 404);

    // A stalled connection still open when the double stops does not hang it.
    double.inject(Fault::stall(1));
    let mut open = TcpStream::connect(double.addr()).unwrap();
    open.write_all(b"GET /v1/status/leader HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    wait_until(SOON, "the stalled request to arrive", || {
        double.requests().len() == 3
    });
    drop(double);
    let mut rest = Vec::new();
    open.set_read_timeout(Some(SOON)).unwrap();
    assert_eq!(
        open.read_to_end(&mut rest).unwrap(),
        0,
        "closed without an answer"
    );
}

#[test]
fn down_refuses_connections_until_up_again() {
    let double = ConsulDouble::start();
    double.set_down(true);
    let url = format!("http://{}/v1/status/leader", double.addr());
    assert!(try_request(&crate::common::http_agent(), "GET", &url, b"").is_err());
    double.set_down(false);
    assert_eq!(get(&double, "/v1/status/leader").status, 200);
}

#[test]
fn percent_encoded_keys_round_trip() {
    let consul = TestConsul::Double(ConsulDouble::start());
    let double = consul.double().unwrap();
    let prefix = crate::common::unique_prefix("keys");
    let names = [
        "with space",
        "question?mark",
        "hash#tag",
        "per%cent",
        "plus+sign",
        "ünïcødé/ключ",
    ];
    for (i, name) in names.iter().enumerate() {
        consul.put(&format!("{prefix}/{name}"), name.as_bytes(), i as u64);
    }
    let entries = consul.kv_entries(&prefix);
    assert_eq!(entries, double.entries(&prefix));
    let mut expected: Vec<String> = names.iter().map(|n| format!("{prefix}/{n}")).collect();
    expected.sort();
    let keys: Vec<String> = entries.iter().map(|e| e.key.clone()).collect();
    assert_eq!(keys, expected);
    for entry in &entries {
        assert_eq!(entry.value, &entry.key.as_bytes()[prefix.len() + 1..]);
        let raw = get(double, &format!("/v1/kv/{}?raw", encode_key(&entry.key)));
        assert_eq!(raw.body.as_bytes(), entry.value.as_slice());
    }
    let recorded = double.requests();
    assert!(recorded.iter().any(|r| r.method == "PUT"
        && r.path.ends_with("/ünïcødé/ключ")
        && r.query_value("flags") == Some("5")));
    consul.delete_tree(&prefix);
    assert!(consul.kv_entries(&prefix).is_empty());
}

#[test]
fn keep_alive_and_chunked_request_bodies_work_on_one_connection() {
    let double = ConsulDouble::start();
    let mut stream = TcpStream::connect(double.addr()).unwrap();
    stream.set_read_timeout(Some(SOON)).unwrap();
    stream
        .write_all(
            b"PUT /v1/kv/chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
              5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n",
        )
        .unwrap();
    stream
        .write_all(b"GET /v1/kv/chunked?raw HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answers = String::new();
    stream.read_to_string(&mut answers).unwrap();
    let (first, second) = answers.split_once("true").expect("the PUT answer");
    assert!(first.starts_with("HTTP/1.1 200 OK\r\n"));
    assert!(first.contains("Content-Length: 4\r\n"));
    assert!(second.starts_with("HTTP/1.1 200 OK\r\n"));
    assert!(second.contains("Content-Length: 11\r\n"));
    assert!(second.contains("X-Consul-Index: "));
    assert!(second.ends_with("\r\n\r\nhello world"));
    assert_eq!(double.entries("chunked")[0].value, b"hello world");
}

#[test]
fn sessions_are_visible_through_the_wrapper() {
    let consul = TestConsul::Double(ConsulDouble::start());
    let double = consul.double().unwrap();
    let reply = put(double, "/v1/session/create", br#"{"TTL": "1500ms"}"#);
    assert_eq!(reply.status, 500);
    assert_eq!(
        reply.body,
        "Invalid Session TTL '1500000000', must be between [10s=24h0m0s]"
    );

    let id = create_session(
        double,
        r#"{"Name": "listed", "TTL": "15s", "Behavior": "delete"}"#,
    );
    assert_eq!(consul.sessions(), vec![(id.clone(), "listed".to_string())]);
    let info = &double.sessions()[0];
    assert_eq!(info.behavior, "delete");
    assert_eq!(info.lock_delay, Duration::from_secs(15));
    assert_eq!(info.ttl, Some(Duration::from_secs(15)));
    let listed = get(double, &format!("/v1/session/info/{id}")).json();
    assert_eq!(listed[0]["TTL"], "15s");
    assert_eq!(listed[0]["LockDelay"], 15_000_000_000u64);

    consul.destroy_session(&id);
    assert!(consul.sessions().is_empty());
}
