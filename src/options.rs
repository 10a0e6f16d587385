//! Settings for a run, validated: what clap cannot check alone (the prefix,
//! the token sources) is checked here, with messages that say how to fix it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::backend::Contend;
use crate::cli::{ConsulArgs, RunArgs};
use crate::consul::{Address, ConsulConfig};
use crate::tls::TlsSettings;

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub prefix: String,
    pub limit: u32,
    pub mode: Contend,
    pub timeout: Option<Duration>,
    pub no_slot_exit_code: u8,
    pub ttl: Duration,
    pub kill_grace: Duration,
    pub monitor_retry: u32,
    pub session_name: String,
    pub verbose: bool,
    pub log_format: crate::report::LogFormat,
    pub consul: ConsulConfig,
    pub command: Vec<OsString>,
}

impl RunOptions {
    pub fn from_args(
        args: RunArgs,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<RunOptions, String> {
        let prefix = normalize_prefix(&args.prefix)?;
        let shown_command = args
            .command
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        let session_name = args
            .name
            .unwrap_or_else(|| format!("consem: {shown_command} at {prefix}"));
        Ok(RunOptions {
            prefix,
            limit: args.limit,
            // `--timeout 0` is one attempt, as flock's `-w 0` is.
            mode: if args.try_once || args.timeout == Some(Duration::ZERO) {
                Contend::Try
            } else {
                Contend::Wait
            },
            timeout: args.timeout.filter(|t| !t.is_zero()),
            no_slot_exit_code: args.no_slot_exit_code,
            ttl: args.ttl,
            kill_grace: args.kill_grace,
            monitor_retry: args.monitor_retry,
            session_name,
            verbose: args.verbose,
            log_format: args.log_format,
            consul: consul_config(args.consul, env)?,
            command: args.command,
        })
    }
}

/// Trims leading and trailing `/`; an empty prefix would put the semaphore
/// at the root of the KV store.
pub fn normalize_prefix(prefix: &str) -> Result<String, String> {
    let trimmed = prefix.trim_matches('/');
    if trimmed.is_empty() {
        return Err(format!(
            "--prefix '{prefix}' is empty once '/' are trimmed: name a KV prefix such as service/db"
        ));
    }
    // Consul's HTTP server redirects paths with such segments to a cleaned
    // path, so keys under them cannot be written where they are named.
    if trimmed
        .split('/')
        .any(|segment| segment.is_empty() || segment == "." || segment == "..")
    {
        return Err(format!(
            "--prefix '{prefix}' has an empty, '.' or '..' segment, which Consul's API cannot address: write it like service/db"
        ));
    }
    Ok(trimmed.to_string())
}

/// Resolves the connection settings as the consul CLI does. Tokens: a token
/// file (`--token-file`, else `CONSUL_HTTP_TOKEN_FILE`) wins over a token
/// (`--token`, else `CONSUL_HTTP_TOKEN`) when both are set, as in Consul's
/// API client ("if the TokenFile is set, always use that"); an empty file
/// falls back to the token.
pub fn consul_config(
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
    let address = Address::parse(&args.http_addr, flag("CONSUL_HTTP_SSL")?.unwrap_or(false))?;
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
    Ok(ConsulConfig {
        address,
        token,
        basic_auth: non_empty(env("CONSUL_HTTP_AUTH")),
        datacenter: non_empty(args.datacenter),
        namespace: non_empty(args.namespace),
        partition: non_empty(args.partition),
        tls: TlsSettings {
            ca_file: args.ca_file,
            ca_path: args.ca_path,
            client_cert: args.client_cert,
            client_key: args.client_key,
            server_name: non_empty(args.tls_server_name),
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    fn parse(extra: &[&str], env: &[(&str, &str)]) -> Result<RunOptions, String> {
        let mut line = vec!["consem", "run", "--limit", "2"];
        line.extend_from_slice(extra);
        line.extend_from_slice(&["--", "echo", "hi"]);
        let crate::cli::Command::Run(args) =
            crate::cli::Cli::try_parse_from(&line).unwrap().command
        else {
            panic!("parsed as run")
        };
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        RunOptions::from_args(args, |name| {
            env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn trims_the_prefix_and_refuses_an_empty_one() {
        assert_eq!(
            parse(&["--prefix", "/service/db/"], &[]).unwrap().prefix,
            "service/db"
        );
        assert!(parse(&["--prefix", "//"], &[])
            .unwrap_err()
            .contains("empty"));
    }

    #[test]
    fn a_zero_timeout_is_one_attempt() {
        let options = parse(&["--prefix", "p", "--timeout", "0"], &[]).unwrap();
        assert_eq!((options.mode, options.timeout), (Contend::Try, None));
        let options = parse(&["--prefix", "p", "--timeout", "3s"], &[]).unwrap();
        assert_eq!(
            (options.mode, options.timeout),
            (Contend::Wait, Some(Duration::from_secs(3)))
        );
    }

    #[test]
    fn names_the_session_after_the_command() {
        let options = parse(&["--prefix", "jobs"], &[]).unwrap();
        assert_eq!(options.session_name, "consem: echo hi at jobs");
    }

    #[test]
    fn token_precedence_follows_the_consul_cli() {
        let dir = std::env::temp_dir().join(format!("consem-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "from-file\n").unwrap();
        let file = file.to_str().unwrap();
        let token = |extra: &[&str], env: &[(&str, &str)]| {
            let mut args = vec!["--prefix", "p"];
            args.extend_from_slice(extra);
            parse(&args, env).unwrap().consul.token
        };
        let env = [
            ("CONSUL_HTTP_TOKEN", "from-env"),
            ("CONSUL_HTTP_TOKEN_FILE", file),
        ];
        // A token file, from the flag or else the environment, wins...
        assert_eq!(
            token(&["--token", "flag"], &env).as_deref(),
            Some("from-file")
        );
        assert_eq!(
            token(&["--token-file", file], &env[..1]).as_deref(),
            Some("from-file")
        );
        // ...then a token, from the flag or else the environment.
        assert_eq!(
            token(&["--token", "flag"], &env[..1]).as_deref(),
            Some("flag")
        );
        assert_eq!(token(&[], &env[..1]).as_deref(), Some("from-env"));
        assert_eq!(token(&[], &[]), None);
        // An empty token file falls back to the token.
        let empty = dir.join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let empty = empty.to_str().unwrap();
        assert_eq!(
            token(&["--token-file", empty, "--token", "flag"], &[]).as_deref(),
            Some("flag")
        );
        let missing = parse(
            &["--prefix", "p", "--token-file", "/nonexistent/token"],
            &[],
        );
        assert!(missing.unwrap_err().contains("/nonexistent/token"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
