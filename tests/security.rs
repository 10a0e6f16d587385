//! consem against a production-like Consul: https with the cluster's CA,
//! mTLS, ACL tokens and their sources, namespaces and partitions. Every test
//! runs the real binary against the Consul double in its TLS or ACL mode
//! (certificates made at test time), even when a real agent is given.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::common::double::{Acl, ConsulDouble, RecordedRequest, Rights};
use crate::common::pki::{PkiFiles, TestPki, ELSEWHERE_NAME};
use crate::common::world::*;
use crate::common::{
    encode_key, http_agent, http_request, unique_prefix, wait_until, KvEntry, TestConsul,
    HELPER_TOKEN,
};

/// The token consem is given in the ACL tests: distinctive, so that a search
/// of the output or of a URL for it cannot match anything else.
const TOKEN: &str = "s3cret-7f1c9e2b-consem-token";
/// A second token, for the precedence tests.
const OTHER_TOKEN: &str = "other-0d5a-consem-token";

/// A world around an https double serving `pki`'s good server certificate
/// (mTLS with `mtls`), and the test PKI written to its scratch directory.
fn tls_world(name: &str, pki: &TestPki, mtls: bool) -> (World<TestConsul>, PkiFiles) {
    let world = World::with_consul(name, TestConsul::start_tls(pki, mtls));
    let files = pki.write_to(&world.dir.join("pki"));
    (world, files)
}

/// A world around an https double presenting `cert` (e.g. the expired one).
fn tls_world_with(
    name: &str,
    pki: &TestPki,
    cert: &crate::common::pki::CertKey,
) -> (World<TestConsul>, PkiFiles) {
    let double = ConsulDouble::start_tls(pki.tls_server_with(cert, false));
    let consul = TestConsul::Secured(
        double,
        crate::common::Access {
            ca_pem: Some(pki.ca_pem.clone()),
            client: None,
            token: None,
        },
    );
    let world = World::with_consul(name, consul);
    let files = pki.write_to(&world.dir.join("pki"));
    (world, files)
}

/// A world around a plain-HTTP double with ACLs on; `acl` gets the world's
/// prefix and says which tokens the double knows (the helpers' token is
/// added).
fn acl_world(name: &str, acl: impl FnOnce(&str) -> Acl) -> World<TestConsul> {
    let prefix = unique_prefix(name);
    let consul = TestConsul::Double(ConsulDouble::start()).with_acls(acl(&prefix));
    let mut world = World::with_consul(name, consul);
    world.prefix = prefix;
    world
}

/// A world around a plain-HTTP double without ACLs.
fn plain_world(name: &str) -> World<TestConsul> {
    World::with_consul(name, TestConsul::Double(ConsulDouble::start()))
}

fn double(world: &World<TestConsul>) -> &ConsulDouble {
    world.store.double().expect("these tests build a double")
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs `command` to its end, within a deadline (it is killed if it passes).
fn run(mut command: Command) -> Output {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_with_deadline(&mut child, PROMPT, "consem to finish");
    child.wait_with_output().unwrap()
}

/// consem's stderr, which must be exactly one line: the error.
fn one_line(output: &Output) -> String {
    let text = stderr(output);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr, got: {text}");
    lines[0].to_string()
}

/// The requests consem made (its User-Agent), not the helpers'.
fn consem_requests(world: &World<TestConsul>) -> Vec<RecordedRequest> {
    let requests: Vec<RecordedRequest> = double(world)
        .requests()
        .into_iter()
        .filter(|r| {
            r.header("user-agent")
                .is_some_and(|ua| ua.starts_with("consem/"))
        })
        .collect();
    assert!(
        !requests.is_empty(),
        "the double recorded nothing from consem"
    );
    requests
}

/// The keys under the world's prefix, read from the double itself (the
/// helpers' HTTP access cannot check every certificate these tests use).
fn keys(world: &World<TestConsul>) -> Vec<KvEntry> {
    double(world).entries(&format!("{}/", world.prefix))
}

/// Nothing left under the prefix, and no session.
fn assert_clean(world: &World<TestConsul>) {
    assert_eq!(keys(world), vec![], "keys left under {}", world.prefix);
    let sessions: Vec<String> = double(world).sessions().into_iter().map(|s| s.id).collect();
    assert_eq!(sessions, Vec::<String>::new(), "sessions left behind");
}

/// Asserts a run exited 0 with the child's output intact and left nothing.
fn assert_ran(world: &World<TestConsul>, output: &Output, stdout: &str) {
    assert_eq!(output.status.code(), Some(0), "{}", stderr(output));
    assert_eq!(String::from_utf8_lossy(&output.stdout), stdout);
    assert_clean(world);
}

const HELLO: [&str; 2] = ["printf", "hello over tls\\n"];
const HELLO_OUT: &str = "hello over tls\n";

// ---------------------------------------------------------------------------
// https with the cluster's CA
// ---------------------------------------------------------------------------

#[test]
fn https_with_the_ca_file_works() {
    let (world, files) = tls_world("https-ca-file", &TestPki::new(), false);
    let output = run(world.consem(1, &["--ca-file", path(&files.ca)], &HELLO));
    assert_ran(&world, &output, HELLO_OUT);
    assert_eq!(stderr(&output), "", "quiet by default");
}

#[test]
fn https_with_consul_cacert_works() {
    let (world, files) = tls_world("https-cacert", &TestPki::new(), false);
    let mut command = world.consem(1, &[], &HELLO);
    command.env("CONSUL_CACERT", &files.ca);
    let output = run(command);
    assert_ran(&world, &output, HELLO_OUT);
}

#[test]
fn https_with_a_ca_path_directory_works() {
    let pki = TestPki::new();
    let (world, _files) = tls_world("https-ca-path", &pki, false);
    // The CA among an unrelated CA and a file that is no certificate, as in
    // a real certificate directory.
    let dir = world.dir.join("ca-dir");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("cluster-ca.pem"), &pki.ca_pem).unwrap();
    std::fs::write(dir.join("another-ca.pem"), &pki.other_ca_pem).unwrap();
    std::fs::write(dir.join("README"), "certificates for the cluster\n").unwrap();
    let output = run(world.consem(1, &["--ca-path", path(&dir)], &HELLO));
    assert_ran(&world, &output, HELLO_OUT);
}

#[test]
fn consul_http_ssl_makes_a_bare_address_https() {
    let (world, files) = tls_world("https-ssl-env", &TestPki::new(), false);
    let mut command = world.consem(1, &["--ca-file", path(&files.ca)], &HELLO);
    command
        .env("CONSUL_HTTP_ADDR", world.store.addr())
        .env("CONSUL_HTTP_SSL", "true");
    assert!(!world.store.addr().contains("://"));
    let output = run(command);
    assert_ran(&world, &output, HELLO_OUT);
}

#[test]
fn tls_server_name_checks_the_certificate_against_another_name_than_the_address() {
    let pki = TestPki::new();
    // Valid only for elsewhere.test, reached at 127.0.0.1.
    let (world, files) = tls_world_with("tls-server-name", &pki, &pki.elsewhere);
    let extra = [
        "--ca-file",
        path(&files.ca),
        "--tls-server-name",
        ELSEWHERE_NAME,
    ];
    let output = run(world.consem(1, &extra, &HELLO));
    assert_ran(&world, &output, HELLO_OUT);
}

#[test]
fn mtls_with_the_client_certificate_works() {
    let (world, files) = tls_world("mtls-ok", &TestPki::new(), true);
    let extra = [
        "--ca-file",
        path(&files.ca),
        "--client-cert",
        path(&files.client),
        "--client-key",
        path(&files.client_key),
    ];
    let output = run(world.consem(1, &extra, &HELLO));
    assert_ran(&world, &output, HELLO_OUT);
}

#[test]
fn mtls_with_the_client_certificate_from_the_environment_works() {
    let (world, files) = tls_world("mtls-env", &TestPki::new(), true);
    let mut command = world.consem(1, &[], &HELLO);
    command
        .env("CONSUL_CACERT", &files.ca)
        .env("CONSUL_CLIENT_CERT", &files.client)
        .env("CONSUL_CLIENT_KEY", &files.client_key);
    let output = run(command);
    assert_ran(&world, &output, HELLO_OUT);
}

#[test]
fn ssl_verify_false_works_against_an_unknown_ca_and_warns() {
    let (world, _files) = tls_world("ssl-verify-false", &TestPki::new(), false);
    let mut command = world.consem(1, &[], &HELLO);
    command.env("CONSUL_HTTP_SSL_VERIFY", "false");
    let output = run(command);
    assert_ran(&world, &output, HELLO_OUT);
    let warning = one_line(&output);
    assert!(
        warning.contains("warning") && warning.contains("CONSUL_HTTP_SSL_VERIFY"),
        "{warning}"
    );
}

// ---------------------------------------------------------------------------
// TLS failures: exit 69, one line that says what to fix
// ---------------------------------------------------------------------------

/// Runs `command`, which must fail to reach Consul: exit 69, one line, the
/// command not run, no request read by the double, nothing left; returns
/// the line.
fn unreachable(world: &World<TestConsul>, command: Command) -> String {
    let output = run(command);
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    assert_eq!(output.stdout, b"", "the command must not run");
    let line = one_line(&output);
    assert!(line.starts_with("consem: error: "), "{line}");
    assert!(
        double(world).requests().is_empty(),
        "a request got through the failed handshake"
    );
    assert_clean(world);
    line
}

/// consem trusting only an unrelated CA.
fn wrong_ca_line() -> String {
    let (world, files) = tls_world("wrong-ca", &TestPki::new(), false);
    unreachable(
        &world,
        world.consem(1, &["--ca-file", path(&files.other_ca)], &HELLO),
    )
}

/// consem trusting the system's roots only (no --ca-file).
fn no_ca_line() -> String {
    let (world, _files) = tls_world("no-ca", &TestPki::new(), false);
    unreachable(&world, world.consem(1, &[], &HELLO))
}

/// The agent's certificate is valid only for elsewhere.test; consem connects
/// to 127.0.0.1.
fn wrong_name_line() -> String {
    let pki = TestPki::new();
    let (world, files) = tls_world_with("wrong-name", &pki, &pki.elsewhere);
    unreachable(
        &world,
        world.consem(1, &["--ca-file", path(&files.ca)], &HELLO),
    )
}

/// The agent verifies clients; consem presents no certificate.
fn no_client_cert_line() -> String {
    let (world, files) = tls_world("mtls-missing", &TestPki::new(), true);
    unreachable(
        &world,
        world.consem(1, &["--ca-file", path(&files.ca)], &HELLO),
    )
}

#[test]
fn a_wrong_ca_exits_69_naming_the_ca_setting() {
    let line = wrong_ca_line();
    assert!(line.contains("CA") && line.contains("--ca-file"), "{line}");
}

#[test]
fn no_ca_exits_69_naming_the_ca_setting() {
    let line = no_ca_line();
    assert!(line.contains("CA") && line.contains("--ca-file"), "{line}");
}

#[test]
fn a_certificate_for_another_name_exits_69_pointing_to_tls_server_name() {
    let line = wrong_name_line();
    assert!(
        line.contains("127.0.0.1") && line.contains("--tls-server-name"),
        "{line}"
    );
}

#[test]
fn an_expired_certificate_exits_69_saying_expired() {
    let pki = TestPki::new();
    let (world, files) = tls_world_with("expired", &pki, &pki.expired);
    let command = world.consem(1, &["--ca-file", path(&files.ca)], &HELLO);
    let line = unreachable(&world, command);
    assert!(line.contains("expired"), "{line}");
}

#[test]
fn mtls_without_a_client_certificate_exits_69_naming_client_cert() {
    let line = no_client_cert_line();
    assert!(line.contains("--client-cert"), "{line}");
}

#[test]
fn plain_http_to_an_https_agent_exits_69() {
    let (world, _files) = tls_world("http-to-https", &TestPki::new(), false);
    let mut command = world.consem(1, &[], &HELLO);
    command.env("CONSUL_HTTP_ADDR", format!("http://{}", world.store.addr()));
    unreachable(&world, command);
}

#[test]
fn https_to_a_plain_agent_exits_69_pointing_to_http() {
    let world = plain_world("https-to-http");
    let mut command = world.consem(1, &[], &HELLO);
    command.env(
        "CONSUL_HTTP_ADDR",
        format!("https://{}", world.store.addr()),
    );
    let line = unreachable(&world, command);
    assert!(
        line.contains("did not answer in TLS") && line.contains("an http:// address"),
        "{line}"
    );
}

// ---------------------------------------------------------------------------
// Bad TLS settings: exit 2 before any request, naming the file
// ---------------------------------------------------------------------------

/// Runs `command`, which must be refused as a usage error: exit 2, one line,
/// no request made; returns the line.
fn usage_error(world: &World<TestConsul>, command: Command) -> String {
    let output = run(command);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert_eq!(output.stdout, b"", "the command must not run");
    assert!(
        double(world).requests().is_empty(),
        "no request before the settings are valid"
    );
    one_line(&output)
}

#[test]
fn a_missing_ca_file_exits_2_naming_it() {
    let (world, files) = tls_world("ca-missing", &TestPki::new(), false);
    let missing = files.dir.join("no-such-ca.pem");
    let line = usage_error(
        &world,
        world.consem(1, &["--ca-file", path(&missing)], &HELLO),
    );
    assert!(line.contains(path(&missing)), "{line}");
}

#[test]
fn an_unreadable_ca_file_exits_2_naming_it() {
    let (world, files) = tls_world("ca-unreadable", &TestPki::new(), false);
    // A directory cannot be read as a file, even by root.
    let line = usage_error(
        &world,
        world.consem(1, &["--ca-file", path(&files.dir)], &HELLO),
    );
    assert!(line.contains(path(&files.dir)), "{line}");
}

#[test]
fn a_ca_file_that_is_not_pem_exits_2_naming_it() {
    let (world, files) = tls_world("ca-not-pem", &TestPki::new(), false);
    let line = usage_error(
        &world,
        world.consem(1, &["--ca-file", path(&files.not_pem)], &HELLO),
    );
    assert!(line.contains(path(&files.not_pem)), "{line}");
    assert!(line.contains("PEM"), "{line}");
}

#[test]
fn a_client_key_that_is_not_pem_exits_2_naming_it() {
    let (world, files) = tls_world("key-not-pem", &TestPki::new(), true);
    let extra = [
        "--ca-file",
        path(&files.ca),
        "--client-cert",
        path(&files.client),
        "--client-key",
        path(&files.not_pem),
    ];
    let line = usage_error(&world, world.consem(1, &extra, &HELLO));
    assert!(line.contains(path(&files.not_pem)), "{line}");
}

#[test]
fn a_client_cert_without_its_key_exits_2() {
    let (world, files) = tls_world("cert-no-key", &TestPki::new(), true);
    let extra = [
        "--ca-file",
        path(&files.ca),
        "--client-cert",
        path(&files.client),
    ];
    let output = run(world.consem(1, &extra, &HELLO));
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert_eq!(output.stdout, b"");
    assert!(
        stderr(&output).contains("--client-key"),
        "{}",
        stderr(&output)
    );
    assert!(double(&world).requests().is_empty());
}

#[test]
fn a_client_cert_without_its_key_in_the_environment_exits_2() {
    let (world, files) = tls_world("cert-no-key-env", &TestPki::new(), true);
    let mut command = world.consem(1, &["--ca-file", path(&files.ca)], &HELLO);
    command.env("CONSUL_CLIENT_CERT", &files.client);
    let output = run(command);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert_eq!(output.stdout, b"");
    assert!(
        stderr(&output).contains("--client-key"),
        "{}",
        stderr(&output)
    );
    assert!(double(&world).requests().is_empty());
}

// ---------------------------------------------------------------------------
// ACLs: exit 77 naming the permission; never prune on a filtered listing
// ---------------------------------------------------------------------------

/// Runs `command`, which Consul's ACLs must refuse: exit 77, the command
/// never ran, one error line; returns it.
fn denied(command: Command) -> String {
    let output = run(command);
    assert_eq!(output.status.code(), Some(77), "{}", stderr(&output));
    assert_eq!(output.stdout, b"", "the command must not run");
    let text = stderr(&output);
    let errors: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("consem: error: "))
        .collect();
    assert_eq!(errors.len(), 1, "{text}");
    assert!(
        errors[0].starts_with("consem: error: permission denied"),
        "{text}"
    );
    errors[0].to_string()
}

/// `world.consem` with `--token` in front of `--`.
fn consem_with_token(world: &World<TestConsul>, token: &str, command: &[&str]) -> Command {
    world.consem(1, &["--token", token], command)
}

#[test]
fn a_token_with_the_semaphore_rights_works() {
    let world = acl_world("acl-ok", |prefix| {
        Acl::new().token(TOKEN, Rights::semaphore(prefix))
    });
    let output = run(consem_with_token(&world, TOKEN, &HELLO));
    assert_ran(&world, &output, HELLO_OUT);
    assert_eq!(stderr(&output), "");
}

#[test]
fn a_token_without_session_write_exits_77_naming_it() {
    let world = acl_world("acl-no-session", |prefix| {
        Acl::new().token(
            TOKEN,
            Rights {
                session_write: false,
                ..Rights::semaphore(prefix)
            },
        )
    });
    let text = denied(consem_with_token(&world, TOKEN, &HELLO));
    assert!(text.contains("session:write"), "{text}");
    assert_clean(&world);
}

/// A token that may write no key, or every key but `.lock` (session IDs
/// start with a hex digit): refused at the first write it lacks, 77, naming
/// the key.
#[test]
fn a_token_without_key_write_exits_77_naming_it() {
    // Whether the token may write every key but `.lock`, else none.
    for (name, all_but_lock, named) in [
        ("acl-no-key-write", false, "/"),
        ("acl-no-lock-write", true, "/.lock"),
    ] {
        let writable = |prefix: &str| -> Vec<String> {
            match all_but_lock {
                true => "0123456789abcdef"
                    .chars()
                    .map(|digit| format!("{prefix}/{digit}"))
                    .collect(),
                false => Vec::new(),
            }
        };
        let world = acl_world(name, |prefix| {
            Acl::new().token(
                TOKEN,
                Rights {
                    session_write: true,
                    key_read: vec![prefix.to_string()],
                    key_write: writable(prefix),
                },
            )
        });
        let text = denied(consem_with_token(&world, TOKEN, &HELLO));
        assert!(
            text.contains(&format!("key:write on {}{named}", world.prefix)),
            "{name}: {text}"
        );
        assert_clean(&world);
    }
}

/// A token that may not write `.lock` while a consem with another token
/// holds the slot: the holder could hand it the slot by naming it in
/// `.lock`, and the run would learn only at release that it cannot leave
/// it. A token that may not read `.lock` either sees none (the listing
/// leaves it out, with a header or, as agents before 1.11 do, silently),
/// so the slot looks promised to the contender ahead. Each run says 77 as
/// it queues, not 75 at `--timeout` nor later, and the holder runs on.
#[test]
fn a_token_that_may_not_write_the_lock_key_exits_77_while_waiting() {
    let cases = [
        (Filtering::Announced, false),
        (Filtering::Silent, false),
        (Filtering::Silent, true),
    ];
    for (filtering, reads_lock) in cases {
        let world = acl_world("acl-hidden-lock", |_| Acl::new());
        let rights = Rights {
            session_write: true,
            key_read: if reads_lock {
                vec![world.prefix.clone()]
            } else {
                every_key_but(&world.prefix, ".lock")
            },
            key_write: every_key_but(&world.prefix, ".lock"),
        };
        assert_eq!(rights.can_read(&world.key(".lock")), reads_lock);
        assert!(!rights.can_write(&world.key(".lock")));
        let acl = Acl::new()
            .token(TOKEN, rights)
            .token(HELPER_TOKEN, Rights::all());
        double(&world).enable_acls(match filtering {
            Filtering::Announced => acl,
            Filtering::Silent => acl.silent_filtering(),
        });
        let holder = world
            .consem(
                1,
                &["--token", HELPER_TOKEN],
                &strs(&world.held_until("ready", "go", 0)),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_until(PROMPT, "the holder's command to start", || {
            world.exists("ready")
        });
        let before = keys(&world);
        // Waiting out the timeout would be 75.
        let text = denied(world.consem(1, &["--token", TOKEN, "--timeout", "60s"], &HELLO));
        assert!(
            text.contains(&format!("key:write on {}/.lock", world.prefix))
                || text.contains("left keys out"),
            "{filtering:?}: {text}"
        );
        assert_eq!(
            keys(&world),
            before,
            "{filtering:?}: the holder's state changed"
        );
        world.touch("go");
        let output = finish(holder);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{filtering:?}: {}",
            stderr(&output)
        );
        assert_clean(&world);
    }
}

#[test]
fn a_refused_acquire_says_only_the_error() {
    let world = acl_world("acl-one-line", |prefix| {
        Acl::new().token(
            TOKEN,
            Rights {
                session_write: true,
                key_read: vec![prefix.to_string()],
                key_write: vec![],
            },
        )
    });
    let output = run(consem_with_token(&world, TOKEN, &HELLO));
    assert_eq!(output.status.code(), Some(77), "{}", stderr(&output));
    assert_clean(&world);
    let line = one_line(&output);
    assert!(line.contains("key:write"), "{line}");
}

#[test]
fn no_token_exits_77() {
    let world = acl_world("acl-anonymous", |prefix| {
        Acl::new().token(TOKEN, Rights::semaphore(prefix))
    });
    let text = denied(world.consem(1, &[], &HELLO));
    assert!(text.contains("session:write"), "{text}");
    assert_clean(&world);
}

#[test]
fn an_unknown_token_exits_77() {
    let world = acl_world("acl-unknown", |prefix| {
        Acl::new().token(TOKEN, Rights::semaphore(prefix))
    });
    let text = denied(consem_with_token(&world, "no-such-token", &HELLO));
    assert!(text.contains("session:write"), "{text}");
    assert_clean(&world);
}

/// Key rules under `prefix/` that cover every key but `prefix/<hidden>` and
/// the keys below it: at each character of `hidden`, every other character a
/// session ID (or `.lock`) can hold there. With them, a listing of the
/// prefix leaves out exactly the hidden key.
fn every_key_but(prefix: &str, hidden: &str) -> Vec<String> {
    const ALPHABET: &str = "0123456789abcdefABCDEF-.";
    let mut rules = Vec::new();
    for (at, own) in hidden.char_indices() {
        for other in ALPHABET.chars().filter(|&c| c != own) {
            rules.push(format!("{prefix}/{}{other}", &hidden[..at]));
        }
    }
    rules
}

/// Plays a holder whose contender key the test will hide from consem's
/// token: a session, its contender key, and `.lock` naming it (Limit 1).
fn hidden_holder(world: &World<TestConsul>) -> String {
    let id = helper_session(world);
    let contender = format!(
        "/v1/kv/{}?acquire={id}&flags={SEMAPHORE_FLAGS}",
        encode_key(&world.key(&id))
    );
    let (status, body) = world.store.request("PUT", &contender, b"{}");
    assert_eq!((status, body.trim()), (200, "true"));
    let lock = format!(r#"{{"Limit":1,"Holders":{{"{id}":true}}}}"#);
    world
        .store
        .put(&world.key(".lock"), lock.as_bytes(), SEMAPHORE_FLAGS);
    id
}

/// A session made with the helpers' token, for a peer the test plays.
fn helper_session(world: &World<TestConsul>) -> String {
    let spec = serde_json::json!({"Name": "hidden peer", "TTL": "30s", "Behavior": "delete"});
    let (status, body) =
        world
            .store
            .request("PUT", "/v1/session/create", spec.to_string().as_bytes());
    assert_eq!(status, 200, "{body}");
    serde_json::from_str::<serde_json::Value>(&body).unwrap()["ID"]
        .as_str()
        .unwrap()
        .to_string()
}

/// How an agent treats a listing that holds keys the token cannot read.
#[derive(Clone, Copy, Debug)]
enum Filtering {
    /// Consul 1.11 and later: left out, and said so in a header.
    Announced,
    /// Earlier agents (1.0.8 among them): left out without a word.
    Silent,
}

const BOTH_FILTERINGS: [Filtering; 2] = [Filtering::Announced, Filtering::Silent];

/// ACLs in which `TOKEN` can read and write every key under the world's
/// prefix but `hidden`'s contender key, and the helpers can do anything.
fn hiding_acl(world: &World<TestConsul>, hidden: &str, filtering: Filtering) -> Acl {
    let rights = Rights {
        session_write: true,
        key_read: vec![],
        key_write: every_key_but(&world.prefix, hidden),
    };
    assert!(rights.can_write(&world.key(".lock")));
    assert!(!rights.can_read(&world.key(hidden)));
    let acl = Acl::new()
        .token(TOKEN, rights)
        .token(HELPER_TOKEN, Rights::all());
    match filtering {
        Filtering::Announced => acl,
        Filtering::Silent => acl.silent_filtering(),
    }
}

/// A world where consem's `TOKEN` can write its own contender key and
/// `.lock`, but cannot read the contender key of a live holder that `.lock`
/// names (Limit 1): listings leave it out, and say so or not as `filtering`
/// has it. Pruning on such a listing would drop the holder and run a second
/// job under Limit 1. Returns the world and the holder's session.
fn filtered_world(name: &str, filtering: Filtering) -> (World<TestConsul>, String) {
    let world = acl_world(name, |_| Acl::new());
    let peer = hidden_holder(&world);
    double(&world).enable_acls(hiding_acl(&world, &peer, filtering));
    // What the token sees: .lock naming the holder, but not its key.
    let url = format!(
        "{}/v1/kv/{}/?recurse",
        world.store.base_url(),
        encode_key(&world.prefix)
    );
    let seen = http_request(&http_agent(), "GET", &url, Some(TOKEN), b"").unwrap();
    let header = seen.header("X-Consul-Results-Filtered-By-ACLs");
    match filtering {
        Filtering::Announced => assert_eq!(header, Some("true")),
        Filtering::Silent => assert_eq!(header, None),
    }
    assert!(
        seen.body.contains("/.lock") && !seen.body.contains(&format!("/{peer}\"")),
        "{}",
        seen.body
    );
    (world, peer)
}

fn assert_filtering_explained(world: &World<TestConsul>, error: &str) {
    assert!(
        error.contains("left keys out")
            && error.contains(&format!("key:read on {}/", world.prefix)),
        "{error}"
    );
}

/// `consem <subcommand> --prefix <prefix> --token TOKEN <extra>` against the world.
fn admin_with_token(world: &World<TestConsul>, subcommand: &str, extra: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_consem"));
    for name in CONSUL_ENV {
        command.env_remove(name);
    }
    command
        .env("CONSUL_HTTP_ADDR", world.http_addr())
        .args([subcommand, "--prefix", &world.prefix, "--token", TOKEN])
        .args(extra)
        .stdin(Stdio::null());
    run(command)
}

#[test]
fn a_hidden_holder_is_never_pruned_and_the_run_exits_77() {
    for filtering in BOTH_FILTERINGS {
        let (world, peer) = filtered_world("acl-filtered", filtering);
        let before = keys(&world);
        assert_eq!(before.len(), 2, "{before:?}");
        let ran = world.path("ran");
        let child = ["sh", "-c", &format!("touch '{ran}'")];
        let error = denied(consem_with_token(&world, TOKEN, &child));
        assert_filtering_explained(&world, &error);
        assert!(
            !world.exists("ran"),
            "{filtering:?}: the command ran without a slot"
        );
        assert_eq!(
            keys(&world),
            before,
            "{filtering:?}: .lock or the holder's key changed"
        );
        let sessions: Vec<String> = double(&world)
            .sessions()
            .into_iter()
            .map(|s| s.id)
            .collect();
        assert_eq!(
            sessions,
            vec![peer],
            "{filtering:?}: consem's session was left behind"
        );
    }
}

#[test]
fn status_and_reset_never_call_a_hidden_holder_dead() {
    for filtering in BOTH_FILTERINGS {
        let (world, _peer) = filtered_world("acl-filtered-admin", filtering);
        let before = keys(&world);
        for (subcommand, extra) in [
            ("status", &[][..]),
            ("status", &["--json"][..]),
            ("reset", &[][..]),
            ("reset", &["--force"][..]),
        ] {
            let output = admin_with_token(&world, subcommand, extra);
            let what = format!("{filtering:?}: {subcommand} {extra:?}");
            assert_eq!(
                output.status.code(),
                Some(77),
                "{what}: {}",
                stderr(&output)
            );
            assert_eq!(
                output.stdout, b"",
                "{what}: no output from a partial listing"
            );
            let error = one_line(&output);
            assert!(error.starts_with("consem: error: "), "{what}: {error}");
            assert_filtering_explained(&world, &error);
            assert_eq!(keys(&world), before, "{what} changed the semaphore");
        }
    }
}

#[test]
fn a_dead_holder_is_still_pruned_with_a_token_that_cannot_read_everything() {
    // The token may not read a part of the prefix, but the dead holder's
    // key is outside it: a direct read of it says 404, so it is pruned.
    let world = acl_world("acl-dead-holder", |_| Acl::new());
    let peer = hidden_holder(&world);
    let elsewhere = "ffffffff-0000-4000-8000-000000000000";
    double(&world).enable_acls(hiding_acl(&world, elsewhere, Filtering::Silent));
    world.store.destroy_session(&peer);
    let lock = world.lock_value().expect(".lock stays");
    assert_eq!(lock["Holders"][&peer], true, "{lock}");
    let output = admin_with_token(&world, "status", &["--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let status: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        status["dead_holders"],
        serde_json::json!([peer]),
        "{status}"
    );
    let output = run(consem_with_token(&world, TOKEN, &HELLO));
    assert_ran(&world, &output, HELLO_OUT);
}

#[test]
fn a_dead_holder_whose_key_the_token_cannot_read_is_not_pruned_either() {
    // Its session is gone, but the token cannot tell: agents filter
    // session reads by ACL without a word, as they filter listings.
    let (world, peer) = filtered_world("acl-dead-hidden", Filtering::Silent);
    world.store.destroy_session(&peer);
    let before = keys(&world);
    let error = denied(consem_with_token(&world, TOKEN, &HELLO));
    assert_filtering_explained(&world, &error);
    assert_eq!(keys(&world), before, ".lock changed");
}

#[test]
fn leaving_keeps_a_hidden_holder_in_lock() {
    for filtering in BOTH_FILTERINGS {
        // consem holds one of 2 slots; then a holder whose key its token
        // cannot read takes the other. Leaving last as far as it can see,
        // consem must not delete .lock (nor drop the holder from it).
        let world = acl_world("acl-hidden-leaving", |_| Acl::new());
        let peer = helper_session(&world);
        double(&world).enable_acls(hiding_acl(&world, &peer, filtering));
        let mut command = world.consem(
            2,
            &["--token", TOKEN],
            &strs(&world.held_until("ready", "go", 0)),
        );
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_until(PROMPT, "consem to start its command", || {
            world.exists("ready")
        });
        let acquired = format!(
            "/v1/kv/{}?acquire={peer}&flags={SEMAPHORE_FLAGS}",
            encode_key(&world.key(&peer))
        );
        let (status, body) = world.store.request("PUT", &acquired, b"{}");
        assert_eq!((status, body.trim()), (200, "true"));
        let mut lock = world.lock_value().expect("consem wrote .lock");
        lock["Holders"][&peer] = serde_json::Value::Bool(true);
        world.store.put(
            &world.key(".lock"),
            lock.to_string().as_bytes(),
            SEMAPHORE_FLAGS,
        );
        world.touch("go");
        let output = finish(child);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{filtering:?}: {}",
            stderr(&output)
        );
        let lock = world
            .lock_value()
            .expect(".lock must stay while the hidden holder holds");
        assert_eq!(
            lock["Holders"],
            serde_json::json!({ peer.clone(): true }),
            "{filtering:?}: {lock}"
        );
    }
}

// ---------------------------------------------------------------------------
// The token: only in X-Consul-Token, never in a URL or in any output
// ---------------------------------------------------------------------------

#[test]
fn the_token_never_appears_in_verbose_output() {
    let world = acl_world("token-output", |prefix| {
        Acl::new()
            .token(TOKEN, Rights::semaphore(prefix))
            .token(OTHER_TOKEN, Rights::none())
    });
    // Runs that work, and runs that are denied, with -v in both formats.
    for format in ["text", "json"] {
        let extra = ["-v", "--log-format", format, "--token", TOKEN];
        let output = run(world.consem(1, &extra, &HELLO));
        assert_ran(&world, &output, HELLO_OUT);
        let log = stderr(&output);
        assert!(log.contains("acquired"), "-v shows events: {log}");
        assert!(!log.contains(TOKEN), "{log}");
        let extra = ["-v", "--log-format", format, "--token", OTHER_TOKEN];
        let output = run(world.consem(1, &extra, &HELLO));
        assert_eq!(output.status.code(), Some(77), "{}", stderr(&output));
        for text in [
            stderr(&output),
            String::from_utf8_lossy(&output.stdout).into(),
        ] {
            assert!(!text.contains(OTHER_TOKEN), "{text}");
        }
        assert_clean(&world);
    }
}

#[test]
fn the_token_travels_only_in_x_consul_token() {
    let world = acl_world("token-header", |prefix| {
        Acl::new().token(TOKEN, Rights::semaphore(prefix))
    });
    let output = run(world.consem(1, &["-v", "--token", TOKEN], &HELLO));
    assert_ran(&world, &output, HELLO_OUT);
    let all = double(&world).requests();
    assert!(all.iter().all(|r| !r.url_contains(TOKEN)), "{all:?}");
    assert_eq!(double(&world).tokens_in_urls(), Vec::<String>::new());
    let requests = consem_requests(&world);
    for request in &requests {
        assert_eq!(
            request.header("X-Consul-Token"),
            Some(TOKEN),
            "{} {}",
            request.method,
            request.target
        );
        assert_eq!(request.header("Authorization"), None);
    }
    // Every request that is not the helpers' is consem's.
    let others = all
        .iter()
        .filter(|r| r.token() != Some(HELPER_TOKEN))
        .count();
    assert_eq!(others, requests.len());
}

// ---------------------------------------------------------------------------
// Token sources, end to end
// ---------------------------------------------------------------------------

/// A world where only `winner` may run the semaphore and `loser` may do
/// nothing, so that exit 0 shows which token consem sent.
fn precedence_world(name: &str, winner: &str, loser: &str) -> World<TestConsul> {
    acl_world(name, |prefix| {
        Acl::new()
            .token(winner, Rights::semaphore(prefix))
            .token(loser, Rights::none())
    })
}

fn assert_sent_only(world: &World<TestConsul>, token: &str) {
    for request in consem_requests(world) {
        assert_eq!(
            request.header("X-Consul-Token"),
            Some(token),
            "{} {}",
            request.method,
            request.target
        );
    }
}

#[test]
fn the_token_file_from_the_environment_wins_over_the_token_flag() {
    let world = precedence_world("token-file-wins", TOKEN, OTHER_TOKEN);
    let file = world.dir.join("token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    let mut command = world.consem(1, &["--token", OTHER_TOKEN], &HELLO);
    command.env("CONSUL_HTTP_TOKEN_FILE", &file);
    let output = run(command);
    assert_ran(&world, &output, HELLO_OUT);
    assert_sent_only(&world, TOKEN);
}

#[test]
fn the_token_file_flag_wins_over_the_token_variable() {
    let world = precedence_world("token-file-flag", TOKEN, OTHER_TOKEN);
    let file = world.dir.join("token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    let mut command = world.consem(1, &["--token-file", path(&file)], &HELLO);
    command.env("CONSUL_HTTP_TOKEN", OTHER_TOKEN);
    let output = run(command);
    assert_ran(&world, &output, HELLO_OUT);
    assert_sent_only(&world, TOKEN);
}

#[test]
fn the_token_flag_wins_over_the_token_variable() {
    let world = precedence_world("token-flag-wins", TOKEN, OTHER_TOKEN);
    let mut command = world.consem(1, &["--token", TOKEN], &HELLO);
    command.env("CONSUL_HTTP_TOKEN", OTHER_TOKEN);
    let output = run(command);
    assert_ran(&world, &output, HELLO_OUT);
    assert_sent_only(&world, TOKEN);
}

#[test]
fn the_token_variable_is_used_alone() {
    let world = precedence_world("token-env", TOKEN, OTHER_TOKEN);
    let mut command = world.consem(1, &[], &HELLO);
    command.env("CONSUL_HTTP_TOKEN", TOKEN);
    let output = run(command);
    assert_ran(&world, &output, HELLO_OUT);
    assert_sent_only(&world, TOKEN);
}

#[test]
fn consul_http_auth_sends_basic_authentication() {
    let world = plain_world("basic-auth");
    let mut command = world.consem(1, &[], &HELLO);
    command.env("CONSUL_HTTP_AUTH", "user:pass");
    let output = run(command);
    assert_ran(&world, &output, HELLO_OUT);
    for request in consem_requests(&world) {
        assert_eq!(
            request.header("Authorization"),
            Some("Basic dXNlcjpwYXNz"),
            "{} {}",
            request.method,
            request.target
        );
        assert!(!request.url_contains("pass"), "{}", request.target);
    }
}

// ---------------------------------------------------------------------------
// Datacenter, namespace, partition on every call
// ---------------------------------------------------------------------------

fn assert_scoped(world: &World<TestConsul>, dc: Option<&str>, ns: &str, partition: &str) {
    let requests = consem_requests(world);
    // Session, contender key, listing, .lock, and the release's calls.
    assert!(requests.len() >= 6, "{requests:?}");
    for request in requests {
        let what = format!("{} {}", request.method, request.target);
        assert_eq!(request.query_value("dc"), dc, "{what}");
        assert_eq!(request.query_value("ns"), Some(ns), "{what}");
        assert_eq!(request.query_value("partition"), Some(partition), "{what}");
    }
}

#[test]
fn datacenter_namespace_and_partition_flags_go_on_every_request() {
    let world = plain_world("scope-flags");
    let extra = [
        "--datacenter",
        "dc1",
        "--namespace",
        "team-a",
        "--partition",
        "part-b",
    ];
    let output = run(world.consem(1, &extra, &HELLO));
    assert_ran(&world, &output, HELLO_OUT);
    assert_scoped(&world, Some("dc1"), "team-a", "part-b");
}

#[test]
fn namespace_and_partition_variables_go_on_every_request() {
    let world = plain_world("scope-env");
    let mut command = world.consem(1, &[], &HELLO);
    command
        .env("CONSUL_NAMESPACE", "team-a")
        .env("CONSUL_PARTITION", "part-b");
    let output = run(command);
    assert_ran(&world, &output, HELLO_OUT);
    assert_scoped(&world, None, "team-a", "part-b");
}

#[test]
fn a_session_destroyed_under_acls_ends_the_run_without_a_cleanup_warning() {
    // With ACLs on, agents answer 500 "Unknown session" to destroying a
    // session that is gone (200 without ACLs): consem takes it as done.
    let world = acl_world("acl-destroyed", |prefix| {
        Acl::new().token(TOKEN, Rights::semaphore(prefix))
    });
    let holder = world
        .consem(
            1,
            &["--token", TOKEN, "--kill-grace", "1s"],
            &strs(&world.held_until("ready", "go", 0)),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    crate::common::wait_until(PROMPT, "the command to start", || world.exists("ready"));
    let (session, _) = world.sessions().into_iter().next().expect("a session");
    world.store.destroy_session(&session);
    let output = finish(holder);
    assert_eq!(output.status.code(), Some(76), "{}", stderr(&output));
    assert!(
        !stderr(&output).contains("could not clean up"),
        "{}",
        stderr(&output)
    );
    assert_clean(&world);
}

#[test]
fn a_lock_the_token_cannot_read_is_not_reported_as_no_semaphore() {
    // A consul lock -n peer holds; the token can read every key but .lock.
    let world = acl_world("acl-hidden-lock", |_| Acl::new());
    let _peer = hidden_holder(&world);
    let rights = Rights {
        session_write: true,
        key_read: vec![],
        key_write: every_key_but(&world.prefix, ".lock"),
    };
    assert!(!rights.can_read(&world.key(".lock")));
    double(&world).enable_acls(
        Acl::new()
            .token(TOKEN, rights)
            .token(HELPER_TOKEN, Rights::all())
            .silent_filtering(),
    );
    for subcommand in ["status", "reset"] {
        let output = admin_with_token(&world, subcommand, &[]);
        assert_eq!(
            output.status.code(),
            Some(77),
            "{subcommand}: {}",
            stderr(&output)
        );
        let error = one_line(&output);
        assert!(
            error.contains(&format!("key:read on {}/.lock", world.prefix)),
            "{error}"
        );
    }
}

/// With no --ca-file or --ca-path, consem trusts the operating system's
/// store, as the consul CLI does: here pointed at the test CA with
/// SSL_CERT_FILE, as a company CA would be installed; -v says which roots.
#[test]
fn the_system_trust_store_is_used_by_default() {
    let pki = TestPki::new();
    let (world, files) = tls_world("system-roots", &pki, false);
    let mut command = world.consem(1, &["-v"], &HELLO);
    command
        .env("SSL_CERT_FILE", &files.ca)
        .env_remove("SSL_CERT_DIR");
    let output = run(command);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(String::from_utf8_lossy(&output.stdout), HELLO_OUT);
    assert!(
        stderr(&output).contains(" tls-roots source=\"system"),
        "{}",
        stderr(&output)
    );
    assert_clean(&world);
}
