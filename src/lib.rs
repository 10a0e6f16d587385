//! consem: run a command while holding one of N slots of a distributed
//! semaphore kept in HashiCorp Consul.
//!
//! Layers, from the outside in: `cli` and `options` (the command line),
//! `supervise` (the child, signals, exit paths; backend-agnostic), `backend`
//! (the interface to a semaphore store), `consul_backend` (the recipe over
//! Consul), `consul` (the HTTP client), and `semaphore` (pure decisions).

pub mod admin;
pub mod backend;
pub mod cli;
pub mod consul;
pub mod consul_backend;
pub mod contender;
pub mod duration;
pub mod options;
pub mod progress;
pub mod report;
pub mod semaphore;
pub mod supervise;
mod sys;
pub mod tls;

use std::io::IsTerminal as _;
use std::os::unix::process::ExitStatusExt as _;
use std::sync::Arc;

use backend::BackendError;
use consul_backend::{ConsulSemaphore, Settings};
use options::RunOptions;
use supervise::{Outcome, Plan};

/// Exit codes of consem's own (see `cli::EXIT_CODES`).
pub mod exit {
    pub const USAGE: i32 = 2;
    pub const CONFLICT: i32 = 65;
    pub const UNAVAILABLE: i32 = 69;
    pub const SLOT_LOST: i32 = 76;
    pub const DENIED: i32 = 77;
    pub const NOT_EXECUTABLE: i32 = 126;
    pub const NOT_FOUND: i32 = 127;
}

/// Runs `consem run` and returns the exit code.
pub fn run(options: RunOptions) -> i32 {
    report::set_verbose(options.verbose);
    report::set_format(options.log_format);
    let command: Vec<String> = options
        .command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let settings = Settings {
        prefix: options.prefix.clone(),
        limit: options.limit,
        ttl: options.ttl,
        session_name: options.session_name.clone(),
        contender_value: consul_backend::contender_value(&command),
        monitor_retry: options.monitor_retry,
    };
    let client = match consul::Client::new(options.consul.clone()) {
        Ok(client) => client,
        Err(message) => {
            report::error(&message);
            return exit::USAGE;
        }
    };
    if !options.consul.tls.verify && options.consul.address.https {
        report::warning(
            "CONSUL_HTTP_SSL_VERIFY=false: the agent's certificate is not checked, so anyone on the path can pose as Consul",
        );
    }
    let backend = Arc::new(ConsulSemaphore::new(client, settings));
    let plan = Plan {
        command: options.command.clone(),
        mode: options.mode,
        timeout: options.timeout,
        kill_grace: options.kill_grace,
        // The waiting line is for people at a terminal; logs get `-v` events.
        // (`-v` writes events instead: the two would garble each other.)
        progress_line: (std::io::stderr().is_terminal()
            && options.log_format == report::LogFormat::Text
            && !options.verbose)
            .then(|| options.prefix.clone()),
    };
    match supervise::run(backend, &plan) {
        Outcome::ChildExited(status) => status
            .code()
            .or_else(|| status.signal().map(|signal| 128 + signal))
            .unwrap_or(1),
        Outcome::NoSlot => i32::from(options.no_slot_exit_code),
        Outcome::Interrupted(signal) => 128 + signal,
        Outcome::SlotLost => exit::SLOT_LOST,
        Outcome::Failed(error) => {
            report::error(&error.to_string());
            match error {
                BackendError::Conflict(_) => exit::CONFLICT,
                BackendError::Unavailable(_) => exit::UNAVAILABLE,
                BackendError::Denied(_) => exit::DENIED,
            }
        }
        Outcome::SpawnFailed(error) => {
            let (hint, code) = if error.kind() == std::io::ErrorKind::NotFound {
                ("check its name and PATH", exit::NOT_FOUND)
            } else {
                ("check that it is an executable file", exit::NOT_EXECUTABLE)
            };
            report::error(&format!("cannot run '{}': {error}; {hint}", command[0]));
            code
        }
    }
}
