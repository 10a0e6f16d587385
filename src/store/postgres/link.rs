//! One contender's connection to PostgreSQL: opened, set up for the
//! semaphore (the session's own keepalives and timeouts), and closed; the
//! server's errors in consem's kinds. Each contender has exactly one, on
//! a single-threaded runtime of its own thread.

use std::future::Future;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_postgres::error::SqlState;
use tokio_postgres::{AsyncMessage, Client, SimpleQueryMessage};

use super::keys::SESSION_CHECK;
use super::tls::Tls;

use crate::store::{network_cause, ErrorKind, StoreError};

/// How a contender reaches the server, validated.
#[derive(Debug, Clone)]
pub struct Connection {
    pub config: tokio_postgres::Config,
    /// TLS as `sslmode` asks.
    pub tls: Tls,
    /// The address as messages show it, without a password.
    pub shown: String,
}

impl Connection {
    fn user(&self) -> &str {
        self.config.get_user().unwrap_or_default()
    }

    fn database(&self) -> &str {
        self.config.get_dbname().unwrap_or_default()
    }
}

/// How long a connection may take to open before the server counts as
/// unreachable, unless the address says otherwise (`connect_timeout`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The port the client dials where the address names none.
const DEFAULT_PORT: u16 = 5432;

/// How long closing waits for the server to see us go.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// The session settings of a contender, for a TTL of `ttl`: no timeout
/// ends a wait or an idle holder; the server drops a session whose client
/// vanished (no FIN) once nothing came from it for `ttl`, and not before
/// (keepalive probes from `ttl/3` on, two of them `ttl/3` apart, and
/// unacknowledged data at most `ttl`), so that a holder that counts its
/// lease from its last confirmed round trip, less a margin, has stopped
/// its command first; a dead waiter's lock wait is ended by the server's
/// check of its client every `ttl/3`. Settings an older server does not
/// know are left out (`pg_settings` says which it has).
fn session_settings(ttl: Duration) -> Vec<(&'static str, String)> {
    let third = ttl.as_secs().div_ceil(3).max(1);
    vec![
        // Every name consem's statements use is the system's: a schema
        // earlier in a role's or the address's search_path could
        // otherwise stand in a function of its own for the lock calls.
        ("search_path", "pg_catalog, pg_temp".into()),
        // The fence's commit is on disk before the slot is taken.
        ("synchronous_commit", "on".into()),
        ("statement_timeout", "0".into()),
        ("lock_timeout", "0".into()),
        ("idle_in_transaction_session_timeout", "0".into()),
        ("idle_session_timeout", "0".into()),
        ("tcp_keepalives_idle", third.to_string()),
        ("tcp_keepalives_interval", third.to_string()),
        ("tcp_keepalives_count", "2".into()),
        ("tcp_user_timeout", ttl.as_millis().to_string()),
        (
            "client_connection_check_interval",
            (third * 1000).to_string(),
        ),
        ("application_name", "consem".into()),
    ]
}

/// What a wait for a notification ended with.
#[derive(Debug, PartialEq, Eq)]
pub enum Waited {
    Note,
    Timeout,
    /// The connection ended, for this reason.
    Ended(String),
    Closing,
}

/// One row of a simple query's answer, its columns as text.
pub type Row = Vec<Option<String>>;

/// An open connection: the client, and what the connection's task
/// reports (notifications; why it ended).
pub struct Link {
    runtime: tokio::runtime::Runtime,
    client: Option<Client>,
    ended: watch::Receiver<Option<String>>,
    notes: mpsc::UnboundedReceiver<String>,
    tls: Tls,
    /// The session's backend process: its identifier in `status`.
    pub pid: i32,
    /// The port the server took the connection on; `None` on a Unix
    /// socket.
    server_port: Option<u16>,
}

/// The statement that sets a session up for a TTL of `ttl` (see
/// [`session_settings`]), one row.
pub fn session_setup(ttl: Duration) -> String {
    let pairs: Vec<String> = session_settings(ttl)
        .iter()
        .map(|(name, value)| format!("('{name}', '{value}')"))
        .collect();
    format!(
        "SELECT pg_catalog.count(pg_catalog.set_config(s.name, s.value, false)) \
         FROM (VALUES {}) AS s(name, value) \
         WHERE pg_catalog.current_setting(s.name, true) IS NOT NULL",
        pairs.join(", ")
    )
}

impl Link {
    /// Connects, without a statement: the caller's first message sets the
    /// session up ([`session_setup`], [`SESSION_CHECK`]) and hands the
    /// check's row to [`Link::checked`].
    pub fn connect(connection: &Connection) -> Result<Link, StoreError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| {
                StoreError::unavailable(format!("cannot start the client's runtime: {error}"))
            })?;
        let mut config = connection.config.clone();
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        let (client, mut pending) = runtime
            .block_on(config.connect(connection.tls.clone()))
            .map_err(|error| connect_failure(connection, &error))?;
        let (ended_tx, ended) = watch::channel(None);
        let (notes_tx, notes) = mpsc::unbounded_channel();
        runtime.spawn(async move {
            let why = loop {
                match std::future::poll_fn(|cx| pending.poll_message(cx)).await {
                    Some(Ok(AsyncMessage::Notification(note))) => {
                        let _ = notes_tx.send(note.payload().to_string());
                    }
                    Some(Ok(_)) => {}
                    // The server's own words where it gave a reason
                    // (`terminating connection due to administrator
                    // command`), not the client's "db error".
                    Some(Err(error)) => match error.as_db_error() {
                        Some(db) => break db.message().to_string(),
                        None => break error.to_string(),
                    },
                    None => break "the connection closed".to_string(),
                }
            };
            let _ = ended_tx.send(Some(why));
        });
        Ok(Link {
            runtime,
            client: Some(client),
            ended,
            notes,
            tls: connection.tls.clone(),
            pid: 0,
            server_port: None,
        })
    }

    /// Connects and sets the session up for a TTL of `ttl`, in one round
    /// trip after the connection's.
    pub fn open(connection: &Connection, ttl: Duration) -> Result<Link, StoreError> {
        let mut link = Link::connect(connection)?;
        let rows = link
            .run(&format!("{};\n{SESSION_CHECK}", session_setup(ttl)))
            .map_err(|error| failure(connection, "setting the session up", &error))?;
        link.checked(connection, rows.last())?;
        Ok(link)
    }

    /// Takes the session's backend from the row of [`SESSION_CHECK`], and
    /// refuses a standby, whose locks the primary does not see, and a
    /// session that is not fresh.
    pub fn checked(
        &mut self,
        connection: &Connection,
        row: Option<&Row>,
    ) -> Result<(), StoreError> {
        let row = row.cloned().unwrap_or_default();
        self.pid = number(&row, 0).unwrap_or_default() as i32;
        self.server_port = number(&row, 3).and_then(|port| u16::try_from(port).ok());
        if text(&row, 1) == "t" {
            return Err(StoreError::config(format!(
                "{} is a standby (in recovery): its advisory locks are not the primary's; point --store at the primary",
                connection.shown
            )));
        }
        if text(&row, 2) != "true" {
            return Err(pooled(connection));
        }
        Ok(())
    }

    /// Whether something stands between consem and the server: the
    /// server took the connection on another port than any consem dialed
    /// (or on a socket of another kind).
    pub fn through_a_middleman(&self, connection: &Connection) -> bool {
        use tokio_postgres::config::Host;
        let ports = connection.config.get_ports();
        let dialed_tcp = connection
            .config
            .get_hosts()
            .iter()
            .any(|host| matches!(host, Host::Tcp(_)));
        match self.server_port {
            None => dialed_tcp,
            Some(_) if !dialed_tcp => true,
            Some(port) if ports.is_empty() => port != DEFAULT_PORT,
            Some(port) => !ports.contains(&port),
        }
    }

    pub fn client(&self) -> &Client {
        self.client.as_ref().expect("the client lives until close")
    }

    /// Runs `future` on the link's runtime (the connection's task with it).
    pub fn block_on<T>(&self, future: impl Future<Output = T>) -> T {
        self.runtime.block_on(future)
    }

    /// Runs `sql` (one or more statements) and returns the rows.
    pub fn run(&self, sql: &str) -> Result<Vec<Row>, tokio_postgres::Error> {
        self.block_on(rows(self.client(), sql))
    }

    /// Resolves when the connection ended, with why.
    pub fn ended(&self) -> impl Future<Output = String> + 'static {
        let mut ended = self.ended.clone();
        async move {
            match ended.wait_for(Option::is_some).await {
                Ok(why) => why.clone().unwrap_or_default(),
                Err(_) => "the connection closed".to_string(),
            }
        }
    }

    /// Waits `at_most` for a notification, unless the connection ends or
    /// `closing` turns true first.
    pub fn wait_for_note(
        &mut self,
        at_most: Duration,
        mut closing: watch::Receiver<bool>,
    ) -> Waited {
        let ended = self.ended();
        let notes = &mut self.notes;
        self.runtime.block_on(async {
            tokio::select! {
                _ = notes.recv() => Waited::Note,
                _ = tokio::time::sleep(at_most) => Waited::Timeout,
                why = ended => Waited::Ended(why),
                _ = closing.wait_for(|closing| *closing) => Waited::Closing,
            }
        })
    }

    /// Drops the notifications received so far.
    pub fn forget_notes(&mut self) {
        while self.notes.try_recv().is_ok() {}
    }

    /// Asks the server to end the statement in progress (a lock wait):
    /// through a connection of its own, as libpq's cancel does.
    pub async fn cancel(&self) {
        let token = self.client().cancel_token();
        let _ = tokio::time::timeout(CLOSE_WAIT, token.cancel_query(self.tls.clone())).await;
    }

    /// Ends the session (the server drops what it held) and waits for the
    /// connection to close, `CLOSE_WAIT` at most.
    pub fn close(&mut self) {
        drop(self.client.take());
        let ended = self.ended();
        self.block_on(async {
            let _ = tokio::time::timeout(CLOSE_WAIT, ended).await;
        });
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        if self.client.is_some() {
            self.close();
        }
    }
}

/// Runs `sql` on `client` and returns the rows of every statement.
pub async fn rows(client: &Client, sql: &str) -> Result<Vec<Row>, tokio_postgres::Error> {
    let messages = client.simple_query(sql).await?;
    Ok(messages
        .into_iter()
        .filter_map(|message| match message {
            SimpleQueryMessage::Row(row) => Some(
                (0..row.len())
                    .map(|i| row.get(i).map(str::to_string))
                    .collect(),
            ),
            _ => None,
        })
        .collect())
}

/// Column `i` of `row` as a number.
pub fn number(row: &Row, i: usize) -> Option<i64> {
    row.get(i)?.as_deref()?.parse().ok()
}

/// Column `i` of `row` as text ("" for NULL).
pub fn text(row: &Row, i: usize) -> &str {
    row.get(i).and_then(|c| c.as_deref()).unwrap_or_default()
}

/// A failure to connect: one the server did not answer says where it was
/// looked for, and what to check.
fn connect_failure(connection: &Connection, error: &tokio_postgres::Error) -> StoreError {
    let failed = failure(connection, "connecting", error);
    if error.as_db_error().is_some() || failed.kind != ErrorKind::Unavailable {
        return failed;
    }
    let mut cause = network_cause(&error.to_string());
    if let Some(source) = std::error::Error::source(error) {
        cause = network_cause(&source.to_string());
    }
    StoreError::unavailable(format!(
        "cannot reach PostgreSQL at {}: {cause} (is the server running there? check --store, PGHOST and PGPORT)",
        connection.shown
    ))
    .caused_by(error_of(error))
}

/// A failure of the server or of the connection to it while `doing`, in
/// consem's kinds: refused credentials and missing rights are denials
/// (77, the right named; a password is never shown: the server's words
/// do not carry it), an unreachable or overloaded server is unavailable
/// (69).
pub fn failure(connection: &Connection, doing: &str, error: &tokio_postgres::Error) -> StoreError {
    let shown = &connection.shown;
    let user = connection.user();
    let database = connection.database();
    let Some(db) = error.as_db_error() else {
        let mut cause = network_cause(&error.to_string());
        if let Some(source) = std::error::Error::source(error) {
            cause = format!("{cause}: {}", network_cause(&source.to_string()));
        }
        if cause.contains("password missing") {
            return StoreError::denied(format!(
                "{shown} asks the role {user} for a password, and none is given: set PGPASSWORD, add a line to ~/.pgpass (or PGPASSFILE), or put it in the address"
            ));
        }
        return StoreError::unavailable(format!("{shown}: {doing}: {cause}"))
            .caused_by(error_of(error));
    };
    let said = db.message();
    let code = db.code();
    let kind_error = if *code == SqlState::INVALID_PASSWORD
        || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
    {
        StoreError::denied(format!(
            "{shown} refused the role {user}: {said} (check the password, PGPASSWORD or ~/.pgpass, and pg_hba.conf)"
        ))
    } else if *code == SqlState::INSUFFICIENT_PRIVILEGE {
        let right = if said.contains("database") {
            format!("the CONNECT right on database {database} (GRANT CONNECT ON DATABASE {database} TO {user})")
        } else if let Some(function) = said.strip_prefix("permission denied for function ") {
            let signature = function_signature(function);
            format!("the EXECUTE right on function {function} (GRANT EXECUTE ON FUNCTION {signature} TO {user})")
        } else {
            format!("a right the server named: {said}")
        };
        StoreError::denied(format!(
            "{shown}: the role {user} lacks {right}; the server said: {said}"
        ))
    } else if *code == SqlState::INVALID_CATALOG_NAME {
        StoreError::usage(format!(
            "{shown}: {said}: name an existing database in the address or PGDATABASE"
        ))
    } else {
        StoreError::unavailable(format!("{shown}: {doing}: {said}"))
    };
    kind_error.caused_by(error_of(error))
}

/// Whether `error` ended the session or the connection (a restart, a
/// failover, `pg_terminate_backend`, the network, a server refusing
/// connections for now), rather than refusing what we asked.
pub fn session_lost(error: &tokio_postgres::Error) -> bool {
    match error.as_db_error() {
        // Connection exceptions, operator intervention (shutdown,
        // terminated, starting up), and no room for another connection.
        Some(db) => {
            let code = db.code().code();
            code.starts_with("08") || code.starts_with("57") || code == "53300"
        }
        None => error.is_closed() || std::error::Error::source(error).is_some(),
    }
}

/// A function consem calls, with the arguments a `GRANT` must name (the
/// advisory lock functions have several forms).
fn function_signature(function: &str) -> String {
    let arguments = match function {
        "pg_advisory_lock"
        | "pg_advisory_lock_shared"
        | "pg_try_advisory_lock"
        | "pg_advisory_unlock" => "integer, integer",
        "pg_logical_emit_message" => "boolean, text, text",
        "set_config" => "text, text, boolean",
        "current_setting" => "text, boolean",
        _ => "",
    };
    format!("pg_catalog.{function}({arguments})")
}

/// The error of a session that is not ours: a pooler in the way.
pub fn pooled(connection: &Connection) -> StoreError {
    StoreError::config(format!(
        "{}: our statements reached a server session that is not the one holding our locks, or one that already held advisory locks: a pooler shares server sessions between clients (PgBouncer with pool_mode = transaction or statement); session-level advisory locks need a session of their own: use pool_mode = session, or connect to PostgreSQL directly",
        connection.shown
    ))
}

/// The client's error as a cause (its type is not `Clone`).
fn error_of(error: &tokio_postgres::Error) -> StoreError {
    StoreError::unavailable(error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_names_the_form_of_the_function_consem_calls() {
        assert_eq!(
            function_signature("pg_advisory_lock_shared"),
            "pg_catalog.pg_advisory_lock_shared(integer, integer)"
        );
        assert_eq!(
            function_signature("txid_current"),
            "pg_catalog.txid_current()"
        );
    }

    #[test]
    fn the_server_drops_a_vanished_client_no_sooner_than_the_ttl() {
        for secs in [2u64, 5, 10, 15, 16, 3600] {
            let ttl = Duration::from_secs(secs);
            let settings = session_settings(ttl);
            let get = |name: &str| -> u64 {
                settings
                    .iter()
                    .find(|(n, _)| *n == name)
                    .unwrap()
                    .1
                    .parse()
                    .unwrap()
            };
            let probes = get("tcp_keepalives_idle")
                + get("tcp_keepalives_count") * get("tcp_keepalives_interval");
            assert!(probes >= secs, "{secs}: keepalives drop after {probes}s");
            assert!(
                probes <= secs + 4,
                "{secs}: keepalives drop after {probes}s"
            );
            assert_eq!(get("tcp_user_timeout"), secs * 1000);
        }
    }
}
