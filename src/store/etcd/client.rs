//! A client of etcd's JSON gateway (`/v3/...`, the gRPC API over HTTP/1.1
//! with keys and values in base64), on the HTTP client consem already has:
//! the handful of calls the semaphore needs, failing over between the
//! endpoints given, and signing in with a user's password when one is set.

use std::io::BufRead as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{json, Value};
use ureq::http;
use ureq::RequestExt as _;

use crate::store::tls::{self, TlsSettings};
use crate::store::StoreError;

/// A member of the cluster runs next to its clients or near them.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Budget of one call (a watch gets its wait on top).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest answer read: a listing of many contenders with their
/// descriptions fits well within.
const MAX_BODY: u64 = 32 * 1024 * 1024;

/// etcdctl's names for the server and its TLS settings.
pub const TLS_NAMES: tls::Names = tls::Names {
    server: "the etcd server",
    ca_file: "--cacert/ETCDCTL_CACERT",
    ca_path: "--cacert/ETCDCTL_CACERT",
    client_cert: "--cert/ETCDCTL_CERT",
    client_key: "--key/ETCDCTL_KEY",
    address: "--store",
    server_name: None,
    plain: "use etcd:// in --store",
};

/// How a call failed, sorted by what can be done about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcdError {
    /// No connection (refused, no route, none within the connect timeout),
    /// a lost connection: worth trying again, on the next endpoint.
    Transient(String),
    /// etcd took the request but did not answer within the call's budget:
    /// a busy server (or a frozen one), not one that cannot be reached.
    Slow(String),
    /// An answer that etcd cannot serve now (no leader, a leader change, a
    /// member catching up): worth trying again shortly.
    NotReady(String),
    /// The credentials or the user's permissions.
    Denied(String),
    /// The lease is unknown to etcd: it expired or was revoked.
    LeaseGone,
    /// An answer that retrying will not change.
    Failed(String),
}

impl std::fmt::Display for EtcdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EtcdError::Transient(m)
            | EtcdError::Slow(m)
            | EtcdError::NotReady(m)
            | EtcdError::Denied(m)
            | EtcdError::Failed(m) => f.write_str(m),
            EtcdError::LeaseGone => {
                f.write_str("etcd does not know the lease (expired or revoked)")
            }
        }
    }
}

impl std::error::Error for EtcdError {}

/// etcd's 64-bit numbers come as JSON strings, and zero values not at all.
fn int64<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    match Value::deserialize(deserializer)? {
        Value::String(text) => text.parse().map_err(serde::de::Error::custom),
        Value::Number(number) => number
            .as_i64()
            .ok_or_else(|| serde::de::Error::custom("not a 64-bit integer")),
        Value::Null => Ok(0),
        other => Err(serde::de::Error::custom(format!("not a number: {other}"))),
    }
}

fn bytes<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
    let text = Option::<String>::deserialize(deserializer)?.unwrap_or_default();
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(serde::de::Error::custom)
}

pub fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// The end of the range of every key that starts with `prefix`.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff: to the end of the key space.
    vec![0]
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Header {
    #[serde(default, deserialize_with = "int64")]
    pub revision: i64,
}

/// A key as etcd describes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct KeyValue {
    #[serde(default, deserialize_with = "bytes")]
    pub key: Vec<u8>,
    #[serde(default, deserialize_with = "int64")]
    pub create_revision: i64,
    #[serde(default, deserialize_with = "int64")]
    pub mod_revision: i64,
    #[serde(default, deserialize_with = "bytes")]
    pub value: Vec<u8>,
    #[serde(default, deserialize_with = "int64")]
    pub lease: i64,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RangeReply {
    #[serde(default)]
    pub header: Header,
    #[serde(default)]
    pub kvs: Vec<KeyValue>,
    /// More keys matched than the read's limit let through.
    #[serde(default)]
    pub more: bool,
    /// Every key in the range, whatever the read's limit and revision
    /// filters (etcd counts before it filters).
    #[serde(default, deserialize_with = "int64")]
    pub count: i64,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct TxnReply {
    #[serde(default)]
    pub header: Header,
    #[serde(default)]
    pub succeeded: bool,
    #[serde(default)]
    pub responses: Vec<Value>,
}

impl TxnReply {
    /// What the `i`th operation (a range) read, as of the transaction's
    /// revision.
    pub fn listing(&self, i: usize) -> RangeReply {
        let mut reply: RangeReply = self
            .responses
            .get(i)
            .and_then(|r| r.get("response_range"))
            .and_then(|r| RangeReply::deserialize(r).ok())
            .unwrap_or_default();
        reply.header = self.header.clone();
        reply
    }

    /// The keys the `i`th operation (a range) read.
    pub fn range(&self, i: usize) -> Vec<KeyValue> {
        self.listing(i).kvs
    }
}

/// A condition of a transaction.
pub enum Compare<'a> {
    /// The key's create revision (0: it does not exist).
    Created(&'a [u8], i64),
    /// The key holds this value.
    Value(&'a [u8], &'a [u8]),
    /// No key in `[from, to)` was written after `revision`.
    UnchangedSince(&'a [u8], &'a [u8], i64),
    /// No key in `[from, to)`: every key in a range must pass a compare,
    /// and only an absent one has create revision 0.
    NoKeyIn(&'a [u8], &'a [u8]),
}

impl Compare<'_> {
    fn to_json(&self) -> Value {
        match self {
            Compare::Created(key, revision) => json!({
                "key": b64(key), "target": "CREATE", "result": "EQUAL",
                "create_revision": revision.to_string(),
            }),
            Compare::Value(key, value) => json!({
                "key": b64(key), "target": "VALUE", "result": "EQUAL", "value": b64(value),
            }),
            Compare::NoKeyIn(from, to) => json!({
                "key": b64(from), "range_end": b64(to), "target": "CREATE", "result": "EQUAL",
                "create_revision": "0",
            }),
            Compare::UnchangedSince(from, to, revision) => json!({
                "key": b64(from), "range_end": b64(to), "target": "MOD", "result": "LESS",
                "mod_revision": (revision + 1).to_string(),
            }),
        }
    }
}

/// An operation of a transaction.
#[derive(Clone, Copy)]
pub enum Op<'a> {
    /// Writes the key, attached to a lease (0: none).
    Put(&'a [u8], &'a [u8], i64),
    Get(&'a [u8]),
    /// Every key in `[from, to)`, oldest first.
    List(&'a [u8], &'a [u8]),
    /// The oldest `n` keys in `[from, to)` (by create revision), oldest
    /// first.
    Oldest(&'a [u8], &'a [u8], i64),
    /// The newest `n` keys in `[from, to)` created at this revision or
    /// before (0: any), newest first.
    NewestUpTo(&'a [u8], &'a [u8], i64, i64),
    /// The first `n` keys in `[from, to)` in key order: unsorted, etcd
    /// reads no more than these, however many keys the range holds (a read
    /// sorted, or filtered by revision, reads every key of the range).
    FirstByKey(&'a [u8], &'a [u8], i64),
    Delete(&'a [u8]),
}

impl Op<'_> {
    fn as_json(&self) -> Value {
        match self {
            Op::Put(key, value, lease) => {
                let mut put = json!({"key": b64(key), "value": b64(value)});
                if *lease != 0 {
                    put["lease"] = json!(lease.to_string());
                }
                json!({ "request_put": put })
            }
            Op::Get(key) => json!({"request_range": {"key": b64(key)}}),
            Op::List(from, to) => json!({"request_range": {
                "key": b64(from), "range_end": b64(to),
                "sort_order": "ASCEND", "sort_target": "CREATE",
            }}),
            Op::Oldest(from, to, n) => json!({"request_range": {
                "key": b64(from), "range_end": b64(to),
                "sort_order": "ASCEND", "sort_target": "CREATE", "limit": n.to_string(),
            }}),
            Op::FirstByKey(from, to, n) => json!({"request_range": {
                "key": b64(from), "range_end": b64(to), "limit": n.to_string(),
            }}),
            Op::NewestUpTo(from, to, revision, n) => {
                let mut range = json!({
                    "key": b64(from), "range_end": b64(to),
                    "sort_order": "DESCEND", "sort_target": "CREATE", "limit": n.to_string(),
                });
                if *revision != 0 {
                    range["max_create_revision"] = json!(revision.to_string());
                }
                json!({ "request_range": range })
            }
            Op::Delete(key) => json!({"request_delete_range": {"key": b64(key)}}),
        }
    }
}

/// What a revoke found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revoked {
    /// The lease is gone now (this call revoked it, or may have).
    Now,
    /// etcd no longer had the lease: it expired, or someone revoked it.
    AlreadyGone,
}

/// The shortest wait worth opening a watch for: with less left before the
/// next keep-alive, renew first.
pub const SHORTEST_WATCH: Duration = Duration::from_millis(50);

/// What a watch saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Watched {
    /// Something changed.
    Changed(Changes),
    /// Nothing changed within the wait.
    Quiet,
    /// etcd ended the watch (cancelled, or the member went away): read
    /// again.
    Ended,
}

/// The events of one watch response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changes {
    /// The keys deleted, in order.
    pub deleted: Vec<Vec<u8>>,
    /// The revision of the last event.
    pub through: i64,
}

#[derive(Deserialize)]
struct Event {
    /// `DELETE`; a put is etcd's zero value, left out.
    #[serde(default, rename = "type")]
    kind: String,
    #[serde(default)]
    kv: KeyValue,
}

impl Changes {
    /// The changes among `events` made after revision `after`; `None` if
    /// there are none.
    fn of(events: &[Event], after: i64) -> Option<Changes> {
        let events: Vec<&Event> = events
            .iter()
            .filter(|e| e.kv.mod_revision > after)
            .collect();
        Some(Changes {
            deleted: events
                .iter()
                .filter(|e| e.kind == "DELETE")
                .map(|e| e.kv.key.clone())
                .collect(),
            through: events.iter().map(|e| e.kv.mod_revision).max()?,
        })
    }
}

/// What to watch.
pub struct WatchRequest<'a> {
    pub key: &'a [u8],
    /// `Some`: every key in `[key, end)`.
    pub end: Option<&'a [u8]>,
    /// Only deletions (a departure), not writes.
    pub deletions_only: bool,
    /// `Some`: every change after this revision, though etcd has passed
    /// it. etcd serves such a watch late, catching it up only every 100 ms
    /// (see [`Watch`]): for a waiter far back in the queue, which spares a
    /// read of what changed since. `None`: from where etcd stands.
    pub after: Option<i64>,
}

/// A watch etcd has created. Unless asked for an earlier start, it starts
/// where etcd stood then, so that etcd serves it live: a watch that starts at a revision etcd has passed is
/// caught up only by a loop that runs every 100 ms, with every change held
/// back until then (`mvcc/watchable_store.go`), and on a busy etcd every
/// read is soon passed. What changed between a read and `created_at` is
/// the caller's to read again.
pub struct Watch {
    lines: std::io::BufReader<ureq::BodyReader<'static>>,
    deadline: Instant,
    /// The watch tells every change after this revision: etcd's when it
    /// created the watch, or the one asked for.
    pub created_at: i64,
}

#[derive(Serialize)]
struct Authenticate<'a> {
    name: &'a str,
    password: &'a str,
}

/// The endpoints and credentials of one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    /// `http://host:port` or `https://host:port`, in the order to try them.
    pub endpoints: Vec<String>,
    /// User name and password.
    pub user: Option<(String, String)>,
    pub tls: TlsSettings,
}

/// A client of one cluster. Its calls may come from several threads.
pub struct Client {
    /// Unary calls. A watch never gives its connection back to the pool,
    /// so watches have their own agent: otherwise a watch takes the
    /// connection the last call left, and a holder's release must open
    /// another (about 0.4 ms of a 3 ms handoff).
    agent: ureq::Agent,
    watch_agent: ureq::Agent,
    connection: Connection,
    /// The endpoint calls go to; moves on when one fails.
    current: AtomicUsize,
    /// The token `/v3/auth/authenticate` gave.
    token: Mutex<Option<String>>,
}

impl Client {
    /// Builds the client; TLS files are read now, so a bad one is reported
    /// at start.
    pub fn new(connection: Connection) -> Result<Client, StoreError> {
        let mut builder = ureq::Agent::config_builder()
            .http_status_as_error(false)
            // The cluster is addressed directly, as etcdctl does.
            .proxy(None)
            .max_redirects(0)
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .user_agent(concat!("consem/", env!("CARGO_PKG_VERSION")));
        if connection.endpoints.iter().any(|e| e.starts_with("https:")) {
            let tls = connection.tls.load(&TLS_NAMES);
            builder =
                builder.tls_config(tls.map_err(|e| StoreError::usage(e.to_string()).caused_by(e))?);
        }
        let config = builder.build();
        let agent = |config| {
            ureq::Agent::with_parts(
                config,
                ureq::unversioned::transport::DefaultConnector::new(),
                crate::store::resolver::DirectResolver { pinned: None },
            )
        };
        Ok(Client {
            watch_agent: agent(config.clone()),
            agent: agent(config),
            connection,
            current: AtomicUsize::new(0),
            token: Mutex::new(None),
        })
    }

    fn endpoint(&self) -> (usize, &str) {
        let endpoints = &self.connection.endpoints;
        let i = self.current.load(Ordering::Relaxed) % endpoints.len();
        (i, &endpoints[i])
    }

    /// Moves on from endpoint `failed`, unless another thread did already.
    fn fail_over(&self, failed: usize) {
        let next = (failed + 1) % self.connection.endpoints.len();
        let _ = self
            .current
            .compare_exchange(failed, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Sends `body` to `path` and returns the answer's body, as a reader
    /// for a watch's stream. Signs in first when a user is set, and again
    /// once if etcd no longer takes the token.
    fn send(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
        resent: &mut bool,
    ) -> Result<ureq::http::Response<ureq::Body>, EtcdError> {
        self.send_or_time_out(path, body, timeout, false, resent)
            .map_err(|e| {
                e.unwrap_or_else(|| {
                    EtcdError::Transient(format!("etcd did not answer {path} in time"))
                })
            })
    }

    /// [`Client::send`]; with `watching`, a timeout is `Err(None)`: the
    /// watch's wait is over, and the endpoint is not to blame. `resent` is
    /// set if a try that may have reached etcd was followed by another.
    fn send_or_time_out(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
        watching: bool,
        resent: &mut bool,
    ) -> Result<ureq::http::Response<ureq::Body>, Option<EtcdError>> {
        let mut signed_in_again = false;
        // A member that cannot be reached is passed over for the next one,
        // once each, and one more try: a pooled connection that the network
        // dropped silently (a NAT or a load balancer that forgot it) fails
        // only when used, and the next try opens a fresh one. Every call of
        // the recipe may be sent again.
        let mut tries_left = self.connection.endpoints.len() + 1;
        loop {
            tries_left = tries_left.saturating_sub(1);
            let token = match self.token() {
                Ok(token) => token,
                Err(EtcdError::Transient(_) | EtcdError::NotReady(_)) if tries_left > 0 => continue,
                Err(error) => return Err(Some(error)),
            };
            let (index, endpoint) = self.endpoint();
            let url = format!("{endpoint}{path}");
            let mut request = http::Request::builder()
                .method(http::Method::POST)
                .uri(&url)
                .header("Content-Type", "application/json")
                // A member cut off from the others must not serve a watch
                // that would never fire (etcd's `hasleader` metadata).
                .header("Grpc-Metadata-hasleader", "true");
            if let Some(token) = &token {
                request = request.header("Authorization", token.as_str());
            }
            let result = request
                .body(body.to_string())
                .map_err(|e| {
                    Some(EtcdError::Failed(format!(
                        "cannot build a request to {url}: {e}"
                    )))
                })?
                .with_agent(if watching {
                    &self.watch_agent
                } else {
                    &self.agent
                })
                .configure()
                .timeout_global(Some(timeout))
                .build()
                .run();
            let mut response = match result {
                Ok(response) => response,
                Err(ureq::Error::Timeout(_)) if watching => return Err(None),
                Err(ureq::Error::Timeout(stage)) if took_the_request(stage) => {
                    self.fail_over(index);
                    return Err(Some(EtcdError::Slow(format!(
                        "etcd at {endpoint} took {path} but did not answer within {}",
                        crate::duration::human(timeout)
                    ))));
                }
                Err(error) => {
                    self.fail_over(index);
                    if tries_left > 0 && !matches!(error, ureq::Error::Timeout(_)) {
                        *resent |= may_have_arrived(&error);
                        continue;
                    }
                    let https = endpoint.starts_with("https:");
                    let no_client_cert = https && self.connection.tls.client_cert.is_none();
                    let host = endpoint
                        .split("://")
                        .nth(1)
                        .and_then(|hp| hp.rsplit_once(':').map(|(h, _)| h))
                        .unwrap_or(endpoint);
                    return Err(Some(
                        match tls::explain(&error, host, no_client_cert, &TLS_NAMES) {
                            Some(why) => EtcdError::Failed(format!(
                                "cannot talk to etcd at {endpoint}: {why}"
                            )),
                            None => EtcdError::Transient(format!(
                                "cannot reach etcd at {endpoint}: {} (is etcd running? check --store or ETCDCTL_ENDPOINTS)",
                                crate::store::network_cause(&error.to_string())
                            )),
                        },
                    ));
                }
            };
            if response.status() == http::StatusCode::OK {
                return Ok(response);
            }
            let status = response.status();
            let error = classify(status, &error_text(&mut response), endpoint);
            if error == Failure::TokenExpired && !signed_in_again && self.connection.user.is_some()
            {
                signed_in_again = true;
                *self.token.lock().unwrap_or_else(|e| e.into_inner()) = None;
                continue;
            }
            if let Failure::Error(EtcdError::Transient(_) | EtcdError::NotReady(_)) = &error {
                self.fail_over(index);
            }
            return Err(Some(match error {
                Failure::Error(error) => error,
                Failure::TokenExpired => EtcdError::Denied(format!(
                    "etcd at {endpoint} refused the sign-in token: check --user or ETCDCTL_USER"
                )),
            }));
        }
    }

    /// The token to send, signing in if need be.
    fn token(&self) -> Result<Option<String>, EtcdError> {
        let Some((name, password)) = &self.connection.user else {
            return Ok(None);
        };
        let mut token = self.token.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(token) = token.as_ref() {
            return Ok(Some(token.clone()));
        }
        let (index, endpoint) = self.endpoint();
        let url = format!("{endpoint}/v3/auth/authenticate");
        let body = serde_json::to_string(&Authenticate { name, password })
            .expect("credentials always encode");
        let mut response = self
            .agent
            .post(&url)
            .config()
            .timeout_global(Some(CALL_TIMEOUT))
            .build()
            .header("Content-Type", "application/json")
            .send(body)
            .map_err(|error| {
                self.fail_over(index);
                EtcdError::Transient(format!(
                    "cannot reach etcd at {endpoint}: {} (is etcd running? check --store or ETCDCTL_ENDPOINTS)",
                    crate::store::network_cause(&error.to_string())
                ))
            })?;
        let status = response.status();
        let text = error_text(&mut response);
        if status != http::StatusCode::OK {
            return Err(match classify(status, &text, endpoint) {
                Failure::Error(EtcdError::Failed(why)) if why.contains("authentication failed") => {
                    EtcdError::Denied(format!(
                        "permission denied: etcd at {endpoint} refused user '{name}' with that password: check --user and --password (ETCDCTL_USER, ETCDCTL_PASSWORD)"
                    ))
                }
                Failure::Error(error) => error,
                Failure::TokenExpired => EtcdError::Denied(format!(
                    "permission denied: etcd at {endpoint} refused user '{name}'"
                )),
            });
        }
        let reply: Value = serde_json::from_str(&text).unwrap_or_default();
        let fresh = reply
            .get("token")
            .and_then(Value::as_str)
            // A cluster without authentication answers with no token.
            .map(str::to_string);
        *token = fresh.clone();
        Ok(fresh)
    }

    fn call<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<T, EtcdError> {
        self.call_noting(path, body, timeout, &mut false)
    }

    /// [`Client::call`], setting `resent` if the request may have reached
    /// etcd more than once.
    fn call_noting<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
        resent: &mut bool,
    ) -> Result<T, EtcdError> {
        let mut response = self.send(path, body, timeout, resent)?;
        let endpoint = self.endpoint().1.to_string();
        let text = response
            .body_mut()
            .with_config()
            .limit(MAX_BODY)
            .read_to_vec()
            .map_err(|e| match e {
                ureq::Error::Timeout(_) => EtcdError::Slow(format!(
                    "etcd at {endpoint} did not finish its answer to {path} within {}",
                    crate::duration::human(timeout)
                )),
                e => EtcdError::Transient(format!(
                    "lost etcd's answer from {endpoint}: {}",
                    crate::store::network_cause(&e.to_string())
                )),
            })?;
        serde_json::from_slice(&text).map_err(|e| {
            EtcdError::Failed(format!(
                "etcd at {endpoint} gave an answer consem cannot read ({e}) to {path}"
            ))
        })
    }

    /// A lease of `ttl` (whole seconds, rounded up); its ID.
    pub fn grant(&self, ttl: Duration) -> Result<i64, EtcdError> {
        #[derive(Deserialize)]
        struct Grant {
            #[serde(rename = "ID", default, deserialize_with = "int64")]
            id: i64,
            #[serde(default)]
            error: Option<String>,
        }
        let seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let grant: Grant = self.call(
            "/v3/lease/grant",
            &json!({ "TTL": seconds.to_string() }),
            CALL_TIMEOUT,
        )?;
        match grant.error.filter(|e| !e.is_empty()) {
            Some(error) => Err(EtcdError::Failed(format!("etcd refused a lease: {error}"))),
            None if grant.id == 0 => Err(EtcdError::Failed("etcd granted lease 0".into())),
            None => Ok(grant.id),
        }
    }

    /// Renews the lease; `LeaseGone` when etcd no longer has it.
    pub fn keep_alive(&self, lease: i64, timeout: Duration) -> Result<(), EtcdError> {
        #[derive(Deserialize)]
        struct Renewed {
            #[serde(rename = "TTL", default, deserialize_with = "int64")]
            ttl: i64,
        }
        #[derive(Deserialize)]
        struct Frame {
            result: Option<Renewed>,
            error: Option<Value>,
        }
        let frame: Frame = self.call(
            "/v3/lease/keepalive",
            &json!({ "ID": lease.to_string() }),
            timeout,
        )?;
        match (frame.result, frame.error) {
            (Some(renewed), _) if renewed.ttl > 0 => Ok(()),
            (Some(_), _) => Err(EtcdError::LeaseGone),
            (None, error) => Err(EtcdError::Transient(format!(
                "etcd did not renew the lease: {}",
                error.map(|e| e.to_string()).unwrap_or_default()
            ))),
        }
    }

    /// Revokes the lease and with it every key attached. `resent` is set
    /// if the request may have reached etcd more than once, and is taken
    /// as set already: then a lease etcd does not know may be one this
    /// call revoked.
    pub fn revoke(
        &self,
        lease: i64,
        timeout: Duration,
        resent: &mut bool,
    ) -> Result<Revoked, EtcdError> {
        let earlier = *resent;
        match self.call_noting::<Value>(
            "/v3/lease/revoke",
            &json!({ "ID": lease.to_string() }),
            timeout,
            resent,
        ) {
            Ok(_) => Ok(Revoked::Now),
            Err(EtcdError::LeaseGone) if !earlier && !*resent => Ok(Revoked::AlreadyGone),
            Err(EtcdError::LeaseGone) => Ok(Revoked::Now),
            Err(other) => Err(other),
        }
    }

    /// Every key in `[key, end)`, oldest first (by create revision), as of
    /// a linearizable read.
    pub fn range(&self, key: &[u8], end: &[u8]) -> Result<RangeReply, EtcdError> {
        self.range_within(key, end, CALL_TIMEOUT)
    }

    /// [`Client::range`] within `timeout`.
    pub fn range_within(
        &self,
        key: &[u8],
        end: &[u8],
        timeout: Duration,
    ) -> Result<RangeReply, EtcdError> {
        self.call(
            "/v3/kv/range",
            &json!({
                "key": b64(key), "range_end": b64(end),
                "sort_order": "ASCEND", "sort_target": "CREATE",
            }),
            timeout,
        )
    }

    pub fn txn(
        &self,
        compare: &[Compare],
        success: &[Op],
        failure: &[Op],
    ) -> Result<TxnReply, EtcdError> {
        self.txn_within(compare, success, failure, CALL_TIMEOUT)
    }

    /// [`Client::txn`] within `timeout`.
    pub fn txn_within(
        &self,
        compare: &[Compare],
        success: &[Op],
        failure: &[Op],
        timeout: Duration,
    ) -> Result<TxnReply, EtcdError> {
        self.call(
            "/v3/kv/txn",
            &json!({
                "compare": compare.iter().map(Compare::to_json).collect::<Vec<_>>(),
                "success": success.iter().map(Op::as_json).collect::<Vec<_>>(),
                "failure": failure.iter().map(Op::as_json).collect::<Vec<_>>(),
            }),
            timeout,
        )
    }

    /// Opens a watch of every change from now on, for at most `wait`;
    /// `None` if the wait ended first, or is too short to open one in (the
    /// caller renews first).
    pub fn watch(
        &self,
        request: &WatchRequest,
        wait: Duration,
    ) -> Result<Option<Watch>, EtcdError> {
        let mut create = json!({ "key": b64(request.key) });
        if let Some(end) = request.end {
            create["range_end"] = json!(b64(end));
        }
        if request.deletions_only {
            create["filters"] = json!(["NOPUT"]);
        }
        if let Some(after) = request.after {
            create["start_revision"] = json!((after + 1).to_string());
        }
        if wait < SHORTEST_WATCH {
            return Ok(None);
        }
        let deadline = Instant::now() + wait;
        let response = match self.send_or_time_out(
            "/v3/watch",
            &json!({ "create_request": create }),
            wait,
            true,
            &mut false,
        ) {
            Ok(response) => response,
            Err(None) => return Ok(None),
            Err(Some(error)) => return Err(error),
        };
        let mut watch = Watch {
            lines: std::io::BufReader::new(response.into_body().into_reader()),
            deadline,
            created_at: 0,
        };
        loop {
            let Some(result) = self.next_frame(&mut watch)? else {
                return Ok(None);
            };
            if result.get("canceled").and_then(Value::as_bool) == Some(true) {
                return Err(EtcdError::Transient(format!(
                    "etcd refused the watch: {}",
                    result
                        .get("cancel_reason")
                        .and_then(Value::as_str)
                        .unwrap_or("no reason given")
                )));
            }
            if result.get("created").and_then(Value::as_bool) == Some(true) {
                if let Some(after) = request.after {
                    watch.created_at = after;
                    return Ok(Some(watch));
                }
                watch.created_at = result
                    .pointer("/header/revision")
                    .and_then(Value::as_str)
                    .and_then(|revision| revision.parse().ok())
                    .ok_or_else(|| {
                        EtcdError::Failed(format!(
                            "etcd at {} created a watch without saying its revision",
                            self.endpoint().1
                        ))
                    })?;
                return Ok(Some(watch));
            }
        }
    }

    /// Waits on `watch` for the first change after revision `after`, until
    /// the watch's wait is over.
    pub fn next_change(&self, watch: &mut Watch, after: i64) -> Result<Watched, EtcdError> {
        loop {
            let Some(result) = self.next_frame(watch)? else {
                return Ok(Watched::Quiet);
            };
            if result.get("canceled").and_then(Value::as_bool) == Some(true)
                || result.get("compact_revision").is_some()
            {
                return Ok(Watched::Ended);
            }
            if let Some(events) = result
                .get("events")
                .filter(|e| e.as_array().is_some_and(|e| !e.is_empty()))
            {
                // Events that do not read as events: read the keys again.
                match Vec::<Event>::deserialize(events) {
                    Ok(events) => {
                        if let Some(changes) = Changes::of(&events, after) {
                            return Ok(Watched::Changed(changes));
                        }
                    }
                    Err(_) => return Ok(Watched::Ended),
                }
            }
        }
    }

    /// The `result` of the watch's next frame; `None` once its wait is
    /// over (an ended stream is `Ended`, through an empty canceled frame).
    fn next_frame(&self, watch: &mut Watch) -> Result<Option<Value>, EtcdError> {
        let mut line = String::new();
        loop {
            line.clear();
            match watch.lines.read_line(&mut line) {
                Ok(0) => return Ok(Some(json!({ "canceled": true }))),
                Ok(_) => {}
                // The request's time is up: nothing happened.
                Err(_) if Instant::now() >= watch.deadline => return Ok(None),
                Err(e) => {
                    // A member that died under the watch: the next call
                    // goes to another.
                    self.fail_over(self.endpoint().0);
                    return Err(EtcdError::Transient(format!(
                        "lost the watch on etcd: {}",
                        crate::store::network_cause(&e.to_string())
                    )));
                }
            }
            let frame: Value = serde_json::from_str(&line).unwrap_or_default();
            match frame.get("result") {
                Some(result) => return Ok(Some(result.clone())),
                None => {
                    if let Some(error) = frame.get("error") {
                        return Err(EtcdError::Transient(format!(
                            "etcd ended the watch: {error}"
                        )));
                    }
                }
            }
            if Instant::now() >= watch.deadline {
                return Ok(None);
            }
        }
    }
}

/// Whether a call that timed out at `stage` had a connection, and so sent
/// its request: then etcd is there and slow (busy, or frozen), not out of
/// reach. A connection that is not made in time is `Connect`, whatever
/// budget ran out (ureq's TCP connector says so).
fn took_the_request(stage: ureq::Timeout) -> bool {
    !matches!(stage, ureq::Timeout::Connect | ureq::Timeout::Resolve)
}

/// Whether a request that failed with `error` may still have reached etcd:
/// only one that never connected surely did not.
fn may_have_arrived(error: &ureq::Error) -> bool {
    match error {
        ureq::Error::Io(e) => e.kind() != std::io::ErrorKind::ConnectionRefused,
        ureq::Error::HostNotFound | ureq::Error::ConnectionFailed => false,
        _ => true,
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Failure {
    Error(EtcdError),
    /// etcd no longer takes the token (it expired): sign in again.
    TokenExpired,
}

/// An error answer of the gateway: `{"error", "code", "message"}` with a
/// gRPC status code.
/// The body of an answer that may be an error, as text: 64 KiB at most,
/// empty if it cannot be read.
fn error_text(response: &mut http::Response<ureq::Body>) -> String {
    response
        .body_mut()
        .with_config()
        .limit(64 * 1024)
        .read_to_string()
        .unwrap_or_default()
}

fn classify(status: http::StatusCode, body: &str, endpoint: &str) -> Failure {
    let reply: Value = serde_json::from_str(body).unwrap_or_default();
    let code = reply.get("code").and_then(Value::as_i64).unwrap_or(-1);
    let message = reply
        .get("message")
        .or_else(|| reply.get("error"))
        .and_then(Value::as_str)
        .unwrap_or(body)
        .trim()
        .to_string();
    let message = crate::report::abbreviated(&message);
    match code {
        // Unauthenticated.
        16 if message.contains("invalid auth token") => Failure::TokenExpired,
        16 | 7 => Failure::Error(EtcdError::Denied(format!(
            "permission denied: etcd at {endpoint} refused the request ({message}); the user needs read and write on the prefix's keys (see docs/etcd.md, \"Credentials and TLS\")"
        ))),
        5 if message.contains("lease not found") => Failure::Error(EtcdError::LeaseGone),
        3 if message.contains("user name is empty") => Failure::Error(EtcdError::Denied(format!(
            "permission denied: etcd at {endpoint} requires a user: give --user or ETCDCTL_USER"
        ))),
        // Unavailable, deadline exceeded, aborted, internal, resource
        // exhausted: a leader election, a member catching up, a restart.
        14 | 4 | 10 | 13 | 8 | 1 => Failure::Error(EtcdError::NotReady(format!(
            "etcd at {endpoint} is not ready ({message})"
        ))),
        _ if status.is_server_error() && code < 0 => Failure::Error(EtcdError::Transient(format!(
            "etcd at {endpoint} answered {status}: {message}"
        ))),
        _ => Failure::Error(EtcdError::Failed(format!(
            "etcd at {endpoint} answered an error: {message}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_response_tells_the_keys_deleted_and_where_to_go_on() {
        // As the gateway writes it: a put's type is left out.
        let events: Vec<Event> = serde_json::from_str(&format!(
            r#"[{{"kv":{{"key":"{}","mod_revision":"7"}}}},
                {{"type":"DELETE","kv":{{"key":"{}","mod_revision":"9"}}}}]"#,
            b64(b"p/1"),
            b64(b"p/2")
        ))
        .unwrap();
        assert_eq!(
            Changes::of(&events, 0),
            Some(Changes {
                deleted: vec![b"p/2".to_vec()],
                through: 9
            })
        );
        // What a read at revision 7 showed already is no change.
        assert_eq!(
            Changes::of(&events, 7),
            Some(Changes {
                deleted: vec![b"p/2".to_vec()],
                through: 9
            })
        );
        assert_eq!(Changes::of(&events, 9), None);
        let put_only = &events[..1];
        assert_eq!(
            Changes::of(put_only, 6),
            Some(Changes {
                deleted: vec![],
                through: 7
            })
        );
    }

    #[test]
    fn a_prefix_range_ends_after_its_last_byte() {
        assert_eq!(prefix_end(b"jobs/"), b"jobs0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\x00");
    }

    #[test]
    fn gateway_errors_are_sorted_by_what_can_be_done() {
        let failure = |code: i64, message: &str| {
            classify(
                http::StatusCode::BAD_REQUEST,
                &json!({"error": message, "message": message, "code": code}).to_string(),
                "http://e:2379",
            )
        };
        assert_eq!(
            failure(16, "etcdserver: invalid auth token"),
            Failure::TokenExpired
        );
        assert!(matches!(
            failure(7, "etcdserver: permission denied"),
            Failure::Error(EtcdError::Denied(_))
        ));
        assert_eq!(
            failure(5, "etcdserver: requested lease not found"),
            Failure::Error(EtcdError::LeaseGone)
        );
        assert!(matches!(
            failure(14, "etcdserver: leader changed"),
            Failure::Error(EtcdError::NotReady(_))
        ));
        assert!(matches!(
            failure(3, "etcdserver: user name is empty"),
            Failure::Error(EtcdError::Denied(_))
        ));
        assert!(matches!(
            failure(3, "etcdserver: key is not provided"),
            Failure::Error(EtcdError::Failed(_))
        ));
    }

    #[test]
    fn numbers_come_as_strings_and_zero_as_nothing() {
        let kv: KeyValue = serde_json::from_value(json!({
            "key": b64(b"p/1"), "create_revision": "12", "mod_revision": 13, "value": b64(b"{}")
        }))
        .unwrap();
        assert_eq!(
            (
                kv.key.as_slice(),
                kv.create_revision,
                kv.mod_revision,
                kv.lease
            ),
            (&b"p/1"[..], 12, 13, 0)
        );
    }
}
