//! A ZooKeeper client of what consem needs, over one blocking TCP
//! connection: a session (its timeout negotiated, pings, resumed on another
//! server after a broken connection, digest credentials sent on each
//! connection), create (ephemeral-sequential, with the new node's stat, and
//! the ACL of the credentials), delete, getChildren and exists with a
//! watch, getData, setData; plain, or TLS on the server's secure port.
//! ZooKeeper's jute encoding: big-endian
//! integers, length-prefixed buffers, strings and vectors, each packet
//! prefixed with its length. docs/design.md says why it is written here.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use super::tls::ZkTls;

/// Operation codes of ZooKeeper's protocol.
const OP_DELETE: i32 = 2;
const OP_EXISTS: i32 = 3;
const OP_GET_DATA: i32 = 4;
const OP_SET_DATA: i32 = 5;
const OP_GET_CHILDREN: i32 = 8;
const OP_PING: i32 = 11;
const OP_CREATE2: i32 = 15;
const OP_AUTH: i32 = 100;
const OP_CLOSE_SESSION: i32 = -11;

/// Reserved xids: watch events, ping replies, the answer to credentials.
const XID_WATCH_EVENT: i32 = -1;
const XID_PING: i32 = -2;
const XID_AUTH: i32 = -4;

/// Every permission (READ, WRITE, CREATE, DELETE, ADMIN).
const PERMS_ALL: i32 = 31;

/// Create modes.
pub const PERSISTENT: i32 = 0;
pub const EPHEMERAL_SEQUENTIAL: i32 = 3;

/// Watch event types.
pub const NODE_DELETED: i32 = 2;

/// Error codes a caller decides on.
pub const NO_NODE: i32 = -101;
pub const NO_AUTH: i32 = -102;
pub const BAD_VERSION: i32 = -103;
pub const NODE_EXISTS: i32 = -110;
pub const NOT_EMPTY: i32 = -111;
pub const SESSION_EXPIRED: i32 = -112;
const AUTH_FAILED: i32 = -115;

/// The longest a ping's answer may take before its server is left for the
/// next one in the list: a frozen or cut-off server is silent, and the
/// session must be resumed on another while the holder's lease still
/// covers its command (`--kill-grace` leaves at least a second after a
/// ping is due: `lease::max_kill_grace`). A live server answers in
/// milliseconds; leaving one that was merely slow costs a reconnection.
const PING_ANSWER: Duration = Duration::from_secs(1);

/// The largest packet accepted from a server (its own jute.maxbuffer
/// default is 1 MiB; listings of many children are larger).
const MAX_PACKET: usize = 64 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ZkError {
    /// The connection broke or no server answered: the session may live
    /// on, and may be resumed on another server.
    Connection(String),
    /// The server ended the session (its timeout passed without a word
    /// from us), or refused to resume it.
    Expired,
    /// The server refused the request with this code.
    Code(i32),
    /// The node's ACL does not grant us `right` on `path` (the full path,
    /// chroot included).
    NoAuth {
        path: String,
        right: Right,
        /// The digest user we signed in as, if any.
        user: Option<String>,
    },
    /// The server refused our credentials (and closed the connection).
    AuthFailed,
    /// The server said something this client cannot read.
    Protocol(String),
}

impl ZkError {
    pub fn code(&self) -> Option<i32> {
        match self {
            ZkError::Code(code) => Some(*code),
            _ => None,
        }
    }
}

impl std::fmt::Display for ZkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ZkError::Connection(why) => f.write_str(why),
            ZkError::Expired => f.write_str("the ZooKeeper session expired"),
            ZkError::Code(code) => write!(f, "ZooKeeper answered {}", code_name(*code)),
            ZkError::NoAuth { path, right, user } => {
                let who = match user {
                    Some(user) => format!("digest user '{user}'"),
                    None => "a client without credentials".to_string(),
                };
                write!(
                    f,
                    "{who} may not {} (NoAuth: its ACL does not grant {right})",
                    right.what(path)
                )
            }
            ZkError::AuthFailed => {
                f.write_str("ZooKeeper refused our digest credentials (AuthFailed)")
            }
            ZkError::Protocol(why) => write!(f, "unreadable answer from ZooKeeper: {why}"),
        }
    }
}

impl std::error::Error for ZkError {}

fn code_name(code: i32) -> String {
    match code {
        NO_NODE => "no node".into(),
        NO_AUTH => "not authorised (NoAuth)".into(),
        NODE_EXISTS => "node exists".into(),
        NOT_EMPTY => "node not empty".into(),
        BAD_VERSION => "bad version".into(),
        SESSION_EXPIRED => "session expired".into(),
        -108 => "no children for ephemerals".into(),
        -4 => "connection loss".into(),
        -7 => "operation timeout".into(),
        other => format!("error {other}"),
    }
}

/// A permission of ZooKeeper's ACLs, as a refused request needed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Right {
    /// getData, getChildren on the node.
    Read,
    /// setData on the node.
    Write,
    /// create, on the parent.
    Create,
    /// delete, on the parent.
    Delete,
}

impl Right {
    /// What was refused on `path`, in words.
    fn what(self, path: &str) -> String {
        match self {
            Right::Read => format!("read {path}"),
            Right::Write => format!("write {path}"),
            Right::Create => format!("create nodes under {path}"),
            Right::Delete => format!("delete nodes under {path}"),
        }
    }
}

impl std::fmt::Display for Right {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Right::Read => "READ",
            Right::Write => "WRITE",
            Right::Create => "CREATE",
            Right::Delete => "DELETE",
        })
    }
}

/// Credentials of ZooKeeper's digest scheme, as `addauth digest
/// user:password` gives them: the server signs the session in as `user`
/// (the password's hash names it in ACLs).
#[derive(Clone, PartialEq, Eq)]
pub struct Digest {
    pub user: String,
    pub password: String,
}

/// Never the password.
impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Digest")
            .field("user", &self.user)
            .field("password", &"…")
            .finish()
    }
}

/// The node's metadata, as far as consem reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stat {
    /// The transaction that created it: grows from one node to the next.
    pub czxid: i64,
    /// How many times its data was set: what a conditional write names.
    pub version: i32,
    pub ephemeral_owner: i64,
}

/// A watch that fired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    pub kind: i32,
    pub path: String,
}

/// Where and how to reach an ensemble.
#[derive(Debug, Clone, Default)]
pub struct Connection {
    /// `host:port` of each server, in the order given.
    pub servers: Vec<String>,
    /// Prepended to every path (`/chroot`), or empty.
    pub chroot: String,
    /// How long to wait for a server's answer.
    pub request_timeout: Duration,
    /// Sent on each connection; the nodes we create are then our user's
    /// alone (CREATOR_ALL_ACL), else open to all (OPEN_ACL_UNSAFE), as
    /// Curator creates them by default.
    pub digest: Option<Digest>,
    /// TLS (`zks://`), to each server's secure client port.
    pub tls: Option<ZkTls>,
}

/// A connection to one server: plain, or TLS.
enum Stream {
    Plain(TcpStream),
    Tls {
        stream: Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>,
        /// The TLS error that broke it, if one did: what a message explains.
        failed: Option<rustls::Error>,
    },
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(tcp) => tcp,
            Stream::Tls { stream, .. } => &stream.sock,
        }
    }

    /// Whether TLS holds bytes already decrypted and not read: the socket
    /// may have nothing more to say, and polling it would miss them.
    fn buffered(&mut self) -> bool {
        match self {
            Stream::Plain(_) => false,
            Stream::Tls { stream, .. } => stream
                .conn
                .process_new_packets()
                .map_or(true, |state| state.plaintext_bytes_to_read() > 0),
        }
    }

    /// Writes all of `bytes` within the socket's write timeout.
    fn send_all(&mut self, bytes: &[u8], wait: Duration) -> std::io::Result<()> {
        self.tcp().set_write_timeout(Some(wait))?;
        let written = match self {
            Stream::Plain(tcp) => tcp.write_all(bytes),
            Stream::Tls { stream, .. } => stream.write_all(bytes).and_then(|()| stream.flush()),
        };
        self.note(written)
    }

    fn read_some(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        let read = match self {
            Stream::Plain(tcp) => tcp.read(buffer),
            Stream::Tls { stream, .. } => stream.read(buffer),
        };
        self.note(read)
    }

    fn read_all(&mut self, buffer: &mut [u8]) -> std::io::Result<()> {
        let read = match self {
            Stream::Plain(tcp) => tcp.read_exact(buffer),
            Stream::Tls { stream, .. } => stream.read_exact(buffer),
        };
        self.note(read)
    }

    /// Keeps the TLS error behind a failed read or write.
    fn note<T>(&mut self, result: std::io::Result<T>) -> std::io::Result<T> {
        if let (Stream::Tls { failed, .. }, Err(error)) = (&mut *self, &result) {
            if let Some(tls) = error
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            {
                *failed = Some(tls.clone());
            }
        }
        result
    }
}

/// One session with the ensemble.
pub struct Session {
    connection: Connection,
    stream: Stream,
    id: i64,
    password: Vec<u8>,
    /// The session timeout the server granted.
    timeout: Duration,
    last_zxid: i64,
    next_xid: i32,
    /// When the latest request the server answered was sent: the server
    /// had heard from us then, and keeps the session a timeout from then.
    heard: Instant,
    /// When the last ping was sent, unanswered yet.
    ping_sent: Option<Instant>,
    events: VecDeque<WatchEvent>,
    /// Which server of the list this connection is to.
    server: usize,
}

impl Session {
    /// A new session, asking for `timeout`, on the first server that
    /// answers.
    pub fn open(connection: &Connection, timeout: Duration) -> Result<Session, ZkError> {
        let mut last = ZkError::Connection("no ZooKeeper server given".into());
        for server in 0..connection.servers.len() {
            match handshake(connection, server, timeout, 0, &[0; 16], 0) {
                Ok((stream, granted, id, password, sent)) => {
                    return Ok(Session {
                        connection: connection.clone(),
                        stream,
                        id,
                        password,
                        timeout: granted,
                        last_zxid: 0,
                        next_xid: 1,
                        heard: sent,
                        ping_sent: None,
                        events: VecDeque::new(),
                        server,
                    });
                }
                Err(error) => last = error,
            }
        }
        Err(last)
    }

    pub fn id(&self) -> i64 {
        self.id
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// When the latest answered request was sent.
    pub fn heard(&self) -> Instant {
        self.heard
    }

    /// Resumes this session over a new connection, trying each server in
    /// turn from the one after the current: the watches set before are
    /// gone, the caller sets them again. `Expired` if the session is over.
    pub fn resume(&mut self) -> Result<(), ZkError> {
        let count = self.connection.servers.len();
        let mut last = ZkError::Connection("no ZooKeeper server given".into());
        for step in 1..=count {
            let server = (self.server + step) % count;
            match handshake(
                &self.connection,
                server,
                self.timeout,
                self.id,
                &self.password,
                self.last_zxid,
            ) {
                Ok((stream, _, _, _, sent)) => {
                    self.stream = stream;
                    self.server = server;
                    self.heard = self.heard.max(sent);
                    self.ping_sent = None;
                    return Ok(());
                }
                Err(ZkError::Expired) => return Err(ZkError::Expired),
                Err(error) => last = error,
            }
        }
        Err(last)
    }

    pub fn full_path(&self, path: &str) -> String {
        format!("{}{path}", self.connection.chroot)
    }

    fn strip_chroot(&self, path: String) -> String {
        match path.strip_prefix(&self.connection.chroot) {
            Some(rest) if !self.connection.chroot.is_empty() => rest.to_string(),
            _ => path,
        }
    }

    /// Creates `path` with `data` in `mode`, with every permission for our
    /// digest user (CREATOR_ALL_ACL) or, without credentials, for anyone
    /// (OPEN_ACL_UNSAFE, what Curator's recipes create by default); its
    /// path (with the sequence number) and stat.
    pub fn create(
        &mut self,
        path: &str,
        data: &[u8],
        mode: i32,
    ) -> Result<(String, Stat), ZkError> {
        let (created, stat) = self.create_full(&self.full_path(path), data, mode)?;
        Ok((self.strip_chroot(created), stat))
    }

    /// [`Session::create`] at a full path, chroot included.
    fn create_full(
        &mut self,
        full: &str,
        data: &[u8],
        mode: i32,
    ) -> Result<(String, Stat), ZkError> {
        let mut body = Vec::new();
        put_str(&mut body, full);
        put_bytes(&mut body, Some(data));
        put_i32(&mut body, 1);
        put_i32(&mut body, PERMS_ALL);
        if self.connection.digest.is_some() {
            // The server puts the session's identities in place of
            // `auth:`: our digest user.
            put_str(&mut body, "auth");
            put_str(&mut body, "");
        } else {
            put_str(&mut body, "world");
            put_str(&mut body, "anyone");
        }
        put_i32(&mut body, mode);
        let mut reply = self
            .call(OP_CREATE2, &body)
            .map_err(|e| self.denied(e, Right::Create, parent(full)))?;
        let created = reply.string()?;
        let stat = reply.stat()?;
        Ok((created, stat))
    }

    /// Creates `path` and each missing parent, persistent and empty, the
    /// chroot's own nodes too (as Curator's namespace is); one that exists
    /// is fine, even where we may not create it (the server checks the
    /// parent's ACL before it looks for the node).
    pub fn create_parents(&mut self, path: &str) -> Result<(), ZkError> {
        let mut at = String::new();
        for segment in self.full_path(path).split('/').filter(|s| !s.is_empty()) {
            at.push('/');
            at.push_str(segment);
            match self.create_full(&at, &[], PERSISTENT) {
                Ok(_) => {}
                Err(ZkError::Code(NODE_EXISTS)) => {}
                Err(denied @ ZkError::NoAuth { .. }) => {
                    if self.exists_at(&at, false)?.is_none() {
                        return Err(denied);
                    }
                }
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Deletes `path`, whatever its version.
    pub fn delete(&mut self, path: &str) -> Result<(), ZkError> {
        let full = self.full_path(path);
        let mut body = Vec::new();
        put_str(&mut body, &full);
        put_i32(&mut body, -1);
        self.call(OP_DELETE, &body)
            .map(|_| ())
            .map_err(|e| self.denied(e, Right::Delete, parent(&full)))
    }

    /// The stat of `path`, or `None`; with `watch`, a watch on its
    /// creation, change or deletion.
    pub fn exists(&mut self, path: &str, watch: bool) -> Result<Option<Stat>, ZkError> {
        self.exists_at(&self.full_path(path), watch)
    }

    /// [`Session::exists`] at a full path, chroot included.
    fn exists_at(&mut self, full: &str, watch: bool) -> Result<Option<Stat>, ZkError> {
        let mut body = Vec::new();
        put_str(&mut body, full);
        body.push(u8::from(watch));
        match self.call(OP_EXISTS, &body) {
            Ok(mut reply) => Ok(Some(reply.stat()?)),
            Err(ZkError::Code(NO_NODE)) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// The data and stat of `path`.
    pub fn get_data(&mut self, path: &str) -> Result<(Vec<u8>, Stat), ZkError> {
        let full = self.full_path(path);
        let mut body = Vec::new();
        put_str(&mut body, &full);
        body.push(0);
        let mut reply = self
            .call(OP_GET_DATA, &body)
            .map_err(|e| self.denied(e, Right::Read, &full))?;
        let data = reply.bytes()?.unwrap_or_default();
        Ok((data, reply.stat()?))
    }

    /// Sets `path`'s data if its version is still `version` (-1: any).
    pub fn set_data(&mut self, path: &str, data: &[u8], version: i32) -> Result<(), ZkError> {
        let full = self.full_path(path);
        let mut body = Vec::new();
        put_str(&mut body, &full);
        put_bytes(&mut body, Some(data));
        put_i32(&mut body, version);
        self.call(OP_SET_DATA, &body)
            .map(|_| ())
            .map_err(|e| self.denied(e, Right::Write, &full))
    }

    /// The names of `path`'s children; with `watch`, a watch on them.
    pub fn children(&mut self, path: &str, watch: bool) -> Result<Vec<String>, ZkError> {
        let full = self.full_path(path);
        let mut body = Vec::new();
        put_str(&mut body, &full);
        body.push(u8::from(watch));
        let mut reply = self
            .call(OP_GET_CHILDREN, &body)
            .map_err(|e| self.denied(e, Right::Read, &full))?;
        let count = reply.i32()?;
        (0..count.max(0)).map(|_| reply.string()).collect()
    }

    /// Ends the session: the server deletes its ephemeral nodes at once.
    pub fn close(&mut self) -> Result<(), ZkError> {
        self.call(OP_CLOSE_SESSION, &[]).map(|_| ())
    }

    /// Waits until a watch fires or `until`, pinging the server every
    /// third of the session timeout meanwhile; `None` at `until`, once a
    /// ping was answered (the session's lease moved on: see
    /// [`Session::heard`]), or as soon as `wake` (the read end of a pipe)
    /// becomes readable.
    pub fn next_event(
        &mut self,
        until: Instant,
        wake: Option<BorrowedFd<'_>>,
    ) -> Result<Option<WatchEvent>, ZkError> {
        loop {
            if let Some(event) = self.events.pop_front() {
                return Ok(Some(event));
            }
            let now = Instant::now();
            if now >= until {
                return Ok(None);
            }
            let ping_due = self.heard + self.timeout / 3;
            if self.ping_sent.is_none() && now >= ping_due {
                self.send(XID_PING, OP_PING, &[])?;
                self.ping_sent = Some(now);
            }
            let ping_answer = self.connection.request_timeout.min(PING_ANSWER);
            if let Some(sent) = self.ping_sent {
                if now >= sent + ping_answer {
                    return Err(ZkError::Connection("no answer to a ping in time".into()));
                }
            }
            let wake_at = match self.ping_sent {
                Some(sent) => until.min(sent + ping_answer),
                None => until.min(ping_due),
            };
            match readable(
                &mut self.stream,
                wake,
                wake_at.saturating_duration_since(now),
            ) {
                Readiness::Woken => return Ok(None),
                Readiness::Nothing => {}
                Readiness::Stream => {
                    let pinging = self.ping_sent.is_some();
                    self.read_one(Duration::from_millis(1), None)?;
                    if pinging && self.ping_sent.is_none() {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// A watch event already received, if any.
    pub fn pending_event(&mut self) -> Option<WatchEvent> {
        self.events.pop_front()
    }

    /// A NoAuth answer as the right it needed on `path`; other errors as
    /// they are.
    fn denied(&self, error: ZkError, right: Right, path: &str) -> ZkError {
        match error {
            ZkError::Code(NO_AUTH) => ZkError::NoAuth {
                path: path.to_string(),
                right,
                user: self.connection.digest.as_ref().map(|d| d.user.clone()),
            },
            other => other,
        }
    }

    fn call(&mut self, op: i32, body: &[u8]) -> Result<Reader, ZkError> {
        let xid = self.next_xid;
        self.next_xid = self.next_xid.wrapping_add(1).max(1);
        let sent = Instant::now();
        self.send(xid, op, body)?;
        self.reply_to(xid, sent)
    }

    fn send(&mut self, xid: i32, op: i32, body: &[u8]) -> Result<(), ZkError> {
        let mut packet = Vec::with_capacity(12 + body.len());
        put_i32(&mut packet, (8 + body.len()) as i32);
        put_i32(&mut packet, xid);
        put_i32(&mut packet, op);
        packet.extend_from_slice(body);
        self.stream
            .send_all(&packet, self.connection.request_timeout)
            .map_err(|e| connection_error(&e))
    }

    /// Reads until the answer to `xid` (sent at `sent`) arrives, within
    /// the request timeout.
    fn reply_to(&mut self, xid: i32, sent: Instant) -> Result<Reader, ZkError> {
        let deadline = sent + self.connection.request_timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ZkError::Connection(
                    "no answer from ZooKeeper in time".into(),
                ));
            }
            if let Some(reply) = self.read_one(left, Some(xid))? {
                self.heard = self.heard.max(sent);
                return reply;
            }
        }
    }

    /// Reads one packet within `wait` (none: fine): a watch event is
    /// queued, a ping's answer noted, and the answer to `xid` returned.
    #[allow(clippy::type_complexity)]
    fn read_one(
        &mut self,
        wait: Duration,
        xid: Option<i32>,
    ) -> Result<Option<Result<Reader, ZkError>>, ZkError> {
        let Some(packet) = read_packet(&mut self.stream, wait)? else {
            return Ok(None);
        };
        let mut reader = Reader::new(packet);
        let got = reader.i32()?;
        let zxid = reader.i64()?;
        let err = reader.i32()?;
        if zxid > 0 {
            self.last_zxid = self.last_zxid.max(zxid);
        }
        match got {
            XID_WATCH_EVENT => {
                let kind = reader.i32()?;
                let state = reader.i32()?;
                let path = reader.string()?;
                if state == -112 {
                    return Err(ZkError::Expired);
                }
                self.events.push_back(WatchEvent {
                    kind,
                    path: self.strip_chroot(path),
                });
                Ok(None)
            }
            XID_PING => {
                if let Some(sent) = self.ping_sent.take() {
                    self.heard = self.heard.max(sent);
                }
                Ok(None)
            }
            _ if Some(got) == xid => {
                if err == SESSION_EXPIRED {
                    return Err(ZkError::Expired);
                }
                Ok(Some(if err == 0 {
                    Ok(reader)
                } else {
                    Err(ZkError::Code(err))
                }))
            }
            other => Err(ZkError::Protocol(format!(
                "an answer to request {other} where {xid:?} was awaited"
            ))),
        }
    }
}

/// Connects to `servers[server]` and asks for a session (new where `id` is
/// 0): the stream, the granted timeout, the session's id and password, and
/// when the request was sent.
fn handshake(
    connection: &Connection,
    server: usize,
    timeout: Duration,
    id: i64,
    password: &[u8],
    last_zxid: i64,
) -> Result<(Stream, Duration, i64, Vec<u8>, Instant), ZkError> {
    let address = &connection.servers[server];
    let addrs: Vec<SocketAddr> = address
        .to_socket_addrs()
        .map_err(|e| {
            ZkError::Connection(format!(
                "{address}: {}",
                super::super::network_cause(&e.to_string())
            ))
        })?
        .collect();
    let mut last = ZkError::Connection(format!("{address}: no address"));
    for addr in addrs {
        let sent = Instant::now();
        let tcp = match TcpStream::connect_timeout(&addr, connection.request_timeout) {
            Ok(tcp) => tcp,
            Err(e) => {
                last = ZkError::Connection(format!(
                    "{address}: {}",
                    super::super::network_cause(&e.to_string())
                ));
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let mut stream = match &connection.tls {
            None => Stream::Plain(tcp),
            Some(tls) => match start_tls(tls, tcp, address, connection.request_timeout) {
                Ok(stream) => stream,
                Err(error) => {
                    last = error;
                    continue;
                }
            },
        };
        let mut body = Vec::new();
        put_i32(&mut body, 0);
        put_i64(&mut body, last_zxid);
        put_i32(
            &mut body,
            i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX),
        );
        put_i64(&mut body, id);
        put_bytes(&mut body, Some(password));
        body.push(0);
        let mut packet = Vec::new();
        put_i32(&mut packet, body.len() as i32);
        packet.extend_from_slice(&body);
        let written = stream.send_all(&packet, connection.request_timeout);
        if let Err(e) = written {
            last = first_exchange_error(&stream, connection, address, connection_error(&e));
            continue;
        }
        let answer = match read_packet(&mut stream, connection.request_timeout) {
            Ok(Some(answer)) => answer,
            Ok(None) => {
                last = ZkError::Connection(format!("{address}: no answer in time"));
                continue;
            }
            Err(error) => {
                last = first_exchange_error(&stream, connection, address, error);
                continue;
            }
        };
        let mut reader = Reader::new(answer);
        let _protocol = reader.i32()?;
        let granted = reader.i32()?;
        let new_id = reader.i64()?;
        let new_password = reader.bytes()?.unwrap_or_default();
        // A timeout of 0 is how the server says the session is over.
        if granted <= 0 {
            return Err(ZkError::Expired);
        }
        // Credentials belong to the connection, not the session: sent on
        // each, before any request, as ZooKeeper's own client does.
        if let Some(digest) = &connection.digest {
            if let Err(error) = sign_in(&mut stream, digest, connection.request_timeout) {
                match error {
                    ZkError::Connection(_) => {
                        last = error;
                        continue;
                    }
                    refused => return Err(refused),
                }
            }
        }
        return Ok((
            stream,
            Duration::from_millis(granted as u64),
            new_id,
            new_password,
            sent,
        ));
    }
    Err(last)
}

/// The host of `host:port` (an IPv6 address without its brackets), as a
/// certificate names it.
fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// TLS over `tcp`, its handshake completed within `wait`; a failure says
/// what it means for the options.
fn start_tls(
    tls: &ZkTls,
    tcp: TcpStream,
    address: &str,
    wait: Duration,
) -> Result<Stream, ZkError> {
    let host = host_of(address);
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|_| {
        ZkError::Connection(format!("{address}: '{host}' is not a name TLS can check"))
    })?;
    let connection = rustls::ClientConnection::new(tls.config.clone(), name)
        .map_err(|e| ZkError::Connection(tls.explain(&e, address, host)))?;
    let mut stream = Box::new(rustls::StreamOwned::new(connection, tcp));
    let timeouts = stream
        .sock
        .set_read_timeout(Some(wait))
        .and_then(|()| stream.sock.set_write_timeout(Some(wait)));
    timeouts.map_err(|e| connection_error(&e))?;
    while stream.conn.is_handshaking() {
        if let Err(e) = stream.conn.complete_io(&mut stream.sock) {
            let tls_error = e
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>());
            return Err(ZkError::Connection(match tls_error {
                Some(tls_error) => tls.explain(tls_error, address, host),
                None if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
                {
                    format!("{address}: no TLS handshake in time")
                }
                None => tls.closed_early(address, &super::super::network_cause(&e.to_string())),
            }));
        }
    }
    Ok(Stream::Tls {
        stream,
        failed: None,
    })
}

/// What broke the first exchange on a new connection: over TLS, a refusal
/// of the server's that the handshake did not show yet (under TLS 1.3 the
/// server judges our certificate after our side is done), explained.
fn first_exchange_error(
    stream: &Stream,
    connection: &Connection,
    address: &str,
    error: ZkError,
) -> ZkError {
    match (stream, &connection.tls) {
        (
            Stream::Tls {
                failed: Some(tls_error),
                ..
            },
            Some(tls),
        ) => ZkError::Connection(tls.explain(tls_error, address, host_of(address))),
        (Stream::Tls { .. }, Some(tls)) => {
            ZkError::Connection(tls.closed_early(address, &error.to_string()))
        }
        _ => error,
    }
}

/// Sends `digest` (ZooKeeper's AuthPacket) and waits for its answer.
fn sign_in(stream: &mut Stream, digest: &Digest, wait: Duration) -> Result<(), ZkError> {
    let mut packet = Vec::new();
    let mut body = Vec::new();
    put_i32(&mut body, XID_AUTH);
    put_i32(&mut body, OP_AUTH);
    put_i32(&mut body, 0);
    put_str(&mut body, "digest");
    put_str(&mut body, &format!("{}:{}", digest.user, digest.password));
    put_i32(&mut packet, body.len() as i32);
    packet.extend_from_slice(&body);
    stream
        .send_all(&packet, wait)
        .map_err(|e| connection_error(&e))?;
    let deadline = Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ZkError::Connection(
                "no answer to our credentials in time".into(),
            ));
        }
        let Some(answer) = read_packet(stream, left)? else {
            continue;
        };
        let mut reader = Reader::new(answer);
        if reader.i32()? != XID_AUTH {
            // Nothing else is asked yet; whatever else comes is not ours.
            continue;
        }
        let _zxid = reader.i64()?;
        return match reader.i32()? {
            0 => Ok(()),
            AUTH_FAILED => Err(ZkError::AuthFailed),
            code => Err(ZkError::Code(code)),
        };
    }
}

/// The parent of a full path (`/` for a node at the root).
fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(at) => &path[..at],
    }
}

enum Readiness {
    Stream,
    Woken,
    Nothing,
}

/// Waits up to `wait` for `stream` to have something to read, or `wake`.
fn readable(stream: &mut Stream, wake: Option<BorrowedFd<'_>>, wait: Duration) -> Readiness {
    if stream.buffered() {
        return Readiness::Stream;
    }
    let mut fds = [
        libc::pollfd {
            fd: stream.tcp().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: wake.map_or(-1, |fd| fd.as_raw_fd()),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let millis = libc::c_int::try_from(wait.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
    // SAFETY: two valid pollfd entries (a negative fd is ignored by poll).
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, millis) };
    if ready <= 0 {
        // A signal's interruption is a wait that ended early: the caller
        // loops.
        return Readiness::Nothing;
    }
    if fds[1].revents != 0 {
        return Readiness::Woken;
    }
    // An error or hang-up is for the read to report.
    Readiness::Stream
}

fn connection_error(error: &std::io::Error) -> ZkError {
    ZkError::Connection(super::super::network_cause(&error.to_string()))
}

/// One length-prefixed packet, or `None` if none began within `wait`.
fn read_packet(stream: &mut Stream, wait: Duration) -> Result<Option<Vec<u8>>, ZkError> {
    let mut length = [0u8; 4];
    stream
        .tcp()
        .set_read_timeout(Some(wait.max(Duration::from_millis(1))))
        .map_err(|e| connection_error(&e))?;
    let mut got = 0;
    while got < 4 {
        match stream.read_some(&mut length[got..]) {
            Ok(0) => {
                return Err(ZkError::Connection(
                    "ZooKeeper closed the connection".into(),
                ))
            }
            Ok(n) => got += n,
            Err(e)
                if got == 0
                    && matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
            {
                return Ok(None)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(connection_error(&e)),
        }
    }
    let length = i32::from_be_bytes(length);
    let length = usize::try_from(length)
        .ok()
        .filter(|&l| l <= MAX_PACKET)
        .ok_or_else(|| ZkError::Protocol(format!("a packet of {length} bytes")))?;
    let mut packet = vec![0; length];
    // The rest of a packet that began follows at once.
    stream
        .tcp()
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| connection_error(&e))?;
    stream
        .read_all(&mut packet)
        .map_err(|e| connection_error(&e))?;
    Ok(Some(packet))
}

fn put_i32(out: &mut Vec<u8>, value: i32) {
    out.extend_from_slice(&value.to_be_bytes());
}

fn put_i64(out: &mut Vec<u8>, value: i64) {
    out.extend_from_slice(&value.to_be_bytes());
}

fn put_bytes(out: &mut Vec<u8>, value: Option<&[u8]>) {
    match value {
        Some(bytes) => {
            put_i32(out, bytes.len() as i32);
            out.extend_from_slice(bytes);
        }
        None => put_i32(out, -1),
    }
}

fn put_str(out: &mut Vec<u8>, value: &str) {
    put_bytes(out, Some(value.as_bytes()));
}

/// Reads jute values from a packet.
struct Reader {
    packet: Vec<u8>,
    at: usize,
}

impl Reader {
    fn new(packet: Vec<u8>) -> Reader {
        Reader { packet, at: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&[u8], ZkError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.packet.len())
            .ok_or_else(|| ZkError::Protocol("a packet ends too soon".into()))?;
        let bytes = &self.packet[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn i32(&mut self) -> Result<i32, ZkError> {
        Ok(i32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn i64(&mut self) -> Result<i64, ZkError> {
        Ok(i64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn bytes(&mut self) -> Result<Option<Vec<u8>>, ZkError> {
        let length = self.i32()?;
        if length < 0 {
            return Ok(None);
        }
        Ok(Some(self.take(length as usize)?.to_vec()))
    }

    fn string(&mut self) -> Result<String, ZkError> {
        let bytes = self.bytes()?.unwrap_or_default();
        String::from_utf8(bytes).map_err(|_| ZkError::Protocol("a name that is not UTF-8".into()))
    }

    fn stat(&mut self) -> Result<Stat, ZkError> {
        let czxid = self.i64()?;
        // mzxid, ctime, mtime.
        self.take(8 * 3)?;
        let version = self.i32()?;
        // cversion, aversion.
        self.take(4 * 2)?;
        let ephemeral_owner = self.i64()?;
        // dataLength, numChildren, pzxid.
        self.take(4 + 4 + 8)?;
        Ok(Stat {
            czxid,
            version,
            ephemeral_owner,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two packets that arrive in one TLS record: once the first is read,
    /// the second is already decrypted in rustls and the socket has nothing
    /// more, so a wait must see it at once rather than poll the socket
    /// (which would miss a watch event, or a ping's answer, until a timeout).
    #[test]
    fn a_packet_decrypted_with_another_is_ready_without_the_socket() {
        use std::sync::Arc;
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let cert = certified.cert.der().clone();
        let key =
            rustls::pki_types::PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server_config = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.clone()], key)
            .unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (tcp, _) = listener.accept().unwrap();
            let connection = rustls::ServerConnection::new(Arc::new(server_config)).unwrap();
            let mut stream = rustls::StreamOwned::new(connection, tcp);
            let mut two = Vec::new();
            for word in ["first", "second"] {
                let mut body = Vec::new();
                put_str(&mut body, word);
                put_i32(&mut two, body.len() as i32);
                two.extend_from_slice(&body);
            }
            // One write: one record.
            stream.write_all(&two).unwrap();
            stream.flush().unwrap();
            // Stay until the client is done.
            let _ = stream.read(&mut [0u8; 1]);
        });
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert).unwrap();
        let tls = ZkTls {
            config: Arc::new(
                rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .unwrap()
                    .with_root_certificates(roots)
                    .with_no_client_auth(),
            ),
            presents_certificate: false,
            own_ca: true,
        };
        let tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let wait = Duration::from_secs(5);
        let mut stream = start_tls(&tls, tcp, &format!("localhost:{port}"), wait).unwrap();
        let first = read_packet(&mut stream, wait).unwrap().unwrap();
        assert_eq!(Reader::new(first).string().unwrap(), "first");
        let asked = Instant::now();
        assert!(matches!(
            readable(&mut stream, None, wait),
            Readiness::Stream
        ));
        assert!(
            asked.elapsed() < wait,
            "the wait missed the buffered packet"
        );
        let second = read_packet(&mut stream, wait).unwrap().unwrap();
        assert_eq!(Reader::new(second).string().unwrap(), "second");
        drop(stream);
        server.join().unwrap();
    }

    #[test]
    fn a_stat_reads_its_creation_zxid_and_owner_and_skips_the_rest() {
        let mut packet = Vec::new();
        put_i64(&mut packet, 42);
        packet.extend_from_slice(&[0; 36]);
        put_i64(&mut packet, 7);
        packet.extend_from_slice(&[0; 16]);
        put_str(&mut packet, "after");
        let mut reader = Reader::new(packet);
        assert_eq!(
            reader.stat().unwrap(),
            Stat {
                czxid: 42,
                version: 0,
                ephemeral_owner: 7
            }
        );
        assert_eq!(reader.string().unwrap(), "after");
        assert!(reader.i32().is_err());
    }
}
