//! The operators' commands: `status` shows a semaphore, `release` frees a
//! slot held by a hung job, `reset` deletes `.lock` so that a new limit can be
//! used. They create no session; every write is a CAS on what was read.

use serde::Serialize;

use crate::cli::{ConsulArgs, ReleaseArgs, ResetArgs, StatusArgs};
use crate::consul::{Client, Consistency, ConsulError};
use crate::semaphore::{
    decode_lock, encode_lock, Entry, HoldersForm, LockRecord, Snapshot, LOCK_KEY_NAME,
    SEMAPHORE_FLAGS,
};
use crate::{exit, options, report};

/// Exit code when there is nothing to show or do.
pub const NOTHING: i32 = 1;

/// Attempts at a CAS on `.lock` against concurrent writers.
const CAS_ATTEMPTS: u32 = 8;

/// How a command ended: the exit code, and the message for stderr if any.
type Outcome = Result<i32, (i32, String)>;

fn finish(outcome: Outcome) -> i32 {
    match outcome {
        Ok(code) => code,
        Err((code, message)) => {
            report::error(&message);
            code
        }
    }
}

fn connect(
    prefix: &str,
    consul: ConsulArgs,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(String, Client), (i32, String)> {
    let usage = |message: String| (exit::USAGE, message);
    let prefix = options::normalize_prefix(prefix).map_err(usage)?;
    let config = options::consul_config(consul, env).map_err(usage)?;
    let client = Client::new(config).map_err(usage)?;
    Ok((prefix, client))
}

fn consul_failure(error: ConsulError) -> (i32, String) {
    match error {
        ConsulError::Denied(why) => (exit::DENIED, format!("permission denied: {why}")),
        other => (exit::UNAVAILABLE, other.to_string()),
    }
}

fn read(client: &Client, prefix: &str) -> Result<Snapshot, (i32, String)> {
    let listing = client
        .list(prefix, Consistency::Consistent, None)
        .map_err(consul_failure)?;
    Ok(Snapshot::from_entries(listing.entries))
}

/// Reads the prefix, and directly each holder the listing shows as dead:
/// calling a holder dead (status) or deleting `.lock` under it (reset) must
/// not rest on a listing that an ACL filtered. Refuses (77) when a holder
/// is hidden from the token; reads again when one came back since.
fn read_checked(client: &Client, prefix: &str) -> Result<Snapshot, (i32, String)> {
    for _ in 0..CAS_ATTEMPTS {
        let mut snapshot = read(client, prefix)?;
        let Some((record, _)) = lock_record(&snapshot, prefix)? else {
            return Ok(snapshot);
        };
        let revealed = client
            .reveal_hidden(prefix, &record, &mut snapshot)
            .map_err(consul_failure)?;
        if let Some(session) = revealed.hidden.first() {
            return Err((
                exit::DENIED,
                format!(
                    "permission denied: {}",
                    crate::consul::hidden_holder(prefix, session)
                ),
            ));
        }
        if revealed.revived.is_empty() {
            return Ok(snapshot);
        }
    }
    Err((
        exit::UNAVAILABLE,
        format!("the holders at {prefix} kept changing while consem read them; try again"),
    ))
}

/// `.lock` decoded whatever its limit, or why it cannot be.
fn lock_record(
    snapshot: &Snapshot,
    prefix: &str,
) -> Result<Option<(LockRecord, u64)>, (i32, String)> {
    let Some(lock) = &snapshot.lock else {
        return Ok(None);
    };
    let conflict = |why: String| (exit::CONFLICT, format!("{prefix}/.lock {why}"));
    if lock.flags != SEMAPHORE_FLAGS {
        return Err(conflict(
            crate::semaphore::Conflict::ForeignFlags(lock.flags).to_string(),
        ));
    }
    let record = decode_lock(&lock.value).map_err(|c| conflict(c.to_string()))?;
    Ok(Some((record, lock.modify_index)))
}

// ---- status ---------------------------------------------------------------

/// `consem status --json`: this schema is stable; fields are only ever added.
#[derive(Debug, Serialize)]
struct Status {
    prefix: String,
    /// `null` when there is no `.lock` yet.
    limit: Option<u32>,
    /// `"map"` (as consul lock writes it), `"list"`, or `null` without `.lock`.
    layout: Option<&'static str>,
    /// Live holders, in `.lock` order.
    holders: Vec<Contender>,
    /// Live contenders without a slot, in arrival order (CreateIndex).
    waiters: Vec<Contender>,
    /// Holders in `.lock` without a live contender key: the next contender
    /// prunes them.
    dead_holders: Vec<String>,
}

#[derive(Debug, Serialize)]
struct Contender {
    session: String,
    /// From the contender key's value (consem writes it; consul lock leaves
    /// it empty, so these are null for its contenders).
    host: Option<String>,
    pid: Option<u64>,
    command: Option<String>,
    started: Option<String>,
    /// From Consul's session info.
    node: Option<String>,
    session_name: Option<String>,
    /// The contender key's CreateIndex: arrival order.
    create_index: u64,
}

pub fn status(args: StatusArgs, env: impl Fn(&str) -> Option<String>) -> i32 {
    let json = args.json;
    finish(collect_status(args, env).map(|status| {
        if json {
            println!(
                "{}",
                serde_json::to_string_pretty(&status).expect("a status always encodes")
            );
        } else {
            print!("{}", render(&status));
        }
        if status.limit.is_none() && status.waiters.is_empty() {
            NOTHING
        } else {
            0
        }
    }))
}

fn collect_status(
    args: StatusArgs,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Status, (i32, String)> {
    let (prefix, client) = connect(&args.prefix, args.consul, env)?;
    let snapshot = read_checked(&client, &prefix)?;
    let record = lock_record(&snapshot, &prefix)?;
    let describe = |entry: &Entry| -> Result<Contender, (i32, String)> {
        let session = entry.session.clone().unwrap_or_default();
        let value: serde_json::Value = serde_json::from_slice(&entry.value).unwrap_or_default();
        let text = |field: &str| {
            value
                .get(field)
                .and_then(|v| v.as_str())
                .map(str::to_string)
        };
        let info = client.session_info(&session).map_err(consul_failure)?;
        Ok(Contender {
            host: text("Host"),
            pid: value.get("Pid").and_then(serde_json::Value::as_u64),
            command: text("Command"),
            started: text("Started"),
            node: info.as_ref().map(|i| i.node.clone()),
            session_name: info.map(|i| i.name),
            create_index: entry.create_index,
            session,
        })
    };
    let held: Vec<String> = record
        .as_ref()
        .map(|(r, _)| r.holders.clone())
        .unwrap_or_default();
    let mut holders = Vec::new();
    let mut dead_holders = Vec::new();
    for id in &held {
        match snapshot.contenders.get(id).filter(|_| snapshot.is_live(id)) {
            Some(entry) => holders.push(describe(entry)?),
            None => dead_holders.push(id.clone()),
        }
    }
    let mut waiting: Vec<&Entry> = snapshot
        .contenders
        .values()
        .filter(|e| snapshot.is_live(&e.name) && !held.contains(&e.name))
        .collect();
    waiting.sort_by_key(|e| e.create_index);
    let waiters = waiting
        .into_iter()
        .map(describe)
        .collect::<Result<_, _>>()?;
    Ok(Status {
        prefix,
        limit: record.as_ref().map(|(r, _)| r.limit),
        layout: record.as_ref().map(|(r, _)| match r.form {
            HoldersForm::Map => "map",
            HoldersForm::List => "list",
        }),
        holders,
        waiters,
        dead_holders,
    })
}

fn render(status: &Status) -> String {
    let mut out = String::new();
    let Some(limit) = status.limit else {
        out.push_str(&format!("{}: no semaphore (no .lock)", status.prefix));
        if !status.waiters.is_empty() {
            out.push_str(&format!(", {} contender(s) joining", status.waiters.len()));
        }
        out.push('\n');
        return out;
    };
    out.push_str(&format!(
        "{}: {} of {limit} slots held, {} waiting ({} form of .lock)\n",
        status.prefix,
        status.holders.len(),
        status.waiters.len(),
        status.layout.unwrap_or("map"),
    ));
    let table = |title: &str, rows: &[Contender], out: &mut String| {
        if rows.is_empty() {
            return;
        }
        out.push_str(&format!("\n{title}\n"));
        out.push_str("  SESSION                               HOST             PID      NODE             SINCE                     COMMAND\n");
        for c in rows {
            let missing = || "-".to_string();
            out.push_str(&format!(
                "  {:<37} {:<16} {:<8} {:<16} {:<25} {}\n",
                c.session,
                c.host.clone().unwrap_or_else(missing),
                c.pid.map_or_else(missing, |p| p.to_string()),
                c.node.clone().unwrap_or_else(missing),
                c.started.clone().unwrap_or_else(missing),
                c.command.clone().unwrap_or_else(missing),
            ));
        }
    };
    table("HOLDERS", &status.holders, &mut out);
    table("WAITING (in arrival order)", &status.waiters, &mut out);
    if !status.dead_holders.is_empty() {
        out.push_str("\nDEAD HOLDERS (no live contender key; the next contender prunes them)\n");
        for id in &status.dead_holders {
            out.push_str(&format!("  {id}\n"));
        }
    }
    out
}

// ---- release --------------------------------------------------------------

pub fn release(args: ReleaseArgs, env: impl Fn(&str) -> Option<String>) -> i32 {
    finish(release_holder(args, env))
}

fn release_holder(args: ReleaseArgs, env: impl Fn(&str) -> Option<String>) -> Outcome {
    let (prefix, client) = connect(&args.prefix, args.consul, env)?;
    let snapshot = read(&client, &prefix)?;
    let Some((record, _)) = lock_record(&snapshot, &prefix)? else {
        return Err((
            NOTHING,
            format!("no semaphore at {prefix} (no .lock): nothing to release"),
        ));
    };
    let matches: Vec<&String> = record
        .holders
        .iter()
        .filter(|id| match (&args.session, &args.host, args.pid) {
            (Some(wanted), _, _) => id.starts_with(wanted.as_str()),
            (None, Some(host), Some(pid)) => snapshot.contenders.get(*id).is_some_and(|entry| {
                let value: serde_json::Value =
                    serde_json::from_slice(&entry.value).unwrap_or_default();
                value.get("Host").and_then(|h| h.as_str()) == Some(host.as_str())
                    && value.get("Pid").and_then(serde_json::Value::as_u64) == Some(u64::from(pid))
            }),
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
            return Err((
                NOTHING,
                format!(
                    "no holder at {prefix} matches {wanted}: see consem status --prefix {prefix}"
                ),
            ))
        }
        [one] => (*one).clone(),
        several => {
            let ids: Vec<&str> = several.iter().map(|s| s.as_str()).collect();
            return Err((
                NOTHING,
                format!(
                    "{wanted} matches {} holders ({}): give more of the session ID",
                    ids.len(),
                    ids.join(", ")
                ),
            ));
        }
    };
    // Destroying the session deletes its contender key: the consem that held
    // the slot sees the loss and stops its command. Only then is `.lock`
    // tidied, so that a failure here leaves nothing half done.
    client.destroy_session(&victim).map_err(consul_failure)?;
    remove_holder(&client, &prefix, &victim)?;
    println!("released {victim} from {prefix}");
    Ok(0)
}

/// Takes `session` out of `.lock` with CAS, retried against other writers.
fn remove_holder(client: &Client, prefix: &str, session: &str) -> Result<(), (i32, String)> {
    let key = format!("{prefix}/{LOCK_KEY_NAME}");
    for _ in 0..CAS_ATTEMPTS {
        let snapshot = read(client, prefix)?;
        let Some((mut record, index)) = lock_record(&snapshot, prefix)? else {
            return Ok(());
        };
        if !record.holds(session) {
            return Ok(());
        }
        record.holders.retain(|h| h != session);
        if client
            .put_cas(&key, encode_lock(&record), index, SEMAPHORE_FLAGS)
            .map_err(consul_failure)?
        {
            return Ok(());
        }
    }
    Err((
        exit::UNAVAILABLE,
        format!("{key} kept changing while consem tried to update it; try again"),
    ))
}

// ---- reset ----------------------------------------------------------------

pub fn reset(args: ResetArgs, env: impl Fn(&str) -> Option<String>) -> i32 {
    finish(reset_lock(args, env))
}

fn reset_lock(args: ResetArgs, env: impl Fn(&str) -> Option<String>) -> Outcome {
    let (prefix, client) = connect(&args.prefix, args.consul, env)?;
    let key = format!("{prefix}/{LOCK_KEY_NAME}");
    let mut evicted = 0;
    // With --force, only the holders live when reset began are evicted:
    // waiters that take the freed slots afterwards started after the reset.
    let mut evictable: Option<Vec<String>> = None;
    for _ in 0..CAS_ATTEMPTS {
        let snapshot = read_checked(&client, &prefix)?;
        let Some((record, index)) = lock_record(&snapshot, &prefix)? else {
            if evicted > 0 {
                // The last evicted consem deleted .lock on its way out.
                println!("reset {prefix}: released {evicted} holder(s); .lock is gone");
                return Ok(0);
            }
            return Err((NOTHING, format!("no .lock at {prefix}: nothing to reset")));
        };
        let live: Vec<&String> = record
            .holders
            .iter()
            .filter(|h| snapshot.is_live(h))
            .collect();
        if !live.is_empty() {
            if !args.force {
                let ids: Vec<&str> = live.iter().map(|s| s.as_str()).collect();
                return Err((
                    NOTHING,
                    format!(
                        "{} live holder(s) at {prefix} ({}): wait for them, release them, or use --force",
                        ids.len(),
                        ids.join(", ")
                    ),
                ));
            }
            let first =
                evictable.get_or_insert_with(|| live.iter().map(|s| s.to_string()).collect());
            let targets: Vec<String> = live
                .iter()
                .filter(|id| first.contains(id))
                .map(|s| s.to_string())
                .collect();
            if targets.is_empty() {
                return Err((
                    NOTHING,
                    format!("new holders took the freed slots at {prefix} after the reset began; reset again to evict them too"),
                ));
            }
            for id in &targets {
                client.destroy_session(id).map_err(consul_failure)?;
                evicted += 1;
            }
            continue;
        }
        if client.delete(&key, Some(index)).map_err(consul_failure)? {
            println!("reset {prefix}: deleted .lock (Limit {})", record.limit);
            return Ok(0);
        }
    }
    Err((
        exit::UNAVAILABLE,
        format!("{key} kept changing while consem tried to delete it; try again"),
    ))
}
