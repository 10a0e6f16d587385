//! The Redis store's settings: the URL of `--store` (its password also
//! from `REDISCLI_AUTH`, as redis-cli reads it), the TLS files of
//! `--cacert`, `--cert` and `--key` (redis-cli's names; it reads no
//! variable for them, nor does consem), `--redis-allow-eviction` and
//! `--redis-wait-replicas`.

use super::{OptionsError, StoreFlags};
use crate::store::kind::StoreSettings;
use crate::store::{redis, without_credentials};

#[derive(Debug)]
enum RedisFlagsError {
    NotAUrl {
        source: &'static str,
        shown: String,
        detail: String,
    },
    Tls(redis::ClientTlsError),
    NoReplicas,
}

impl std::fmt::Display for RedisFlagsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RedisFlagsError::NotAUrl {
                source,
                shown,
                detail,
            } => write!(
                f,
                "{source}: {shown} is not a Redis URL ({detail}); write redis://[user[:password]@]host[:port][/db]"
            ),
            RedisFlagsError::Tls(error) => error.fmt(f),
            RedisFlagsError::NoReplicas => f.write_str(
                "--redis-wait-replicas 0 waits for no replica: give how many replicas must acknowledge a slot (1 or more), or drop it",
            ),
        }
    }
}

impl std::error::Error for RedisFlagsError {}

impl From<RedisFlagsError> for OptionsError {
    fn from(error: RedisFlagsError) -> OptionsError {
        OptionsError::StoreFlags(Box::new(error))
    }
}

/// Reads `redis://[user[:password]@]host[:port][/db]`, or `rediss://` for
/// TLS (the server's certificate checked against the system's roots, or
/// the file `SSL_CERT_FILE` names, as OpenSSL has it).
pub fn configure(flags: &StoreFlags<'_>) -> Result<Box<dyn StoreSettings>, OptionsError> {
    let url = flags.text;
    let mut connection = ::redis::IntoConnectionInfo::into_connection_info(url).map_err(|e| {
        RedisFlagsError::NotAUrl {
            source: flags.source,
            shown: without_credentials(url),
            detail: e.detail().unwrap_or("unreadable").to_string(),
        }
    })?;
    if connection.redis_settings().password().is_none() {
        if let Some(password) = (flags.env)("REDISCLI_AUTH").filter(|p| !p.is_empty()) {
            let settings = connection.redis_settings().clone().set_password(password);
            connection = connection.set_redis_settings(settings);
        }
    }
    let wait_replicas = flags.run.and_then(|run| run.redis_wait_replicas);
    if wait_replicas == Some(0) {
        return Err(RedisFlagsError::NoReplicas.into());
    }
    let tls_args = &flags.args.tls;
    let files = redis::TlsFiles {
        cacert: tls_args.cacert.as_deref(),
        cert: tls_args.cert.as_deref(),
        key: tls_args.key.as_deref(),
    };
    let rediss = matches!(connection.addr(), ::redis::ConnectionAddr::TcpTls { .. });
    let tls = redis::ClientTls::load(&files, rediss).map_err(RedisFlagsError::Tls)?;
    Ok(Box::new(redis::Settings::new(
        connection,
        flags.lease_ttl(),
        flags.monitor_retry(),
        flags.run.is_some_and(|run| run.redis_allow_eviction),
        wait_replicas,
        tls,
    )))
}
