//! The PostgreSQL store's settings, as libpq reads them: the address of
//! `--store` (`postgres://` or `postgresql://`, or `postgres` alone), and
//! where it leaves something out, `PGHOST`, `PGPORT`, `PGUSER`,
//! `PGPASSWORD`, `PGDATABASE`, `PGSSLMODE`, and the password file
//! (`PGPASSFILE`, else `~/.pgpass`).

use std::str::FromStr as _;

use super::{OptionsError, StoreFlags};
use crate::store::kind::StoreSettings;
use std::path::PathBuf;

use crate::store::postgres::tls::{Roots, SslMode, Tls};
use crate::store::postgres::{self, link::Connection};
use crate::store::without_credentials;

/// Where libpq looks for a server when nothing names a host (Debian's
/// build); `localhost` where that directory does not exist.
const DEFAULT_SOCKET_DIR: &str = "/var/run/postgresql";

#[derive(Debug, PartialEq, Eq)]
enum PostgresFlagsError {
    NotAnAddress {
        source: &'static str,
        shown: String,
        why: String,
    },
    UnknownSslMode {
        mode: String,
    },
    /// A TLS setting that cannot be used, in its own words.
    Tls(String),
}

impl std::fmt::Display for PostgresFlagsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PostgresFlagsError::NotAnAddress { source, shown, why } => write!(
                f,
                "{source}: '{shown}' is not a PostgreSQL address ({why}): write postgres://user@host:port/database"
            ),
            PostgresFlagsError::UnknownSslMode { mode } => write!(
                f,
                "sslmode={mode} is not one of disable, allow, prefer, require, verify-ca, verify-full"
            ),
            PostgresFlagsError::Tls(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for PostgresFlagsError {}

impl From<PostgresFlagsError> for OptionsError {
    fn from(error: PostgresFlagsError) -> OptionsError {
        OptionsError::StoreFlags(Box::new(error))
    }
}

pub fn configure(flags: &StoreFlags<'_>) -> Result<Box<dyn StoreSettings>, OptionsError> {
    Ok(Box::new(postgres::Settings {
        connection: connection(flags.text, flags.source, flags.env)?,
        ttl: flags.lease_ttl(),
    }))
}

/// The address's own `sslmode` and `sslrootcert` (taken out: the
/// client's parser knows neither as libpq does), and the rest.
fn split_tls_params(address: &str) -> (String, Option<String>, Option<String>) {
    let Some((base, query)) = address.split_once('?') else {
        return (address.to_string(), None, None);
    };
    let (mut mode, mut root) = (None, None);
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            if let Some(value) = pair.strip_prefix("sslmode=") {
                mode = Some(value.to_string());
                false
            } else if let Some(value) = pair.strip_prefix("sslrootcert=") {
                root = Some(value.to_string());
                false
            } else {
                !pair.is_empty()
            }
        })
        .collect();
    if kept.is_empty() {
        (base.to_string(), mode, root)
    } else {
        (format!("{base}?{}", kept.join("&")), mode, root)
    }
}

fn connection(
    text: &str,
    source: &'static str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Connection, PostgresFlagsError> {
    let var = |name: &str| env(name).filter(|v| !v.is_empty());
    let shown = without_credentials(text);
    let address = if text == postgres::STORE.name {
        "postgres://"
    } else {
        text
    };
    let (address, mode, root) = split_tls_params(address);
    let mode = mode.or_else(|| var("PGSSLMODE"));
    let mode = match mode.as_deref() {
        None => SslMode::Prefer,
        Some(text) => SslMode::parse(text)
            .ok_or_else(|| PostgresFlagsError::UnknownSslMode { mode: text.into() })?,
    };
    let roots = match root.or_else(|| var("PGSSLROOTCERT")) {
        Some(system) if system == "system" => Roots::System,
        Some(path) => Roots::File(percent_decoded(&path).into()),
        None => match var("HOME").map(|home| PathBuf::from(home).join(".postgresql/root.crt")) {
            Some(path) if path.exists() => Roots::File(path),
            _ => Roots::None,
        },
    };
    let address = match var("PGPORT") {
        Some(port) if !names_a_port(&address) => with_port(&address, &port),
        _ => address,
    };
    let mut config = tokio_postgres::Config::from_str(&address).map_err(|error| {
        PostgresFlagsError::NotAnAddress {
            source,
            shown: shown.clone(),
            why: error.to_string(),
        }
    })?;
    if config.get_hosts().is_empty() {
        let hosts = var("PGHOST").unwrap_or_else(|| {
            if std::path::Path::new(DEFAULT_SOCKET_DIR).is_dir() {
                DEFAULT_SOCKET_DIR.to_string()
            } else {
                "localhost".to_string()
            }
        });
        for host in hosts.split(',') {
            if host.starts_with('/') {
                config.host_path(host);
            } else {
                config.host(host);
            }
        }
    }

    // libpq uses no TLS over a Unix socket, whatever sslmode says (the
    // server offers none there), and so needs no root certificate.
    let mode = if config
        .get_hosts()
        .iter()
        .all(|host| matches!(host, tokio_postgres::config::Host::Unix(_)))
    {
        SslMode::Disable
    } else {
        mode
    };
    config.ssl_mode(mode.client_mode());
    let tls = Tls::new(mode, &roots).map_err(|e| PostgresFlagsError::Tls(e.to_string()))?;
    if config.get_ports().is_empty() {
        if let Some(port) = var("PGPORT").and_then(|p| p.parse().ok()) {
            config.port(port);
        }
    }
    if config.get_user().is_none() {
        config.user(var("PGUSER").unwrap_or_else(os_user));
    }
    if config.get_dbname().is_none() {
        let database =
            var("PGDATABASE").unwrap_or_else(|| config.get_user().unwrap_or_default().to_string());
        config.dbname(database);
    }
    if config.get_password().is_none() {
        let password = var("PGPASSWORD").or_else(|| {
            let file =
                var("PGPASSFILE").or_else(|| var("HOME").map(|home| format!("{home}/.pgpass")))?;
            let passfile = std::fs::read_to_string(file).ok()?;
            let host = match config.get_hosts().first() {
                Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
                _ => "localhost".to_string(),
            };
            let port = config
                .get_ports()
                .first()
                .copied()
                .unwrap_or(5432)
                .to_string();
            password_from_file(
                &passfile,
                [
                    host.as_str(),
                    &port,
                    config.get_dbname().unwrap_or_default(),
                    config.get_user().unwrap_or_default(),
                ],
            )
        });
        if let Some(password) = password {
            config.password(password);
        }
    }
    Ok(Connection { config, tls, shown })
}

/// Whether the address gives a port (the client's parser fills in 5432
/// where it does not, so that its answer cannot tell).
fn names_a_port(address: &str) -> bool {
    let rest = address.split_once("://").map_or(address, |(_, rest)| rest);
    let (authority, query) = match rest.find(['/', '?']) {
        Some(end) => (&rest[..end], &rest[end..]),
        None => (rest, ""),
    };
    let hosts = authority
        .rsplit_once('@')
        .map_or(authority, |(_, hosts)| hosts);
    let bracketless = hosts.rsplit(']').next().unwrap_or_default();
    bracketless.contains(':') || query.contains("port=")
}

/// `address` with `port` after each of its hosts (the client's parser
/// gives a host without one 5432, which no later setting replaces).
fn with_port(address: &str, port: &str) -> String {
    let Some((scheme, rest)) = address.split_once("://") else {
        return address.to_string();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (credentials, hosts) = match authority.rsplit_once('@') {
        Some((credentials, hosts)) => (format!("{credentials}@"), hosts),
        None => (String::new(), authority),
    };
    if hosts.is_empty() {
        return address.to_string();
    }
    let hosts: Vec<String> = hosts
        .split(',')
        .map(|host| format!("{host}:{port}"))
        .collect();
    format!("{scheme}://{credentials}{}{tail}", hosts.join(","))
}

/// `%XX` escapes decoded, as in a URL's query.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).and_then(|&b| hex(b)),
            bytes.get(i + 2).and_then(|&b| hex(b)),
        ) {
            (b'%', Some(high), Some(low)) => {
                out.push((high * 16 + low) as u8);
                i += 3;
            }
            (byte, _, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The user this process runs as, libpq's default role.
fn os_user() -> String {
    // SAFETY: getpwuid returns a pointer into static storage or null; the
    // name is copied out at once, before any other call could reuse it.
    unsafe {
        let entry = libc::getpwuid(libc::geteuid());
        if entry.is_null() || (*entry).pw_name.is_null() {
            return "postgres".to_string();
        }
        std::ffi::CStr::from_ptr((*entry).pw_name)
            .to_string_lossy()
            .into_owned()
    }
}

/// The password of the first line of a password file that matches
/// `host:port:database:user` (`*` matches anything; `\:` and `\\` are a
/// colon and a backslash), as libpq reads it. A socket counts as
/// `localhost`.
fn password_from_file(file: &str, wanted: [&str; 4]) -> Option<String> {
    file.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .find_map(|line| {
            let fields = split_escaped(line);
            if fields.len() != 5 {
                return None;
            }
            let matches = fields[..4]
                .iter()
                .zip(wanted)
                .all(|(field, wanted)| field == "*" || field == wanted);
            matches.then(|| fields[4].clone())
        })
}

fn split_escaped(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next() {
                    fields.last_mut().unwrap().push(next);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut().unwrap().push(c),
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str, vars: &[(&str, &str)]) -> Result<Connection, PostgresFlagsError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        connection(text, "--store", &move |name| {
            vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn an_address_takes_what_it_lacks_from_libpq_s_variables() {
        let c = read(
            "postgres://db.internal/jobs",
            &[
                ("PGUSER", "ops"),
                ("PGPASSWORD", "S3cret"),
                ("PGPORT", "6432"),
            ],
        )
        .unwrap();
        assert_eq!(c.config.get_user(), Some("ops"));
        assert_eq!(c.config.get_dbname(), Some("jobs"));
        assert_eq!(c.config.get_ports(), [6432]);
        assert_eq!(c.config.get_password(), Some(&b"S3cret"[..]));
        let c = read(
            "postgresql://u:pw@h:5/d?application_name=x",
            &[("PGUSER", "ops")],
        )
        .unwrap();
        assert_eq!(c.config.get_user(), Some("u"));
        assert_eq!(c.shown, "postgresql://…@h:5/d?application_name=x");
        let c = read(
            "postgres",
            &[
                ("PGHOST", "/tmp/sock"),
                ("PGUSER", "me"),
                ("PGDATABASE", "db"),
            ],
        )
        .unwrap();
        assert_eq!(
            c.config.get_hosts(),
            [tokio_postgres::config::Host::Unix("/tmp/sock".into())]
        );
        assert_eq!(c.config.get_dbname(), Some("db"));
        let c = read("postgres://u@%2Ftmp%2Fsock/d", &[]).unwrap();
        assert_eq!(
            c.config.get_hosts(),
            [tokio_postgres::config::Host::Unix("/tmp/sock".into())]
        );
        let c = read("postgres://u@h:7/d", &[("PGPORT", "6432")]).unwrap();
        assert_eq!(c.config.get_ports(), [7]);
        let c = read("postgres://u@[::1]/d", &[("PGPORT", "6432")]).unwrap();
        assert_eq!(c.config.get_ports(), [6432]);
    }

    #[test]
    fn ssl_modes_and_root_certificates_are_read_as_libpq_reads_them() {
        assert!(read("postgres://h/d?sslmode=disable", &[]).is_ok());
        assert!(read("postgres://h/d?sslmode=prefer&connect_timeout=3", &[]).is_ok());
        assert!(read("postgres://h/d?sslmode=require", &[]).is_ok());
        assert!(matches!(
            read("postgres://h/d?sslmode=verify-full", &[("HOME", "/nonexistent")]),
            Err(PostgresFlagsError::Tls(why)) if why.contains("no root certificate")
        ));
        assert!(matches!(
            read("postgres://h/d?sslmode=verify-ca&sslrootcert=%2Fnonexistent%2Fca.pem", &[]),
            Err(PostgresFlagsError::Tls(why)) if why.contains("cannot read /nonexistent/ca.pem")
        ));
        assert!(read("postgres://h/d?sslmode=verify-full&sslrootcert=system", &[]).is_ok());
        assert!(matches!(
            read("postgres://h/d", &[("PGSSLMODE", "bogus")]),
            Err(PostgresFlagsError::UnknownSslMode { .. })
        ));
        assert!(matches!(
            read("postgres://h:notaport/d", &[]),
            Err(PostgresFlagsError::NotAnAddress { .. })
        ));
    }

    #[test]
    fn the_password_file_is_read_as_libpq_reads_it() {
        let file = "# comment\nother:*:*:*:no\n*:5432:jobs:ops:first\\:pass\\\\\n*:*:*:*:any\n";
        assert_eq!(
            password_from_file(file, ["h", "5432", "jobs", "ops"]).as_deref(),
            Some("first:pass\\")
        );
        assert_eq!(
            password_from_file(file, ["h", "5433", "jobs", "ops"]).as_deref(),
            Some("any")
        );
        assert_eq!(password_from_file("a:b:c\n", ["a", "b", "c", "d"]), None);
    }
}
