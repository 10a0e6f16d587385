//! Settings for a run or an operator's command, validated: what clap
//! cannot check alone (the prefix, the store chosen, the options that
//! store takes, its rules) is checked here, with messages that say how to
//! fix it. Each store's flags and environment become its settings in a
//! module of its own, which the registry (`stores`) names.

mod consul;
mod etcd;
mod local;
mod postgres;
mod redis;
pub mod stores;
mod zookeeper;

use std::ffi::OsString;
use std::time::Duration;

use crate::cli::{RunArgs, StoreArgs};
use crate::duration::human;
use crate::store::kind::{RuleError, StoreSettings};
use crate::store::{lease, Contend};
use stores::{Entry, STORES};

#[derive(Debug)]
pub struct RunOptions {
    pub prefix: String,
    pub limit: u32,
    pub mode: Contend,
    pub timeout: Option<Duration>,
    pub no_slot_exit_code: u8,
    pub kill_grace: Duration,
    pub wait_group: bool,
    pub verbose: bool,
    /// Whether a run that ends without a slot says why on stderr: a
    /// timeout does (a CI step's log says why it failed), `--timeout 0`
    /// too, unless `-q`; `--try` only with `-v`, so that cron is not
    /// mailed every round it skips.
    pub say_no_slot: bool,
    pub log_format: crate::report::LogFormat,
    pub command: Vec<OsString>,
    /// The chosen store's settings.
    pub store: Box<dyn StoreSettings>,
}

/// What `status`, `release` and `reset` need to open a store.
#[derive(Debug)]
pub struct AdminOptions {
    /// Empty for a listing of the whole store.
    pub prefix: String,
    pub store: Box<dyn StoreSettings>,
    /// The store chosen.
    pub store_entry: &'static Entry,
}

/// Between SIGTERM and SIGKILL when consem stops the command.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(5);

/// Turns the chosen store's flags and environment into its settings.
pub type Configure = fn(&StoreFlags<'_>) -> Result<Box<dyn StoreSettings>, OptionsError>;

/// What the command line and the environment say of the chosen store, for
/// its `configure`.
pub struct StoreFlags<'a> {
    /// `--store`'s text (trimmed), else `CONSEM_STORE`'s, else the default
    /// store's name.
    pub text: &'a str,
    /// Where `text` came from, for messages: `--store` or `CONSEM_STORE`.
    pub source: &'static str,
    pub args: &'a StoreArgs,
    /// The run's options; `None` for an operator's command, which leaves
    /// them at their defaults.
    pub run: Option<&'a RunArgs>,
    /// Empty for a listing, which names no one semaphore.
    pub prefix: &'a str,
    /// The TTL of a slot's lease, within the store's range; `None` for a
    /// store without leases.
    pub ttl: Option<Duration>,
    pub env: &'a dyn Fn(&str) -> Option<String>,
}

impl StoreFlags<'_> {
    /// The TTL of a store with leases.
    fn lease_ttl(&self) -> Duration {
        self.ttl.expect("a store with leases has a TTL")
    }

    fn monitor_retry(&self) -> Option<u32> {
        self.run.and_then(|run| run.monitor_retry)
    }
}

/// The long options given on the command line, not left to their defaults
/// (clap's matches of one subcommand).
#[derive(Debug, Default)]
pub struct GivenOptions(Vec<String>);

impl GivenOptions {
    pub fn of(matches: &clap::ArgMatches) -> GivenOptions {
        GivenOptions(
            matches
                .ids()
                .filter(|id| {
                    matches.value_source(id.as_str())
                        == Some(clap::parser::ValueSource::CommandLine)
                })
                // Every option is spelled after its field, as clap derives it.
                .map(|id| format!("--{}", id.as_str().replace('_', "-")))
                .collect(),
        )
    }

    fn contains(&self, option: &str) -> bool {
        self.0.iter().any(|given| given == option)
    }
}

/// Why a command line cannot be used; each says how to fix it. Exit 2.
#[derive(Debug)]
pub enum OptionsError {
    PrefixTooLong {
        shown: String,
        bytes: usize,
    },
    PrefixControlCharacter {
        shown: String,
        character: char,
    },
    PrefixEmpty {
        prefix: String,
    },
    PrefixSegment {
        prefix: String,
        store: &'static Entry,
    },
    NotAStore {
        source: &'static str,
        shown: String,
        /// The way to write a store nearest to what was given.
        nearest: Option<&'static str>,
    },
    /// An option of other stores' (`owners`, one or more) with the store
    /// chosen.
    OtherStoresOption {
        option: &'static str,
        owners: Vec<&'static Entry>,
        chosen: &'static Entry,
    },
    /// A run option the chosen store does not take.
    DoesNotApply {
        option: &'static str,
        store: &'static Entry,
    },
    Rule {
        store: &'static Entry,
        error: RuleError,
    },
    KillGraceTooLong {
        store: &'static Entry,
        grace: Duration,
        ttl: Duration,
        most: Duration,
    },
    /// A store's own flags or variables, as its flags module words them.
    StoreFlags(Box<dyn std::error::Error + Send + Sync>),
}

impl std::fmt::Display for OptionsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OptionsError::PrefixTooLong { shown, bytes } => write!(
                f,
                "--prefix '{shown}' is {bytes} bytes long: use at most {MAX_PREFIX}"
            ),
            OptionsError::PrefixControlCharacter { shown, character } => write!(
                f,
                "--prefix '{shown}' has a control character ({}): use printable characters only",
                character.escape_default()
            ),
            OptionsError::PrefixEmpty { prefix } => write!(
                f,
                "--prefix '{prefix}' is empty once '/' and spaces are trimmed: name the semaphore, such as service/db"
            ),
            OptionsError::PrefixSegment { prefix, store } => write!(
                f,
                "--prefix '{prefix}' has an empty, '.' or '..' segment, {}: write it like service/db",
                store.segments_refused
            ),
            OptionsError::NotAStore {
                source,
                shown,
                nearest: Some(nearest),
            } => write!(
                f,
                "{source} '{shown}' is not a store: did you mean {nearest}? (the stores: {})",
                stores::every_way_to_write()
            ),
            OptionsError::NotAStore {
                source,
                shown,
                nearest: None,
            } => write!(
                f,
                "{source} '{shown}' is not a store: use {}",
                stores::every_way_to_write()
            ),
            OptionsError::OtherStoresOption {
                option,
                owners,
                chosen,
            } => {
                let titles: Vec<&str> = owners.iter().map(|owner| owner.store.title).collect();
                let ways: Vec<&str> = owners.iter().map(|owner| owner.written[0]).collect();
                write!(
                    f,
                    "{option} is an option of the {} {}, and --store is {}: ",
                    stores::listed(&titles, "and"),
                    if owners.len() == 1 { "store" } else { "stores" },
                    chosen.shown(),
                )?;
                match chosen.same_as(option) {
                    Some(ours) => write!(f, "the {} store's is {ours}", chosen.store.title),
                    None => write!(
                        f,
                        "drop it, or use --store {}",
                        stores::listed(&ways, "or")
                    ),
                }
            }
            OptionsError::DoesNotApply { option, store } => {
                let takers: Vec<&str> = STORES
                    .iter()
                    .filter(|entry| !entry.refuses.contains(option))
                    .map(|entry| entry.store.title)
                    .collect();
                let what_for = stores::SOME_STORES_OPTIONS
                    .iter()
                    .find(|(some, _)| some == option)
                    .map_or("", |(_, what_for)| what_for);
                write!(
                    f,
                    "{option} applies to {}, {what_for}; the {} store's slot is {}: drop it",
                    stores::listed(&takers, "and"),
                    store.store.title,
                    store.slot_is
                )
            }
            OptionsError::Rule {
                store,
                error: RuleError::LimitAbove { limit, most },
            } => write!(
                f,
                "--limit {limit} is more than {}: use 1 to {most}",
                store.limit_bound_by
            ),
            OptionsError::Rule {
                store,
                error:
                    RuleError::TtlOutside {
                        ttl,
                        shortest,
                        longest,
                    },
            } => write!(
                f,
                "--ttl {} is outside what {}: use {} to {}",
                human(*ttl),
                store.ttl_bound_by,
                human(*shortest),
                human(*longest)
            ),
            OptionsError::KillGraceTooLong {
                store,
                grace,
                ttl,
                most,
            } => write!(
                f,
                "--kill-grace {} does not fit in the lease of --ttl {}: consem must have stopped the command before {} may free the slot; use at most {}, or a longer --ttl",
                human(*grace),
                human(*ttl),
                store.store.title,
                // Whole milliseconds, rounded down: a grace one can type
                // that still fits.
                human(Duration::from_millis(most.as_millis() as u64))
            ),
            OptionsError::StoreFlags(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for OptionsError {}

/// The store that `--store`, else `CONSEM_STORE`, else the default
/// (Consul) chooses, with the text that chose it and where it came from.
fn choose_store(
    flag: Option<&str>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(&'static Entry, String, &'static str), OptionsError> {
    let (text, source) = match flag {
        Some(text) => (text.to_string(), "--store"),
        None => match env("CONSEM_STORE").filter(|s| !s.trim().is_empty()) {
            Some(text) => (text, "CONSEM_STORE"),
            None => (stores::DEFAULT_STORE.to_string(), "--store"),
        },
    };
    let text = text.trim();
    match stores::chosen_by(text) {
        Some(entry) => Ok((entry, text.to_string(), source)),
        None => Err(OptionsError::NotAStore {
            source,
            shown: crate::store::without_credentials(text),
            nearest: stores::nearest_way_to_write(text),
        }),
    }
}

/// Refuses another store's options, and run options that do not apply to
/// the chosen store: one rule for every store, from the registry.
fn refuse_foreign_options(
    chosen: &'static Entry,
    given: &GivenOptions,
) -> Result<(), OptionsError> {
    // An option several stores share (`--cert`: etcd's and Redis's) is
    // refused only where none of them is chosen.
    let foreign = STORES
        .iter()
        .flat_map(|entry| entry.options.iter())
        .find(|option| given.contains(option) && !chosen.options.contains(option));
    if let Some(option) = foreign {
        return Err(OptionsError::OtherStoresOption {
            option,
            owners: STORES
                .iter()
                .filter(|entry| entry.options.contains(option))
                .collect(),
            chosen,
        });
    }
    match chosen.refuses.iter().find(|o| given.contains(o)) {
        Some(option) => Err(OptionsError::DoesNotApply {
            option,
            store: chosen,
        }),
        None => Ok(()),
    }
}

/// The kill grace for a store with leases of `ttl`: one asked for that does
/// not fit is refused; the default is shortened to fit.
fn fit_kill_grace(
    asked: Option<Duration>,
    ttl: Option<Duration>,
    store: &'static Entry,
) -> Result<Duration, OptionsError> {
    let Some(ttl) = ttl else {
        return Ok(asked.unwrap_or(DEFAULT_KILL_GRACE));
    };
    let most = lease::max_kill_grace(ttl);
    match asked {
        Some(grace) if grace > most => Err(OptionsError::KillGraceTooLong {
            store,
            grace,
            ttl,
            most,
        }),
        Some(grace) => Ok(grace),
        None => Ok(DEFAULT_KILL_GRACE.min(most)),
    }
}

impl RunOptions {
    pub fn from_args(
        args: RunArgs,
        given: &GivenOptions,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<RunOptions, OptionsError> {
        let (entry, text, source) = choose_store(args.store.store.as_deref(), &env)?;
        let prefix = normalize_prefix(&args.prefix, entry)?;
        refuse_foreign_options(entry, given)?;
        let rule = |error| OptionsError::Rule {
            store: entry,
            error,
        };
        entry.store.check_limit(args.limit).map_err(rule)?;
        let ttl = entry.store.ttl(args.ttl).map_err(rule)?;
        let store = (entry.configure)(&StoreFlags {
            text: &text,
            source,
            args: &args.store,
            run: Some(&args),
            prefix: &prefix,
            ttl,
            env: &env,
        })?;
        let kill_grace = fit_kill_grace(args.kill_grace, ttl, entry)?;
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
            say_no_slot: if args.try_once {
                args.verbose
            } else {
                !args.quiet
            },
            log_format: args.log_format,
            command: args.command,
            store,
        })
    }
}

impl AdminOptions {
    pub fn from_args(
        prefix: &str,
        args: &StoreArgs,
        given: &GivenOptions,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<AdminOptions, OptionsError> {
        AdminOptions::open(Some(prefix), args, given, env)
    }

    /// The options of a listing (`status` over `root`, `""` for the whole
    /// store): the root is checked as a prefix is, and the store is
    /// configured for no one semaphore.
    pub fn for_listing(
        root: &str,
        args: &StoreArgs,
        given: &GivenOptions,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<AdminOptions, OptionsError> {
        let mut options = AdminOptions::open(None, args, given, env)?;
        if !root.is_empty() {
            options.prefix = normalize_prefix(root, options.store_entry)?;
        }
        Ok(options)
    }

    /// `prefix`: `None` for a listing.
    fn open(
        prefix: Option<&str>,
        args: &StoreArgs,
        given: &GivenOptions,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<AdminOptions, OptionsError> {
        let (entry, text, source) = choose_store(args.store.as_deref(), &env)?;
        let prefix = match prefix {
            Some(prefix) => normalize_prefix(prefix, entry)?,
            None => String::new(),
        };
        refuse_foreign_options(entry, given)?;
        let ttl = entry.store.ttl(None).expect("the default TTL is in range");
        let store = (entry.configure)(&StoreFlags {
            text: &text,
            source,
            args,
            run: None,
            prefix: &prefix,
            ttl,
            env: &env,
        })?;
        Ok(AdminOptions {
            prefix,
            store,
            store_entry: entry,
        })
    }
}

/// The longest prefix, in bytes: a key's name must fit in a URL line.
pub const MAX_PREFIX: usize = 1024;

/// Trims leading and trailing `/` and checks a prefix as every store takes
/// it (`store`: the one in use, for messages); an empty prefix would put
/// the semaphore at the root of the KV store.
pub fn normalize_prefix(prefix: &str, store: &'static Entry) -> Result<String, OptionsError> {
    let shown = crate::report::abbreviated(prefix);
    if prefix.len() > MAX_PREFIX {
        return Err(OptionsError::PrefixTooLong {
            shown: shown.to_string(),
            bytes: prefix.len(),
        });
    }
    // Consul answers such keys with an empty 400, and they would end up in
    // file names and operators' terminals.
    if let Some(character) = prefix.chars().find(|c| c.is_control()) {
        return Err(OptionsError::PrefixControlCharacter {
            shown: crate::report::printable(&shown).into_owned(),
            character,
        });
    }
    let trimmed = prefix.trim_matches('/');
    if prefix
        .trim_matches(|c: char| c == '/' || c.is_whitespace())
        .is_empty()
    {
        return Err(OptionsError::PrefixEmpty {
            prefix: prefix.to_string(),
        });
    }
    // Consul's HTTP server redirects paths with such segments to a cleaned
    // path, so keys under them cannot be written where they are named.
    if trimmed
        .split('/')
        .any(|segment| segment.trim().is_empty() || segment == "." || segment == "..")
    {
        return Err(OptionsError::PrefixSegment {
            prefix: prefix.to_string(),
            store,
        });
    }
    Ok(trimmed.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use crate::store::{consul, etcd, redis};
    use clap::{CommandFactory as _, FromArgMatches as _};

    fn parse(extra: &[&str], env: &[(&str, &str)]) -> Result<RunOptions, String> {
        let mut line = vec!["consem", "run", "--limit", "2"];
        line.extend_from_slice(extra);
        line.extend_from_slice(&["--", "echo", "hi"]);
        let mut matches = Cli::command().try_get_matches_from(&line).unwrap();
        let given = GivenOptions::of(matches.subcommand().unwrap().1);
        let Command::Run(args) = Cli::from_arg_matches_mut(&mut matches).unwrap().command else {
            panic!("parsed as run")
        };
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        RunOptions::from_args(args, &given, |name| {
            env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
        .map_err(|error| error.to_string())
    }

    /// The chosen store's settings, as that store's type.
    fn settings<T: 'static>(options: &RunOptions) -> &T {
        (options.store.as_ref() as &dyn std::any::Any)
            .downcast_ref()
            .expect("the store expected")
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
        assert_eq!(
            parse(&["--prefix", " / "], &[]).unwrap_err(),
            "--prefix ' / ' is empty once '/' and spaces are trimmed: name the semaphore, such as service/db"
        );
        assert!(parse(&["--prefix", "a/  /b"], &[])
            .unwrap_err()
            .contains("has an empty, '.' or '..' segment"));
        assert_eq!(parse(&["--prefix", "a b/c"], &[]).unwrap().prefix, "a b/c");
    }

    /// A prefix's message names the store in use, and Consul's API only
    /// where Consul is used.
    #[test]
    fn a_prefix_is_refused_in_the_words_of_the_store_in_use() {
        let refused = |store: &str, prefix: &str| {
            parse(&["--store", store, "--prefix", prefix], &[]).unwrap_err()
        };
        assert_eq!(
            refused("consul", "a/../b"),
            "--prefix 'a/../b' has an empty, '.' or '..' segment, which Consul's HTTP API cannot address (it redirects such a path to a cleaned one): write it like service/db"
        );
        for (store, title) in [
            ("local:/tmp/x", "local"),
            ("redis://h", "Redis"),
            ("etcd://h:1", "etcd"),
        ] {
            let error = refused(store, "..");
            assert_eq!(
                error,
                format!("--prefix '..' has an empty, '.' or '..' segment, which the {title} store does not take (a prefix is a path of names, the same on every store): write it like service/db")
            );
            assert!(!error.contains("Consul"), "{error}");
            assert_eq!(
                refused(store, "//"),
                "--prefix '//' is empty once '/' and spaces are trimmed: name the semaphore, such as service/db"
            );
        }
    }

    /// Every run option a store refuses says which stores take it and
    /// what for.
    #[test]
    fn every_option_a_store_refuses_says_what_it_is_for() {
        for entry in STORES {
            for option in entry.refuses {
                assert!(
                    stores::SOME_STORES_OPTIONS
                        .iter()
                        .any(|(some, _)| some == option),
                    "{option}, refused by the {} store, says nothing of what it is for",
                    entry.store.title
                );
            }
        }
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

    /// A run without a slot says why unless asked not to: a timeout, even
    /// `--timeout 0` (a `--timeout ${T:-0}` in CI must not fail silently),
    /// unless `-q`; `--try` only with `-v`.
    #[test]
    fn a_run_without_a_slot_says_why_unless_it_was_a_quiet_try() {
        let says = |args: &[&str]| {
            let mut all = vec!["--prefix", "p"];
            all.extend_from_slice(args);
            parse(&all, &[]).unwrap().say_no_slot
        };
        assert!(says(&["--timeout", "1m"]));
        assert!(says(&["--timeout", "0"]));
        assert!(!says(&["--timeout", "0", "-q"]));
        assert!(!says(&["--timeout", "1m", "-q"]));
        assert!(!says(&["--try"]));
        assert!(says(&["--try", "-v"]));
    }

    /// What docs/run.md and `--help` say a run gets when it gives nothing: the
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
        assert!(!options.wait_group && !options.verbose && options.say_no_slot);
        assert_eq!(options.log_format, crate::report::LogFormat::Text);
        let consul: &consul::Settings = settings(&options);
        assert_eq!(consul.connection.address.host_port, "127.0.0.1:8500");
        assert!(!consul.connection.address.https);
        assert_eq!(consul.ttl, Duration::from_secs(15));
        assert_eq!(consul.monitor_retry, None);
        let options = parse(&["--prefix", "p", "--store", "redis://h"], &[]).unwrap();
        assert_eq!(options.kill_grace, Duration::from_secs(5));
        let redis: &redis::Settings = settings(&options);
        assert_eq!(
            (
                redis.ttl,
                redis.monitor_retry,
                redis.allow_eviction,
                redis.wait_replicas
            ),
            (Duration::from_secs(15), None, false, None)
        );
        assert!(redis.tls.is_none());
        let options = parse(&["--prefix", "p", "--store", "etcd://h:1"], &[]).unwrap();
        assert_eq!(options.kill_grace, Duration::from_secs(5));
        let etcd: &etcd::Settings = settings(&options);
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
        let consul: &consul::Settings = settings(&options);
        assert_eq!(consul.session_name, "consem: echo hi at jobs");
    }

    #[test]
    fn a_store_s_url_is_refused_in_the_name_of_where_it_came_from() {
        let error = |extra: &[&str], env: &[(&str, &str)]| {
            let mut args = vec!["--prefix", "p"];
            args.extend_from_slice(extra);
            parse(&args, env).unwrap_err()
        };
        assert!(error(&[], &[("CONSEM_STORE", "redis://")])
            .starts_with("CONSEM_STORE: redis:// is not a Redis URL"),);
        assert!(
            error(&["--store", "redis://"], &[("CONSEM_STORE", "local")])
                .starts_with("--store: redis:// is not a Redis URL")
        );
    }

    #[test]
    fn chooses_the_store_from_the_flag_then_the_environment() {
        let choice = |flag: Option<&str>, env: Option<&str>| {
            choose_store(flag, |name| {
                (name == "CONSEM_STORE")
                    .then(|| env.map(String::from))
                    .flatten()
            })
            .map(|(entry, text, source)| (entry.store.name, text, source))
            .map_err(|error| error.to_string())
        };
        let chosen = |name: &'static str, text: &str, source: &'static str| {
            Ok((name, text.to_string(), source))
        };
        assert_eq!(choice(None, None), chosen("consul", "consul", "--store"));
        assert_eq!(
            choice(None, Some("local")),
            chosen("local", "local", "CONSEM_STORE")
        );
        assert_eq!(
            choice(Some("consul"), Some("local")),
            chosen("consul", "consul", "--store")
        );
        assert_eq!(
            choice(Some(" local:/srv/slots "), None),
            chosen("local", "local:/srv/slots", "--store")
        );
        assert_eq!(
            choice(Some("redis://cache:6379/2"), None),
            chosen("redis", "redis://cache:6379/2", "--store")
        );
        assert_eq!(
            choice(Some("etcds://a:2379,b:2379"), None),
            chosen("etcd", "etcds://a:2379,b:2379", "--store")
        );
        assert_eq!(
            choice(None, Some("etcd")),
            chosen("etcd", "etcd", "CONSEM_STORE")
        );
        assert_eq!(
            choice(None, Some("memcached")).unwrap_err(),
            "CONSEM_STORE 'memcached' is not a store: use consul, local, local:DIR, redis://host:port, etcd://host:port, postgres://user@host:port/database or zk://host:port[/chroot]"
        );
        assert_eq!(
            choice(Some("redis:/:S3cret@h"), None).unwrap_err(),
            "--store 'redis:…@h' is not a store: did you mean redis://host:port? (the stores: consul, local, local:DIR, redis://host:port, etcd://host:port, postgres://user@host:port/database or zk://host:port[/chroot])"
        );
        assert_eq!(
            parse(&["--prefix", "p", "--cacert", "/ca.pem"], &[]).unwrap_err(),
            "--cacert is an option of the Redis, etcd and ZooKeeper stores, and --store is consul: the Consul store's is --ca-file"
        );
        assert_eq!(
            parse(&["--prefix", "p", "--store", "etcd", "--client-key", "/k"], &[]).unwrap_err(),
            "--client-key is an option of the Consul store, and --store is etcd://: the etcd store's is --key"
        );
        assert!(choice(Some("lcoal"), None).unwrap_err().starts_with(
            "--store 'lcoal' is not a store: did you mean local? (the stores: consul, "
        ));
        assert!(parse(&["--prefix", "p", "--store", "local:"], &[])
            .unwrap_err()
            .contains("--store 'local:' names no directory"));
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
        // What an option is for, which stores take it, and why this one
        // does not.
        assert_eq!(
            local(&["--ttl", "20s"]).unwrap_err(),
            "--ttl applies to Consul, Redis, etcd, PostgreSQL and ZooKeeper, whose slots are leases; the local store's slot is a kernel lock, which lasts as long as consem lives, with no lease to renew and no session to name: drop it"
        );
        assert_eq!(
            local(&["--monitor-retry", "2"]).unwrap_err(),
            "--monitor-retry applies to Consul, Redis and etcd, whose holders renew their slots' leases; the local store's slot is a kernel lock, which lasts as long as consem lives, with no lease to renew and no session to name: drop it"
        );
        assert!(local(&["--name", "n"])
            .unwrap_err()
            .starts_with("--name applies to Consul, whose slots are held by named sessions; the local store's slot is"));
        assert_eq!(
            local(&["--user", "u"]).unwrap_err(),
            "--user is an option of the etcd and ZooKeeper stores, and --store is local: drop it, or use --store etcd://host:port or zk://host:port[/chroot]"
        );
        let redis = parse(
            &["--prefix", "p", "--store", "redis://h", "--name", "n"],
            &[],
        );
        assert_eq!(
            redis.unwrap_err(),
            "--name applies to Consul, whose slots are held by named sessions; the Redis store's slot is a permit with a lease, and no session to name: drop it"
        );
        let etcd = parse(&["--prefix", "p", "--store", "etcd", "--name", "n"], &[]);
        assert_eq!(
            etcd.unwrap_err(),
            "--name applies to Consul, whose slots are held by named sessions; the etcd store's slot is a key on a lease, and no session to name: drop it"
        );
        let etcd = parse(&["--prefix", "p", "--store", "etcd", "--token", "t"], &[]);
        assert_eq!(
            etcd.unwrap_err(),
            "--token is an option of the Consul store, and --store is etcd://: drop it, or use --store consul"
        );
        assert_eq!(
            local(&["--redis-wait-replicas", "1"]).unwrap_err(),
            "--redis-wait-replicas is an option of the Redis store, and --store is local: drop it, or use --store redis://host:port"
        );
        assert_eq!(
            parse(
                &["--prefix", "p", "--store", "redis://h", "--redis-wait-replicas", "0"],
                &[]
            )
            .unwrap_err(),
            "--redis-wait-replicas 0 waits for no replica: give how many replicas must acknowledge a slot (1 or more), or drop it"
        );
        // Shared by etcd and Redis: refused by the others, naming both.
        assert_eq!(
            local(&["--cert", "c.pem"]).unwrap_err(),
            "--cert is an option of the Redis, etcd and ZooKeeper stores, and --store is local: drop it, or use --store redis://host:port, etcd://host:port or zk://host:port[/chroot]"
        );
        assert_eq!(
            parse(
                &["--prefix", "p", "--store", "etcd", "--cacert", "ca.pem"],
                &[]
            )
            .map(|_| ()),
            Ok(())
        );
        assert_eq!(
            parse(&["--prefix", "p", "--redis-allow-eviction"], &[]).unwrap_err(),
            "--redis-allow-eviction is an option of the Redis store, and --store is consul: drop it, or use --store redis://host:port"
        );
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
        let consul_entry = &STORES[0];
        let too_many = OptionsError::Rule {
            store: consul_entry,
            error: consul_entry.store.check_limit(1025).unwrap_err(),
        };
        assert_eq!(
            too_many.to_string(),
            "--limit 1025 is more than the Consul store holds in .lock: use 1 to 1024"
        );
        assert_eq!(
            consul(&["--store", "etcd", "--ttl", "1.5s"]).unwrap_err(),
            "--ttl 1.5s is outside what the etcd store takes: use 2s to 24h"
        );
    }

    #[test]
    fn the_kill_grace_fits_in_the_lease() {
        let kill_grace = |extra: &[&str]| {
            let mut args = vec!["--prefix", "p"];
            args.extend_from_slice(extra);
            parse(&args, &[]).map(|options| options.kill_grace)
        };
        assert_eq!(
            kill_grace(&["--ttl", "12s", "--kill-grace", "6s"]).unwrap_err(),
            "--kill-grace 6s does not fit in the lease of --ttl 12s: consem must have stopped the command before Consul may free the slot; use at most 5s, or a longer --ttl"
        );
        assert!(kill_grace(&["--ttl", "10s", "--kill-grace", "5s"])
            .unwrap_err()
            .contains("use at most 4s, or"));
        assert_eq!(
            kill_grace(&["--ttl", "10s", "--kill-grace", "4s"]),
            Ok(Duration::from_secs(4))
        );
        assert_eq!(kill_grace(&["--ttl", "60s"]), Ok(Duration::from_secs(5)));
        // Without a lease, any grace.
        assert_eq!(
            kill_grace(&["--store", "local:/tmp/x", "--kill-grace", "1h"]),
            Ok(Duration::from_secs(3600))
        );
    }

    /// The registry names options as the command line spells them, and as
    /// `GivenOptions` finds them given.
    #[test]
    fn the_registry_names_options_of_the_command_line() {
        let run = Cli::command();
        let run = run.find_subcommand("run").unwrap();
        for entry in STORES {
            for option in entry.options.iter().chain(entry.refuses) {
                let arg = run
                    .get_arguments()
                    .find(|arg| {
                        arg.get_long().map(|long| format!("--{long}")).as_deref() == Some(*option)
                    })
                    .unwrap_or_else(|| panic!("{option} is not an option of consem run"));
                assert_eq!(
                    format!("--{}", arg.get_id().as_str().replace('_', "-")),
                    *option
                );
            }
        }
    }
}
