//! A small client for the parts of Consul's HTTP API that the semaphore uses:
//! sessions and KV, with blocking queries. It knows HTTP and Consul's answers,
//! not the semaphore: callers decide what a status means for them.

use std::borrow::Cow;
use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;
use ureq::http;
use ureq::unversioned::transport::DefaultConnector;
use ureq::RequestExt as _;

use crate::duration;
use crate::store::consul::semaphore::{self, Entry, LockRecord, Snapshot};
use crate::store::resolver::DirectResolver;
use crate::store::tls::{self, TlsSettings};
use crate::store::StoreError;

/// Connect timeout: Consul agents run next to their clients, so a connection
/// that takes longer than this is not coming.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Budget for a call that does not block on the server.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Slack on top of a blocking query's wait: Consul adds up to wait/16 of
/// jitter, and the answer still has to travel.
const BLOCKING_SLACK: Duration = Duration::from_secs(5);

/// Where and how to reach Consul.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsulConfig {
    pub address: Address,
    pub token: Option<String>,
    /// `user:password` for HTTP basic authentication (`CONSUL_HTTP_AUTH`).
    pub basic_auth: Option<String>,
    pub datacenter: Option<String>,
    pub namespace: Option<String>,
    pub partition: Option<String>,
    pub tls: TlsSettings,
}

/// The agent's HTTP API address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    pub https: bool,
    /// `host:port`.
    pub host_port: String,
    /// A path in front of `/v1` when the API sits behind a reverse proxy.
    pub path_prefix: String,
}

impl Address {
    /// Host and port, with IPv6 brackets taken off the host.
    fn split(&self) -> (&str, Option<&str>) {
        let text = self.host_port.as_str();
        if let Some((host, after)) = text.strip_prefix('[').and_then(|rest| rest.split_once(']')) {
            return (host, after.strip_prefix(':'));
        }
        match text.rsplit_once(':') {
            Some((host, port)) if !host.contains(':') => (host, Some(port)),
            _ => (text, None),
        }
    }

    /// The host part, for certificate checks.
    fn host(&self) -> &str {
        self.split().0
    }

    fn port(&self) -> &str {
        match self.split().1 {
            Some(port) => port,
            None if self.https => "443",
            None => "80",
        }
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.https { "https" } else { "http" };
        write!(f, "{scheme}://{}{}", self.host_port, self.path_prefix)
    }
}

/// How a call failed, sorted by what the caller can do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsulError {
    /// No answer, or a 5xx: worth retrying (the agent may be restarting, or
    /// the cluster may have no leader for a moment).
    Transient(String),
    /// The request went out, but no answer came in time: worth retrying
    /// too, and it may have taken effect.
    Unanswered(String),
    /// 403: the token lacks a permission. Retrying will not help.
    Denied(String),
    /// Any other answer the call did not expect.
    Rejected { status: u16, body: String },
}

impl std::fmt::Display for ConsulError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConsulError::Transient(why) | ConsulError::Unanswered(why) => write!(f, "{why}"),
            ConsulError::Denied(why) => write!(f, "permission denied: {why}"),
            ConsulError::Rejected { status, body } => {
                write!(f, "the server answered {status}: {body}")
            }
        }
    }
}

impl std::error::Error for ConsulError {}

/// Holders a listing showed as dead that are not: see
/// [`Client::reveal_hidden`].
#[derive(Debug, Default)]
pub struct Revealed {
    /// Their keys cannot be read (403).
    pub hidden: Vec<String>,
    /// Their keys are held: they came back since the listing.
    pub revived: Vec<String>,
}

/// Why consem refuses to go on when a holder's contender key is hidden from
/// its token: the listing left it out without saying so, and the direct
/// read of the key answered 403 or showed it held.
pub fn hidden_holder(prefix: &str, session: &str) -> String {
    format!(
        "Consul left keys out of the listing because the token cannot read them (the contender key {prefix}/{session} of a holder in .lock); consem will not prune holders it cannot see: the token needs key:read on {prefix}/, for every key"
    )
}

/// An answer with its status, `X-Consul-Index`, and body.
struct Reply {
    status: u16,
    index: Option<u64>,
    body: Vec<u8>,
}

/// What a session renewal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    Renewed,
    /// Consul no longer knows the session (404): it was invalidated.
    Gone,
}

/// A listing of a prefix and the index to block on next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    pub index: u64,
    pub entries: Vec<Entry>,
}

/// How a read may be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consistency {
    /// Any server may answer (the default; cheap, maybe a little stale).
    Default,
    /// The leader confirms it is still the leader: no stale answers.
    Consistent,
}

/// Options for creating a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSpec {
    pub name: String,
    pub ttl: Duration,
}

/// A listing's entry as Consul writes it, borrowing from the answer: a
/// listing holds every contender, and most of its strings are read once.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawEntry<'a> {
    #[serde(borrow)]
    key: Cow<'a, str>,
    flags: u64,
    #[serde(borrow)]
    value: Option<Cow<'a, str>>,
    #[serde(borrow)]
    session: Option<Cow<'a, str>>,
    create_index: u64,
    modify_index: u64,
}

/// What `consem status` shows of a session.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct SessionInfo {
    #[serde(rename = "Node", default)]
    pub node: String,
    #[serde(rename = "Name", default)]
    pub name: String,
}

#[derive(Deserialize)]
struct CreatedSession {
    #[serde(rename = "ID")]
    id: String,
}

/// What a contender key acquisition found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquire {
    Held,
    /// Another session holds the key, or it is in its lock-delay.
    Refused,
    /// Consul does not know the session: it was invalidated.
    UnknownSession,
}

/// A Consul HTTP API client. Cheap to clone: clones share connections.
#[derive(Clone)]
pub struct Client {
    agent: ureq::Agent,
    config: ConsulConfig,
    /// Scheme, host and path prefix that request URLs start with.
    base_url: String,
    /// Headers every request carries (token, basic authentication).
    headers: Vec<(&'static str, String)>,
    call_timeout: Duration,
}

impl Client {
    /// Builds the client; TLS files are read now, so a bad one is reported
    /// at start.
    pub fn new(config: ConsulConfig) -> Result<Client, StoreError> {
        let address = &config.address;
        let mut builder = ureq::Agent::config_builder()
            .http_status_as_error(false)
            // The agent is addressed directly, as the consul CLI does: a
            // proxy from the environment must not see the calls or the token.
            .proxy(None)
            // A redirect means a path Consul cleaned up; following it would
            // turn a PUT into a GET. Report the answer instead.
            .max_redirects(0)
            .timeout_connect(Some(CONNECT_TIMEOUT))
            // Consul's answers stream through; their headers are small. The
            // default, 128 KiB each way per connection, is time spent zeroing.
            .input_buffer_size(IO_BUFFER)
            .output_buffer_size(IO_BUFFER)
            .user_agent(concat!("consem/", env!("CARGO_PKG_VERSION")));
        if address.https {
            let tls = config.tls.load(&TLS_NAMES);
            builder =
                builder.tls_config(tls.map_err(|e| StoreError::usage(e.to_string()).caused_by(e))?);
        }
        let server_name = config.tls.server_name.as_deref().filter(|_| address.https);
        let (pinned, base_url) = match server_name {
            // URLs name the certificate's host, so that rustls checks it; the
            // resolver still connects to the address given.
            Some(name) => {
                let target = format!("https://{}/", address.host_port);
                let target: http::Uri = target
                    .parse()
                    .map_err(|_| StoreError::usage(format!("cannot use {target} as an address")))?;
                (
                    Some(target),
                    format!("https://{name}:{}{}", address.port(), address.path_prefix),
                )
            }
            None => (None, address.to_string()),
        };
        let agent = ureq::Agent::with_parts(
            builder.build(),
            DefaultConnector::new(),
            DirectResolver { pinned },
        );
        let mut headers = Vec::new();
        if let Some(token) = &config.token {
            headers.push(("X-Consul-Token", token.clone()));
        }
        if let Some(credentials) = &config.basic_auth {
            let encoded = base64::engine::general_purpose::STANDARD.encode(credentials);
            headers.push(("Authorization", format!("Basic {encoded}")));
        }
        Ok(Client {
            agent,
            config,
            base_url,
            headers,
            call_timeout: CALL_TIMEOUT,
        })
    }

    /// The same client with a shorter budget for each non-blocking call, for
    /// clean-up that must finish in time.
    pub fn with_call_timeout(&self, timeout: Duration) -> Client {
        Client {
            call_timeout: timeout.min(CALL_TIMEOUT),
            ..self.clone()
        }
    }

    /// The address, as the user gave it, for messages.
    pub fn address(&self) -> &Address {
        &self.config.address
    }

    /// `PUT /v1/session/create` with behaviour `delete` (our keys vanish with
    /// the session) and no lock-delay (a new contender never waits for an old
    /// one's key name).
    pub fn create_session(&self, spec: &SessionSpec) -> Result<String, ConsulError> {
        let body = serde_json::json!({
            "Name": spec.name,
            "TTL": duration::to_go(spec.ttl),
            "Behavior": "delete",
            "LockDelay": "0s",
        });
        let reply = self.call(
            http::Method::PUT,
            "/v1/session/create",
            &[],
            Some(body.to_string().into_bytes()),
            self.call_timeout,
            "session:write",
        )?;
        let reply = expect_ok(reply)?;
        let created: CreatedSession = decode_json(&reply.body, "session create")?;
        Ok(created.id)
    }

    /// `<method> /v1/session/<op>/<id>`: reading needs `session:read`,
    /// the rest `session:write`.
    fn session_call(&self, method: http::Method, op: &str, id: &str) -> Result<Reply, ConsulError> {
        let permission = if method == http::Method::GET {
            "session:read"
        } else {
            "session:write"
        };
        let path = format!("/v1/session/{op}/{}", encode_path(id));
        self.call(method, &path, &[], None, self.call_timeout, permission)
    }

    /// `PUT /v1/session/renew/<id>`.
    pub fn renew_session(&self, id: &str) -> Result<Renewal, ConsulError> {
        let reply = self.session_call(http::Method::PUT, "renew", id)?;
        if reply.status == 404 {
            return Ok(Renewal::Gone);
        }
        expect_ok(reply).map(|_| Renewal::Renewed)
    }

    /// `GET /v1/session/info/<id>`: `None` when Consul does not know it.
    pub fn session_info(&self, id: &str) -> Result<Option<SessionInfo>, ConsulError> {
        let reply = self.session_call(http::Method::GET, "info", id)?;
        let reply = expect_ok(reply)?;
        let found: Option<Vec<SessionInfo>> = decode_json(&reply.body, "session info")?;
        Ok(found.and_then(|list| list.into_iter().next()))
    }

    /// `PUT /v1/session/destroy/<id>`; Consul answers `true` even for an
    /// unknown session.
    pub fn destroy_session(&self, id: &str) -> Result<(), ConsulError> {
        let reply = self.session_call(http::Method::PUT, "destroy", id)?;
        // With ACLs on, agents answer 500 "Unknown session" for a session
        // that is already gone, where they answer 200 without: gone is done.
        if reply.status == 500 && one_line(&reply.body).contains("Unknown session") {
            return Ok(());
        }
        expect_ok(reply).map(|_| ())
    }

    /// `GET /v1/kv/<prefix>/?recurse`, optionally blocking until the index
    /// moves past `index` or `wait` passes. Entry names are relative to
    /// `<prefix>/`. A missing prefix is an empty listing.
    pub fn list(
        &self,
        prefix: &str,
        consistency: Consistency,
        block: Option<(u64, Duration)>,
    ) -> Result<Listing, ConsulError> {
        let dir = format!("{prefix}/");
        self.read_kv(&dir, &dir, true, consistency, block)
    }

    /// `GET /v1/kv/<root>/?recurse` (the whole KV store for the empty
    /// root): every key at any depth, named in full.
    pub fn list_tree(&self, root: &str, consistency: Consistency) -> Result<Listing, ConsulError> {
        let key = if root.is_empty() {
            String::new()
        } else {
            format!("{root}/")
        };
        self.read_kv(&key, "", true, consistency, None)
    }

    /// `GET /v1/kv/<prefix>/<name>`: one key, as a listing of at most one
    /// entry. Blocking on it wakes only when that key changes or goes.
    pub fn get(
        &self,
        prefix: &str,
        name: &str,
        consistency: Consistency,
        block: Option<(u64, Duration)>,
    ) -> Result<Listing, ConsulError> {
        let dir = format!("{prefix}/");
        self.read_kv(&format!("{dir}{name}"), &dir, false, consistency, block)
    }

    /// Reads directly the contender key of each holder in `record` that the
    /// listing in `snapshot` shows as dead: the listing may have left it out
    /// because the token cannot read it. Marks as live in `snapshot`, so
    /// that nothing prunes them, the holders whose key the token may not
    /// read (403: `hidden`), and those whose key is held after all
    /// (`revived`: back since the listing).
    pub fn reveal_hidden(
        &self,
        prefix: &str,
        record: &LockRecord,
        snapshot: &mut Snapshot,
    ) -> Result<Revealed, ConsulError> {
        let mut revealed = Revealed::default();
        for suspect in semaphore::suspects(record, snapshot) {
            if !semaphore::can_be_a_contender_key(&suspect) {
                continue;
            }
            match self.get(prefix, &suspect, Consistency::Default, None) {
                Ok(read) => {
                    let key = read.entries.iter().find(|e| e.name == suspect);
                    if semaphore::check_key(key, &suspect).is_ok() {
                        revealed.revived.push(suspect.clone());
                    }
                }
                // The token cannot read the whole prefix: the holder may
                // live (agents filter session reads by ACL silently too).
                Err(ConsulError::Denied(_)) => revealed.hidden.push(suspect.clone()),
                Err(other) => return Err(other),
            }
        }
        let live = revealed.hidden.iter().chain(&revealed.revived).cloned();
        snapshot.hidden.extend(live);
        Ok(revealed)
    }

    /// Reads `key` (a prefix with `recurse`); entries are named relative to `dir`.
    fn read_kv(
        &self,
        key: &str,
        dir: &str,
        recurse: bool,
        consistency: Consistency,
        block: Option<(u64, Duration)>,
    ) -> Result<Listing, ConsulError> {
        let path = format!("/v1/kv/{}", encode_path(key));
        let mut query = Vec::new();
        if recurse {
            query.push(("recurse", String::new()));
        }
        if consistency == Consistency::Consistent {
            query.push(("consistent", String::new()));
        }
        let timeout = match block {
            Some((index, wait)) if index > 0 => {
                query.push(("index", index.to_string()));
                query.push(("wait", duration::to_go(wait)));
                wait + wait / 16 + BLOCKING_SLACK
            }
            _ => self.call_timeout,
        };
        let permission = format!("key:read on {key}");
        let reply = self.call(http::Method::GET, &path, &query, None, timeout, &permission)?;
        // A missing key or prefix answers 404 with an index, like an empty listing.
        let reply = if reply.status == 404 && reply.index.is_some() {
            Reply {
                body: b"[]".to_vec(),
                ..reply
            }
        } else {
            expect_ok(reply)?
        };
        let index = reply.index.ok_or_else(|| {
            ConsulError::Transient("Consul's answer has no X-Consul-Index header".into())
        })?;
        let raw: Vec<RawEntry> =
            serde_json::from_slice(&reply.body).map_err(|e| undecodable(e, "KV listing"))?;
        let entries = raw
            .into_iter()
            .filter_map(|e| {
                let name = e.key.strip_prefix(dir)?.to_string();
                let value = match e.value {
                    None => Vec::new(),
                    Some(text) => base64::engine::general_purpose::STANDARD
                        .decode(text.as_bytes())
                        .ok()?,
                };
                Some(Entry {
                    name,
                    value,
                    flags: e.flags,
                    session: e.session.filter(|s| !s.is_empty()).map(Cow::into_owned),
                    create_index: e.create_index,
                    modify_index: e.modify_index,
                })
            })
            .collect();
        Ok(Listing { index, entries })
    }

    /// `PUT /v1/kv/<key>?acquire=<session>&flags=...`.
    pub fn acquire(
        &self,
        key: &str,
        session: &str,
        value: Vec<u8>,
        flags: u64,
    ) -> Result<Acquire, ConsulError> {
        let query = [
            ("acquire", session.to_string()),
            ("flags", flags.to_string()),
        ];
        match self.write_bool(key, &query, Some(value)) {
            Ok(true) => Ok(Acquire::Held),
            Ok(false) => Ok(Acquire::Refused),
            // Consul answers 500 `invalid session "<id>"` for a session it
            // does not know; that is news about the session, not an outage.
            Err(ConsulError::Transient(why))
                if why.to_ascii_lowercase().contains("invalid session") =>
            {
                Ok(Acquire::UnknownSession)
            }
            Err(e) => Err(e),
        }
    }

    /// `PUT /v1/kv/<key>?cas=<index>&flags=...`: true when written (0 creates).
    pub fn put_cas(
        &self,
        key: &str,
        value: Vec<u8>,
        cas: u64,
        flags: u64,
    ) -> Result<bool, ConsulError> {
        let query = [("cas", cas.to_string()), ("flags", flags.to_string())];
        self.write_bool(key, &query, Some(value))
    }

    /// `DELETE /v1/kv/<key>`, with `?cas=<index>` when given.
    pub fn delete(&self, key: &str, cas: Option<u64>) -> Result<bool, ConsulError> {
        let query: Vec<(&str, String)> = cas.map(|c| ("cas", c.to_string())).into_iter().collect();
        self.write_bool(key, &query, None)
    }

    /// A KV write Consul answers `true` or `false` to: a PUT of `value`,
    /// or a DELETE without one.
    fn write_bool(
        &self,
        key: &str,
        query: &[(&str, String)],
        value: Option<Vec<u8>>,
    ) -> Result<bool, ConsulError> {
        let method = match value {
            Some(_) => http::Method::PUT,
            None => http::Method::DELETE,
        };
        let path = format!("/v1/kv/{}", encode_path(key));
        let permission = format!("key:write on {key}");
        let reply =
            expect_ok(self.call(method, &path, query, value, self.call_timeout, &permission)?)?;
        decode_json(&reply.body, "KV write")
    }

    /// Makes one request. `permission` names the ACL right it needs, for
    /// the message when Consul denies it.
    fn call(
        &self,
        method: http::Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Vec<u8>>,
        timeout: Duration,
        permission: &str,
    ) -> Result<Reply, ConsulError> {
        let url = self.url(path, query);
        let mut request = http::Request::builder().method(method).uri(&url);
        for (name, value) in &self.headers {
            request = request.header(*name, value);
        }
        let unbuilt = |e| ConsulError::Transient(format!("cannot build request to {url}: {e}"));
        let result = match body {
            Some(body) => self.send(request.body(body).map_err(unbuilt)?, timeout),
            None => self.send(request.body(()).map_err(unbuilt)?, timeout),
        };
        let address = &self.config.address;
        let mut response = result.map_err(|e| self.unreachable(e))?;
        let status = response.status().as_u16();
        if status == 403 {
            let body = response.body_mut().read_to_string().unwrap_or_default();
            let body = one_line(body.as_bytes());
            // Consul answers "ACL not found" for a token it does not know.
            if body.to_ascii_lowercase().contains("acl not found") {
                return Err(ConsulError::Denied(
                    "Consul does not know the token (ACL not found): check --token, --token-file, CONSUL_HTTP_TOKEN or CONSUL_HTTP_TOKEN_FILE".into(),
                ));
            }
            return Err(ConsulError::Denied(format!(
                "the token lacks {permission} (Consul answered 403: {body})"
            )));
        }
        // With ACLs, a listing silently leaves out what the token cannot
        // read; pruning on such a listing would drop live holders.
        let filtered = response
            .headers()
            .get("X-Consul-Results-Filtered-By-ACLs")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
        if filtered {
            return Err(ConsulError::Denied(format!(
                "Consul left keys out of the listing because the token cannot read them; consem will not prune holders it cannot see: the token needs {permission}, for every key"
            )));
        }
        let index = response
            .headers()
            .get("X-Consul-Index")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let body = response
            .body_mut()
            .with_config()
            .limit(MAX_BODY)
            .read_to_vec()
            .map_err(|e| {
                ConsulError::Transient(format!(
                    "lost Consul's answer from {address}: {}",
                    crate::store::network_cause(&e.to_string())
                ))
            })?;
        Ok(Reply {
            status,
            index,
            body,
        })
    }
}

impl Client {
    /// The URL of a request: `path`, `query` and the scope (datacenter,
    /// namespace, partition) the settings give.
    fn url(&self, path: &str, query: &[(&str, String)]) -> String {
        let mut url = format!("{}{}", self.base_url, path);
        let mut separator = '?';
        let scope = [
            ("dc", &self.config.datacenter),
            ("ns", &self.config.namespace),
            ("partition", &self.config.partition),
        ];
        let scope = scope
            .iter()
            .filter_map(|(name, value)| value.as_ref().map(|v| (*name, v)));
        for (name, value) in query.iter().map(|(n, v)| (*n, v)).chain(scope) {
            url.push(separator);
            url.push_str(name);
            if !value.is_empty() {
                url.push('=');
                url.push_str(&encode_query_value(value));
            }
            separator = '&';
        }
        url
    }

    /// Sends `request` through the agent, with its answer due within
    /// `timeout`.
    fn send<B: ureq::AsSendBody>(
        &self,
        request: http::Request<B>,
        timeout: Duration,
    ) -> Result<http::Response<ureq::Body>, ureq::Error> {
        request
            .with_agent(&self.agent)
            .configure()
            .timeout_global(Some(timeout))
            .build()
            .run()
    }

    /// A request that got no answer: why, as a user can act on it.
    fn unreachable(&self, error: ureq::Error) -> ConsulError {
        let address = &self.config.address;
        let no_client_cert = address.https && self.config.tls.client_cert.is_none();
        // The name the certificate is checked against.
        let checked = self
            .config
            .tls
            .server_name
            .as_deref()
            .unwrap_or(address.host());
        if let Some(why) = tls::explain(&error, checked, no_client_cert, &TLS_NAMES) {
            return ConsulError::Transient(format!("cannot talk to Consul at {address}: {why}"));
        }
        let why = format!(
            "cannot reach Consul at {address}: {} (is the agent running? check --http-addr or CONSUL_HTTP_ADDR; for slots on this host alone, with no server, use --store local)",
            crate::store::network_cause(&error.to_string())
        );
        // Connected and sent, then no answer: Consul may have acted.
        match error {
            ureq::Error::Timeout(ureq::Timeout::Resolve | ureq::Timeout::Connect) => {
                ConsulError::Transient(why)
            }
            ureq::Error::Timeout(_) => ConsulError::Unanswered(why),
            _ => ConsulError::Transient(why),
        }
    }
}

/// The consul CLI's names for the agent and its TLS settings.
const TLS_NAMES: tls::Names = tls::Names {
    server: "the agent",
    ca_file: "--ca-file/CONSUL_CACERT",
    ca_path: "--ca-path/CONSUL_CAPATH",
    client_cert: "--client-cert/CONSUL_CLIENT_CERT",
    client_key: "--client-key/CONSUL_CLIENT_KEY",
    address: "--http-addr",
    server_name: Some("--tls-server-name/CONSUL_TLS_SERVER_NAME"),
    plain: "give --http-addr an http:// address (with CONSUL_HTTP_SSL, if set, false)",
};

/// Size of each connection's read and write buffers.
const IO_BUFFER: usize = 16 * 1024;

/// The largest answer read: a prefix listing with the biggest `.lock` Consul
/// allows (512 KiB, base64-encoded) and many contender keys fits well within.
const MAX_BODY: u64 = 16 * 1024 * 1024;

/// Sorts an answer the caller did not handle itself: 200 passes; 403 is a
/// denial; 5xx and 429 (rate limited) are worth retrying; the rest is
/// rejected.
fn expect_ok(reply: Reply) -> Result<Reply, ConsulError> {
    if reply.status == 200 {
        // A listing can be megabytes: only an error's body is made a line.
        return Ok(reply);
    }
    let body = one_line(&reply.body);
    match reply.status {
        429 | 500..=599 => Err(ConsulError::Transient(format!(
            "Consul answered {}: {body}",
            reply.status
        ))),
        // Consul's own 404s carry an index; this one is from something else.
        404 if reply.index.is_none() => Err(ConsulError::Rejected {
            status: 404,
            body: if body.is_empty() {
                "not found; is this address a Consul agent's HTTP API?".to_string()
            } else {
                format!("not found ({body}); is this address a Consul agent's HTTP API?")
            },
        }),
        status => Err(ConsulError::Rejected { status, body }),
    }
}

/// An answer's body as one short line for an error message: a proxy's HTML
/// error page must not spill over the terminal.
fn one_line(body: &[u8]) -> String {
    const MAX_CHARS: usize = 200;
    // Enough to fill the line whatever the whitespace and the encoding.
    const MAX_READ: usize = 64 * 1024;
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX_READ)]);
    let mut line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() > MAX_CHARS {
        line = line.chars().take(MAX_CHARS).collect::<String>() + "…";
    }
    line
}

fn decode_json<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<T, ConsulError> {
    serde_json::from_slice(body).map_err(|e| undecodable(e, what))
}

fn undecodable(error: serde_json::Error, what: &str) -> ConsulError {
    ConsulError::Transient(format!(
        "Consul's answer to the {what} is not what it should be: {error}"
    ))
}

/// Percent-encodes a KV key for a URL path: everything but unreserved
/// characters and `/` is encoded, so spaces, `?`, `#`, `%` and non-ASCII
/// characters reach Consul as part of the key.
pub fn encode_path(key: &str) -> String {
    encode(key, |b| b == b'/')
}

fn encode_query_value(value: &str) -> String {
    encode(value, |_| false)
}

fn encode(text: &str, keep: impl Fn(u8) -> bool) -> String {
    let mut out = String::with_capacity(text.len());
    for &byte in text.as_bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') || keep(byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_keys_for_urls() {
        assert_eq!(encode_path("service/db/.lock"), "service/db/.lock");
        assert_eq!(encode_path("a b?c#d%e"), "a%20b%3Fc%23d%25e");
        assert_eq!(encode_path("jobs/é"), "jobs/%C3%A9");
    }

    #[test]
    fn error_bodies_become_one_short_line() {
        assert_eq!(
            one_line(b"<html>\n  <body>Bad   gateway</body>\n</html>\n"),
            "<html> <body>Bad gateway</body> </html>"
        );
        assert_eq!(one_line(&[b'x'; 500]).chars().count(), 201);
    }

    #[test]
    fn an_address_has_its_host_and_port_apart() {
        let address = |https: bool, host_port: &str| Address {
            https,
            host_port: host_port.into(),
            path_prefix: String::new(),
        };
        let v6 = address(true, "[::1]:8501");
        assert_eq!((v6.host(), v6.port()), ("::1", "8501"));
        let bare = address(true, "consul.test");
        assert_eq!((bare.host(), bare.port()), ("consul.test", "443"));
    }
}
