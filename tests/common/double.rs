//! An in-process stand-in for the parts of a Consul 1.0 agent's HTTP API that a
//! semaphore client uses: sessions, KV (with acquire/release, cas, tombstones,
//! lock-delay) and blocking queries, plus fault injection for tests.
//!
//! It can also serve over TLS (optionally requiring client certificates,
//! `ConsulDouble::start_tls`) and enforce ACLs (`ConsulDouble::enable_acls`).
//!
//! It answers the way `tests/fixtures/consul-1.0-transcript.json` records a
//! real agent answering (see `tests/fixtures/consul-reference.md`). Where the
//! reference leaves a detail open, Consul 1.0's own code decides (noted inline).

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use base64::Engine as _;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Serialize;
use serde_json::Value as Json;

/// Node name the double reports for itself and its sessions.
pub const NODE_NAME: &str = "consem-double";

const JSON: &str = "application/json";
const TEXT: &str = "text/plain; charset=utf-8";
/// Raft index of a fresh (or restarted) store; the first write gets the next one.
const FIRST_INDEX: u64 = 1;
const DEFAULT_LOCK_DELAY: Duration = Duration::from_secs(15);
/// Consul caps a session's lock-delay at 60 s.
const MAX_LOCK_DELAY: Duration = Duration::from_secs(60);
const SESSION_TTL_MIN_NANOS: i128 = 10 * 1_000_000_000;
const SESSION_TTL_MAX_NANOS: i128 = 86_400 * 1_000_000_000;
const DEFAULT_QUERY_WAIT: Duration = Duration::from_secs(300);
const MAX_QUERY_WAIT: Duration = Duration::from_secs(600);
/// Consul adds up to wait/16 of random jitter to a blocking query's wait.
const QUERY_JITTER_FRACTION: u32 = 16;
const MAX_VALUE_SIZE: usize = 512 * 1024;
/// How often the reaper looks for sessions whose TTL has run out.
const REAPER_PERIOD: Duration = Duration::from_millis(20);

// ---------------------------------------------------------------------------
// Public test-facing types
// ---------------------------------------------------------------------------

/// One KV entry as the store holds it (value decoded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEntry {
    pub key: String,
    pub value: Vec<u8>,
    pub flags: u64,
    pub session: Option<String>,
    pub lock_index: u64,
    pub create_index: u64,
    pub modify_index: u64,
}

/// A live session as the store holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionInfo {
    pub id: String,
    pub name: String,
    pub ttl: Option<Duration>,
    pub behavior: String,
    pub lock_delay: Duration,
    /// How many times `PUT /v1/session/renew/<id>` succeeded.
    pub renewals: u64,
}

/// A request the double read in full (faulted ones included).
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    pub method: String,
    /// The request target as sent: path and query, still percent-encoded.
    pub target: String,
    /// Percent-decoded path, without the query.
    pub path: String,
    /// Percent-decoded query pairs in request order; `?recurse` gives `("recurse", "")`.
    pub query: Vec<(String, String)>,
    /// Header names lowercased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub at: Instant,
    /// The size of the answer's body, once the double answered.
    pub answer_bytes: Option<usize>,
}

impl RecordedRequest {
    /// The first value of a query parameter, if present.
    pub fn query_value(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The first value of a header (name matched case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// True if `text` appears in the URL, as sent (percent-encoded) or decoded
    /// (path and every query name and value): for "the token never travels
    /// in a URL".
    pub fn url_contains(&self, text: &str) -> bool {
        self.target.contains(text)
            || self.path.contains(text)
            || self
                .query
                .iter()
                .any(|(k, v)| k.contains(text) || v.contains(text))
    }

    /// The ACL token the double took from this request, where Consul looks:
    /// `?token=` first, then `X-Consul-Token`, then `Authorization: Bearer`.
    pub fn token(&self) -> Option<&str> {
        token_of(&self.query, &self.headers)
    }
}

/// How the double serves TLS (`ConsulDouble::start_tls`).
#[derive(Clone, Debug)]
pub struct TlsServer {
    /// The server's certificate chain, PEM (leaf first).
    pub cert_pem: String,
    /// Its private key, PEM (PKCS#8, SEC1 or PKCS#1).
    pub key_pem: String,
    /// `Some(ca)`: clients must present a certificate signed by this CA
    /// (mTLS); a handshake without one fails.
    pub client_ca_pem: Option<String>,
}

/// ACLs for `ConsulDouble::enable_acls`: the tokens the double knows. Any
/// other token, and a request without one, gets the anonymous token's
/// rights: none.
#[derive(Clone, Debug, Default)]
pub struct Acl {
    pub tokens: Vec<(String, Rights)>,
    /// Filter listings without `X-Consul-Results-Filtered-By-ACLs`, as
    /// agents before 1.11 (the recorded 1.0 among them) do.
    pub silent_filtering: bool,
}

impl Acl {
    pub fn new() -> Acl {
        Acl::default()
    }

    /// Adds a token (builder style).
    pub fn token(mut self, token: &str, rights: Rights) -> Acl {
        self.tokens.push((token.to_string(), rights));
        self
    }

    /// Leaves keys the token cannot read out of listings without saying so,
    /// as agents before 1.11 do (a listing with nothing readable is empty, not
    /// 403); a direct read of such a key still answers 403.
    pub fn silent_filtering(mut self) -> Acl {
        self.silent_filtering = true;
        self
    }

    fn rights(&self, token: Option<&str>) -> Rights {
        token
            .filter(|t| !t.is_empty())
            .and_then(|t| self.tokens.iter().find(|(known, _)| known == t))
            .map(|(_, rights)| rights.clone())
            .unwrap_or_default()
    }
}

/// What a token may do. Prefixes work like Consul's `key_prefix` rules (`""`
/// is every key); as with a Consul `write` policy, write implies read.
/// Session list/info, status and agent reads need no rights.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rights {
    /// Create, renew and destroy sessions (Consul's `session:write`).
    pub session_write: bool,
    /// Key prefixes the token can read.
    pub key_read: Vec<String>,
    /// Key prefixes the token can write (and read).
    pub key_write: Vec<String>,
}

impl Rights {
    /// No rights at all (the anonymous token).
    pub fn none() -> Rights {
        Rights::default()
    }

    /// Everything: session write, read and write on every key.
    pub fn all() -> Rights {
        Rights {
            session_write: true,
            key_read: vec![String::new()],
            key_write: vec![String::new()],
        }
    }

    /// What consem needs on `prefix`: session write, read and write under it.
    pub fn semaphore(prefix: &str) -> Rights {
        Rights {
            session_write: true,
            key_read: vec![prefix.to_string()],
            key_write: vec![prefix.to_string()],
        }
    }

    /// Can read `key`.
    pub fn can_read(&self, key: &str) -> bool {
        self.can_write(key) || self.key_read.iter().any(|p| key.starts_with(p.as_str()))
    }

    /// Can write `key`.
    pub fn can_write(&self, key: &str) -> bool {
        self.key_write.iter().any(|p| key.starts_with(p.as_str()))
    }

    /// Can read some key under `prefix`: a read or write rule lies under it
    /// or covers it.
    fn can_read_some(&self, prefix: &str) -> bool {
        self.key_read
            .iter()
            .chain(&self.key_write)
            .any(|p| p.starts_with(prefix) || prefix.starts_with(p.as_str()))
    }
}

/// A fault to apply to the next `count` requests that match `matcher`.
#[derive(Clone, Debug)]
pub struct Fault {
    pub matcher: Match,
    pub action: FaultAction,
    pub count: usize,
}

impl Fault {
    /// Answer `count` requests (any route) with `status` and a text body.
    pub fn status(status: u16, body: &str, count: usize) -> Fault {
        Fault::any(FaultAction::Status(status, body.to_string()), count)
    }

    /// Close the connection without answering, `count` times.
    pub fn drop_connection(count: usize) -> Fault {
        Fault::any(FaultAction::Drop, count)
    }

    /// Answer normally after `delay`, `count` times.
    pub fn delay(delay: Duration, count: usize) -> Fault {
        Fault::any(FaultAction::Delay(delay), count)
    }

    /// Read the request and never answer, `count` times.
    pub fn stall(count: usize) -> Fault {
        Fault::any(FaultAction::Stall, count)
    }

    /// Carry the request out, then send half of the answer and close,
    /// `count` times.
    pub fn truncate(count: usize) -> Fault {
        Fault::any(FaultAction::Truncate, count)
    }

    /// Narrow the fault to requests matching `matcher`.
    pub fn on(self, matcher: Match) -> Fault {
        Fault { matcher, ..self }
    }

    fn any(action: FaultAction, count: usize) -> Fault {
        Fault {
            matcher: Match::any(),
            action,
            count,
        }
    }
}

/// Which requests a fault applies to. `path_contains` is looked for both in
/// the request target as sent (path and query, percent-encoded) and in the
/// decoded path, so `"acquire="` and `"/v1/kv/a b"` both work.
#[derive(Clone, Debug, Default)]
pub struct Match {
    pub method: Option<String>,
    pub path_contains: Option<String>,
}

impl Match {
    pub fn any() -> Match {
        Match::default()
    }

    pub fn path(fragment: &str) -> Match {
        Match {
            method: None,
            path_contains: Some(fragment.to_string()),
        }
    }

    pub fn method_path(method: &str, fragment: &str) -> Match {
        Match {
            method: Some(method.to_string()),
            path_contains: Some(fragment.to_string()),
        }
    }

    fn matches(&self, request: &Request) -> bool {
        let method_ok = self
            .method
            .as_ref()
            .is_none_or(|m| m.eq_ignore_ascii_case(&request.method));
        let path_ok = self.path_contains.as_ref().is_none_or(|fragment| {
            request.target.contains(fragment.as_str()) || request.path.contains(fragment.as_str())
        });
        method_ok && path_ok
    }
}

#[derive(Clone, Debug)]
pub enum FaultAction {
    /// Answer this status with a text/plain body, e.g. `(500, "No cluster leader")`.
    Status(u16, String),
    /// Close the connection without answering.
    Drop,
    /// Wait, then answer normally.
    Delay(Duration),
    /// Read the request, then answer nothing; the connection stays open until
    /// the client closes it or the double stops (or restarts / goes down).
    Stall,
    /// Carry the request out, then send the head and half of the body (the
    /// Content-Length announcing all of it) and close: a write whose answer
    /// is lost, a read cut short.
    Truncate,
}

// ---------------------------------------------------------------------------
// The double
// ---------------------------------------------------------------------------

/// A Consul agent double listening on a loopback port. Dropping it closes the
/// listener and every connection and joins all its threads.
pub struct ConsulDouble {
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
    reaper: Option<JoinHandle<()>>,
}

impl ConsulDouble {
    /// Binds 127.0.0.1 on a free port and starts serving plain HTTP.
    pub fn start() -> ConsulDouble {
        ConsulDouble::start_with(None)
    }

    /// Like `start`, but every connection speaks TLS (HTTPS) with `tls`'s
    /// certificate; with `client_ca_pem` set, clients must present a
    /// certificate signed by that CA. A failed handshake just closes that
    /// connection. Panics if the PEM cannot be used.
    pub fn start_tls(tls: TlsServer) -> ConsulDouble {
        ConsulDouble::start_with(Some(server_config(&tls)))
    }

    fn start_with(tls: Option<Arc<rustls::ServerConfig>>) -> ConsulDouble {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the Consul double");
        let addr = listener.local_addr().expect("listener address");
        let shared = Arc::new(Shared {
            addr,
            tls,
            acl: Mutex::new(None),
            store: Mutex::new(Store::new(Rng::seeded())),
            changed: Condvar::new(),
            queries: Mutex::new(Vec::new()),
            query_wakeups: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            down: AtomicBool::new(false),
            faults: Mutex::new(Vec::new()),
            requests: Mutex::new(Vec::new()),
            connections: Mutex::new(Connections::default()),
            workers: Mutex::new(Vec::new()),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            thread::spawn(move || shared.accept_loop(listener))
        };
        let reaper = {
            let shared = Arc::clone(&shared);
            thread::spawn(move || shared.reap_loop())
        };
        ConsulDouble {
            shared,
            acceptor: Some(acceptor),
            reaper: Some(reaper),
        }
    }

    /// "127.0.0.1:PORT"
    pub fn addr(&self) -> String {
        self.shared.addr.to_string()
    }

    /// "http://127.0.0.1:PORT", or "https://..." for a TLS double.
    pub fn url(&self) -> String {
        let scheme = if self.is_tls() { "https" } else { "http" };
        format!("{scheme}://{}", self.shared.addr)
    }

    /// True for a double started with `start_tls`.
    pub fn is_tls(&self) -> bool {
        self.shared.tls.is_some()
    }

    /// Turns ACL enforcement on (or replaces the tokens). Requests are checked
    /// as Consul checks them: session create/renew/destroy need session
    /// write; KV reads need key read (listings leave out unreadable keys and
    /// then carry `X-Consul-Results-Filtered-By-ACLs: true`; a listing with
    /// no readable part at all answers 403); KV writes and deletes need key
    /// write. Denials answer 403 `Permission denied`.
    pub fn enable_acls(&self, acl: Acl) {
        *lock(&self.shared.acl) = Some(acl);
    }

    /// Turns ACL enforcement off again.
    pub fn disable_acls(&self) {
        *lock(&self.shared.acl) = None;
    }

    /// Every `?token=` value received so far (the double accepts it as
    /// Consul does; consem must never send one).
    pub fn tokens_in_urls(&self) -> Vec<String> {
        lock(&self.shared.requests)
            .iter()
            .flat_map(|r| r.query.iter())
            .filter(|(k, _)| k == "token")
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Adds a fault rule after the existing ones; the first matching rule with
    /// count left applies and uses up one count.
    pub fn inject(&self, rule: Fault) {
        lock(&self.shared.faults).push(rule);
    }

    pub fn clear_faults(&self) {
        lock(&self.shared.faults).clear();
    }

    /// Sessions expire once (now - last renew) > TTL * `multiplier` (default 2.0,
    /// since Consul invalidates at up to twice the TTL).
    pub fn set_ttl_multiplier(&self, multiplier: f64) {
        assert!(
            multiplier.is_finite() && multiplier > 0.0,
            "TTL multiplier must be positive, got {multiplier}"
        );
        lock(&self.shared.store).ttl_multiplier = multiplier;
        // Wake the reaper's view of time at once rather than on its next tick.
        self.shared.notify_changed();
    }

    /// Invalidates every session with a TTL that has not been renewed for `idle`
    /// (the fast way to say "the TTL passed"); returns how many.
    pub fn expire_sessions_idle_for(&self, idle: Duration) -> usize {
        let mut store = lock(&self.shared.store);
        let now = Instant::now();
        let stale: Vec<String> = store
            .sessions
            .values()
            .filter(|s| s.ttl.is_some() && now.duration_since(s.last_renewed) >= idle)
            .map(|s| s.id.clone())
            .collect();
        for id in &stale {
            store.destroy_session(id);
        }
        drop(store);
        self.shared.notify_changed();
        stale.len()
    }

    /// Destroys a session as an operator would (same as `PUT /v1/session/destroy/<id>`).
    pub fn destroy_session(&self, id: &str) {
        lock(&self.shared.store).destroy_session(id);
        self.shared.notify_changed();
    }

    /// Like restarting a `-dev` agent: every open connection is dropped, all
    /// sessions and KV data are lost and the raft index starts low again, so
    /// clients see an index lower than the one they sent.
    pub fn restart(&self) {
        self.shared.drop_connections();
        {
            let mut store = lock(&self.shared.store);
            let multiplier = store.ttl_multiplier;
            let rng = store.rng.clone();
            *store = Store::new(rng);
            store.ttl_multiplier = multiplier;
        }
        self.shared.wake_every_query();
    }

    /// Like `consul snapshot restore` onto servers whose raft index is lower
    /// than the one clients last saw: every key and session is kept, every
    /// index is renumbered from the bottom in the same order, and blocking
    /// queries are abandoned (Consul wakes them when it swaps the state
    /// store): they answer at once, with an index lower than the one sent.
    /// Connections stay open, so a client sees only the index go back.
    pub fn restore_with_lower_index(&self) {
        lock(&self.shared.store).renumber();
        self.shared.notify_changed();
    }

    /// Invalidates every session (their behaviours apply); KV is otherwise kept.
    pub fn invalidate_all_sessions(&self) {
        let mut store = lock(&self.shared.store);
        let ids: Vec<String> = store.sessions.keys().cloned().collect();
        for id in &ids {
            store.destroy_session(id);
        }
        drop(store);
        self.shared.notify_changed();
    }

    /// While down, every connection is accepted and closed at once, and open
    /// ones are dropped.
    pub fn set_down(&self, down: bool) {
        {
            // Flip the flag under the registry lock so the acceptor cannot
            // register a connection between the flag and the sweep.
            let _connections = lock(&self.shared.connections);
            self.shared.down.store(down, Ordering::SeqCst);
        }
        if down {
            self.shared.drop_connections();
        }
    }

    /// Entries whose key starts with `prefix`, sorted by key.
    pub fn entries(&self, prefix: &str) -> Vec<KvEntry> {
        lock(&self.shared.store).under(prefix).cloned().collect()
    }

    /// Live sessions, sorted by ID.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        lock(&self.shared.store)
            .sessions
            .values()
            .map(|s| SessionInfo {
                id: s.id.clone(),
                name: s.name.clone(),
                ttl: s.ttl,
                behavior: s.behavior.as_str().to_string(),
                lock_delay: s.lock_delay,
                renewals: s.renewals,
            })
            .collect()
    }

    /// A plain write (like `PUT /v1/kv/<key>?flags=<flags>`); bumps the index.
    pub fn put_raw(&self, key: &str, value: &[u8], flags: u64) {
        let mut store = lock(&self.shared.store);
        let index = store.next_index();
        store.set(index, key, value, flags);
        drop(store);
        self.shared.notify_changed();
    }

    /// Rewrites `key` with its own value and flags, as a CAS write of what
    /// was read would, in one step: its ModifyIndex moves and whoever blocks
    /// on it wakes. False if the key does not exist.
    pub fn rewrite(&self, key: &str) -> bool {
        let mut store = lock(&self.shared.store);
        let Some(entry) = store.kv.get(key).cloned() else {
            return false;
        };
        let index = store.next_index();
        store.set(index, key, &entry.value, entry.flags);
        drop(store);
        self.shared.notify_changed();
        true
    }

    /// Blocking queries waiting now.
    pub fn blocked_queries(&self) -> usize {
        lock(&self.shared.queries).len()
    }

    /// How many times, so far, a change woke a blocking query to read
    /// again (a stop or a restart not counted).
    pub fn query_wakeups(&self) -> u64 {
        self.shared.query_wakeups.load(Ordering::SeqCst)
    }

    /// Every request read so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.requests).clone()
    }
}

impl Drop for ConsulDouble {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.shared.wake_every_query();
        self.shared.drop_connections();
        // The acceptor is blocked in accept(); a connection wakes it to see `stopping`.
        let _ = TcpStream::connect(self.shared.addr);
        for handle in [self.acceptor.take(), self.reaper.take()]
            .into_iter()
            .flatten()
        {
            let _ = handle.join();
        }
        let workers: Vec<JoinHandle<()>> = lock(&self.shared.workers).drain(..).collect();
        for worker in workers {
            let _ = worker.join();
        }
    }
}

/// Locks a mutex, carrying on past poisoning: a panicking test thread must not
/// turn every later request into a second panic.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------------------
// Server plumbing: accept, connections, faults
// ---------------------------------------------------------------------------

struct Shared {
    addr: SocketAddr,
    /// Set for a TLS double.
    tls: Option<Arc<rustls::ServerConfig>>,
    /// Set while ACLs are enforced.
    acl: Mutex<Option<Acl>>,
    store: Mutex<Store>,
    /// Signalled on every store change (and on stop): the reaper and fault
    /// delays wait on it.
    changed: Condvar,
    /// The blocking queries waiting, each woken only by a change in its
    /// scope, as a Consul agent's are (its state store watches the radix
    /// tree's node for the key or the prefix read).
    queries: Mutex<Vec<Arc<Watch>>>,
    /// How many times a change woke a blocking query to read again.
    query_wakeups: AtomicU64,
    stopping: AtomicBool,
    down: AtomicBool,
    faults: Mutex<Vec<Fault>>,
    requests: Mutex<Vec<RecordedRequest>>,
    connections: Mutex<Connections>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

/// Clones of the open sockets, so restart/down/stop can shut them down from
/// outside the threads that serve them.
#[derive(Default)]
struct Connections {
    next_id: u64,
    open: HashMap<u64, TcpStream>,
}

impl Shared {
    fn accept_loop(self: Arc<Self>, listener: TcpListener) {
        for incoming in listener.incoming() {
            if self.stopping.load(Ordering::SeqCst) {
                break;
            }
            let stream = match incoming {
                Ok(stream) => stream,
                Err(_) => {
                    // e.g. out of file descriptors: back off instead of spinning.
                    thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            let Some(id) = self.register(&stream) else {
                let _ = stream.shutdown(Shutdown::Both);
                continue;
            };
            let shared = Arc::clone(&self);
            let worker = thread::spawn(move || shared.serve_connection(stream, id));
            let mut workers = lock(&self.workers);
            workers.retain(|w| !w.is_finished());
            workers.push(worker);
        }
    }

    /// Records a clone of the socket; `None` when the double is down or
    /// stopping. Checked under the registry lock, so a connection is either
    /// refused here or seen by the sweep that follows setting either flag.
    fn register(&self, stream: &TcpStream) -> Option<u64> {
        let mut connections = lock(&self.connections);
        if self.down.load(Ordering::SeqCst) || self.stopping.load(Ordering::SeqCst) {
            return None;
        }
        let clone = stream.try_clone().ok()?;
        let _ = stream.set_nodelay(true);
        connections.next_id += 1;
        let id = connections.next_id;
        connections.open.insert(id, clone);
        Some(id)
    }

    fn drop_connections(&self) {
        for (_, stream) in lock(&self.connections).open.drain() {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    fn serve_connection(&self, stream: TcpStream, id: u64) {
        if let Ok(own) = stream.try_clone() {
            let connection = match &self.tls {
                None => Some(Connection::Plain(own)),
                // The handshake happens on the first read; if it fails, that
                // read fails and the connection is closed like any other.
                Some(config) => rustls::ServerConnection::new(Arc::clone(config))
                    .ok()
                    .map(|tls| Connection::Tls(Box::new(rustls::StreamOwned::new(tls, own)))),
            };
            if let Some(connection) = connection {
                self.serve_requests(BufReader::new(connection));
            }
        }
        // Shut down explicitly: the registry's clone would otherwise keep the
        // socket open after this thread's handles drop.
        let _ = stream.shutdown(Shutdown::Both);
        lock(&self.connections).open.remove(&id);
    }

    /// Answers requests until the connection ends. Reads go through the
    /// buffer; writes go straight to the connection underneath it.
    fn serve_requests(&self, mut reader: BufReader<Connection>) {
        loop {
            let request = match read_request(&mut reader) {
                Ok(request) => request,
                Err(RequestError::Closed) => return,
                Err(RequestError::Malformed(reason)) => {
                    let writer = reader.get_mut();
                    let _ = write_response(&mut *writer, &Response::text(400, &reason), false);
                    writer.close_notify();
                    return;
                }
            };
            if self.stopping.load(Ordering::SeqCst) || self.down.load(Ordering::SeqCst) {
                return;
            }
            let recorded = self.record(&request);
            let response = match self.take_fault(&request) {
                Some(FaultAction::Drop) => return,
                Some(FaultAction::Stall) => {
                    // Returns when the client closes or the socket is shut down.
                    let _ = io::copy(&mut reader, &mut io::sink());
                    return;
                }
                Some(FaultAction::Status(status, body)) => Response::text(status, &body),
                Some(FaultAction::Truncate) => {
                    if let Some(response) = self.handle(&request) {
                        let mut bytes = Vec::new();
                        let _ = write_response(&mut bytes, &response, false);
                        let cut = bytes.len() - response.body.len().div_ceil(2);
                        let writer = reader.get_mut();
                        // Over TLS, without close_notify: cut short, not ended.
                        let _ = writer.write_all(&bytes[..cut]);
                        let _ = writer.flush();
                    }
                    return;
                }
                Some(FaultAction::Delay(delay)) => {
                    if !self.pause(delay) {
                        return;
                    }
                    match self.handle(&request) {
                        Some(response) => response,
                        None => return,
                    }
                }
                None => match self.handle(&request) {
                    Some(response) => response,
                    None => return,
                },
            };
            lock(&self.requests)[recorded].answer_bytes = Some(response.body.len());
            let writer = reader.get_mut();
            if write_response(&mut *writer, &response, request.keep_alive).is_err() {
                return;
            }
            if !request.keep_alive {
                writer.close_notify();
                return;
            }
        }
    }

    /// Records `request`; its place among the recorded ones.
    fn record(&self, request: &Request) -> usize {
        let mut requests = lock(&self.requests);
        requests.push(RecordedRequest {
            method: request.method.clone(),
            target: request.target.clone(),
            path: request.path.clone(),
            query: request.query.clone(),
            headers: request.headers.clone(),
            body: request.body.clone(),
            at: Instant::now(),
            answer_bytes: None,
        });
        requests.len() - 1
    }

    fn take_fault(&self, request: &Request) -> Option<FaultAction> {
        let mut faults = lock(&self.faults);
        let position = faults
            .iter()
            .position(|f| f.count > 0 && f.matcher.matches(request))?;
        let rule = &mut faults[position];
        rule.count -= 1;
        let action = rule.action.clone();
        if rule.count == 0 {
            faults.remove(position);
        }
        Some(action)
    }

    /// Sleeps for `delay` unless the double stops first; false if it stopped.
    fn pause(&self, delay: Duration) -> bool {
        let deadline = Instant::now() + delay;
        let mut store = lock(&self.store);
        loop {
            if self.stopping.load(Ordering::SeqCst) {
                return false;
            }
            let now = Instant::now();
            if now >= deadline {
                return true;
            }
            store = self
                .changed
                .wait_timeout(store, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Wakes the blocking queries whose scope the changes since the last
    /// call touched, and whoever waits on `changed`.
    fn notify_changed(&self) {
        let touched = std::mem::take(&mut lock(&self.store).touched);
        for query in lock(&self.queries).iter() {
            if touched.iter().any(|t| query.scope.touched_by(t)) {
                self.query_wakeups.fetch_add(1, Ordering::SeqCst);
                query.signal.notify_all();
            }
        }
        self.changed.notify_all();
    }

    /// Wakes every blocking query (a stop, a restart), and whoever waits on
    /// `changed`.
    fn wake_every_query(&self) {
        lock(&self.store).touched.clear();
        for query in lock(&self.queries).iter() {
            query.signal.notify_all();
        }
        self.changed.notify_all();
    }

    /// Expires sessions whose TTL ran out, so blocking queries wake even when
    /// no request arrives.
    fn reap_loop(&self) {
        let mut store = lock(&self.store);
        while !self.stopping.load(Ordering::SeqCst) {
            if store.expire_due(Instant::now()) > 0 {
                drop(store);
                self.notify_changed();
                store = lock(&self.store);
            }
            store = self
                .changed
                .wait_timeout(store, REAPER_PERIOD)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    // -----------------------------------------------------------------------
    // Routing
    // -----------------------------------------------------------------------

    /// The answer to a request; `None` if the double stopped while it waited.
    fn handle(&self, request: &Request) -> Option<Response> {
        // Go's ServeMux, in front of Consul's handlers, redirects a path
        // with `.` or `..` segments (after decoding) to its cleaned form.
        let segments: Vec<&str> = request.path.split('/').skip(1).collect();
        if segments.iter().any(|s| *s == "." || *s == "..") {
            return Some(Response::text(301, "<a href=\"/\">Moved Permanently</a>."));
        }
        // Check expiry here too, so a request never sees a session that the
        // reaper simply has not got round to yet.
        if lock(&self.store).expire_due(Instant::now()) > 0 {
            self.notify_changed();
        }
        let method = request.method.as_str();
        let path = request.path.as_str();
        // None while ACLs are off.
        let (rights, announce_filtering) = match lock(&self.acl).as_ref() {
            Some(acl) => (
                Some(acl.rights(token_of(&request.query, &request.headers))),
                !acl.silent_filtering,
            ),
            None => (None, false),
        };
        if let Some(rights) = &rights {
            if !allowed(request, rights, announce_filtering) {
                return Some(permission_denied());
            }
        }
        if let Some(key) = path.strip_prefix("/v1/kv/") {
            return match method {
                "GET" => self.kv_get(request, key, rights.as_ref(), announce_filtering),
                "PUT" => Some(self.kv_put(request, key)),
                "DELETE" => Some(self.kv_delete(request, key)),
                _ => Some(method_not_allowed(method)),
            };
        }
        if let Some(rest) = path.strip_prefix("/v1/session/") {
            let (action, id) = rest.split_once('/').unwrap_or((rest, ""));
            return match (action, method) {
                ("create", "PUT") => Some(self.session_create(&request.body)),
                ("list", "GET") => self.session_list(request),
                ("info", "GET") => self.session_info(request, id),
                ("renew", "PUT") => Some(self.session_renew(id)),
                ("destroy", "PUT") => Some(self.session_destroy(id, rights.is_some())),
                ("create" | "renew" | "destroy" | "list" | "info", _) => {
                    Some(method_not_allowed(method))
                }
                _ => Some(not_found()),
            };
        }
        Some(match (method, path) {
            ("GET", "/v1/status/leader") => Response::json(200, &"127.0.0.1:8300"),
            ("GET", "/v1/agent/self") => Response::json(
                200,
                &serde_json::json!({
                    "Config": {"Datacenter": "dc1", "NodeName": NODE_NAME, "Version": "1.0.7"},
                    "Member": {"Name": NODE_NAME, "Addr": "127.0.0.1", "Port": 8301},
                }),
            ),
            _ => not_found(),
        })
    }

    /// Runs `read` at once, or (for `?index=N` with N > 0) until its index
    /// exceeds N or the wait passes, like Consul's blockingQuery.
    fn blocking_read(
        &self,
        request: &Request,
        scope: Scope,
        read: impl Fn(&Store) -> Response,
    ) -> Option<Response> {
        let query = match BlockingQuery::parse(request) {
            Ok(query) => query,
            Err(response) => return Some(response),
        };
        let mut store = lock(&self.store);
        let mut response = read(&store);
        if query.min_index == 0 {
            return Some(response);
        }
        let restores = store.restores;
        let jitter_cap = query.wait / QUERY_JITTER_FRACTION;
        let jitter = jitter_cap.mul_f64(store.rng.fraction());
        let deadline = Instant::now() + query.wait + jitter;
        // Registered while the store is locked: a change after this read
        // wakes it.
        let watch = Arc::new(Watch {
            scope,
            signal: Condvar::new(),
        });
        lock(&self.queries).push(Arc::clone(&watch));
        while response.index.unwrap_or(0) <= query.min_index {
            if self.stopping.load(Ordering::SeqCst) {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            store = watch
                .signal
                .wait_timeout(store, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            response = read(&store);
            // A restore abandons every blocking query: it answers now, with
            // whatever index the restored state has.
            if store.restores != restores {
                break;
            }
        }
        lock(&self.queries).retain(|q| !Arc::ptr_eq(q, &watch));
        (!self.stopping.load(Ordering::SeqCst)).then_some(response)
    }

    // -----------------------------------------------------------------------
    // KV
    // -----------------------------------------------------------------------

    /// `rights` is `Some` while ACLs are on: listings then leave out the
    /// keys the token cannot read, and say so in a header if
    /// `announce_filtering`.
    fn kv_get(
        &self,
        request: &Request,
        key: &str,
        rights: Option<&Rights>,
        announce_filtering: bool,
    ) -> Option<Response> {
        let readable = |k: &str| rights.is_none_or(|r| r.can_read(k));
        if request.has("keys") {
            let separator = request.value("separator").unwrap_or("");
            return self.blocking_read(request, Scope::Prefix(key.to_string()), |store| {
                let mut keys = store.keys_under(key, separator);
                let before = keys.len();
                keys.retain(|k| readable(k));
                let filtered = keys.len() < before && announce_filtering;
                let index = store.prefix_index(key);
                // Consul answers the root listing with [] rather than 404.
                let response = if keys.is_empty() && !key.is_empty() {
                    Response::empty(404)
                } else {
                    Response::json(200, &keys)
                };
                response.with_index(index).filtered_by_acls(filtered)
            });
        }
        if request.has("recurse") {
            return self.blocking_read(request, Scope::Prefix(key.to_string()), |store| {
                let mut filtered = false;
                let entries: Vec<EntryJson> = store
                    .under(key)
                    .filter(|entry| {
                        let visible = readable(&entry.key);
                        filtered |= !visible;
                        visible
                    })
                    .map(EntryJson::from)
                    .collect();
                let index = store.prefix_index(key);
                let response = if entries.is_empty() {
                    Response::empty(404)
                } else {
                    Response::json(200, &entries)
                };
                response
                    .with_index(index)
                    .filtered_by_acls(filtered && announce_filtering)
            });
        }
        if key.is_empty() {
            return Some(missing_key_name());
        }
        let raw = request.has("raw");
        self.blocking_read(request, Scope::Key(key.to_string()), |store| {
            match store.kv.get(key) {
                // Consul answers a found key with its own ModifyIndex.
                Some(entry) if raw => Response::raw(&entry.value).with_index(entry.modify_index),
                Some(entry) => {
                    Response::json(200, &[EntryJson::from(entry)]).with_index(entry.modify_index)
                }
                None => Response::empty(404).with_index(store.missing_key_index(key)),
            }
        })
    }

    fn kv_put(&self, request: &Request, key: &str) -> Response {
        if key.is_empty() {
            return missing_key_name();
        }
        let flags = match request.value("flags").map(parse_go_uint).transpose() {
            Ok(flags) => flags.unwrap_or(0),
            Err(message) => return Response::text(500, &message),
        };
        // Later parameters win, as in Consul: release over acquire over cas.
        let operation = if let Some(session) = request.value("release") {
            PutOp::Release(session)
        } else if let Some(session) = request.value("acquire") {
            PutOp::Acquire(session)
        } else if let Some(cas) = request.value("cas") {
            match parse_go_uint(cas) {
                Ok(cas) => PutOp::Cas(cas),
                Err(message) => return Response::text(500, &message),
            }
        } else {
            PutOp::Set
        };
        if request.body.len() > MAX_VALUE_SIZE {
            return Response::text(413, &format!("Value exceeds {MAX_VALUE_SIZE} byte limit"));
        }
        let value = request.body.as_slice();
        let mut store = lock(&self.store);
        // Lock-delay is checked before anything else, even the session, and
        // without a raft write (Consul checks it in the endpoint).
        if matches!(operation, PutOp::Acquire(_)) && store.lock_delay_active(key, Instant::now()) {
            return Response::json(200, &false);
        }
        let index = store.next_index();
        let outcome = match operation {
            PutOp::Set => {
                store.set(index, key, value, flags);
                Ok(true)
            }
            PutOp::Cas(cas) => Ok(store.cas(index, key, value, flags, cas)),
            PutOp::Acquire(session) => store.acquire(index, key, value, flags, session),
            PutOp::Release(session) => Ok(store.release(index, key, value, flags, session)),
        };
        drop(store);
        self.notify_changed();
        match outcome {
            Ok(done) => Response::json(200, &done),
            Err(message) => Response::text(500, &message),
        }
    }

    fn kv_delete(&self, request: &Request, key: &str) -> Response {
        let recurse = request.has("recurse");
        if key.is_empty() && !recurse {
            return missing_key_name();
        }
        let cas = match request.value("cas").map(parse_go_uint).transpose() {
            Ok(cas) => cas,
            Err(message) => return Response::text(500, &message),
        };
        let mut store = lock(&self.store);
        let index = store.next_index();
        let done = match (recurse, cas) {
            (true, _) => {
                store.delete_tree(index, key);
                true
            }
            (false, Some(cas)) => store.delete_cas(index, key, cas),
            (false, None) => {
                store.delete(index, key);
                true
            }
        };
        drop(store);
        self.notify_changed();
        Response::json(200, &done)
    }

    // -----------------------------------------------------------------------
    // Sessions
    // -----------------------------------------------------------------------

    fn session_create(&self, body: &[u8]) -> Response {
        let spec = match SessionSpec::parse(body) {
            Ok(spec) => spec,
            Err(response) => return response,
        };
        let mut store = lock(&self.store);
        let id = store.create_session(spec);
        drop(store);
        self.notify_changed();
        Response::json(200, &serde_json::json!({ "ID": id }))
    }

    fn session_list(&self, request: &Request) -> Option<Response> {
        self.blocking_read(request, Scope::Sessions, |store| {
            let sessions: Vec<SessionJson> =
                store.sessions.values().map(SessionJson::from).collect();
            Response::json(200, &sessions).with_index(store.sessions_read_index())
        })
    }

    fn session_info(&self, request: &Request, id: &str) -> Option<Response> {
        if id.is_empty() {
            return Some(Response::text(400, "Missing session"));
        }
        self.blocking_read(request, Scope::Sessions, |store| {
            let sessions: Vec<SessionJson> = store
                .sessions
                .get(id)
                .map(SessionJson::from)
                .into_iter()
                .collect();
            Response::json(200, &sessions).with_index(store.sessions_read_index())
        })
    }

    fn session_renew(&self, id: &str) -> Response {
        if id.is_empty() {
            return Response::text(400, "Missing session");
        }
        let mut store = lock(&self.store);
        match store.sessions.get_mut(id) {
            Some(session) => {
                session.last_renewed = Instant::now();
                session.renewals += 1;
                Response::json(200, &[SessionJson::from(&*session)])
            }
            None => Response::text(404, &format!("Session id '{id}' not found")),
        }
    }

    /// `acls`: with ACLs on, Consul looks the session up to check the
    /// token against its node, and answers 500 "Unknown session" for one
    /// that is gone; without, it answers 200 either way.
    fn session_destroy(&self, id: &str, acls: bool) -> Response {
        if id.is_empty() {
            return Response::text(400, "Missing session");
        }
        let mut store = lock(&self.store);
        if acls && !store.sessions.contains_key(id) {
            return Response::text(500, &format!("Unknown session {id:?}"));
        }
        store.destroy_session(id);
        drop(store);
        self.notify_changed();
        Response::json(200, &true)
    }
}

enum PutOp<'a> {
    Set,
    Cas(u64),
    Acquire(&'a str),
    Release(&'a str),
}

/// `?index=` and `?wait=` of a read.
struct BlockingQuery {
    min_index: u64,
    wait: Duration,
}

impl BlockingQuery {
    /// Parses like Consul's `parseWait` (wait first, then index) and its
    /// consistency check.
    fn parse(request: &Request) -> Result<BlockingQuery, Response> {
        let bad = |message: &str| Response::text(400, message);
        // Like Go's query.Get, an empty value counts as absent.
        let param = |name: &str| request.value(name).filter(|value| !value.is_empty());
        let wait = match param("wait") {
            Some(text) => match parse_go_duration(text) {
                Ok(nanos) if nanos <= 0 => DEFAULT_QUERY_WAIT,
                Ok(nanos) => Duration::from_nanos(nanos as u64).min(MAX_QUERY_WAIT),
                Err(_) => return Err(bad("Invalid wait time")),
            },
            None => DEFAULT_QUERY_WAIT,
        };
        let min_index = match param("index") {
            Some(text) => parse_go_uint(text).map_err(|_| bad("Invalid index"))?,
            None => 0,
        };
        if request.has("stale") && request.has("consistent") {
            return Err(bad(
                "Cannot specify ?stale with ?consistent, conflicting semantics.",
            ));
        }
        Ok(BlockingQuery { min_index, wait })
    }
}

/// The fields of a `PUT /v1/session/create` body, validated.
struct SessionSpec {
    name: String,
    ttl_text: String,
    ttl: Option<Duration>,
    behavior: Behavior,
    lock_delay: Duration,
}

impl SessionSpec {
    /// Validates in Consul's order: decode (400), then Behavior, then TTL (500).
    fn parse(body: &[u8]) -> Result<SessionSpec, Response> {
        let decode_failed =
            |detail: &str| Response::text(400, &format!("Request decode failed: {detail}"));
        let fields = if body.iter().all(u8::is_ascii_whitespace) {
            serde_json::Map::new()
        } else {
            match serde_json::from_slice::<Json>(body) {
                Ok(Json::Object(fields)) => fields,
                Ok(Json::Null) => serde_json::Map::new(),
                Ok(_) => return Err(decode_failed("the body must be a JSON object")),
                Err(error) => return Err(decode_failed(&error.to_string())),
            }
        };
        let text_field = |name: &str| -> Result<String, Response> {
            match fields.get(name) {
                None | Some(Json::Null) => Ok(String::new()),
                Some(Json::String(text)) => Ok(text.clone()),
                Some(other) => Err(decode_failed(&format!(
                    "{name} must be a string, got {other}"
                ))),
            }
        };
        let name = text_field("Name")?;
        let behavior = match text_field("Behavior")?.as_str() {
            "" | "release" => Behavior::Release,
            "delete" => Behavior::Delete,
            other => {
                return Err(Response::text(
                    500,
                    &format!("Invalid Behavior setting '{other}'"),
                ))
            }
        };
        let ttl_text = text_field("TTL")?;
        let ttl = if ttl_text.is_empty() {
            None
        } else {
            let nanos = parse_go_duration(&ttl_text).map_err(|error| {
                Response::text(500, &format!("Session TTL '{ttl_text}' invalid: {error}"))
            })?;
            if nanos != 0 && !(SESSION_TTL_MIN_NANOS..=SESSION_TTL_MAX_NANOS).contains(&nanos) {
                return Err(Response::text(
                    500,
                    &format!("Invalid Session TTL '{nanos}', must be between [10s=24h0m0s]"),
                ));
            }
            // "0s" means no TTL.
            (nanos != 0).then(|| Duration::from_nanos(nanos as u64))
        };
        // LockDelay is a Go duration string or a number: below 1000 it means
        // seconds, otherwise nanoseconds (Consul's fixupLockDelay).
        let lock_delay = match fields.get("LockDelay") {
            None | Some(Json::Null) => DEFAULT_LOCK_DELAY,
            Some(Json::String(text)) => {
                let nanos = parse_go_duration(text).map_err(|e| decode_failed(&e))?;
                Duration::from_nanos(nanos.max(0) as u64)
            }
            Some(Json::Number(number)) => match number.as_u64() {
                Some(n) if n < 1000 => Duration::from_secs(n),
                Some(n) => Duration::from_nanos(n),
                None => Duration::ZERO,
            },
            Some(other) => return Err(decode_failed(&format!("invalid LockDelay {other}"))),
        };
        Ok(SessionSpec {
            name,
            ttl_text,
            ttl,
            behavior,
            lock_delay,
        })
    }
}

// ---------------------------------------------------------------------------
// The store
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Behavior {
    Release,
    Delete,
}

impl Behavior {
    fn as_str(self) -> &'static str {
        match self {
            Behavior::Release => "release",
            Behavior::Delete => "delete",
        }
    }
}

struct Session {
    id: String,
    name: String,
    /// The TTL as the client sent it ("15s"), echoed back by info/list.
    ttl_text: String,
    ttl: Option<Duration>,
    behavior: Behavior,
    lock_delay: Duration,
    create_index: u64,
    last_renewed: Instant,
    renewals: u64,
}

/// What a blocking query waits on.
enum Scope {
    /// One key (a plain read): its own writes and its deletion.
    Key(String),
    /// Every key under a prefix (a listing): any write under it.
    Prefix(String),
    /// The sessions table.
    Sessions,
}

/// What a change touched, for the blocking queries to wake.
enum Touched {
    Key(String),
    Sessions,
    /// Everything: a restore renumbered every index.
    Everything,
}

impl Scope {
    fn touched_by(&self, touched: &Touched) -> bool {
        match (self, touched) {
            (_, Touched::Everything) => true,
            (Scope::Key(key), Touched::Key(changed)) => key == changed,
            (Scope::Prefix(prefix), Touched::Key(changed)) => changed.starts_with(prefix.as_str()),
            (Scope::Sessions, Touched::Sessions) => true,
            _ => false,
        }
    }
}

/// A blocking query waiting, and how to wake it.
struct Watch {
    scope: Scope,
    signal: Condvar,
}

struct Store {
    /// The raft index: every write that reaches the state machine takes the next one.
    raft_index: u64,
    kv: BTreeMap<String, KvEntry>,
    /// Index of each key's last delete, so a listing's index never goes back.
    tombstones: BTreeMap<String, u64>,
    sessions: BTreeMap<String, Session>,
    /// Index of the last session create/destroy (the "sessions" table index).
    sessions_index: u64,
    /// Keys released by an invalidated session, and when acquiring them is
    /// allowed again.
    lock_delays: HashMap<String, Instant>,
    ttl_multiplier: f64,
    rng: Rng,
    /// How many times `restore_with_lower_index` ran: blocking queries
    /// started before a restore answer at once.
    restores: u64,
    /// What the writes since the last wake-up touched.
    touched: Vec<Touched>,
}

impl Store {
    fn new(rng: Rng) -> Store {
        Store {
            raft_index: FIRST_INDEX,
            kv: BTreeMap::new(),
            tombstones: BTreeMap::new(),
            sessions: BTreeMap::new(),
            sessions_index: 0,
            lock_delays: HashMap::new(),
            ttl_multiplier: 2.0,
            rng,
            restores: 0,
            touched: Vec::new(),
        }
    }

    /// Renumbers every index in use (keys, deletes, sessions) from the
    /// bottom, in the same order: the state as a restore onto servers whose
    /// raft log is shorter leaves it.
    fn renumber(&mut self) {
        let mut used: Vec<u64> = self
            .kv
            .values()
            .flat_map(|e| [e.create_index, e.modify_index])
            .chain(self.tombstones.values().copied())
            .chain(self.sessions.values().map(|s| s.create_index))
            .chain([self.sessions_index])
            .filter(|&i| i > 0)
            .collect();
        used.sort_unstable();
        used.dedup();
        let rank = |index: u64| match used.binary_search(&index) {
            Ok(at) => FIRST_INDEX + 1 + at as u64,
            Err(_) => index,
        };
        for entry in self.kv.values_mut() {
            entry.create_index = rank(entry.create_index);
            entry.modify_index = rank(entry.modify_index);
        }
        for index in self.tombstones.values_mut() {
            *index = rank(*index);
        }
        for session in self.sessions.values_mut() {
            session.create_index = rank(session.create_index);
        }
        self.sessions_index = rank(self.sessions_index);
        self.raft_index = FIRST_INDEX + used.len() as u64;
        self.restores += 1;
        self.touched.push(Touched::Everything);
    }

    fn next_index(&mut self) -> u64 {
        self.raft_index += 1;
        self.raft_index
    }

    fn under<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a KvEntry> + 'a {
        self.kv
            .range(prefix.to_string()..)
            .take_while(move |(key, _)| key.starts_with(prefix))
            .map(|(_, entry)| entry)
    }

    /// X-Consul-Index of a listing: the highest ModifyIndex or delete index
    /// under the prefix, at least 1.
    fn prefix_index(&self, prefix: &str) -> u64 {
        let live = self.under(prefix).map(|e| e.modify_index).max();
        let deleted = self
            .tombstones
            .range(prefix.to_string()..)
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(_, index)| *index)
            .max();
        live.max(deleted).unwrap_or(0).max(1)
    }

    /// X-Consul-Index of a GET for a key that does not exist.
    fn missing_key_index(&self, key: &str) -> u64 {
        self.tombstones.get(key).copied().unwrap_or(0).max(1)
    }

    fn sessions_read_index(&self) -> u64 {
        self.sessions_index.max(1)
    }

    /// `?keys` listing: with a separator, keys are cut just after the first
    /// separator following the prefix, and repeats dropped.
    fn keys_under(&self, prefix: &str, separator: &str) -> Vec<String> {
        let mut keys: Vec<String> = Vec::new();
        for entry in self.under(prefix) {
            let key = match entry.key[prefix.len()..].find(separator) {
                Some(at) if !separator.is_empty() => {
                    &entry.key[..prefix.len() + at + separator.len()]
                }
                _ => entry.key.as_str(),
            };
            if keys.last().map(String::as_str) != Some(key) {
                keys.push(key.to_string());
            }
        }
        keys
    }

    /// A plain write: an existing entry keeps its CreateIndex, LockIndex and
    /// Session (Consul only changes the holder through acquire/release).
    fn set(&mut self, index: u64, key: &str, value: &[u8], flags: u64) {
        let previous = self.kv.get(key);
        let entry = KvEntry {
            key: key.to_string(),
            value: value.to_vec(),
            flags,
            session: previous.and_then(|e| e.session.clone()),
            lock_index: previous.map_or(0, |e| e.lock_index),
            create_index: previous.map_or(index, |e| e.create_index),
            modify_index: index,
        };
        self.kv.insert(key.to_string(), entry);
        self.touched.push(Touched::Key(key.to_string()));
    }

    /// `cas=0` creates only; `cas=N` writes only over ModifyIndex N.
    fn cas(&mut self, index: u64, key: &str, value: &[u8], flags: u64, cas: u64) -> bool {
        let allowed = match self.kv.get(key) {
            None => cas == 0,
            Some(entry) => cas != 0 && entry.modify_index == cas,
        };
        if allowed {
            self.set(index, key, value, flags);
        }
        allowed
    }

    fn acquire(
        &mut self,
        index: u64,
        key: &str,
        value: &[u8],
        flags: u64,
        session: &str,
    ) -> Result<bool, String> {
        if session.is_empty() {
            return Err("missing session".to_string());
        }
        // Consul's UUID index rejects other lengths before looking anything up.
        if session.len() != 36 {
            return Err(
                "failed session lookup: index error: UUID must be 36 characters".to_string(),
            );
        }
        if !self.sessions.contains_key(session) {
            return Err(format!("invalid session {session:?}"));
        }
        let (create_index, lock_index) = match self.kv.get(key) {
            None => (index, 1),
            Some(entry) => match entry.session.as_deref() {
                // The holder re-acquiring keeps its LockIndex.
                Some(holder) if holder == session => (entry.create_index, entry.lock_index),
                Some(_) => return Ok(false),
                None => (entry.create_index, entry.lock_index + 1),
            },
        };
        self.kv.insert(
            key.to_string(),
            KvEntry {
                key: key.to_string(),
                value: value.to_vec(),
                flags,
                session: Some(session.to_string()),
                lock_index,
                create_index,
                modify_index: index,
            },
        );
        self.touched.push(Touched::Key(key.to_string()));
        Ok(true)
    }

    /// Like Consul, a release also writes the request's value and flags.
    fn release(&mut self, index: u64, key: &str, value: &[u8], flags: u64, session: &str) -> bool {
        let Some(entry) = self.kv.get_mut(key) else {
            return false;
        };
        if entry.session.as_deref() != Some(session) {
            return false;
        }
        entry.session = None;
        entry.value = value.to_vec();
        entry.flags = flags;
        entry.modify_index = index;
        self.touched.push(Touched::Key(key.to_string()));
        true
    }

    fn delete(&mut self, index: u64, key: &str) {
        if self.kv.remove(key).is_some() {
            self.tombstones.insert(key.to_string(), index);
            self.touched.push(Touched::Key(key.to_string()));
        }
    }

    /// Consul answers true for a missing key even with a cas index.
    fn delete_cas(&mut self, index: u64, key: &str, cas: u64) -> bool {
        match self.kv.get(key) {
            None => true,
            Some(entry) if entry.modify_index == cas => {
                self.delete(index, key);
                true
            }
            Some(_) => false,
        }
    }

    fn delete_tree(&mut self, index: u64, prefix: &str) {
        let keys: Vec<String> = self.under(prefix).map(|e| e.key.clone()).collect();
        for key in keys {
            self.delete(index, &key);
        }
    }

    fn lock_delay_active(&self, key: &str, now: Instant) -> bool {
        self.lock_delays.get(key).is_some_and(|until| *until > now)
    }

    fn create_session(&mut self, spec: SessionSpec) -> String {
        let index = self.next_index();
        let id = loop {
            let candidate = self.rng.uuid();
            if !self.sessions.contains_key(&candidate) {
                break candidate;
            }
        };
        self.sessions.insert(
            id.clone(),
            Session {
                id: id.clone(),
                name: spec.name,
                ttl_text: spec.ttl_text,
                ttl: spec.ttl,
                behavior: spec.behavior,
                lock_delay: spec.lock_delay,
                create_index: index,
                last_renewed: Instant::now(),
                renewals: 0,
            },
        );
        self.sessions_index = index;
        self.touched.push(Touched::Sessions);
        id
    }

    /// Destroys a session and applies its behaviour to the keys it holds.
    /// Takes a raft index even for an unknown session, as the recording shows.
    fn destroy_session(&mut self, id: &str) {
        let index = self.next_index();
        let Some(session) = self.sessions.remove(id) else {
            return;
        };
        self.sessions_index = index;
        self.touched.push(Touched::Sessions);
        let held: Vec<String> = self
            .kv
            .values()
            .filter(|e| e.session.as_deref() == Some(id))
            .map(|e| e.key.clone())
            .collect();
        let delay = session.lock_delay.min(MAX_LOCK_DELAY);
        let now = Instant::now();
        for key in held {
            match session.behavior {
                Behavior::Release => {
                    if let Some(entry) = self.kv.get_mut(&key) {
                        entry.session = None;
                        entry.modify_index = index;
                        self.touched.push(Touched::Key(key.clone()));
                    }
                }
                Behavior::Delete => self.delete(index, &key),
            }
            // Consul 1.0 (deleteSessionTxn) starts the lock-delay for both behaviours.
            if !delay.is_zero() {
                self.lock_delays.insert(key, now + delay);
            }
        }
    }

    /// Destroys sessions whose TTL (times the multiplier) passed since their
    /// last renewal; returns how many.
    fn expire_due(&mut self, now: Instant) -> usize {
        let multiplier = self.ttl_multiplier;
        let expired: Vec<String> = self
            .sessions
            .values()
            .filter(|s| {
                s.ttl
                    .is_some_and(|ttl| now.duration_since(s.last_renewed) > ttl.mul_f64(multiplier))
            })
            .map(|s| s.id.clone())
            .collect();
        for id in &expired {
            self.destroy_session(id);
        }
        expired.len()
    }
}

// ---------------------------------------------------------------------------
// JSON shapes
// ---------------------------------------------------------------------------

/// A KV entry as Consul serializes it (this field order).
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct EntryJson<'a> {
    lock_index: u64,
    key: &'a str,
    flags: u64,
    /// Base64; null for an empty value.
    value: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<&'a str>,
    create_index: u64,
    modify_index: u64,
}

impl<'a> From<&'a KvEntry> for EntryJson<'a> {
    fn from(entry: &'a KvEntry) -> Self {
        EntryJson {
            lock_index: entry.lock_index,
            key: &entry.key,
            flags: entry.flags,
            value: (!entry.value.is_empty())
                .then(|| base64::engine::general_purpose::STANDARD.encode(&entry.value)),
            session: entry.session.as_deref(),
            create_index: entry.create_index,
            modify_index: entry.modify_index,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct SessionJson<'a> {
    #[serde(rename = "ID")]
    id: &'a str,
    name: &'a str,
    node: &'static str,
    checks: [&'static str; 1],
    /// Nanoseconds.
    lock_delay: u64,
    behavior: &'static str,
    #[serde(rename = "TTL")]
    ttl: &'a str,
    create_index: u64,
    modify_index: u64,
}

impl<'a> From<&'a Session> for SessionJson<'a> {
    fn from(session: &'a Session) -> Self {
        SessionJson {
            id: &session.id,
            name: &session.name,
            node: NODE_NAME,
            checks: ["serfHealth"],
            lock_delay: session.lock_delay.as_nanos() as u64,
            behavior: session.behavior.as_str(),
            ttl: &session.ttl_text,
            create_index: session.create_index,
            modify_index: session.create_index,
        }
    }
}

// ---------------------------------------------------------------------------
// Connections: plain TCP or TLS
// ---------------------------------------------------------------------------

/// One accepted connection. The registry keeps a clone of the TCP socket,
/// so shutting that down ends reads and writes here, TLS or not.
enum Connection {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ServerConnection, TcpStream>>),
}

impl Connection {
    /// Ends a TLS session properly (close_notify) before the socket closes;
    /// nothing to do for plain TCP.
    fn close_notify(&mut self) {
        if let Connection::Tls(stream) = self {
            stream.conn.send_close_notify();
            let _ = stream.flush();
        }
    }
}

impl Read for Connection {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Connection::Plain(stream) => stream.read(buf),
            Connection::Tls(stream) => stream.read(buf),
        }
    }
}

impl Write for Connection {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Connection::Plain(stream) => stream.write(buf),
            Connection::Tls(stream) => stream.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Connection::Plain(stream) => stream.flush(),
            Connection::Tls(stream) => stream.flush(),
        }
    }
}

/// A rustls server configuration (ring provider, TLS 1.2 and 1.3) from PEM.
fn server_config(tls: &TlsServer) -> Arc<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(tls.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .expect("TlsServer::cert_pem holds PEM certificates");
    assert!(
        !chain.is_empty(),
        "TlsServer::cert_pem holds no certificate"
    );
    let key = PrivateKeyDer::from_pem_slice(tls.key_pem.as_bytes())
        .expect("TlsServer::key_pem holds a PEM private key");
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .expect("the ring provider supports the default TLS versions");
    let builder = match &tls.client_ca_pem {
        None => builder.with_no_client_auth(),
        Some(ca_pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
                roots
                    .add(cert.expect("TlsServer::client_ca_pem holds PEM certificates"))
                    .expect("a usable client CA certificate");
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .expect("a client certificate verifier");
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(chain, key)
        .expect("the certificate matches its key");
    Arc::new(config)
}

// ---------------------------------------------------------------------------
// HTTP/1.1
// ---------------------------------------------------------------------------

struct Request {
    method: String,
    /// The request target as sent (path and query, still encoded).
    target: String,
    path: String,
    query: Vec<(String, String)>,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    keep_alive: bool,
}

impl Request {
    fn value(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn has(&self, name: &str) -> bool {
        self.value(name).is_some()
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

enum RequestError {
    /// The client closed the connection (or it was shut down) between requests.
    Closed,
    Malformed(String),
}

impl From<io::Error> for RequestError {
    fn from(_: io::Error) -> Self {
        RequestError::Closed
    }
}

fn read_line(reader: &mut impl BufRead) -> Result<String, RequestError> {
    let mut line = Vec::new();
    if reader.read_until(b'\n', &mut line)? == 0 {
        return Err(RequestError::Closed);
    }
    while matches!(line.last(), Some(b'\n' | b'\r')) {
        line.pop();
    }
    String::from_utf8(line).map_err(|_| RequestError::Malformed("non-UTF-8 header".into()))
}

fn read_request(reader: &mut BufReader<Connection>) -> Result<Request, RequestError> {
    // Tolerate stray blank lines between requests (RFC 9112, 2.2).
    let request_line = loop {
        let line = read_line(reader)?;
        if !line.is_empty() {
            break line;
        }
    };
    let malformed = || RequestError::Malformed(format!("malformed request line {request_line:?}"));
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(malformed());
    };
    let mut headers = Vec::new();
    loop {
        let line = read_line(reader)?;
        if line.is_empty() {
            break;
        }
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| RequestError::Malformed(format!("malformed header {line:?}")))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    // Accept absolute-form targets too; only the path and query matter.
    let origin = match target.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |at| &rest[at..]),
        None => target,
    };
    let (raw_path, raw_query) = origin.split_once('?').unwrap_or((origin, ""));
    let path = percent_decode(raw_path, false).map_err(RequestError::Malformed)?;
    let query = raw_query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((percent_decode(name, true)?, percent_decode(value, true)?))
        })
        .collect::<Result<Vec<_>, String>>()
        .map_err(RequestError::Malformed)?;
    let mut request = Request {
        method: method.to_string(),
        target: origin.to_string(),
        path,
        query,
        headers,
        body: Vec::new(),
        keep_alive: true,
    };
    let connection = request
        .header("connection")
        .unwrap_or("")
        .to_ascii_lowercase();
    request.keep_alive = if version == "HTTP/1.0" {
        connection.contains("keep-alive")
    } else {
        !connection.contains("close")
    };
    if request
        .header("expect")
        .is_some_and(|e| e.eq_ignore_ascii_case("100-continue"))
    {
        let writer = reader.get_mut();
        writer.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
        writer.flush()?;
    }
    let chunked = request
        .header("transfer-encoding")
        .is_some_and(|te| te.to_ascii_lowercase().contains("chunked"));
    request.body = if chunked {
        read_chunked_body(reader)?
    } else {
        let length = match request.header("content-length") {
            Some(text) => text
                .parse::<usize>()
                .map_err(|_| RequestError::Malformed(format!("bad Content-Length {text:?}")))?,
            None => 0,
        };
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        body
    };
    Ok(request)
}

fn read_chunked_body(reader: &mut impl BufRead) -> Result<Vec<u8>, RequestError> {
    let mut body = Vec::new();
    loop {
        let line = read_line(reader)?;
        let size_text = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| RequestError::Malformed(format!("bad chunk size {line:?}")))?;
        if size == 0 {
            // Skip any trailers up to the blank line that ends the body.
            while !read_line(reader)?.is_empty() {}
            return Ok(body);
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(&mut body[start..])?;
        read_line(reader)?; // the CRLF after the chunk data
    }
}

/// Decodes %XX escapes (and `+` as a space in query strings, as Go's
/// url.ParseQuery does). Invalid escapes are an error, as in Go.
fn percent_decode(raw: &str, plus_is_space: bool) -> Result<String, String> {
    let bytes = raw.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'%' => {
                let hex = bytes
                    .get(at + 1..at + 3)
                    .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
                    .ok_or_else(|| format!("invalid URL escape in {raw:?}"))?;
                let text = std::str::from_utf8(hex).expect("hex digits are ASCII");
                decoded.push(u8::from_str_radix(text, 16).expect("checked hex digits"));
                at += 3;
            }
            b'+' if plus_is_space => {
                decoded.push(b' ');
                at += 1;
            }
            byte => {
                decoded.push(byte);
                at += 1;
            }
        }
    }
    Ok(String::from_utf8_lossy(&decoded).into_owned())
}

struct Response {
    status: u16,
    content_type: Option<&'static str>,
    /// Set on reads: adds X-Consul-Index and the leader headers.
    index: Option<u64>,
    /// Adds `X-Consul-Results-Filtered-By-ACLs: true`.
    filtered_by_acls: bool,
    body: Vec<u8>,
}

impl Response {
    fn json(status: u16, body: &impl Serialize) -> Response {
        Response {
            status,
            content_type: Some(JSON),
            index: None,
            filtered_by_acls: false,
            body: serde_json::to_vec(body).expect("serializable response"),
        }
    }

    fn text(status: u16, message: &str) -> Response {
        Response {
            status,
            content_type: Some(TEXT),
            index: None,
            filtered_by_acls: false,
            body: message.as_bytes().to_vec(),
        }
    }

    /// Consul's not-found answers for KV have no body and no Content-Type.
    fn empty(status: u16) -> Response {
        Response {
            status,
            content_type: None,
            index: None,
            filtered_by_acls: false,
            body: Vec::new(),
        }
    }

    /// `?raw`: the value's bytes, with the type Go's content sniffing would give.
    fn raw(value: &[u8]) -> Response {
        let content_type = if std::str::from_utf8(value).is_ok() {
            TEXT
        } else {
            "application/octet-stream"
        };
        Response {
            status: 200,
            content_type: Some(content_type),
            index: None,
            filtered_by_acls: false,
            body: value.to_vec(),
        }
    }

    fn with_index(self, index: u64) -> Response {
        Response {
            index: Some(index),
            ..self
        }
    }

    fn filtered_by_acls(self, filtered: bool) -> Response {
        Response {
            filtered_by_acls: filtered,
            ..self
        }
    }
}

fn not_found() -> Response {
    Response::text(404, "404 page not found\n")
}

fn method_not_allowed(method: &str) -> Response {
    Response::text(405, &format!("Method {method} not allowed"))
}

fn missing_key_name() -> Response {
    Response::text(400, "Missing key name")
}

/// Consul's answer to a request its token may not make.
fn permission_denied() -> Response {
    Response::text(403, "Permission denied")
}

/// The token Consul would take from a request: `?token=` first, then
/// `X-Consul-Token`, then `Authorization: Bearer`. Header names lowercased.
fn token_of<'a>(query: &'a [(String, String)], headers: &'a [(String, String)]) -> Option<&'a str> {
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    };
    query
        .iter()
        .find(|(k, v)| k == "token" && !v.is_empty())
        .map(|(_, v)| v.as_str())
        .or_else(|| header("x-consul-token"))
        .or_else(|| {
            header("authorization").and_then(|v| {
                let (scheme, token) = v.split_once(' ')?;
                scheme
                    .eq_ignore_ascii_case("bearer")
                    .then(|| token.trim())
                    .filter(|t| !t.is_empty())
            })
        })
}

/// Whether `rights` allow `request` (listings are then filtered, in
/// `kv_get`). Requests Consul would refuse before looking at the token (a
/// wrong method, a missing key name) are let through to be refused the
/// same way.
/// `newer`: an agent of 1.11 or later, which refuses a listing with no
/// readable part; older ones answer it as empty.
fn allowed(request: &Request, rights: &Rights, newer: bool) -> bool {
    let method = request.method.as_str();
    if let Some(key) = request.path.strip_prefix("/v1/kv/") {
        let listing = request.has("keys") || request.has("recurse");
        return match method {
            "GET" if listing => !newer || rights.can_read_some(key),
            // A recursive delete needs write on the whole prefix: a rule
            // that covers it, which `can_write(prefix)` is.
            "GET" | "PUT" | "DELETE" if key.is_empty() && !listing => true,
            "GET" => rights.can_read(key),
            "PUT" | "DELETE" => rights.can_write(key),
            _ => true,
        };
    }
    if let Some(rest) = request.path.strip_prefix("/v1/session/") {
        let action = rest.split('/').next().unwrap_or("");
        return match (action, method) {
            ("create" | "renew" | "destroy", "PUT") => rights.session_write,
            _ => true,
        };
    }
    true
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

fn write_response(mut writer: impl Write, response: &Response, keep_alive: bool) -> io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {} {}\r\n",
        response.status,
        reason_phrase(response.status)
    );
    if let Some(content_type) = response.content_type {
        head.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    if let Some(index) = response.index {
        head.push_str(&format!(
            "X-Consul-Index: {index}\r\nX-Consul-Knownleader: true\r\nX-Consul-Lastcontact: 0\r\n"
        ));
    }
    if response.filtered_by_acls {
        head.push_str("X-Consul-Results-Filtered-By-ACLs: true\r\n");
    }
    head.push_str(&format!("Content-Length: {}\r\n", response.body.len()));
    if !keep_alive {
        head.push_str("Connection: close\r\n");
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(&response.body);
    writer.write_all(&bytes)?;
    writer.flush()
}

// ---------------------------------------------------------------------------
// Go-compatible parsing and small utilities
// ---------------------------------------------------------------------------

/// Go's `strconv.ParseUint(text, 10, 64)`, with its error wording (Consul
/// passes it to clients verbatim).
fn parse_go_uint(text: &str) -> Result<u64, String> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "strconv.ParseUint: parsing {text:?}: invalid syntax"
        ));
    }
    text.parse::<u64>()
        .map_err(|_| format!("strconv.ParseUint: parsing {text:?}: value out of range"))
}

/// Go's `time.ParseDuration` ("1500ms", "2s", "1h2m3.5s", "0"), in
/// nanoseconds, with Go's error wording.
fn parse_go_duration(text: &str) -> Result<i128, String> {
    let invalid = || format!("time: invalid duration {text:?}");
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let digits_end = |s: &str| s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let mut total: i128 = 0;
    while !rest.is_empty() {
        let (whole, after) = rest.split_at(digits_end(rest));
        let (fraction, after) = match after.strip_prefix('.') {
            Some(after_dot) => after_dot.split_at(digits_end(after_dot)),
            None => ("", after),
        };
        if whole.is_empty() && fraction.is_empty() {
            return Err(invalid());
        }
        let unit_end = after
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        let unit_nanos: i128 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3_600 * 1_000_000_000,
            "" => return Err(format!("time: missing unit in duration {text:?}")),
            _ => return Err(format!("time: unknown unit {unit:?} in duration {text:?}")),
        };
        let whole: i128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| invalid())?
        };
        let mut value = whole.checked_mul(unit_nanos).ok_or_else(invalid)?;
        if !fraction.is_empty() {
            // Digits past nanosecond precision cannot matter.
            let fraction = &fraction[..fraction.len().min(18)];
            let scale = 10i128.pow(fraction.len() as u32);
            value += fraction.parse::<i128>().map_err(|_| invalid())? * unit_nanos / scale;
        }
        total = total.checked_add(value).ok_or_else(invalid)?;
        if total > i64::MAX as i128 {
            return Err(invalid());
        }
        rest = after;
    }
    Ok(if negative { -total } else { total })
}

/// xorshift64* seeded from std's randomly keyed hasher: enough for session
/// IDs and jitter without a `rand` dependency.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn seeded() -> Rng {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        Rng(hasher.finish() | 1)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    fn fraction(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A random UUID in version 4 layout (8-4-4-4-12 lowercase hex).
    fn uuid(&mut self) -> String {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.next_u64().to_be_bytes());
        bytes[8..].copy_from_slice(&self.next_u64().to_be_bytes());
        bytes[6] = (bytes[6] & 0x0f) | 0x40;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "{}-{}-{}-{}-{}",
            &hex[..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..]
        )
    }
}
