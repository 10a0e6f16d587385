//! The command line, as clap reads it. Validation across flags and the
//! conversion into settings live in `options`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::semaphore::MAX_LIMIT;

pub const EXIT_CODES: &str = "\
Exit codes:
  <child's>  the command ran and exited by itself
  128+N      the command died of signal N, or a signal N ended the wait
  2          usage error
  65         semaphore conflict (other limit, foreign or undecodable .lock)
  69         Consul unreachable or failing when starting
  75         no slot within --timeout, or none free with --try (see -E)
  76         the slot was lost while the command ran; it was stopped
  77         permission denied by Consul ACLs
  126/127    command not executable / not found";

const RUN_EXAMPLES: &str = "\
Examples:
  # At most 2 migrations at once across the fleet:
  consem run --prefix service/db --limit 2 -- ./migrate.sh

  # In cron: skip this round if the nightly job still runs elsewhere.
  */5 * * * * consem run --prefix jobs/nightly --limit 1 --try -- /opt/nightly.sh

  # In CI: wait up to 10 minutes for one of 3 deploy slots.
  consem run --prefix ci/deploy --limit 3 --timeout 10m -- make deploy

  # In a script: someone else syncing is fine (exit 0); the job's own
  # failures still fail.
  consem run --prefix jobs/sync --limit 1 --try -E 0 -- ./sync.sh";

#[derive(Debug, Parser)]
#[command(
    name = "consem",
    version,
    about = "Run a command while holding one of N slots of a Consul semaphore",
    long_about = "Run a command while holding one of N slots of a distributed semaphore kept in \
HashiCorp Consul, so that at most N copies of a job run at once across many machines. \
consem shares its prefix layout with `consul lock -n N`.",
    after_help = format!("{RUN_EXAMPLES}\n\n{EXIT_CODES}"),
    propagate_version = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command while holding a slot
    #[command(after_help = format!("{RUN_EXAMPLES}\n\n{EXIT_CODES}"))]
    Run(RunArgs),
    /// Show the semaphore at a prefix: limit, holders, waiters, dead holders
    #[command(after_help = STATUS_HELP)]
    Status(StatusArgs),
    /// Free a slot: take a holder out of .lock and destroy its session
    #[command(after_help = ADMIN_EXIT_CODES)]
    Release(ReleaseArgs),
    /// Delete .lock once no live holder remains, so that a new limit can be used
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
  65  .lock at the prefix is not a semaphore consem can read
  69  Consul unreachable or failing
  77  permission denied by Consul ACLs";

const STATUS_HELP: &str = "\
Examples:
  consem status --prefix service/db
  consem status --prefix service/db --json | jq '.holders[].host'

Exit codes:
  0   a semaphore is at the prefix
  1   nothing is at the prefix
  2   usage error
  65  .lock at the prefix is not a semaphore consem can read
  69  Consul unreachable or failing
  77  permission denied by Consul ACLs";

/// `consem status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// KV prefix of the semaphore
    #[arg(long, value_name = "PREFIX")]
    pub prefix: String,

    /// Print JSON (a stable schema, see README) instead of a table
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub consul: ConsulArgs,
}

/// `consem release`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("holder").required(true).args(["session", "host"])))]
pub struct ReleaseArgs {
    /// KV prefix of the semaphore
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
    pub consul: ConsulArgs,
}

/// `consem reset`.
#[derive(Debug, Args)]
pub struct ResetArgs {
    /// KV prefix of the semaphore
    #[arg(long, value_name = "PREFIX")]
    pub prefix: String,

    /// Release every live holder first (their commands are stopped, exit 76)
    #[arg(long)]
    pub force: bool,

    #[command(flatten)]
    pub consul: ConsulArgs,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// KV prefix that all contenders agree on (leading and trailing '/' are trimmed)
    #[arg(long, value_name = "PREFIX")]
    pub prefix: String,

    /// Number of slots; every contender on the prefix must use the same limit
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_LIMIT)))]
    pub limit: u32,

    /// Give up waiting for a slot after this long (default: wait forever)
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, conflicts_with = "try_once")]
    pub timeout: Option<Duration>,

    /// Make one attempt and do not wait
    #[arg(long = "try")]
    pub try_once: bool,

    /// Exit code when no slot was obtained
    #[arg(short = 'E', long, value_name = "CODE", default_value_t = 75)]
    pub no_slot_exit_code: u8,

    /// Session TTL, renewed every TTL/2 (10s to 24h)
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_ttl)]
    pub ttl: Duration,

    /// Time between SIGTERM and SIGKILL when consem must stop the command
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub kill_grace: Duration,

    /// Consecutive transient Consul failures tolerated while holding a slot
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub monitor_retry: u32,

    /// Session name (default: "consem: <command> at <prefix>")
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,

    /// Print lifecycle events on stderr
    #[arg(short, long)]
    pub verbose: bool,

    /// Format of what consem writes on stderr
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t)]
    pub log_format: crate::report::LogFormat,

    #[command(flatten)]
    pub consul: ConsulArgs,

    /// The command and its arguments, after `--`; run directly, not by a shell
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// How to reach Consul; the environment variables are the consul CLI's.
#[derive(Debug, Args)]
pub struct ConsulArgs {
    /// Consul HTTP API address: host:port, http://host:port or https://host:port
    #[arg(
        long,
        value_name = "ADDR",
        env = "CONSUL_HTTP_ADDR",
        default_value = "127.0.0.1:8500"
    )]
    pub http_addr: String,

    /// ACL token (also CONSUL_HTTP_TOKEN); sent in the X-Consul-Token header
    #[arg(long, value_name = "TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// File holding the ACL token (also CONSUL_HTTP_TOKEN_FILE)
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,

    /// Datacenter to use (default: the agent's)
    #[arg(long, value_name = "DC")]
    pub datacenter: Option<String>,

    /// Namespace to use (Consul Enterprise)
    #[arg(long, value_name = "NS", env = "CONSUL_NAMESPACE")]
    pub namespace: Option<String>,

    /// Admin partition to use (Consul Enterprise)
    #[arg(long, value_name = "PARTITION", env = "CONSUL_PARTITION")]
    pub partition: Option<String>,

    /// PEM file of the CA that signs the agent's certificate
    #[arg(long, value_name = "PATH", env = "CONSUL_CACERT")]
    pub ca_file: Option<PathBuf>,

    /// Directory of PEM CA certificates
    #[arg(long, value_name = "DIR", env = "CONSUL_CAPATH")]
    pub ca_path: Option<PathBuf>,

    /// PEM client certificate, for agents that verify clients (mTLS)
    #[arg(
        long,
        value_name = "PATH",
        env = "CONSUL_CLIENT_CERT",
        requires = "client_key"
    )]
    pub client_cert: Option<PathBuf>,

    /// PEM private key of the client certificate
    #[arg(
        long,
        value_name = "PATH",
        env = "CONSUL_CLIENT_KEY",
        requires = "client_cert"
    )]
    pub client_key: Option<PathBuf>,

    /// Name to verify the agent's certificate against, instead of the address's host
    #[arg(long, value_name = "NAME", env = "CONSUL_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    crate::duration::parse(text)
}

fn parse_ttl(text: &str) -> Result<Duration, String> {
    let ttl = crate::duration::parse(text)?;
    if ttl < Duration::from_secs(10) || ttl > Duration::from_secs(86_400) {
        return Err(format!(
            "TTL {text} is outside what Consul accepts: use 10s to 24h"
        ));
    }
    Ok(ttl)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

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
            &["--limit", "1025"],
            &["--limit", "1", "--ttl", "5s"],
            &["--limit", "1", "--ttl", "25h"],
            &["--limit", "1", "--try", "--timeout", "1s"],
        ] {
            let mut line = vec!["consem", "run", "--prefix", "p"];
            line.extend_from_slice(args);
            line.extend_from_slice(&["--", "true"]);
            assert!(Cli::try_parse_from(&line).is_err(), "{line:?}");
        }
    }
}
