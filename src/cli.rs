//! The command line, as clap reads it. Validation across flags and the
//! conversion into each store's settings live in `options`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

pub const EXIT_CODES: &str = "\
Exit codes:
  <child's>  the command ran and exited by itself
  128+N      the command died of signal N, or a signal N ended the wait
             (consem then dies of signal N itself, as the shell expects)
  2          usage error
  65         semaphore conflict (other limit, a record that is not consem's)
  69         the store unreachable or failing when starting
  75         no slot within --timeout (said in one line; -q: not), or none
             free with --try (said with -v); see -E
  76         the slot was lost while the command ran; it was stopped
  77         permission denied (ACLs, credentials, the local store's directory)
  78         a store set up in a way that breaks the limit (a Redis that may
             evict, a PostgreSQL standby, a pooler that shares sessions)
  126/127    command not executable / not found";

/// Every example fits in 78 columns: one that clap had to wrap could not
/// be copied. A longer one is continued with `\\`, as a shell reads it.
const RUN_EXAMPLES: &str = "\
Examples:
  # At most 2 backups at once on this host, no server needed:
  consem run --store local --prefix backups --limit 2 -- ./backup.sh

  # At most 2 migrations at once across the fleet (Consul):
  consem run --prefix service/db --limit 2 -- ./migrate.sh

  # At most 3 nightly jobs at once, kept in etcd:
  consem run --store etcd://10.0.0.1:2379,10.0.0.2:2379 \\
      --prefix jobs/nightly --limit 3 -- ./nightly.sh

  # In cron: skip this round if the nightly job still runs elsewhere.
  */5 * * * * consem run --prefix nightly --limit 1 --try -- /opt/nightly.sh

  # In CI: wait up to 10 minutes for one of 3 deploy slots.
  consem run --prefix ci/deploy --limit 3 --timeout 10m -- make deploy

  # In a script: someone else syncing is fine (exit 0); the job's own
  # failures still fail.
  consem run --prefix jobs/sync --limit 1 --try -E 0 -- ./sync.sh";

/// What `-h` shows after the options, instead of every example.
const RUN_EXAMPLES_SHORT: &str = "\
Examples:
  consem run --store local --prefix backups --limit 2 -- ./backup.sh
  consem run --prefix ci/deploy --limit 3 --timeout 10m -- make deploy

Every option, more examples and the exit codes: consem run --help";

#[derive(Debug, Parser)]
#[command(
    name = "consem",
    version,
    about = "Run a command while holding one of N slots of a semaphore (Consul, Redis, etcd, PostgreSQL, ZooKeeper, or this host alone)",
    long_about = "Run a command while holding one of N slots of a counting semaphore, so that at \
most N copies of a job run at once: across many machines with HashiCorp Consul (sharing the \
layout of `consul lock -n N`), Redis, etcd, PostgreSQL or ZooKeeper (sharing Apache Curator's \
semaphore), or on this host alone with the local store, which \
needs no server.",
    after_help = RUN_EXAMPLES_SHORT,
    after_long_help = format!("{RUN_EXAMPLES}\n\n{EXIT_CODES}"),
    propagate_version = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command while holding a slot
    #[command(after_help = RUN_EXAMPLES_SHORT, after_long_help = format!("{RUN_EXAMPLES}\n\n{EXIT_CODES}"))]
    Run(RunArgs),
    /// Show a semaphore (limit, holders, waiters), or list every one under a root
    #[command(after_help = STATUS_HELP)]
    Status(StatusArgs),
    /// Free a slot: take a holder out of the record (Consul: and destroy its session)
    #[command(after_help = ADMIN_EXIT_CODES)]
    Release(ReleaseArgs),
    /// Drop the limit record once no live holder remains, so that a new limit can be used
    #[command(after_help = ADMIN_EXIT_CODES)]
    Reset(ResetArgs),
    /// Print a shell completion script
    Completions {
        /// The shell to complete for
        shell: clap_complete::Shell,
    },
}

pub const ADMIN_EXIT_CODES: &str = "\
Exit codes:
  0   done
  1   nothing to do: no semaphore at the prefix, no such holder, or live holders (reset without --force)
  2   usage error
  65  the limit record at the prefix is not one consem can read
  69  the store unreachable or failing
  77  permission denied (Consul ACLs, etcd or Redis credentials, the local store's directory)";

const STATUS_HELP: &str = "\
Examples:
  consem status --prefix service/db
  consem status --prefix service/db --json | jq '.holders[].host'
  # Every semaphore under jobs/, then every one in the store, a line each:
  consem status --prefix jobs/
  consem status

Exit codes:
  0   the store answered (a semaphore nobody uses is idle, which is no error)
  2   usage error
  65  the limit record at the prefix is not one consem can read
  69  the store unreachable or failing
  77  permission denied (Consul ACLs, etcd or Redis credentials, the local store's directory)";

/// `consem status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Name of the semaphore (a KV prefix on Consul); ending in `/`, or left out: every one under it, or in the store
    #[arg(long, value_name = "PREFIX")]
    pub prefix: Option<String>,

    /// Print JSON (a stable schema, see docs/operators.md) instead of a table
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub store: StoreArgs,
}

/// `consem release`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("holder").required(true).args(["session", "host"])))]
pub struct ReleaseArgs {
    /// Name of the semaphore (a KV prefix on Consul)
    #[arg(long, value_name = "PREFIX")]
    pub prefix: String,

    /// The holder's session ID, or a unique beginning of it
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,

    /// The holder's host (with --pid)
    #[arg(long, value_name = "HOST", requires = "pid")]
    pub host: Option<String>,

    /// The holder's consem process ID (with --host)
    #[arg(long, value_name = "PID", requires = "host")]
    pub pid: Option<u32>,

    #[command(flatten)]
    pub store: StoreArgs,
}

/// `consem reset`.
#[derive(Debug, Args)]
pub struct ResetArgs {
    /// Name of the semaphore (a KV prefix on Consul)
    #[arg(long, value_name = "PREFIX")]
    pub prefix: String,

    /// Release every live holder first (their commands are stopped, exit 76)
    #[arg(long)]
    pub force: bool,

    #[command(flatten)]
    pub store: StoreArgs,
}

/// `consem run`. Its options come in groups (`help_heading`), the
/// semaphore's first; `-h` shows what most runs need, `--help` everything.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Name all contenders agree on (a KV prefix on Consul)
    ///
    /// Leading and trailing / are trimmed.
    #[arg(long, value_name = "PREFIX")]
    pub prefix: String,

    /// Number of slots; every contender on the prefix must use the same limit
    #[arg(long, value_name = "N", value_parser = parse_limit, allow_negative_numbers = true)]
    pub limit: u32,

    /// Give up waiting for a slot after this long, saying why (default: wait forever)
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, conflicts_with = "try_once", help_heading = WAITING)]
    pub timeout: Option<Duration>,

    /// Make one attempt and do not wait (quietly; -v says who held the slots)
    #[arg(long = "try", help_heading = WAITING)]
    pub try_once: bool,

    /// Exit code when no slot was obtained
    #[arg(short = 'E', long, value_name = "CODE", default_value_t = 75, help_heading = WAITING)]
    pub no_slot_exit_code: u8,

    /// Print lifecycle events on stderr, and why --try found no slot
    #[arg(short, long, help_heading = OUTPUT)]
    pub verbose: bool,

    /// Leave out the line that says why --timeout ran out
    ///
    /// Errors and warnings are still written.
    #[arg(short, long, conflicts_with = "verbose", help_heading = OUTPUT)]
    pub quiet: bool,

    /// Format of what consem writes on stderr
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t, help_heading = OUTPUT, hide_short_help = true)]
    pub log_format: crate::report::LogFormat,

    /// Time between SIGTERM and SIGKILL when consem must stop the command
    ///
    /// Default 5s; on Consul, Redis, etcd and ZooKeeper, at most what fits
    /// in the lease of --ttl.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help_heading = COMMAND, hide_short_help = true)]
    pub kill_grace: Option<Duration>,

    /// Keep the slot until every process in the command's process group has
    /// exited, instead of stopping them when the command exits
    #[arg(long, help_heading = COMMAND, hide_short_help = true)]
    pub wait_group: bool,

    /// The lease of a slot, renewed every TTL/3 (default 15s)
    ///
    /// Consul's session TTL, 10s to 24h; a Redis permit's or an etcd
    /// lease's, 2s to 24h; ZooKeeper's session timeout, 2s to 1h within
    /// the server's bounds.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help_heading = LEASES, hide_short_help = true)]
    pub ttl: Option<Duration>,

    /// Give a held slot up after N failed attempts in a row to reach the
    /// store (default: keep trying while the slot's lease lasts)
    #[arg(long, value_name = "N", help_heading = LEASES, hide_short_help = true)]
    pub monitor_retry: Option<u32>,

    /// Session name (default: "consem: <command> at <prefix>")
    #[arg(long, value_name = "NAME", help_heading = CONSUL, hide_short_help = true)]
    pub name: Option<String>,

    /// Run even where Redis may evict any key when its memory is full
    ///
    /// maxmemory-policy allkeys-*: the semaphore's permits too, which lets
    /// more than --limit run.
    #[arg(long, help_heading = REDIS, hide_short_help = true)]
    pub redis_allow_eviction: bool,

    /// Use a slot, and count each renewal, only once N replicas have
    /// acknowledged it
    ///
    /// WAIT N, for a second or TTL/6; an unconfirmed slot is given back and
    /// asked for again for up to one TTL, then exit 69. Narrows, does not
    /// close, what a failover can lose (docs/redis.md, "Grants that survive
    /// a failover").
    #[arg(long, value_name = "N", help_heading = REDIS, hide_short_help = true)]
    pub redis_wait_replicas: Option<u32>,

    /// The command and its arguments, after `--`; run directly, not by a shell
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,

    // Last: `--store` joins the options above, and each store's own come
    // after every group of the run's.
    #[command(flatten)]
    pub store: StoreArgs,
}

/// The groups of `consem run --help`, after the semaphore's own options.
const WAITING: &str = "Waiting for a slot";
const OUTPUT: &str = "What consem writes";
const COMMAND: &str = "Running the command";
const LEASES: &str = "Leases (Consul, Redis, etcd and ZooKeeper)";
const CONSUL: &str = "Consul options";
const REDIS: &str = "Redis options";

/// Which store keeps the semaphore, and how to reach it.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// Where the semaphore lives: consul, local, redis://host:port,
    /// etcd://host:port, postgres://host/database or zk://host:port
    /// [default: CONSEM_STORE, else consul]
    ///
    /// consul; local (this host only, no server) or local:DIR;
    /// redis://[user[:password]@]host[:port][/db] or rediss://... (TLS; the
    /// password also from REDISCLI_AUTH; several hosts, comma-separated, are
    /// a Redis Cluster's nodes); redis+sentinel://host[:port][,...]/<primary
    /// name>[/db] (the primary that Redis Sentinel names);
    /// etcd://host:port[,host:port...] or etcds://... (TLS; etcd alone:
    /// ETCDCTL_ENDPOINTS); postgres://[user[:password]@]host[:port][/database]
    /// or postgresql://... (libpq's PG* variables and ~/.pgpass fill in what
    /// it leaves out; postgres alone: those variables);
    /// zk://[user:password@]host:port[,host:port...][/chroot] or zks://...
    /// (ZooKeeper, TLS to its secureClientPort; shared with Apache Curator's
    /// InterProcessSemaphoreV2 at --prefix; the user and password are
    /// zkCli's addauth digest).
    #[arg(long, value_name = "STORE", value_parser = StoreText, hide_possible_values = true)]
    pub store: Option<String>,

    #[command(flatten)]
    pub consul: ConsulArgs,

    #[command(flatten)]
    pub etcd: EtcdArgs,

    #[command(flatten)]
    pub tls: TlsFileArgs,
}

/// `--store`'s text, taken as it is (`options` reads it), with the ways to
/// begin it as possible values: completions offer them instead of file
/// names.
#[derive(Debug, Clone, Copy)]
struct StoreText;

impl clap::builder::TypedValueParser for StoreText {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<String, clap::Error> {
        clap::builder::StringValueParser::new().parse_ref(cmd, arg, value)
    }

    fn possible_values(
        &self,
    ) -> Option<Box<dyn Iterator<Item = clap::builder::PossibleValue> + '_>> {
        // A store's name where it needs no address (consul, local), then
        // how addresses begin (local:, redis://, etcd://).
        let ways = crate::options::stores::STORES.iter().flat_map(|entry| {
            let schemes = entry.store.schemes;
            let needs_address = schemes.iter().any(|scheme| scheme.ends_with("://"));
            (!needs_address)
                .then_some(entry.store.name)
                .into_iter()
                .chain(schemes.iter().copied())
        });
        Some(Box::new(ways.map(clap::builder::PossibleValue::new)))
    }
}

/// How to reach Consul (with `--store consul`); each option's default comes
/// from the consul CLI's environment variable, read in `options::consul`.
#[derive(Debug, Default, Args)]
#[command(next_help_heading = "Consul options")]
pub struct ConsulArgs {
    /// Consul HTTP API address: host:port, http://host:port or https://host:port
    /// (host:port means https with CONSUL_HTTP_SSL=true) [default: CONSUL_HTTP_ADDR, else
    /// 127.0.0.1:8500]
    #[arg(long, value_name = "ADDR", hide_short_help = true)]
    pub http_addr: Option<String>,

    /// ACL token, sent in the X-Consul-Token header [default: CONSUL_HTTP_TOKEN]; HTTP basic
    /// auth, if the agent sits behind it, comes from CONSUL_HTTP_AUTH (user:password)
    #[arg(long, value_name = "TOKEN", hide_short_help = true)]
    pub token: Option<String>,

    /// File holding the ACL token; wins over a token [default: CONSUL_HTTP_TOKEN_FILE]
    #[arg(long, value_name = "PATH", hide_short_help = true)]
    pub token_file: Option<PathBuf>,

    /// Datacenter to use (default: the agent's)
    #[arg(long, value_name = "DC", hide_short_help = true)]
    pub datacenter: Option<String>,

    /// Namespace to use (Consul Enterprise) [default: CONSUL_NAMESPACE]
    #[arg(long, value_name = "NS", hide_short_help = true)]
    pub namespace: Option<String>,

    /// Admin partition to use (Consul Enterprise) [default: CONSUL_PARTITION]
    #[arg(long, value_name = "PARTITION", hide_short_help = true)]
    pub partition: Option<String>,

    /// PEM file of the CA that signs the agent's certificate [default: CONSUL_CACERT, else the
    /// system's trust store]; CONSUL_HTTP_SSL_VERIFY=false turns checking off
    #[arg(long, value_name = "PATH", hide_short_help = true)]
    pub ca_file: Option<PathBuf>,

    /// Directory of PEM CA certificates [default: CONSUL_CAPATH]
    #[arg(long, value_name = "DIR", hide_short_help = true)]
    pub ca_path: Option<PathBuf>,

    /// PEM client certificate, for agents that verify clients (mTLS) [default: CONSUL_CLIENT_CERT]
    #[arg(long, value_name = "PATH", hide_short_help = true)]
    pub client_cert: Option<PathBuf>,

    /// PEM private key of the client certificate [default: CONSUL_CLIENT_KEY]
    #[arg(long, value_name = "PATH", hide_short_help = true)]
    pub client_key: Option<PathBuf>,

    /// Name to verify the agent's certificate against, instead of the address's host
    /// [default: CONSUL_TLS_SERVER_NAME]
    #[arg(long, value_name = "NAME", hide_short_help = true)]
    pub tls_server_name: Option<String>,
}

/// How to sign in to etcd (with `--store etcd://...`; each option's default
/// comes from the variable etcdctl reads) or ZooKeeper (`zk://...`).
#[derive(Debug, Default, Args)]
#[command(next_help_heading = "etcd and ZooKeeper options")]
pub struct EtcdArgs {
    /// User to sign in as, with its password after a colon or in --password
    /// (etcd; ZooKeeper's digest, as zkCli's addauth) [default: etcd: ETCDCTL_USER]
    #[arg(long, value_name = "USER[:PASSWORD]", hide_short_help = true)]
    pub user: Option<String>,

    /// Password of --user [default: etcd: ETCDCTL_PASSWORD]
    #[arg(long, value_name = "PASSWORD", hide_short_help = true)]
    pub password: Option<String>,
}

/// TLS files for `etcds://`, `rediss://` and `zks://`, named as etcdctl and
/// redis-cli name them; etcd's defaults come from etcdctl's variables, read
/// in `options::etcd` (redis-cli reads none, nor does consem for ZooKeeper).
#[derive(Debug, Default, Args)]
#[command(next_help_heading = "etcd, Redis and ZooKeeper TLS options")]
pub struct TlsFileArgs {
    /// PEM file of the CA that signs the servers' certificates (etcds://, rediss://, zks://)
    /// [default: etcd: ETCDCTL_CACERT; else the system's trust store]
    #[arg(long, value_name = "PATH", hide_short_help = true)]
    pub cacert: Option<PathBuf>,

    /// PEM client certificate, for servers that verify clients (etcds://, rediss://, zks://)
    /// [default: etcd: ETCDCTL_CERT]
    #[arg(long, value_name = "PATH", hide_short_help = true)]
    pub cert: Option<PathBuf>,

    /// PEM private key of the client certificate [default: etcd: ETCDCTL_KEY]
    #[arg(long, value_name = "PATH", hide_short_help = true)]
    pub key: Option<PathBuf>,
}

/// A command line clap could not read, as one line: what is wrong, and
/// how to fix it (`consem: error: ` goes in front, or it becomes a JSON
/// object, as every other error does).
pub fn describe_error(error: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let rendered = error.render().to_string();
    // clap's text: "error: <what>", maybe more lines (the arguments that
    // are missing, a tip), a blank line, the usage.
    let mut lines = rendered.lines();
    let first = lines.next().unwrap_or_default();
    let mut what = first.strip_prefix("error: ").unwrap_or(first).to_string();
    for line in lines.by_ref() {
        let line = line.trim();
        if line.is_empty() || line.starts_with("tip:") || line.starts_with("Usage:") {
            break;
        }
        what.push(' ');
        what.push_str(line);
    }
    let what = what
        .replace("invalid digit found in string", "expected a whole number")
        .replace(
            "number too large to fit in target type",
            "the number is too large",
        )
        .trim_end_matches(':')
        .to_string();
    // args_os: an argument that is not UTF-8 may be why we are here.
    let subcommand = std::env::args_os()
        .nth(1)
        .and_then(|a| a.into_string().ok())
        .filter(|a| ["run", "status", "release", "reset", "completions"].contains(&a.as_str()));
    let help = match &subcommand {
        Some(sub) => format!("consem {sub} --help"),
        None => "consem --help".to_string(),
    };
    // clap's own guess at what was meant (`--prefx`: `--prefix`).
    let suggestion = [
        ContextKind::SuggestedArg,
        ContextKind::SuggestedSubcommand,
        ContextKind::SuggestedValue,
    ]
    .into_iter()
    .find_map(|kind| match error.get(kind) {
        Some(ContextValue::String(one)) => Some(one.clone()),
        Some(ContextValue::Strings(many)) => many.first().cloned(),
        _ => None,
    });
    let fix = match error.kind() {
        _ if suggestion.is_some() => {
            format!(
                "did you mean {}? see {help}",
                suggestion.unwrap_or_default()
            )
        }
        // `--timeout -5s`: a negative value, read as a short option.
        ErrorKind::UnknownArgument
            if matches!(error.get(ContextKind::InvalidArg), Some(ContextValue::String(arg))
                if arg.strip_prefix('-').is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))) =>
        {
            format!("a limit or a duration is never negative; see {help}")
        }
        ErrorKind::UnknownArgument if subcommand.as_deref() == Some("run") => {
            format!("the command goes after --, as in consem run --prefix P --limit N -- ./job.sh; see {help}")
        }
        ErrorKind::InvalidUtf8 => {
            return format!(
                "{} is not valid UTF-8: give it as UTF-8 text (see {help})",
                not_utf8_argument(std::env::args_os())
            );
        }
        ErrorKind::InvalidSubcommand => {
            "use run, status, release, reset or completions; see consem --help".to_string()
        }
        _ => format!("see {help}"),
    };
    format!("{what} ({fix})")
}

/// Names the first argument that is not UTF-8: the option it is the value
/// of, where there is one.
fn not_utf8_argument(args: impl Iterator<Item = OsString>) -> String {
    let mut previous: Option<String> = None;
    for arg in args {
        match arg.to_str() {
            Some(text) => previous = Some(text.to_string()),
            None => {
                let lossy = arg.to_string_lossy();
                if let Some((option, _)) =
                    lossy.split_once('=').filter(|(o, _)| o.starts_with("--"))
                {
                    return format!("the value of {option}");
                }
                return match previous.filter(|p| p.starts_with('-') && p != "--") {
                    Some(option) => format!("the value of {option}"),
                    None => format!("the argument '{}'", crate::report::printable(&lossy)),
                };
            }
        }
    }
    "an argument".to_string()
}

/// A limit: a whole number of slots, at least 1 (each store says its most).
fn parse_limit(text: &str) -> Result<u32, String> {
    let largest = crate::options::stores::largest_limit();
    match text.parse::<i128>() {
        Ok(..=0) => Err("a limit is at least 1 slot".into()),
        Ok(limit) => match u32::try_from(limit) {
            Ok(limit) => Ok(limit),
            Err(_) => Err(format!("no store takes more than {largest} slots")),
        },
        Err(_) => Err("expected a whole number of slots, such as 2".into()),
    }
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    crate::duration::parse(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn a_negative_or_huge_limit_says_what_a_limit_is() {
        assert_eq!(parse_limit("-1"), Err("a limit is at least 1 slot".into()));
        assert_eq!(parse_limit("0"), Err("a limit is at least 1 slot".into()));
        assert_eq!(parse_limit("3"), Ok(3));
        assert_eq!(
            parse_limit("99999999999"),
            Err("no store takes more than 10000 slots".into())
        );
        let error = Cli::try_parse_from([
            "consem", "run", "--prefix", "p", "--limit", "-1", "--", "true",
        ])
        .unwrap_err();
        assert!(describe_error(&error).contains("a limit is at least 1 slot"));
        let error = Cli::try_parse_from([
            "consem",
            "run",
            "--prefix",
            "p",
            "--limit",
            "1",
            "--timeout",
            "-5s",
            "--",
            "true",
        ])
        .unwrap_err();
        assert!(describe_error(&error).contains("a limit or a duration is never negative"));
    }

    #[test]
    fn the_argument_that_is_not_utf8_is_named_by_its_option() {
        use std::os::unix::ffi::OsStringExt as _;
        let args = |list: &[&[u8]]| {
            list.iter()
                .map(|a| OsString::from_vec(a.to_vec()))
                .collect::<Vec<_>>()
                .into_iter()
        };
        assert_eq!(
            not_utf8_argument(args(&[b"consem", b"run", b"--prefix", b"a\xff"])),
            "the value of --prefix"
        );
        assert_eq!(
            not_utf8_argument(args(&[b"consem", b"run", b"--prefix=a\xff"])),
            "the value of --prefix"
        );
        assert_eq!(
            not_utf8_argument(args(&[b"consem", b"\xffrun"])),
            "the argument '\u{fffd}run'"
        );
    }

    #[test]
    fn definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_shows_examples_and_exit_codes() {
        let top = Cli::command().render_long_help().to_string();
        let run = Cli::command()
            .find_subcommand_mut("run")
            .unwrap()
            .render_long_help()
            .to_string();
        for help in [top, run] {
            assert!(help.contains("--try -- /opt/nightly.sh"), "{help}");
            assert!(help.contains("--timeout 10m -- make deploy"), "{help}");
            assert!(help.contains("76         the slot was lost"), "{help}");
        }
    }

    /// `run --help` at 80 columns, and `-h`.
    fn run_help(long: bool) -> String {
        let mut command = Cli::command().term_width(80);
        let run = command.find_subcommand_mut("run").unwrap();
        if long {
            run.render_long_help().to_string()
        } else {
            run.render_help().to_string()
        }
    }

    /// Every example command is whole in the help of an 80-column
    /// terminal, on one line or continued with `\`, so that a copy runs.
    #[test]
    fn every_example_can_be_copied_from_an_80_column_terminal() {
        let help = run_help(true);
        for line in RUN_EXAMPLES.lines().skip(1) {
            assert!(
                line.chars().count() <= 78,
                "{line:?} is wrapped at 80 columns"
            );
            let text = line.trim();
            if text.is_empty() || text.starts_with('#') {
                continue;
            }
            assert!(
                help.lines().any(|shown| shown.trim() == text),
                "{text:?} is not whole in:\n{help}"
            );
        }
        // A command continued on the next line ends with a lone `\`.
        let continued: Vec<&str> = RUN_EXAMPLES.lines().filter(|l| l.ends_with('\\')).collect();
        assert!(
            continued.iter().all(|l| l.ends_with(" \\")),
            "{continued:?}"
        );
    }

    /// `-h` shows what most runs need, `--store`, `--prefix` and `--limit`
    /// first; `--help` every option, in groups.
    #[test]
    fn short_help_is_short_and_starts_with_the_semaphore() {
        let short = run_help(false);
        assert!(short.lines().count() <= 40, "{short}");
        let first_options: Vec<&str> = short
            .lines()
            .skip_while(|line| *line != "Options:")
            .skip(1)
            .filter_map(|line| line.split_whitespace().next())
            .filter(|word| word.starts_with('-'))
            .take(3)
            .collect();
        assert_eq!(first_options, ["--prefix", "--limit", "--store"], "{short}");
        for shown in ["--timeout", "--try", "-v, --verbose", "-q, --quiet"] {
            assert!(short.contains(shown), "{short}");
        }
        for hidden in ["--http-addr", "--ttl", "--cacert", "--redis-wait-replicas"] {
            assert!(!short.contains(hidden), "{hidden} in -h:\n{short}");
        }
        let long = run_help(true);
        let headings: Vec<&str> = long
            .lines()
            .filter(|line| line.ends_with(':') && !line.starts_with(' '))
            .collect();
        assert_eq!(
            headings,
            [
                "Arguments:",
                "Options:",
                "Waiting for a slot:",
                "What consem writes:",
                "Running the command:",
                "Leases (Consul, Redis, etcd and ZooKeeper):",
                "Consul options:",
                "Redis options:",
                "etcd and ZooKeeper options:",
                "etcd, Redis and ZooKeeper TLS options:",
                "Examples:",
                "Exit codes:",
            ],
            "{long}"
        );
    }

    /// Completion offers the ways to write `--store`, not file names.
    #[test]
    fn store_completes_to_the_ways_to_write_it() {
        let mut script = Vec::new();
        clap_complete::generate(
            clap_complete::Shell::Bash,
            &mut Cli::command(),
            "consem",
            &mut script,
        );
        let script = String::from_utf8(script).unwrap();
        let mut cases = script.split("--store)").skip(1).peekable();
        assert!(cases.peek().is_some(), "no --store case");
        for case in cases {
            let completion = case.lines().nth(1).unwrap_or_default();
            assert!(
                completion.contains(r#"compgen -W "consul local local: redis:// "#)
                    && completion.contains(" etcd:// etcds://")
                    && !completion.contains("compgen -f"),
                "{completion}"
            );
        }
    }

    #[test]
    fn usage_errors_are_one_line_that_says_how_to_fix_them() {
        let error = |line: &[&str]| describe_error(&Cli::try_parse_from(line).unwrap_err());
        let not_a_number = error(&[
            "consem", "run", "--limit", "two", "--prefix", "p", "--", "x",
        ]);
        assert!(
            not_a_number.contains("'two' for '--limit <N>': expected a whole number"),
            "{not_a_number}"
        );
        let missing = error(&["consem", "run", "--prefix", "p", "--", "x"]);
        assert!(
            missing.contains("were not provided: --limit <N>"),
            "{missing}"
        );
        let unknown = error(&["consem", "bogus"]);
        assert!(
            unknown.contains("unrecognized subcommand 'bogus'"),
            "{unknown}"
        );
        assert!(
            unknown
                .ends_with("(use run, status, release, reset or completions; see consem --help)"),
            "{unknown}"
        );
        for message in [not_a_number, missing, unknown] {
            assert_eq!(message.lines().count(), 1, "{message}");
            assert!(!message.starts_with("error"), "{message}");
        }
    }

    #[test]
    fn a_mistyped_name_gets_clap_s_guess_at_what_was_meant() {
        let error = |line: &[&str]| describe_error(&Cli::try_parse_from(line).unwrap_err());
        for (line, guess) in [
            (
                &["consem", "run", "--prefx", "p", "--limit", "1", "--", "x"][..],
                "did you mean --prefix?",
            ),
            (
                &["consem", "status", "--prefix", "p", "--jsn"][..],
                "did you mean --json?",
            ),
            (&["consem", "stauts"][..], "did you mean status?"),
            (
                &[
                    "consem",
                    "run",
                    "--log-format",
                    "jsn",
                    "--prefix",
                    "p",
                    "--limit",
                    "1",
                    "--",
                    "x",
                ][..],
                "did you mean json?",
            ),
        ] {
            let message = error(line);
            assert!(message.contains(guess), "{line:?}: {message}");
            assert_eq!(message.lines().count(), 1, "{message}");
        }
        // Nothing close: no guess.
        let far = error(&[
            "consem", "run", "--bogus", "--prefix", "p", "--limit", "1", "--", "x",
        ]);
        assert!(!far.contains("did you mean"), "{far}");
    }

    #[test]
    fn reads_a_full_run_line() {
        let cli = Cli::try_parse_from([
            "consem",
            "run",
            "--prefix",
            "service/db",
            "--limit",
            "2",
            "--timeout",
            "1m30s",
            "--",
            "./migrate.sh",
            "--dry-run",
        ])
        .unwrap();
        let Command::Run(run) = cli.command else {
            panic!("parsed as run")
        };
        assert_eq!(run.limit, 2);
        assert_eq!(run.timeout, Some(Duration::from_secs(90)));
        assert_eq!(run.command, ["./migrate.sh", "--dry-run"]);
    }

    #[test]
    fn refuses_out_of_range_values() {
        for args in [
            &["--limit", "0"][..],
            &["--limit", "1", "--ttl", "5"],
            &["--limit", "1", "--try", "--timeout", "1s"],
        ] {
            let mut line = vec!["consem", "run", "--prefix", "p"];
            line.extend_from_slice(args);
            line.extend_from_slice(&["--", "true"]);
            assert!(Cli::try_parse_from(&line).is_err(), "{line:?}");
        }
    }
}
