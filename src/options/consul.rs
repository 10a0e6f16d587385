//! The Consul store's settings: the Consul options, each defaulting to the
//! consul CLI's environment variable, and the session's TTL and name.

use std::path::{Path, PathBuf};

use super::{OptionsError, StoreFlags};
use crate::cli::ConsulArgs;
use crate::store::consul::{
    self,
    client::{Address, ConsulConfig},
};
use crate::store::kind::StoreSettings;
use crate::store::tls::TlsSettings;

#[derive(Debug)]
enum ConsulFlagsError {
    NotABoolean {
        name: &'static str,
        value: String,
    },
    EmptyAddress,
    UnixSocket {
        address: String,
    },
    UnsupportedScheme {
        scheme: String,
        address: String,
    },
    NoHost {
        address: String,
    },
    TokenFile {
        path: PathBuf,
        source: &'static str,
        error: std::io::Error,
    },
    CertificateWithoutKey,
    KeyWithoutCertificate,
}

impl std::fmt::Display for ConsulFlagsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConsulFlagsError::NotABoolean { name, value } => {
                write!(f, "{name}='{value}' is not a boolean: use true or false")
            }
            ConsulFlagsError::EmptyAddress => f.write_str(
                "the Consul address is empty: set --http-addr or CONSUL_HTTP_ADDR to host:port",
            ),
            ConsulFlagsError::UnixSocket { address } => write!(
                f,
                "unix socket addresses are not supported ('{address}'): have the agent listen for HTTP on a TCP address, e.g. 127.0.0.1:8500"
            ),
            ConsulFlagsError::UnsupportedScheme { scheme, address } => write!(
                f,
                "unsupported scheme '{scheme}' in Consul address '{address}': use host:port, http://host:port or https://host:port"
            ),
            ConsulFlagsError::NoHost { address } => write!(
                f,
                "invalid Consul address '{address}': use host:port, http://host:port or https://host:port"
            ),
            ConsulFlagsError::TokenFile {
                path,
                source,
                error,
            } => write!(
                f,
                "cannot read the token file {} ({source}): {error}",
                path.display()
            ),
            ConsulFlagsError::CertificateWithoutKey => f.write_str(
                "a client certificate needs its key: give --client-key or CONSUL_CLIENT_KEY",
            ),
            ConsulFlagsError::KeyWithoutCertificate => f.write_str(
                "a client key needs its certificate: give --client-cert or CONSUL_CLIENT_CERT",
            ),
        }
    }
}

impl std::error::Error for ConsulFlagsError {}

impl From<ConsulFlagsError> for OptionsError {
    fn from(error: ConsulFlagsError) -> OptionsError {
        OptionsError::StoreFlags(Box::new(error))
    }
}

pub fn configure(flags: &StoreFlags<'_>) -> Result<Box<dyn StoreSettings>, OptionsError> {
    let session_name = match flags.run {
        Some(run) => run.name.clone().unwrap_or_else(|| {
            let command: Vec<_> = run.command.iter().map(|a| a.to_string_lossy()).collect();
            format!("consem: {} at {}", command.join(" "), flags.prefix)
        }),
        // The operators' commands make no session.
        None => String::new(),
    };
    Ok(Box::new(consul::Settings {
        connection: connection(&flags.args.consul, flags.env)?,
        ttl: flags.lease_ttl(),
        monitor_retry: flags.monitor_retry(),
        session_name,
    }))
}

/// Resolves the connection settings as the consul CLI does. Tokens: a token
/// file (`--token-file`, else `CONSUL_HTTP_TOKEN_FILE`) wins over a token
/// (`--token`, else `CONSUL_HTTP_TOKEN`) when both are set, as in Consul's
/// API client ("if the TokenFile is set, always use that"); an empty file
/// falls back to the token.
fn connection(
    args: &ConsulArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ConsulConfig, ConsulFlagsError> {
    let non_empty = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
    let flag = |name: &'static str| -> Result<Option<bool>, ConsulFlagsError> {
        match non_empty(env(name)) {
            None => Ok(None),
            Some(value) => parse_bool(&value)
                .map(Some)
                .ok_or(ConsulFlagsError::NotABoolean { name, value }),
        }
    };
    // A flag wins over its variable, as in the consul CLI.
    let text = |flag: &Option<String>, name: &str| {
        non_empty(flag.clone()).or_else(|| non_empty(env(name)))
    };
    let path = |flag: &Option<PathBuf>, name: &str| {
        flag.clone()
            .or_else(|| non_empty(env(name)).map(PathBuf::from))
    };
    let http_addr =
        text(&args.http_addr, "CONSUL_HTTP_ADDR").unwrap_or_else(|| "127.0.0.1:8500".into());
    let address = address(&http_addr, flag("CONSUL_HTTP_SSL")?.unwrap_or(false))?;
    let token_file = match &args.token_file {
        Some(path) => Some((path.clone(), "--token-file")),
        None => non_empty(env("CONSUL_HTTP_TOKEN_FILE"))
            .map(|p| (PathBuf::from(p), "CONSUL_HTTP_TOKEN_FILE")),
    };
    let from_file = match token_file {
        Some((path, source)) => read_token_file(&path, source)?,
        None => None,
    };
    let token = from_file.or_else(|| text(&args.token, "CONSUL_HTTP_TOKEN"));
    let verify = flag("CONSUL_HTTP_SSL_VERIFY")?.unwrap_or(true);
    let client_cert = path(&args.client_cert, "CONSUL_CLIENT_CERT");
    let client_key = path(&args.client_key, "CONSUL_CLIENT_KEY");
    match (&client_cert, &client_key) {
        (Some(_), None) => return Err(ConsulFlagsError::CertificateWithoutKey),
        (None, Some(_)) => return Err(ConsulFlagsError::KeyWithoutCertificate),
        _ => {}
    }
    Ok(ConsulConfig {
        address,
        token,
        basic_auth: non_empty(env("CONSUL_HTTP_AUTH")),
        datacenter: non_empty(args.datacenter.clone()),
        namespace: text(&args.namespace, "CONSUL_NAMESPACE"),
        partition: text(&args.partition, "CONSUL_PARTITION"),
        tls: TlsSettings {
            ca_file: path(&args.ca_file, "CONSUL_CACERT"),
            ca_path: path(&args.ca_path, "CONSUL_CAPATH"),
            client_cert,
            client_key,
            server_name: text(&args.tls_server_name, "CONSUL_TLS_SERVER_NAME"),
            verify,
        },
    })
}

/// Reads an address the way the consul CLI does: `http://host:port`,
/// `https://host:port` or a bare `host:port` (https when `ssl`, which is
/// `CONSUL_HTTP_SSL=true`), with an optional path prefix.
fn address(address: &str, ssl: bool) -> Result<Address, ConsulFlagsError> {
    let address = address.trim().trim_end_matches('/');
    if address.is_empty() {
        return Err(ConsulFlagsError::EmptyAddress);
    }
    let (https, rest) = match address.split_once("://") {
        None => (ssl, address),
        // As in the consul CLI, CONSUL_HTTP_SSL=true never falls back to http.
        Some(("http", rest)) => (ssl, rest),
        Some(("https", rest)) => (true, rest),
        Some(("unix", _)) => {
            return Err(ConsulFlagsError::UnixSocket {
                address: address.to_string(),
            })
        }
        Some((scheme, _)) => {
            return Err(ConsulFlagsError::UnsupportedScheme {
                scheme: scheme.to_string(),
                address: address.to_string(),
            })
        }
    };
    let (host_port, path) = rest.split_once('/').unwrap_or((rest, ""));
    if host_port.is_empty() {
        return Err(ConsulFlagsError::NoHost {
            address: address.to_string(),
        });
    }
    Ok(Address {
        https,
        host_port: host_port.to_string(),
        path_prefix: if path.is_empty() {
            String::new()
        } else {
            format!("/{path}")
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

fn read_token_file(path: &Path, source: &'static str) -> Result<Option<String>, ConsulFlagsError> {
    let text = std::fs::read_to_string(path).map_err(|error| ConsulFlagsError::TokenFile {
        path: path.to_path_buf(),
        source,
        error,
    })?;
    let token = text.trim();
    Ok((!token.is_empty()).then(|| token.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_addresses_like_the_consul_cli() {
        let parse = |text: &str, ssl: bool| {
            address(text, ssl)
                .map(|a| a.to_string())
                .map_err(|e| e.to_string())
        };
        assert_eq!(
            parse("127.0.0.1:8500", false),
            Ok("http://127.0.0.1:8500".into())
        );
        assert_eq!(
            parse("127.0.0.1:8501", true),
            Ok("https://127.0.0.1:8501".into())
        );
        assert_eq!(
            parse("http://consul.local:8500/", false),
            Ok("http://consul.local:8500".into())
        );
        // CONSUL_HTTP_SSL=true never falls back to http, as in the consul CLI.
        assert_eq!(
            parse("http://consul.local:8500", true),
            Ok("https://consul.local:8500".into())
        );
        assert_eq!(
            parse("https://consul.local:8501", false),
            Ok("https://consul.local:8501".into())
        );
        assert_eq!(
            parse("https://gw:443/consul", false),
            Ok("https://gw:443/consul".into())
        );
        assert!(parse("unix:///var/run/consul.sock", false)
            .unwrap_err()
            .contains("unix socket"));
        assert!(parse("ftp://x:1", false).is_err());
        assert!(parse("", false).is_err());
    }

    #[test]
    fn token_precedence_follows_the_consul_cli() {
        let dir = std::env::temp_dir().join(format!("consem-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "from-file\n").unwrap();
        let token = |token: Option<&str>, token_file: Option<&Path>, env: &[(&str, &Path)]| {
            let args = ConsulArgs {
                token: token.map(String::from),
                token_file: token_file.map(Path::to_path_buf),
                ..ConsulArgs::default()
            };
            let env = |name: &str| {
                env.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string_lossy().into_owned())
            };
            connection(&args, &env).map(|config| config.token)
        };
        let env = [
            ("CONSUL_HTTP_TOKEN", Path::new("from-env")),
            ("CONSUL_HTTP_TOKEN_FILE", &file),
        ];
        // A token file, from the flag or else the environment, wins...
        assert_eq!(
            token(Some("flag"), None, &env).unwrap().as_deref(),
            Some("from-file")
        );
        assert_eq!(
            token(None, Some(&file), &env[..1]).unwrap().as_deref(),
            Some("from-file")
        );
        // ...then a token, from the flag or else the environment.
        assert_eq!(
            token(Some("flag"), None, &env[..1]).unwrap().as_deref(),
            Some("flag")
        );
        assert_eq!(
            token(None, None, &env[..1]).unwrap().as_deref(),
            Some("from-env")
        );
        assert_eq!(token(None, None, &[]).unwrap(), None);
        // An empty token file falls back to the token.
        let empty = dir.join("empty");
        std::fs::write(&empty, "\n").unwrap();
        assert_eq!(
            token(Some("flag"), Some(&empty), &[]).unwrap().as_deref(),
            Some("flag")
        );
        let missing = token(None, Some(Path::new("/nonexistent/token")), &[]);
        assert!(missing
            .unwrap_err()
            .to_string()
            .starts_with("cannot read the token file /nonexistent/token (--token-file): "));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
