//! The etcd store's settings: the endpoints of `--store` (or
//! `ETCDCTL_ENDPOINTS`), and the etcd options, each defaulting to the
//! variable etcdctl reads.

use std::path::PathBuf;

use super::{OptionsError, StoreFlags};
use crate::cli::{EtcdArgs, TlsFileArgs};
use crate::store::etcd::{self, client::Connection};
use crate::store::kind::StoreSettings;
use crate::store::tls::TlsSettings;
use crate::store::without_credentials;

/// etcdctl's default endpoint.
const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:2379";

#[derive(Debug, PartialEq, Eq)]
enum EtcdFlagsError {
    NotAnEndpoint { source: &'static str, item: String },
    CarriesCredentials { source: &'static str, item: String },
    HasPath { source: &'static str, item: String },
    BadPort { source: &'static str, item: String },
    NotHostPort { source: &'static str, item: String },
    NoEndpoint { source: &'static str, store: String },
    NoPassword { name: String },
    NoUserName,
}

impl std::fmt::Display for EtcdFlagsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EtcdFlagsError::NotAnEndpoint { source, item } => write!(
                f,
                "{source}: '{item}' is not an etcd endpoint: write {}",
                if *source == "--store" {
                    "etcd://host:port[,host:port...] or etcds://... for TLS"
                } else {
                    "http://host:port or https://host:port, comma-separated"
                }
            ),
            EtcdFlagsError::CarriesCredentials { source, item } => write!(
                f,
                "{source}: '{item}' carries credentials: give the user in --user or ETCDCTL_USER instead"
            ),
            EtcdFlagsError::HasPath { source, item } => write!(
                f,
                "{source}: '{item}' is not host:port: an etcd endpoint has no path; write etcd://host:port"
            ),
            EtcdFlagsError::BadPort { source, item } => write!(
                f,
                "{source}: '{item}' is not host:port (a port is 1 to 65535): write etcd://host:port"
            ),
            EtcdFlagsError::NotHostPort { source, item } => write!(
                f,
                "{source}: '{item}' is not host:port: write etcd://host:port, an IPv6 address in brackets ([::1]:2379)"
            ),
            EtcdFlagsError::NoEndpoint { source, store } => write!(
                f,
                "{source} '{store}' names no endpoint: write etcd://host:port[,host:port...]"
            ),
            EtcdFlagsError::NoPassword { name } => write!(
                f,
                "--user {name} has no password: write --user {name}:PASSWORD, or set --password or ETCDCTL_PASSWORD"
            ),
            EtcdFlagsError::NoUserName => {
                f.write_str("--user names no user: write --user NAME:PASSWORD")
            }
        }
    }
}

impl std::error::Error for EtcdFlagsError {}

impl From<EtcdFlagsError> for OptionsError {
    fn from(error: EtcdFlagsError) -> OptionsError {
        OptionsError::StoreFlags(Box::new(error))
    }
}

pub fn configure(flags: &StoreFlags<'_>) -> Result<Box<dyn StoreSettings>, OptionsError> {
    Ok(Box::new(etcd::Settings {
        connection: connection(flags.text, &flags.args.etcd, &flags.args.tls, flags.env)?,
        ttl: flags.lease_ttl(),
        monitor_retry: flags.monitor_retry(),
    }))
}

/// Reads `etcd://host:port[,host:port...]`, `etcds://...` (TLS), or `etcd`
/// alone for `ETCDCTL_ENDPOINTS` (else 127.0.0.1:2379), and the etcd
/// options.
fn connection(
    store: &str,
    args: &EtcdArgs,
    tls: &TlsFileArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Connection, EtcdFlagsError> {
    let endpoints = endpoints(store, env)?;
    let from_env = |value: &Option<String>, name: &str| {
        value
            .clone()
            .or_else(|| env(name).filter(|v| !v.is_empty()))
    };
    let user = match from_env(&args.user, "ETCDCTL_USER") {
        None => None,
        Some(user) => {
            let (name, inline) = match user.split_once(':') {
                Some((name, password)) => (name.to_string(), Some(password.to_string())),
                None => (user, None),
            };
            let password = inline
                .or_else(|| from_env(&args.password, "ETCDCTL_PASSWORD"))
                .ok_or_else(|| EtcdFlagsError::NoPassword { name: name.clone() })?;
            if name.is_empty() {
                return Err(EtcdFlagsError::NoUserName);
            }
            Some((name, password))
        }
    };
    let path = |value: &Option<PathBuf>, name: &str| {
        value
            .clone()
            .or_else(|| env(name).filter(|v| !v.is_empty()).map(Into::into))
    };
    Ok(Connection {
        endpoints,
        user,
        tls: TlsSettings {
            ca_file: path(&tls.cacert, "ETCDCTL_CACERT"),
            ca_path: None,
            client_cert: path(&tls.cert, "ETCDCTL_CERT"),
            client_key: path(&tls.key, "ETCDCTL_KEY"),
            server_name: None,
            verify: true,
        },
    })
}

/// The endpoints of `--store`, as `http(s)://host:port`.
fn endpoints(
    store: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<String>, EtcdFlagsError> {
    let (list, scheme, source) = match store.split_once("://") {
        Some(("etcd", list)) => (list.to_string(), "http", "--store"),
        Some(("etcds", list)) => (list.to_string(), "https", "--store"),
        _ => match env("ETCDCTL_ENDPOINTS").filter(|e| !e.trim().is_empty()) {
            Some(list) => (list, "http", "ETCDCTL_ENDPOINTS"),
            None => (DEFAULT_ENDPOINT.to_string(), "http", "ETCDCTL_ENDPOINTS"),
        },
    };
    let mut endpoints = Vec::new();
    for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (scheme, address) = match item.split_once("://") {
            Some((s @ ("http" | "https"), address)) if source == "ETCDCTL_ENDPOINTS" => {
                (s, address)
            }
            Some(_) => {
                return Err(EtcdFlagsError::NotAnEndpoint {
                    source,
                    item: without_credentials(item),
                })
            }
            None => (scheme, item),
        };
        let address = address.trim_end_matches('/');
        if address.contains('@') {
            return Err(EtcdFlagsError::CarriesCredentials {
                source,
                item: without_credentials(item),
            });
        }
        let item = item.to_string();
        if address.contains('/') || address.contains('?') || address.is_empty() {
            return Err(EtcdFlagsError::HasPath { source, item });
        }
        let bracketed_v6 = address.starts_with('[') && address.ends_with(']');
        let address = match address.rsplit_once(':') {
            Some((host, port))
                if !bracketed_v6 && (host.starts_with('[') || !host.contains(':')) =>
            {
                if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
                    return Err(EtcdFlagsError::BadPort { source, item });
                }
                address.to_string()
            }
            None => format!("{address}:2379"),
            _ if bracketed_v6 => format!("{address}:2379"),
            _ => return Err(EtcdFlagsError::NotHostPort { source, item }),
        };
        endpoints.push(format!("{scheme}://{address}"));
    }
    if endpoints.is_empty() {
        return Err(EtcdFlagsError::NoEndpoint {
            source,
            store: store.to_string(),
        });
    }
    Ok(endpoints)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn endpoints_come_from_the_store_or_etcdctls_variable() {
        let none = env(&[]);
        assert_eq!(
            endpoints("etcd://a:1,b , [::1]:3", &none).unwrap(),
            ["http://a:1", "http://b:2379", "http://[::1]:3"]
        );
        assert_eq!(endpoints("etcds://a", &none).unwrap(), ["https://a:2379"]);
        assert_eq!(endpoints("etcd", &none).unwrap(), [DEFAULT_ENDPOINT]);
        let etcdctl = env(&[("ETCDCTL_ENDPOINTS", "https://x:1,http://y:2")]);
        assert_eq!(
            endpoints("etcd", &etcdctl).unwrap(),
            ["https://x:1", "http://y:2"]
        );
        assert!(endpoints("etcd://u:secret@a:1", &none)
            .unwrap_err()
            .to_string()
            .contains("give the user in --user"));
        assert!(endpoints("etcd://a:1/v3", &none)
            .unwrap_err()
            .to_string()
            .contains("has no path"));
        assert!(endpoints("etcd://", &none)
            .unwrap_err()
            .to_string()
            .contains("names no endpoint"));
        assert!(endpoints("etcd://http://a:1", &none)
            .unwrap_err()
            .to_string()
            .contains("is not an etcd endpoint"));
        for bad in [
            "etcd://a:b:c",
            "etcd://a:99999",
            "etcd://a:0",
            "etcd://:1",
            "etcd://a:x",
        ] {
            assert!(
                endpoints(bad, &none)
                    .unwrap_err()
                    .to_string()
                    .contains("is not host:port"),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_user_and_password_come_from_the_flags_then_etcdctls_variables() {
        let user = |user: Option<&str>, password: Option<&str>, vars: &[(&str, &str)]| {
            let args = EtcdArgs {
                user: user.map(String::from),
                password: password.map(String::from),
            };
            connection("etcd://a:1", &args, &TlsFileArgs::default(), &env(vars)).map(|c| c.user)
        };
        assert_eq!(
            user(Some("root:pw"), None, &[]),
            Ok(Some(("root".into(), "pw".into())))
        );
        assert_eq!(
            user(
                None,
                None,
                &[("ETCDCTL_USER", "app"), ("ETCDCTL_PASSWORD", "s3")]
            ),
            Ok(Some(("app".into(), "s3".into())))
        );
        assert_eq!(
            user(Some("app"), Some("flag"), &[("ETCDCTL_PASSWORD", "env")]),
            Ok(Some(("app".into(), "flag".into())))
        );
        assert!(user(Some("app"), None, &[])
            .unwrap_err()
            .to_string()
            .contains("has no password"));
        assert_eq!(user(None, None, &[]), Ok(None));
    }
}
