//! The Consul double's TLS mode (https, mTLS) and ACL mode, and the test
//! certificates they use: the infrastructure the TLS/ACL tests of consem
//! stand on.

use std::time::Duration;

use crate::common::double::{Acl, ConsulDouble, Fault, Match, Rights};
use crate::common::pki::TestPki;
use crate::common::{
    encode_key, http_agent, http_request, tls_agent, unique_prefix, HttpAnswer, TestConsul,
    HELPER_TOKEN,
};

fn get(agent: &ureq::Agent, url: &str) -> Result<HttpAnswer, ureq::Error> {
    http_request(agent, "GET", url, None, b"")
}

/// The error of a request that must fail, as text.
fn failure(result: Result<HttpAnswer, ureq::Error>, what: &str) -> String {
    match result {
        Ok(answer) => panic!("{what}: expected a failure, got {answer:?}"),
        Err(error) => error.to_string(),
    }
}

// ---------------------------------------------------------------------------
// Certificates
// ---------------------------------------------------------------------------

#[test]
fn pki_files_are_written_as_pem() {
    let pki = TestPki::new();
    let dir = std::env::temp_dir().join(unique_prefix("pki").replace('/', "_"));
    let files = pki.write_to(&dir);
    for (path, marker) in [
        (&files.ca, "BEGIN CERTIFICATE"),
        (&files.other_ca, "BEGIN CERTIFICATE"),
        (&files.server, "BEGIN CERTIFICATE"),
        (&files.server_key, "PRIVATE KEY"),
        (&files.client, "BEGIN CERTIFICATE"),
        (&files.client_key, "PRIVATE KEY"),
        (&files.expired, "BEGIN CERTIFICATE"),
        (&files.expired_key, "PRIVATE KEY"),
        (&files.elsewhere, "BEGIN CERTIFICATE"),
        (&files.elsewhere_key, "PRIVATE KEY"),
        (&files.other_client, "BEGIN CERTIFICATE"),
        (&files.other_client_key, "PRIVATE KEY"),
    ] {
        let text = std::fs::read_to_string(path).unwrap();
        assert!(text.contains(marker), "{} lacks {marker}", path.display());
    }
    let names: Vec<String> = [
        "ca.pem",
        "other-ca.pem",
        "server.pem",
        "server-key.pem",
        "client.pem",
        "client-key.pem",
        "expired.pem",
        "expired-key.pem",
        "elsewhere.pem",
        "elsewhere-key.pem",
        "not-pem.pem",
    ]
    .iter()
    .map(|n| dir.join(n).to_str().unwrap().to_string())
    .collect();
    for name in &names {
        assert!(std::path::Path::new(name).is_file(), "{name} missing");
    }
    let garbage = std::fs::read(&files.not_pem).unwrap();
    assert_eq!(
        ureq::tls::parse_pem(&garbage)
            .filter(|item| item.is_ok())
            .count(),
        0,
        "not-pem.pem must hold no PEM item"
    );
    assert_ne!(pki.ca_pem, pki.other_ca_pem);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn making_a_pki_is_fast() {
    let started = std::time::Instant::now();
    let _pki = TestPki::new();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "TestPki::new took {:?}",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------
// TLS
// ---------------------------------------------------------------------------

#[test]
fn https_with_the_ca_works_by_ip_and_by_name() {
    let pki = TestPki::new();
    let double = ConsulDouble::start_tls(pki.tls_server(false));
    assert!(double.is_tls());
    assert!(
        double.url().starts_with("https://127.0.0.1:"),
        "{}",
        double.url()
    );
    assert_eq!(double.url(), format!("https://{}", double.addr()));
    let agent = tls_agent(&pki.ca_pem, None);
    let answer = get(&agent, &format!("{}/v1/status/leader", double.url())).unwrap();
    assert_eq!(
        (answer.status, answer.body.as_str()),
        (200, "\"127.0.0.1:8300\"")
    );
    let port = double.addr().rsplit_once(':').unwrap().1.to_string();
    let by_name = get(
        &agent,
        &format!("https://localhost:{port}/v1/status/leader"),
    )
    .unwrap();
    assert_eq!(by_name.status, 200);
}

#[test]
fn a_plain_double_says_http() {
    let double = ConsulDouble::start();
    assert!(!double.is_tls());
    assert_eq!(double.url(), format!("http://{}", double.addr()));
}

#[test]
fn keep_alive_blocking_queries_and_faults_work_over_tls() {
    let pki = TestPki::new();
    let consul = TestConsul::start_tls(&pki, false);
    let double = consul.double().unwrap();
    let prefix = unique_prefix("tls-kv");
    let key = format!("{prefix}/a");
    let agent = tls_agent(&pki.ca_pem, None);
    let base = double.url();
    let key_url = format!("{base}/v1/kv/{}", encode_key(&key));
    // The helpers work against the TLS double.
    consul.put(&key, b"one", 7);
    let entries = consul.kv_entries(&prefix);
    assert_eq!(entries.len(), 1);
    assert_eq!(
        (entries[0].value.as_slice(), entries[0].flags),
        (&b"one"[..], 7)
    );
    assert_eq!(consul.sessions(), vec![]);
    // Several requests on one agent (its pooled connection).
    for _ in 0..5 {
        assert_eq!(get(&agent, &key_url).unwrap().status, 200);
    }
    // A blocking query wakes on a write.
    let index: u64 = get(&agent, &key_url)
        .unwrap()
        .header("x-consul-index")
        .unwrap()
        .parse()
        .unwrap();
    let waiter = {
        let agent = agent.clone();
        let url = format!("{key_url}?index={index}&wait=20s");
        std::thread::spawn(move || get(&agent, &url).unwrap())
    };
    std::thread::sleep(Duration::from_millis(200));
    consul.put(&key, b"two", 7);
    let woken = waiter.join().unwrap();
    assert_eq!(woken.status, 200);
    assert!(woken.body.contains("dHdv"), "{}", woken.body); // base64("two")
                                                            // Faults apply as over plain HTTP.
    double.inject(Fault::status(500, "No cluster leader", 1).on(Match::path("/v1/kv/")));
    let faulted = get(&agent, &key_url).unwrap();
    assert_eq!(
        (faulted.status, faulted.body.as_str()),
        (500, "No cluster leader")
    );
    double.inject(Fault::drop_connection(1).on(Match::path("/v1/kv/")));
    failure(get(&agent, &key_url), "a dropped connection");
    double.inject(Fault::truncate(1).on(Match::path("/v1/kv/")));
    failure(get(&agent, &key_url), "a truncated answer");
    assert_eq!(get(&agent, &key_url).unwrap().status, 200);
    consul.delete_tree(&prefix);
    assert_eq!(consul.kv_entries(&prefix), vec![]);
}

#[test]
fn https_without_the_ca_fails() {
    let pki = TestPki::new();
    let double = ConsulDouble::start_tls(pki.tls_server(false));
    let url = format!("{}/v1/status/leader", double.url());
    // Default roots (webpki): the test CA is unknown.
    let error = failure(get(&http_agent(), &url), "no CA");
    assert!(error.to_lowercase().contains("issuer"), "{error}");
    // Only an unrelated CA trusted.
    let error = failure(get(&tls_agent(&pki.other_ca_pem, None), &url), "wrong CA");
    assert!(error.to_lowercase().contains("issuer"), "{error}");
    // Plain HTTP to a TLS double: the handshake fails, the connection closes.
    failure(
        get(
            &http_agent(),
            &format!("http://{}/v1/status/leader", double.addr()),
        ),
        "plain HTTP to https",
    );
    // The double keeps serving.
    let agent = tls_agent(&pki.ca_pem, None);
    assert_eq!(get(&agent, &url).unwrap().status, 200);
}

#[test]
fn mtls_needs_a_client_certificate_from_the_ca() {
    let pki = TestPki::new();
    let consul = TestConsul::start_tls(&pki, true);
    let double = consul.double().unwrap();
    let url = format!("{}/v1/status/leader", double.url());
    failure(get(&tls_agent(&pki.ca_pem, None), &url), "no client cert");
    failure(
        get(&tls_agent(&pki.ca_pem, Some(&pki.other_client)), &url),
        "client cert from another CA",
    );
    let answer = get(&tls_agent(&pki.ca_pem, Some(&pki.client)), &url).unwrap();
    assert_eq!(answer.status, 200);
    // The helpers present the client certificate.
    assert_eq!(consul.sessions(), vec![]);
    // Requests whose handshake failed were never read.
    assert_eq!(double.requests().len(), 2);
}

#[test]
fn an_expired_server_certificate_fails_validation() {
    let pki = TestPki::new();
    let double = ConsulDouble::start_tls(pki.tls_server_with(&pki.expired, false));
    let url = format!("{}/v1/status/leader", double.url());
    let error = failure(get(&tls_agent(&pki.ca_pem, None), &url), "expired cert");
    assert!(error.to_lowercase().contains("expired"), "{error}");
    assert!(double.requests().is_empty());
}

#[test]
fn a_certificate_for_another_name_fails_validation() {
    let pki = TestPki::new();
    let double = ConsulDouble::start_tls(pki.tls_server_with(&pki.elsewhere, false));
    let url = format!("{}/v1/status/leader", double.url());
    let error = failure(get(&tls_agent(&pki.ca_pem, None), &url), "wrong name");
    assert!(error.contains("not valid for name"), "{error}");
    let port = double.addr().rsplit_once(':').unwrap().1.to_string();
    failure(
        get(
            &tls_agent(&pki.ca_pem, None),
            &format!("https://localhost:{port}/v1/status/leader"),
        ),
        "wrong name (localhost)",
    );
    assert!(double.requests().is_empty());
}

// ---------------------------------------------------------------------------
// ACLs
// ---------------------------------------------------------------------------

const SESSIONS: &str = "sessions-only";
const READ_A: &str = "reads-a";
const READ_ALL: &str = "reads-all";
const WRITE_P: &str = "writes-p";

/// A double with ACLs on; the prefix `p/` holds `p/a/1`, `p/a/2`, `p/b/1`.
fn acl_double() -> (TestConsul, String) {
    let consul = TestConsul::Double(ConsulDouble::start());
    let double = consul.double().unwrap();
    double.put_raw("p/a/1", b"a1", 0);
    double.put_raw("p/a/2", b"a2", 0);
    double.put_raw("p/b/1", b"b1", 0);
    let acl = Acl::new()
        .token(
            SESSIONS,
            Rights {
                session_write: true,
                ..Rights::none()
            },
        )
        .token(
            READ_A,
            Rights {
                key_read: vec!["p/a/".into()],
                ..Rights::none()
            },
        )
        .token(
            READ_ALL,
            Rights {
                key_read: vec![String::new()],
                ..Rights::none()
            },
        )
        .token(
            WRITE_P,
            Rights {
                key_write: vec!["p/".into()],
                ..Rights::none()
            },
        );
    let consul = consul.with_acls(acl);
    let base = consul.base_url();
    (consul, base)
}

fn call(base: &str, method: &str, path: &str, token: Option<&str>, body: &[u8]) -> HttpAnswer {
    let url = format!("{base}{path}");
    http_request(&http_agent(), method, &url, token, body)
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"))
}

fn assert_denied(answer: &HttpAnswer, what: &str) {
    assert_eq!(
        (answer.status, answer.body.as_str()),
        (403, "Permission denied"),
        "{what}"
    );
}

fn keys_of(answer: &HttpAnswer) -> Vec<String> {
    let entries: Vec<serde_json::Value> = serde_json::from_str(&answer.body).unwrap();
    entries
        .iter()
        .map(|e| e["Key"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn sessions_need_session_write() {
    let (_consul, base) = acl_double();
    let spec = br#"{"TTL":"15s"}"#;
    for token in [None, Some("no-such-token"), Some(READ_ALL), Some(WRITE_P)] {
        let answer = call(&base, "PUT", "/v1/session/create", token, spec);
        assert_denied(&answer, &format!("create with {token:?}"));
    }
    let created = call(&base, "PUT", "/v1/session/create", Some(SESSIONS), spec);
    assert_eq!(created.status, 200, "{}", created.body);
    let id = serde_json::from_str::<serde_json::Value>(&created.body).unwrap()["ID"]
        .as_str()
        .unwrap()
        .to_string();
    let renew = format!("/v1/session/renew/{id}");
    let destroy = format!("/v1/session/destroy/{id}");
    assert_denied(&call(&base, "PUT", &renew, None, b""), "renew, anonymous");
    assert_denied(&call(&base, "PUT", &renew, Some(READ_ALL), b""), "renew");
    assert_denied(&call(&base, "PUT", &destroy, Some(WRITE_P), b""), "destroy");
    assert_eq!(call(&base, "PUT", &renew, Some(SESSIONS), b"").status, 200);
    // Session reads need no rights.
    let list = call(&base, "GET", "/v1/session/list", None, b"");
    assert_eq!(list.status, 200);
    assert!(list.body.contains(&id));
    let info = call(&base, "GET", &format!("/v1/session/info/{id}"), None, b"");
    assert_eq!(info.status, 200);
    assert!(info.body.contains(&id));
    assert_eq!(
        call(&base, "PUT", &destroy, Some(SESSIONS), b"").status,
        200
    );
    assert!(!call(&base, "GET", "/v1/session/list", None, b"")
        .body
        .contains(&id));
}

#[test]
fn key_reads_need_key_read() {
    let (_consul, base) = acl_double();
    assert_denied(&call(&base, "GET", "/v1/kv/p/a/1", None, b""), "anonymous");
    assert_denied(
        &call(&base, "GET", "/v1/kv/p/b/1", Some(READ_A), b""),
        "p/b",
    );
    assert_denied(
        &call(&base, "GET", "/v1/kv/p/a/1", Some("unknown"), b""),
        "unknown token",
    );
    let answer = call(&base, "GET", "/v1/kv/p/a/1", Some(READ_A), b"");
    assert_eq!(answer.status, 200);
    assert_eq!(keys_of(&answer), vec!["p/a/1"]);
    // Write implies read.
    assert_eq!(
        call(&base, "GET", "/v1/kv/p/b/1?raw", Some(WRITE_P), b"").body,
        "b1"
    );
}

#[test]
fn key_writes_and_deletes_need_key_write() {
    let (consul, base) = acl_double();
    let double = consul.double().unwrap();
    for token in [None, Some(READ_ALL), Some(SESSIONS)] {
        assert_denied(
            &call(&base, "PUT", "/v1/kv/p/new", token, b"x"),
            &format!("put with {token:?}"),
        );
        assert_denied(
            &call(&base, "DELETE", "/v1/kv/p/a/1", token, b""),
            &format!("delete with {token:?}"),
        );
        assert_denied(
            &call(&base, "DELETE", "/v1/kv/p/?recurse", token, b""),
            &format!("recursive delete with {token:?}"),
        );
    }
    assert_denied(
        &call(&base, "PUT", "/v1/kv/q/outside", Some(WRITE_P), b"x"),
        "put outside the writable prefix",
    );
    // A recursive delete needs write on the whole prefix.
    assert_denied(
        &call(&base, "DELETE", "/v1/kv/?recurse", Some(WRITE_P), b""),
        "recursive delete of everything",
    );
    assert_eq!(
        double.entries("p/").len(),
        3,
        "denied writes changed nothing"
    );
    let put = call(&base, "PUT", "/v1/kv/p/new", Some(WRITE_P), b"x");
    assert_eq!((put.status, put.body.as_str()), (200, "true"));
    let deleted = call(&base, "DELETE", "/v1/kv/p/a/1", Some(WRITE_P), b"");
    assert_eq!((deleted.status, deleted.body.as_str()), (200, "true"));
    let tree = call(&base, "DELETE", "/v1/kv/p/b/?recurse", Some(WRITE_P), b"");
    assert_eq!(tree.status, 200);
    let left: Vec<String> = double.entries("p/").into_iter().map(|e| e.key).collect();
    assert_eq!(left, vec!["p/a/2", "p/new"]);
}

#[test]
fn listings_leave_out_unreadable_keys_and_say_so() {
    let (_consul, base) = acl_double();
    const FILTERED: &str = "x-consul-results-filtered-by-acls";
    // Partly readable: filtered, with the header.
    let partial = call(&base, "GET", "/v1/kv/p/?recurse", Some(READ_A), b"");
    assert_eq!(partial.status, 200);
    assert_eq!(keys_of(&partial), vec!["p/a/1", "p/a/2"]);
    assert_eq!(partial.header(FILTERED), Some("true"));
    assert!(partial.header("x-consul-index").is_some());
    let keys = call(&base, "GET", "/v1/kv/p/?keys", Some(READ_A), b"");
    assert_eq!(keys.status, 200);
    assert_eq!(
        serde_json::from_str::<Vec<String>>(&keys.body).unwrap(),
        vec!["p/a/1", "p/a/2"]
    );
    assert_eq!(keys.header(FILTERED), Some("true"));
    // Everything readable: the whole listing, no header.
    for token in [READ_ALL, WRITE_P] {
        let full = call(&base, "GET", "/v1/kv/p/?recurse", Some(token), b"");
        assert_eq!(full.status, 200);
        assert_eq!(keys_of(&full), vec!["p/a/1", "p/a/2", "p/b/1"]);
        assert_eq!(full.header(FILTERED), None, "{token}");
    }
    // No read on any part of the prefix: 403.
    let elsewhere = call(&base, "GET", "/v1/kv/p/b/?recurse", Some(READ_A), b"");
    assert_denied(&elsewhere, "no read on any part of p/b/");
    assert_denied(
        &call(&base, "GET", "/v1/kv/p/?recurse", None, b""),
        "anonymous listing",
    );
    assert_denied(
        &call(&base, "GET", "/v1/kv/p/?keys", Some(SESSIONS), b""),
        "keys listing without key read",
    );
    // A broader listing than the rule is filtered, not refused.
    let root = call(&base, "GET", "/v1/kv/?recurse", Some(READ_A), b"");
    assert_eq!(root.status, 200);
    assert_eq!(keys_of(&root), vec!["p/a/1", "p/a/2"]);
    assert_eq!(root.header(FILTERED), Some("true"));
}

#[test]
fn a_filtered_blocking_listing_wakes_and_stays_filtered() {
    let (consul, base) = acl_double();
    let first = call(&base, "GET", "/v1/kv/p/?recurse", Some(READ_A), b"");
    let index = first.header("x-consul-index").unwrap().to_string();
    let waiter = {
        let base = base.clone();
        std::thread::spawn(move || {
            let path = format!("/v1/kv/p/?recurse&index={index}&wait=20s");
            call(&base, "GET", &path, Some(READ_A), b"")
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    consul.put("p/b/2", b"hidden", 0);
    let woken = waiter.join().unwrap();
    assert_eq!(keys_of(&woken), vec!["p/a/1", "p/a/2"]);
    assert_eq!(
        woken.header("x-consul-results-filtered-by-acls"),
        Some("true")
    );
}

#[test]
fn tokens_are_taken_from_the_url_too_and_recorded() {
    let (consul, base) = acl_double();
    let double = consul.double().unwrap();
    let by_query = call(
        &base,
        "GET",
        &format!("/v1/kv/p/a/1?token={READ_A}"),
        None,
        b"",
    );
    assert_eq!(by_query.status, 200);
    // A bearer token works as in Consul.
    let url = format!("{base}/v1/kv/p/a/2");
    let request = ureq::http::Request::get(&url)
        .header("Authorization", format!("Bearer {READ_A}"))
        .body(())
        .unwrap();
    let bearer = http_agent().run(request).unwrap();
    assert_eq!(bearer.status().as_u16(), 200);
    let by_header = call(&base, "GET", "/v1/kv/p/a/2", Some(READ_A), b"");
    assert_eq!(by_header.status, 200);
    assert_eq!(double.tokens_in_urls(), vec![READ_A.to_string()]);
    let requests = double.requests();
    let in_url: Vec<_> = requests.iter().filter(|r| r.url_contains(READ_A)).collect();
    assert_eq!(in_url.len(), 1);
    assert_eq!(in_url[0].target, format!("/v1/kv/p/a/1?token={READ_A}"));
    let last = requests.last().unwrap();
    assert_eq!(last.header("X-Consul-Token"), Some(READ_A));
    assert_eq!(last.token(), Some(READ_A));
    assert!(!last.url_contains(READ_A));
    // The helpers' own requests carry the helper token, in the header.
    assert!(requests
        .iter()
        .all(|r| r.token() != Some(HELPER_TOKEN) || !r.url_contains(HELPER_TOKEN)));
}

#[test]
fn acls_can_be_turned_off_and_other_routes_stay_open() {
    let (consul, base) = acl_double();
    let double = consul.double().unwrap();
    assert_eq!(
        call(&base, "GET", "/v1/status/leader", None, b"").status,
        200
    );
    assert_eq!(call(&base, "GET", "/v1/agent/self", None, b"").status, 200);
    // Validation Consul does before looking at the token still answers first.
    assert_eq!(call(&base, "PUT", "/v1/kv/", None, b"").status, 400);
    double.disable_acls();
    assert_eq!(call(&base, "PUT", "/v1/kv/p/open", None, b"x").status, 200);
    let listing = call(&base, "GET", "/v1/kv/p/?recurse", None, b"");
    assert_eq!(listing.header("x-consul-results-filtered-by-acls"), None);
    assert_eq!(keys_of(&listing).len(), 4);
}

#[test]
fn helpers_work_against_a_tls_double_with_acls() {
    let pki = TestPki::new();
    let prefix = unique_prefix("tls-acl");
    let consul = TestConsul::start_tls(&pki, true)
        .with_acls(Acl::new().token("consem", Rights::semaphore(&prefix)));
    let double = consul.double().unwrap();
    consul.put(&format!("{prefix}/x"), b"v", 0);
    assert_eq!(consul.kv_entries(&prefix).len(), 1);
    assert_eq!(consul.sessions(), vec![]);
    let agent = tls_agent(&pki.ca_pem, Some(&pki.client));
    let url = format!("{}/v1/kv/{}/x", double.url(), encode_key(&prefix));
    let anonymous = http_request(&agent, "GET", &url, None, b"").unwrap();
    assert_denied(&anonymous, "anonymous over mTLS");
    let allowed = http_request(&agent, "GET", &url, Some("consem"), b"").unwrap();
    assert_eq!(allowed.status, 200);
    assert!(double
        .requests()
        .iter()
        .filter(|r| r.token() == Some(HELPER_TOKEN))
        .all(|r| r.header("X-Consul-Token") == Some(HELPER_TOKEN)));
    consul.delete_tree(&prefix);
    assert_eq!(consul.kv_entries(&prefix), vec![]);
}
