//! The operators' commands, whatever the store: `status` shows a semaphore
//! (a table, or JSON in one schema for every store), `release` frees the
//! slot of a hung job, `reset` drops the limit record so that a new limit
//! can be used. The store does the reading and the writing ([`Admin`]).

use crate::cli::{ReleaseArgs, ResetArgs, StatusArgs, StoreArgs};
use crate::options::{AdminOptions, GivenOptions, OptionsError};
use crate::store::{Admin, ContenderStatus, ResetOutcome, Status, StoreError};
use crate::{exit, report};

/// How an operator's command ended: done (0), nothing to do (1, with a
/// message), or a failure.
enum Done {
    Ok,
    /// Nothing to do, and the output already says so.
    Quiet,
    Nothing(String),
}

/// Why an operator's command failed: its command line, or the store.
enum Failure {
    Options(OptionsError),
    Store(StoreError),
}

impl From<OptionsError> for Failure {
    fn from(error: OptionsError) -> Failure {
        Failure::Options(error)
    }
}

impl From<StoreError> for Failure {
    fn from(error: StoreError) -> Failure {
        Failure::Store(error)
    }
}

fn finish(outcome: Result<Done, Failure>) -> i32 {
    match outcome {
        Ok(Done::Ok) => 0,
        Ok(Done::Quiet) => exit::NOTHING,
        Ok(Done::Nothing(message)) => {
            report::error(&message);
            exit::NOTHING
        }
        Err(Failure::Options(error)) => {
            report::error(&error.to_string());
            exit::USAGE
        }
        Err(Failure::Store(error)) => {
            report::error(&error.to_string());
            crate::exit_code_of(&error)
        }
    }
}

/// Opens the chosen store's admin side for `prefix`.
fn open(
    prefix: &str,
    store: &StoreArgs,
    given: &GivenOptions,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(String, Box<dyn Admin>), Failure> {
    let options = AdminOptions::from_args(prefix, store, given, env)?;
    let admin = options.store.open_admin(&options.prefix)?;
    Ok((options.prefix, admin))
}

// ---- status ---------------------------------------------------------------

pub fn status(args: StatusArgs, given: &GivenOptions, env: impl Fn(&str) -> Option<String>) -> i32 {
    let json = args.json;
    finish((|| {
        let (_, admin) = open(&args.prefix, &args.store, given, env)?;
        let mut status = admin.status()?;
        status.conflict = status.conflict.take().or_else(|| status.over_limit());
        if json {
            println!(
                "{}",
                serde_json::to_string_pretty(&status).expect("a status always encodes")
            );
        } else {
            print!("{}", render(&status));
        }
        if let Some(conflict) = status.conflict {
            return Err(StoreError::conflict(conflict).into());
        }
        Ok(if status.limit.is_none() && status.waiters.is_empty() {
            Done::Quiet
        } else {
            Done::Ok
        })
    })())
}

fn render(status: &Status) -> String {
    let mut out = String::new();
    let Some(limit) = status.limit else {
        out.push_str(&format!("{}: no semaphore", status.prefix));
        if !status.waiters.is_empty() {
            out.push_str(&format!(", {} contender(s) joining", status.waiters.len()));
        }
        out.push('\n');
        render_leftovers(status, &mut out);
        return out;
    };
    out.push_str(&format!(
        "{}: {} of {limit} slots held, {} waiting ({} store{})\n",
        status.prefix,
        status.holders.len(),
        status.waiters.len(),
        status.store,
        status
            .layout
            .map(|layout| format!(", {layout} form of .lock"))
            .unwrap_or_default(),
    ));
    let table = |title: &str, rows: &[ContenderStatus], out: &mut String| {
        if rows.is_empty() {
            return;
        }
        out.push_str(&format!("\n{title}\n"));
        out.push_str("  SESSION                               HOST             PID      NODE             SINCE                     COMMAND\n");
        for c in rows {
            // Written by whoever can write the store: shown, never obeyed.
            let missing = || "-".to_string();
            let shown = |value: &Option<String>| {
                value
                    .as_deref()
                    .map_or_else(missing, |v| crate::report::printable(v).into_owned())
            };
            out.push_str(&format!(
                "  {:<37} {:<16} {:<8} {:<16} {:<25} {}\n",
                crate::report::printable(&c.session),
                shown(&c.host),
                c.pid.map_or_else(missing, |p| p.to_string()),
                shown(&c.node),
                shown(&c.started),
                shown(&c.command),
            ));
        }
    };
    table("HOLDERS", &status.holders, &mut out);
    table("WAITING (in arrival order)", &status.waiters, &mut out);
    if !status.dead_holders.is_empty() {
        out.push_str("\nDEAD HOLDERS (gone; the next contender prunes them)\n");
        for id in &status.dead_holders {
            out.push_str(&format!("  {}\n", crate::report::printable(id)));
        }
    }
    render_leftovers(status, &mut out);
    out
}

/// The lock delay and what no live contender accounts for.
fn render_leftovers(status: &Status, out: &mut String) {
    if let Some(left) = status.lock_delay_ms {
        out.push_str(&format!(
            "\nLOCK DELAY: no slot is granted for another {} (the semaphore's keys were lost; holders the store forgot are stopping)\n",
            crate::duration::human(std::time::Duration::from_millis(left))
        ));
    }
    if !status.stale.is_empty() {
        out.push_str("\nSTALE (left by an outage or a crash; no live contender accounts for it)\n");
        for item in &status.stale {
            out.push_str(&format!("  {}\n", crate::report::printable(item)));
        }
    }
}

// ---- release --------------------------------------------------------------

pub fn release(
    args: ReleaseArgs,
    given: &GivenOptions,
    env: impl Fn(&str) -> Option<String>,
) -> i32 {
    finish((|| {
        let (prefix, admin) = open(&args.prefix, &args.store, given, env)?;
        let status = admin.status()?;
        if status.limit.is_none() {
            return Ok(Done::Nothing(format!(
                "no semaphore at {prefix}: nothing to release"
            )));
        }
        let matches: Vec<&ContenderStatus> = status
            .holders
            .iter()
            .filter(|holder| match (&args.session, &args.host, args.pid) {
                (Some(wanted), _, _) => holder.session.starts_with(wanted.as_str()),
                (None, Some(host), Some(pid)) => {
                    holder.host.as_deref() == Some(host.as_str())
                        && holder.pid == Some(u64::from(pid))
                }
                _ => false,
            })
            .collect();
        let wanted = match (&args.session, &args.host, args.pid) {
            (Some(session), _, _) => format!("session {session}"),
            (None, Some(host), Some(pid)) => format!("host {host} pid {pid}"),
            _ => String::new(),
        };
        let victim = match matches.as_slice() {
            [] => {
                return Ok(Done::Nothing(format!(
                    "no holder at {prefix} matches {wanted}: see consem status --prefix {prefix}"
                )))
            }
            [one] => one.session.clone(),
            several => {
                let ids: Vec<&str> = several.iter().map(|s| s.session.as_str()).collect();
                return Ok(Done::Nothing(format!(
                    "{wanted} matches {} holders ({}): give more of the session ID",
                    ids.len(),
                    ids.join(", ")
                )));
            }
        };
        admin.release(&victim)?;
        println!("released {victim} from {prefix}");
        Ok(Done::Ok)
    })())
}

// ---- reset ----------------------------------------------------------------

pub fn reset(args: ResetArgs, given: &GivenOptions, env: impl Fn(&str) -> Option<String>) -> i32 {
    finish((|| {
        let (prefix, admin) = open(&args.prefix, &args.store, given, env)?;
        Ok(match admin.reset(args.force)? {
            ResetOutcome::Reset { limit, evicted } => {
                let released = |n: usize| match n {
                    1 => "released 1 holder".to_string(),
                    n => format!("released {n} holders"),
                };
                match (limit, evicted) {
                    (Some(limit), 0) => println!("reset {prefix}: deleted the limit record (Limit {limit})"),
                    (Some(limit), n) => println!(
                        "reset {prefix}: {}, deleted the limit record (Limit {limit})",
                        released(n)
                    ),
                    (None, 0) => println!("reset {prefix}: removed what was left; no limit was recorded"),
                    (None, n) => println!("reset {prefix}: {}; the limit record is gone", released(n)),
                }
                Done::Ok
            }
            ResetOutcome::Nothing => Done::Nothing(format!("no semaphore at {prefix}: nothing to reset")),
            // The holders by what `consem release --session` takes.
            ResetOutcome::LiveHolders(ids) => Done::Nothing(match ids.as_slice() {
                [id] => format!(
                    "1 live holder at {prefix} (session {id}): wait for it to end, free its slot with consem release --session {id}, or reset with --force"
                ),
                ids => format!(
                    "{} live holders at {prefix} (sessions {}): wait for them to end, free their slots with consem release --session, or reset with --force",
                    ids.len(),
                    ids.join(", ")
                ),
            }),
            ResetOutcome::NewHolders => Done::Nothing(format!(
                "new holders took the freed slots at {prefix} after the reset began; reset again to evict them too"
            )),
        })
    })())
}
