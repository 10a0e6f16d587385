//! consem: run a command while holding one of N slots of a counting
//! semaphore kept in a store: Consul, Redis or etcd (fleet-wide), or the
//! local store (one host, no server).
//!
//! Layers, from the outside in: `cli` and `options` (the command line and
//! the validated settings; `options::stores` is the registry of stores),
//! `supervise` (the child, signals, exit paths; store-neutral), `admin`
//! (the operators' commands, store-neutral), `store` (the store interface)
//! and one folder per store below it. This file opens the chosen store and
//! maps every outcome to an exit code.

pub mod admin;
pub mod cli;
pub mod duration;
pub mod options;
pub mod progress;
pub mod report;
pub mod store;
pub mod supervise;
mod sys;
mod watchdog;

use std::io::IsTerminal as _;
use std::os::unix::process::ExitStatusExt as _;

use options::RunOptions;
use store::{ContenderInfo, StoreError};
use supervise::{Outcome, Plan};

/// Exit codes of consem's own (see `cli::EXIT_CODES`).
pub mod exit {
    /// `status`, `release`, `reset`: nothing there, or nothing to do.
    pub const NOTHING: i32 = 1;
    pub const USAGE: i32 = 2;
    pub const CONFLICT: i32 = 65;
    pub const UNAVAILABLE: i32 = 69;
    pub const SLOT_LOST: i32 = 76;
    pub const DENIED: i32 = 77;
    /// The store's own configuration breaks the semaphore's promise.
    pub const CONFIG: i32 = 78;
    pub const NOT_EXECUTABLE: i32 = 126;
    pub const NOT_FOUND: i32 = 127;
}

/// The exit code of a store's failure.
pub fn exit_code_of(error: &StoreError) -> i32 {
    match error {
        StoreError::Usage(_) => exit::USAGE,
        StoreError::Conflict(_) => exit::CONFLICT,
        StoreError::Unavailable(_) => exit::UNAVAILABLE,
        StoreError::Denied(_) => exit::DENIED,
        StoreError::Config(_) => exit::CONFIG,
    }
}

/// How `consem run` ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    /// Die of this signal, as the command did or as the signal that ended
    /// the wait would have had it, so that a shell sees it (`sys::die_of`).
    Signal(i32),
}

impl Exit {
    /// Ends consem this way.
    pub fn finish(self) -> ! {
        match self {
            Exit::Code(code) => std::process::exit(code),
            Exit::Signal(signal) => sys::die_of(signal),
        }
    }
}

/// Runs `consem run` and says how to exit.
pub fn run(options: RunOptions) -> Exit {
    report::set_verbose(options.verbose);
    report::set_format(options.log_format);
    let command: Vec<String> = options
        .command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let info = ContenderInfo::of_this_process(&command);
    let backend = match options.store.open_run(&options.prefix, options.limit, info) {
        Ok(backend) => backend,
        Err(error) => {
            report::error(&error.to_string());
            return Exit::Code(exit_code_of(&error));
        }
    };
    let plan = Plan {
        command: options.command.clone(),
        mode: options.mode,
        timeout: options.timeout,
        kill_grace: options.kill_grace,
        wait_group: options.wait_group,
        // The waiting line is for people at a terminal; logs get `-v` events.
        // (`-v` writes events instead: the two would garble each other.)
        progress_line: (std::io::stderr().is_terminal()
            && options.log_format == report::LogFormat::Text
            && !options.verbose)
            .then(|| options.prefix.clone()),
    };
    let code = match supervise::run(backend, &plan) {
        Outcome::ChildExited(status) => match (status.code(), status.signal()) {
            (Some(code), _) => code,
            (None, Some(signal)) => return Exit::Signal(signal),
            (None, None) => 1,
        },
        Outcome::NoSlot => i32::from(options.no_slot_exit_code),
        Outcome::Interrupted(signal) => return Exit::Signal(signal),
        Outcome::SlotLost => exit::SLOT_LOST,
        Outcome::Failed(error) => {
            report::error(&error.to_string());
            exit_code_of(&error)
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
    };
    Exit::Code(code)
}
