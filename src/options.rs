//! Settings for a run, validated: what clap cannot check alone (the prefix,
//! the token sources) is checked here, with messages that say how to fix it.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::cli::{ConsulArgs, EtcdArgs, RunArgs};
use crate::store::{consul, local, Contend};

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub prefix: String,
    pub limit: u32,
    pub mode: Contend,
    pub timeout: Option<Duration>,
    pub no_slot_exit_code: u8,
    pub kill_grace: Duration,
    pub wait_group: bool,
    pub verbose: bool,
    pub log_format: crate::report::LogFormat,
    pub command: Vec<OsString>,
    pub store: StoreOptions,
}

/// Between SIGTERM and SIGKILL when consem stops the command.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(5);

/// The chosen store and what it alone needs.
#[derive(Debug, Clone)]
pub enum StoreOptions {
    Consul(Box<consul::RunSettings>),
    Local(local::Settings),
    Redis(Box<crate::store::redis::Settings>),
    Etcd(Box<crate::store::etcd::Settings>),
}

/// `--store`, else `CONSEM_STORE`, else Consul.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreChoice {
    Consul,
    /// The directory of `local:<DIR>`, or the default one.
    Local(Option<PathBuf>),
    /// `redis://...`.
    Redis(String),
    /// `etcd`, `etcd://...` or `etcds://...`.
    Etcd(String),
}

impl StoreChoice {
    pub fn from_args(
        flag: Option<String>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<StoreChoice, String> {
        let (text, source) = match flag {
            Some(text) => (text, "--store"),
            None => match env("CONSEM_STORE").filter(|s| !s.trim().is_empty()) {
                Some(text) => (text, "CONSEM_STORE"),
                None => return Ok(StoreChoice::Consul),
            },
        };
        let text = text.trim();
        match text {
            "consul" => Ok(StoreChoice::Consul),
            "local" => Ok(StoreChoice::Local(None)),
            _ => {
                if let Some(dir) = text.strip_prefix("local:") {
                    if dir.is_empty() {
                        return Err(format!(
                            "{source} '{text}' names no directory: write local:/path/to/dir, or local for the default"
                        ));
                    }
                    return Ok(StoreChoice::Local(Some(PathBuf::from(dir))));
                }
                let scheme = text.split("://").next().unwrap_or(text);
                if text.contains("://") && ["redis", "rediss"].contains(&scheme) {
                    return Ok(StoreChoice::Redis(text.to_string()));
                }
                if text == "etcd" || (text.contains("://") && ["etcd", "etcds"].contains(&scheme)) {
                    return Ok(StoreChoice::Etcd(text.to_string()));
                }
                Err(format!(
                    "{source} '{}' is not a store: use consul, local, local:DIR, redis://host:port or etcd://host:port",
                    crate::store::without_credentials(text)
                ))
            }
        }
    }
}

/// Refuses the Consul options with a store that does not use them.
pub fn refuse_consul_options(consul: &ConsulArgs, store: &str) -> Result<(), String> {
    match consul.first_given() {
        Some(flag) => Err(format!(
            "{flag} is an option of the Consul store, and --store is {store}: drop it, or use --store consul"
        )),
        None => Ok(()),
    }
}

/// Refuses the etcd options with a store that does not use them.
pub fn refuse_etcd_options(etcd: &EtcdArgs, store: &str) -> Result<(), String> {
    match etcd.first_given() {
        Some(flag) => Err(format!(
            "{flag} is an option of the etcd store, and --store is {store}: drop it, or use --store etcd://host:port"
        )),
        None => Ok(()),
    }
}

impl RunOptions {
    pub fn from_args(
        args: RunArgs,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<RunOptions, String> {
        let prefix = normalize_prefix(&args.prefix)?;
        let choice = StoreChoice::from_args(args.store.store, &env)?;
        let shown_command = args
            .command
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        if !matches!(choice, StoreChoice::Etcd(_)) {
            let store = match &choice {
                StoreChoice::Consul => "consul",
                StoreChoice::Local(_) => "local",
                _ => "redis://",
            };
            refuse_etcd_options(&args.etcd, store)?;
        }
        if args.redis_allow_eviction && !matches!(choice, StoreChoice::Redis(_)) {
            return Err(
                "--redis-allow-eviction is an option of the Redis store, and --store is not redis://: drop it".into(),
            );
        }
        let store = match choice {
            StoreChoice::Consul => {
                let session_name = args
                    .name
                    .unwrap_or_else(|| format!("consem: {shown_command} at {prefix}"));
                StoreOptions::Consul(Box::new(consul::RunSettings::new(
                    consul::config(args.consul, &env)?,
                    args.limit,
                    args.ttl,
                    args.monitor_retry,
                    session_name,
                )?))
            }
            StoreChoice::Local(dir) => {
                refuse_consul_options(&args.consul, "local")?;
                let consul_only = [
                    ("--ttl", args.ttl.is_some()),
                    ("--monitor-retry", args.monitor_retry.is_some()),
                    ("--name", args.name.is_some()),
                ];
                if let Some((flag, _)) = consul_only.iter().find(|(_, given)| *given) {
                    return Err(format!(
                        "{flag} does not apply to the local store, which holds a slot with a kernel lock that ends with consem: drop it"
                    ));
                }
                StoreOptions::Local(local::Settings::new(dir, &env, args.limit)?)
            }
            StoreChoice::Redis(url) => {
                refuse_consul_options(&args.consul, "redis://")?;
                if args.name.is_some() {
                    return Err("--name does not apply to the Redis store, which keeps no sessions: drop it".into());
                }
                StoreOptions::Redis(Box::new(crate::store::redis::Settings::new(
                    &url,
                    &env,
                    args.limit,
                    args.ttl,
                    args.monitor_retry,
                    args.redis_allow_eviction,
                )?))
            }
            StoreChoice::Etcd(store) => {
                refuse_consul_options(&args.consul, "etcd://")?;
                if args.name.is_some() {
                    return Err("--name does not apply to the etcd store, which names a contender by its lease: drop it".into());
                }
                StoreOptions::Etcd(Box::new(crate::store::etcd::Settings::new(
                    &store,
                    args.etcd.given(),
                    &env,
                    args.limit,
                    args.ttl,
                    args.monitor_retry,
                )?))
            }
        };
        let kill_grace = match &store {
            StoreOptions::Consul(consul) => {
                crate::store::lease::fit_kill_grace(args.kill_grace, consul.ttl, "Consul")?
            }
            StoreOptions::Local(_) => args.kill_grace.unwrap_or(DEFAULT_KILL_GRACE),
            StoreOptions::Redis(redis) => {
                crate::store::lease::fit_kill_grace(args.kill_grace, redis.ttl, "Redis")?
            }
            StoreOptions::Etcd(etcd) => {
                crate::store::lease::fit_kill_grace(args.kill_grace, etcd.ttl, "etcd")?
            }
        };
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
            kill_grace,
            wait_group: args.wait_group,
            verbose: args.verbose,
            log_format: args.log_format,
            command: args.command,
            store,
        })
    }
}

/// The longest prefix, in bytes: a key's name must fit in a URL line.
pub const MAX_PREFIX: usize = 1024;

/// Trims leading and trailing `/` and checks a prefix as every store takes
/// it; an empty prefix would put the semaphore at the root of the KV store.
pub fn normalize_prefix(prefix: &str) -> Result<String, String> {
    let shown = crate::report::abbreviated(prefix);
    if prefix.len() > MAX_PREFIX {
        return Err(format!(
            "--prefix '{shown}' is {} bytes long: use at most {MAX_PREFIX}",
            prefix.len()
        ));
    }
    // Consul answers such keys with an empty 400, and they would end up in
    // file names and operators' terminals.
    if let Some(c) = prefix.chars().find(|c| c.is_control()) {
        return Err(format!(
            "--prefix '{}' has a control character ({}): use printable characters only",
            crate::report::printable(&shown),
            c.escape_default()
        ));
    }
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

    /// What README and `--help` say a run gets when it gives nothing: the
    /// agent at 127.0.0.1:8500, a lease of 15 s on every store with one,
    /// holders that retry for as long as their lease lasts (no
    /// `--monitor-retry` bound), a kill grace of 5 s (the lease of 15 s
    /// leaves room for it), no timeout, 75 when no slot is had, quiet text
    /// on stderr.
    #[test]
    fn the_documented_defaults_hold_when_nothing_is_given() {
        let options = parse(&["--prefix", "p"], &[]).unwrap();
        assert_eq!(options.kill_grace, Duration::from_secs(5));
        assert_eq!((options.mode, options.timeout), (Contend::Wait, None));
        assert_eq!(options.no_slot_exit_code, 75);
        assert!(!options.wait_group && !options.verbose);
        assert_eq!(options.log_format, crate::report::LogFormat::Text);
        let StoreOptions::Consul(consul) = options.store else {
            panic!("the default store is Consul")
        };
        assert_eq!(consul.config.address.host_port, "127.0.0.1:8500");
        assert!(!consul.config.address.https);
        assert_eq!(consul.ttl, Duration::from_secs(15));
        assert_eq!(consul.monitor_retry, None);
        let redis = parse(&["--prefix", "p", "--store", "redis://h"], &[]).unwrap();
        assert_eq!(redis.kill_grace, Duration::from_secs(5));
        let StoreOptions::Redis(redis) = redis.store else {
            panic!("redis://")
        };
        assert_eq!(
            (redis.ttl, redis.monitor_retry, redis.allow_eviction),
            (Duration::from_secs(15), None, false)
        );
        let etcd = parse(&["--prefix", "p", "--store", "etcd://h:1"], &[]).unwrap();
        assert_eq!(etcd.kill_grace, Duration::from_secs(5));
        let StoreOptions::Etcd(etcd) = etcd.store else {
            panic!("etcd://")
        };
        assert_eq!(
            (etcd.ttl, etcd.monitor_retry),
            (Duration::from_secs(15), None)
        );
        let local = parse(&["--prefix", "p", "--store", "local:/tmp/x"], &[]).unwrap();
        assert_eq!(local.kill_grace, Duration::from_secs(5));
        // A lease too short for 5 s shortens the default to what fits.
        let short = parse(&["--prefix", "p", "--ttl", "10s"], &[]).unwrap();
        assert_eq!(short.kill_grace.as_millis(), 4000);
    }

    #[test]
    fn names_the_session_after_the_command() {
        let options = parse(&["--prefix", "jobs"], &[]).unwrap();
        let StoreOptions::Consul(consul) = options.store else {
            panic!("the default store is Consul")
        };
        assert_eq!(consul.session_name, "consem: echo hi at jobs");
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
            match parse(&args, env).unwrap().store {
                StoreOptions::Consul(consul) => consul.config.token,
                _ => panic!("the default store is Consul"),
            }
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

    #[test]
    fn chooses_the_store_from_the_flag_then_the_environment() {
        let choice = |flag: Option<&str>, env: Option<&str>| {
            StoreChoice::from_args(flag.map(String::from), |name| {
                (name == "CONSEM_STORE")
                    .then(|| env.map(String::from))
                    .flatten()
            })
        };
        assert_eq!(choice(None, None), Ok(StoreChoice::Consul));
        assert_eq!(choice(None, Some("local")), Ok(StoreChoice::Local(None)));
        assert_eq!(
            choice(Some("consul"), Some("local")),
            Ok(StoreChoice::Consul)
        );
        assert_eq!(
            choice(Some("local:/srv/slots"), None),
            Ok(StoreChoice::Local(Some(PathBuf::from("/srv/slots"))))
        );
        assert_eq!(
            choice(Some("redis://cache:6379/2"), None),
            Ok(StoreChoice::Redis("redis://cache:6379/2".into()))
        );
        assert_eq!(
            choice(Some("etcds://a:2379,b:2379"), None),
            Ok(StoreChoice::Etcd("etcds://a:2379,b:2379".into()))
        );
        assert_eq!(
            choice(None, Some("etcd")),
            Ok(StoreChoice::Etcd("etcd".into()))
        );
        let unknown = choice(None, Some("zookeeper")).unwrap_err();
        assert!(
            unknown.starts_with("CONSEM_STORE 'zookeeper' is not a store"),
            "{unknown}"
        );
        assert!(choice(Some("local:"), None)
            .unwrap_err()
            .contains("names no directory"));
    }

    #[test]
    fn each_store_refuses_what_it_does_not_use() {
        let local = |extra: &[&str]| {
            let mut args = vec!["--prefix", "p", "--store", "local:/tmp/x"];
            args.extend_from_slice(extra);
            parse(&args, &[("CONSUL_HTTP_ADDR", "10.0.0.1:8500")])
        };
        assert!(
            local(&[]).is_ok(),
            "Consul's variables do not get in the way"
        );
        for (flag, value) in [
            ("--ca-file", "ca.pem"),
            ("--http-addr", "h:1"),
            ("--token", "t"),
        ] {
            let error = local(&[flag, value]).unwrap_err();
            assert!(
                error.starts_with(&format!("{flag} is an option of the Consul store")),
                "{error}"
            );
        }
        for (flag, value) in [("--ttl", "20s"), ("--monitor-retry", "2"), ("--name", "n")] {
            let error = local(&[flag, value]).unwrap_err();
            assert!(
                error.starts_with(&format!("{flag} does not apply to the local store")),
                "{error}"
            );
        }
        // Ranges are the store's own.
        let consul = |extra: &[&str]| {
            let mut args = vec!["--prefix", "p"];
            args.extend_from_slice(extra);
            parse(&args, &[])
        };
        assert!(consul(&["--ttl", "5s"])
            .unwrap_err()
            .contains("use 10s to 24h"));
        assert!(consul(&["--ttl", "25h"])
            .unwrap_err()
            .contains("use 10s to 24h"));
        assert!(consul(&["--ttl", "10s"]).is_ok());
    }
}
