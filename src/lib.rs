//! consem: run a command while holding one of N slots of a counting
//! semaphore kept in a store: Consul, Redis, etcd, PostgreSQL or ZooKeeper
//! (fleet-wide), or the local store (one host, no server).
//!
//! Layers, from the outside in: `cli` and `options` (the command line and
//! the validated settings; `options::stores` is the registry of stores),
//! `supervise` (the child, signals, exit paths; store-neutral), `admin`
//! (the operators' commands, store-neutral), `store` (the store interface)
//! and one folder per store below it. This file opens the chosen store and
//! runs it; `exit` maps every way a run ends to an exit code.

pub mod admin;
pub mod cli;
pub mod duration;
pub mod exit;
pub mod options;
pub mod progress;
pub mod report;
pub mod store;
pub mod supervise;
mod sys;
mod watchdog;

use std::io::IsTerminal as _;

use options::RunOptions;
use store::ContenderInfo;
use supervise::Plan;

pub use exit::{exit_code_of, Exit};
pub use sys::die_of_a_closed_pipe;

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
        prefix: options.prefix.clone(),
        limit: options.limit,
        mode: options.mode,
        timeout: options.timeout,
        kill_grace: options.kill_grace,
        wait_group: options.wait_group,
        // The waiting line is for people at a terminal; logs get `-v` events.
        // (`-v` writes events instead: the two would garble each other.)
        // A single look (`--try`) has nothing to show while it waits.
        progress_line: (std::io::stderr().is_terminal()
            && options.log_format == report::LogFormat::Text
            && !options.verbose
            && options.mode == store::Contend::Wait)
            .then(|| options.prefix.clone()),
    };
    let ended = supervise::run(backend, &plan);
    match &ended {
        Err(error) => report::error(&error.to_string()),
        Ok(supervise::Outcome::NoSlot(no_slot)) if options.say_no_slot => {
            report::notice(&no_slot.describe(&options.prefix, std::time::SystemTime::now()));
        }
        Ok(_) => {}
    }
    exit::of_run(&ended, i32::from(options.no_slot_exit_code))
}
