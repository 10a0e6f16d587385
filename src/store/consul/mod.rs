//! The Consul store: Consul's semaphore recipe, in the layout `consul lock
//! -n N` writes, over Consul's HTTP API.

pub mod admin;
pub mod client;
pub mod contender;
pub mod recipe;
pub mod semaphore;

pub use client::Client;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cli::ConsulArgs;
use crate::store::tls::TlsSettings;
use client::{Address, ConsulConfig};

/// The highest `--limit`: 1024 holders in map form take about 45 KiB of
/// `.lock`, a tenth of Consul's 512 KiB value limit.
pub const MAX_LIMIT: u32 = semaphore::MAX_LIMIT;

/// The session TTLs Consul accepts.
const TTL_RANGE: (Duration, Duration) = (Duration::from_secs(10), Duration::from_secs(86_400));

/// What a run on Consul needs beyond the store-neutral options.
#[derive(Debug, Clone)]
pub struct RunSettings {
    pub config: ConsulConfig,
    pub ttl: Duration,
    pub monitor_retry: Option<u32>,
    pub session_name: String,
}

impl RunSettings {
    /// Checks the options only Consul uses against Consul's ranges.
    pub fn new(
        config: ConsulConfig,
        limit: u32,
        ttl: Option<Duration>,
        monitor_retry: Option<u32>,
        session_name: String,
    ) -> Result<RunSettings, String> {
        if limit > MAX_LIMIT {
            return Err(format!(
                "--limit {limit} is more than the Consul store holds in .lock: use 1 to {MAX_LIMIT}"
            ));
        }
        let ttl = ttl.unwrap_or(Duration::from_secs(15));
        if ttl < TTL_RANGE.0 || ttl > TTL_RANGE.1 {
            return Err(format!(
                "--ttl {} is outside what Consul accepts: use 10s to 24h",
                crate::duration::human(ttl)
            ));
        }
        Ok(RunSettings {
            config,
            ttl,
            monitor_retry,
            session_name,
        })
    }
}

/// Resolves the connection settings as the consul CLI does. Tokens: a token
/// file (`--token-file`, else `CONSUL_HTTP_TOKEN_FILE`) wins over a token
/// (`--token`, else `CONSUL_HTTP_TOKEN`) when both are set, as in Consul's
/// API client ("if the TokenFile is set, always use that"); an empty file
/// falls back to the token.
pub fn config(
    args: ConsulArgs,
    env: impl Fn(&str) -> Option<String>,
) -> Result<ConsulConfig, String> {
    let non_empty = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
    let flag = |name: &str| -> Result<Option<bool>, String> {
        match non_empty(env(name)) {
            None => Ok(None),
            Some(value) => parse_bool(&value)
                .map(Some)
                .ok_or_else(|| format!("{name}='{value}' is not a boolean: use true or false")),
        }
    };
    // A flag wins over its variable, as in the consul CLI.
    let text = |flag: Option<String>, name: &str| non_empty(flag).or_else(|| non_empty(env(name)));
    let path = |flag: Option<PathBuf>, name: &str| {
        flag.or_else(|| non_empty(env(name)).map(PathBuf::from))
    };
    let http_addr =
        text(args.http_addr, "CONSUL_HTTP_ADDR").unwrap_or_else(|| "127.0.0.1:8500".into());
    let address = Address::parse(&http_addr, flag("CONSUL_HTTP_SSL")?.unwrap_or(false))?;
    let token_file = match args.token_file {
        Some(path) => Some((path, "--token-file")),
        None => non_empty(env("CONSUL_HTTP_TOKEN_FILE"))
            .map(|p| (PathBuf::from(p), "CONSUL_HTTP_TOKEN_FILE")),
    };
    let from_file = match token_file {
        Some((path, source)) => read_token_file(&path, source)?,
        None => None,
    };
    let token =
        from_file.or_else(|| non_empty(args.token).or_else(|| non_empty(env("CONSUL_HTTP_TOKEN"))));
    let verify = flag("CONSUL_HTTP_SSL_VERIFY")?.unwrap_or(true);
    let client_cert = path(args.client_cert, "CONSUL_CLIENT_CERT");
    let client_key = path(args.client_key, "CONSUL_CLIENT_KEY");
    match (&client_cert, &client_key) {
        (Some(_), None) => {
            return Err(
                "a client certificate needs its key: give --client-key or CONSUL_CLIENT_KEY".into(),
            )
        }
        (None, Some(_)) => {
            return Err(
                "a client key needs its certificate: give --client-cert or CONSUL_CLIENT_CERT"
                    .into(),
            )
        }
        _ => {}
    }
    Ok(ConsulConfig {
        address,
        token,
        basic_auth: non_empty(env("CONSUL_HTTP_AUTH")),
        datacenter: non_empty(args.datacenter),
        namespace: text(args.namespace, "CONSUL_NAMESPACE"),
        partition: text(args.partition, "CONSUL_PARTITION"),
        tls: TlsSettings {
            ca_file: path(args.ca_file, "CONSUL_CACERT"),
            ca_path: path(args.ca_path, "CONSUL_CAPATH"),
            client_cert,
            client_key,
            server_name: text(args.tls_server_name, "CONSUL_TLS_SERVER_NAME"),
            verify,
        },
    })
}

/// Go's strconv.ParseBool, which the consul CLI uses for its variables.
fn parse_bool(value: &str) -> Option<bool> {
    match value.trim() {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

fn read_token_file(path: &Path, source: &str) -> Result<Option<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "cannot read the token file {} ({source}): {e}",
            path.display()
        )
    })?;
    let token = text.trim();
    Ok((!token.is_empty()).then(|| token.to_string()))
}
