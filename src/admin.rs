//! The operators' commands, whatever the store: `status` shows a semaphore
//! (a table, or JSON in one schema for every store), `release` frees the
//! slot of a hung job, `reset` drops the limit record so that a new limit
//! can be used. The store does the reading and the writing ([`Admin`]).

use crate::cli::{ReleaseArgs, ResetArgs, StatusArgs, StoreArgs};
use crate::options::{AdminOptions, GivenOptions, OptionsError};
use std::time::SystemTime;

use crate::progress::width;

use crate::store::{Admin, ContenderStatus, Holder, ResetOutcome, Status, StoreError, Summary};
use crate::{exit, report};

/// How an operator's command ended: done (0), nothing to do (1, with a
/// message), or a failure.
enum Done {
    Ok,
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

/// What `status` looks at: one semaphore, or every one under a root.
enum Scope {
    One(String),
    /// `""`: the whole store.
    Under(String),
}

/// `--prefix P` is one semaphore; no `--prefix`, or one ending in `/`
/// (`jobs/`), is every semaphore at and under it (checked as a prefix
/// once the store is known).
fn scope(prefix: Option<&str>) -> Scope {
    match prefix {
        None => Scope::Under(String::new()),
        Some(root) if root.ends_with('/') => match root.trim_matches('/') {
            "" => Scope::Under(String::new()),
            _ => Scope::Under(root.to_string()),
        },
        Some(prefix) => Scope::One(prefix.to_string()),
    }
}

pub fn status(args: StatusArgs, given: &GivenOptions, env: impl Fn(&str) -> Option<String>) -> i32 {
    let json = args.json;
    finish((|| match scope(args.prefix.as_deref()) {
        Scope::One(prefix) => {
            let (_, admin) = open(&prefix, &args.store, given, env)?;
            status_of_one(admin.as_ref(), json)
        }
        Scope::Under(root) => {
            let options = AdminOptions::for_listing(&root, &args.store, given, env)?;
            let (root, store_name) = (options.prefix, options.store_entry.store.name);
            let admin = options.store.open_admin(&root)?;
            let semaphores = admin.list()?;
            if json {
                let listing = Listing {
                    root: &root,
                    store: store_name,
                    semaphores: &semaphores,
                };
                println!(
                    "{}",
                    serde_json::to_string_pretty(&listing).expect("a listing always encodes")
                );
            } else {
                print!(
                    "{}",
                    render_listing(&root, store_name, &semaphores, SystemTime::now())
                );
            }
            Ok(Done::Ok)
        }
    })())
}

/// A listing as `status --json` prints it; fields are only ever added.
#[derive(serde::Serialize)]
struct Listing<'a> {
    /// What was listed under; empty for the whole store.
    root: &'a str,
    store: &'static str,
    /// In order of prefix.
    semaphores: &'a [Summary],
}

/// `status` of one semaphore. A semaphore nobody holds or waits for is
/// idle, not missing: no store keeps a record of it, and the answer is
/// still an answer (0).
fn status_of_one(admin: &dyn Admin, json: bool) -> Result<Done, Failure> {
    let mut status = admin.status()?;
    status.conflict = status.conflict.take().or_else(|| status.over_limit());
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&status).expect("a status always encodes")
        );
    } else {
        print!("{}", render(&status, SystemTime::now()));
    }
    if let Some(conflict) = status.conflict {
        return Err(StoreError::conflict(conflict).into());
    }
    Ok(Done::Ok)
}

/// What the store's layout of the record means to an operator.
fn layout_words(layout: &str) -> Option<&'static str> {
    match layout {
        "map" => Some("recorded as consul lock -n records it: consul lock can share these slots"),
        "list" => Some(
            "recorded with its holders as a list, as in Consul's semaphore guide: consul lock cannot read it",
        ),
        _ => None,
    }
}

/// `status` of one semaphore as a table, sized to its content: the
/// columns as wide as their longest value, those with nothing to say left
/// out, times as ages (the exact ones are in `--json`).
fn render(status: &Status, now: SystemTime) -> String {
    let (held, waiting) = (status.holders.len(), status.waiters.len());
    let mut out = match status.limit {
        // Most stores keep nothing of a semaphore nobody uses; ZooKeeper
        // keeps its limit record.
        _ if held == 0 && waiting == 0 => format!(
            "{}: idle, nobody holds a slot or waits for one ({} store{})\n",
            status.prefix,
            status.store,
            status
                .limit
                .map(|limit| format!(", limit {limit} recorded"))
                .unwrap_or_default()
        ),
        Some(limit) => format!(
            "{}: {held} of {limit} slots held, {waiting} waiting ({} store)\n",
            status.prefix, status.store
        ),
        None => format!(
            "{}: {held} held, {waiting} waiting, no limit recorded yet ({} store)\n",
            status.prefix, status.store
        ),
    };
    if let Some(words) = status.layout.and_then(layout_words) {
        out.push_str(&format!("  {words}\n"));
    }
    let table = ContenderTable::new(&status.holders, &status.waiters, now);
    out.push_str(&table.render("HOLDERS"));
    out.push_str(&table.for_waiters().render("WAITING (in arrival order)"));
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

/// Identifiers shown in a table are cut to this many characters, longer
/// where that is not enough to tell them apart: `release --session` takes
/// a unique beginning, and the whole of each is in `--json`.
const SHORT_ID: usize = 8;

/// The shortest beginning of `id`, `SHORT_ID` characters at least, that
/// no other of `ids` shares.
fn short_id<'a>(id: &'a str, ids: &[&str]) -> &'a str {
    let chars: Vec<(usize, char)> = id.char_indices().collect();
    for length in SHORT_ID..chars.len() {
        let beginning = &id[..chars[length].0];
        if !ids
            .iter()
            .any(|other| *other != id && other.starts_with(beginning))
        {
            return beginning;
        }
    }
    id
}

/// Whether a contender's Consul node is its host by another name (the
/// agent's node is named after its host, often the short name): NODE
/// would then say what HOST says.
fn node_is_host(contender: &ContenderStatus) -> bool {
    match (&contender.node, &contender.host) {
        (Some(node), Some(host)) => host == node || host.split('.').next() == Some(node.as_str()),
        _ => false,
    }
}

/// The holders and the waiters of one semaphore in columns shared by both,
/// so that their values line up.
struct ContenderTable {
    headers: Vec<&'static str>,
    holders: Vec<Vec<String>>,
    waiters: Vec<Vec<String>>,
    showing_waiters: bool,
}

impl ContenderTable {
    fn new(
        holders: &[ContenderStatus],
        waiters: &[ContenderStatus],
        now: SystemTime,
    ) -> ContenderTable {
        let ids: Vec<&str> = holders
            .iter()
            .chain(waiters)
            .map(|c| c.session.as_str())
            .collect();
        // Written by whoever can write the store: shown, never obeyed.
        let shown = |value: &Option<String>| {
            value
                .as_deref()
                .map(|v| crate::report::printable(v).into_owned())
        };
        type Column = (&'static str, fn(&ContenderStatus) -> bool);
        let columns: [Column; 6] = [
            ("SESSION", |_| true),
            ("HOST", |c| c.host.is_some()),
            ("PID", |c| c.pid.is_some()),
            ("NODE", |c| c.node.is_some() && !node_is_host(c)),
            ("STARTED", |c| c.started.is_some()),
            ("COMMAND", |c| c.command.is_some()),
        ];
        let kept: Vec<usize> = (0..columns.len())
            .filter(|&i| holders.iter().chain(waiters).any(columns[i].1))
            .collect();
        let row = |c: &ContenderStatus| -> Vec<String> {
            let started = c.started.as_deref().map(|text| {
                crate::report::parse_timestamp(text)
                    .and_then(|at| crate::duration::ago(at, now))
                    .unwrap_or_else(|| crate::report::printable(text).into_owned())
            });
            let cells = [
                Some(crate::report::printable(short_id(&c.session, &ids)).into_owned()),
                shown(&c.host),
                c.pid.map(|p| p.to_string()),
                shown(&c.node),
                started,
                shown(&c.command),
            ];
            kept.iter()
                .map(|&i| cells[i].clone().unwrap_or_else(|| "-".to_string()))
                .collect()
        };
        ContenderTable {
            headers: kept.iter().map(|&i| columns[i].0).collect(),
            holders: holders.iter().map(row).collect(),
            waiters: waiters.iter().map(row).collect(),
            showing_waiters: false,
        }
    }

    fn for_waiters(self) -> ContenderTable {
        ContenderTable {
            showing_waiters: true,
            ..self
        }
    }

    /// The rows shown under `title`, or nothing if there are none.
    fn render(&self, title: &str) -> String {
        let rows = if self.showing_waiters {
            &self.waiters
        } else {
            &self.holders
        };
        if rows.is_empty() {
            return String::new();
        }
        let widths: Vec<usize> = (0..self.headers.len())
            .map(|i| {
                self.holders
                    .iter()
                    .chain(&self.waiters)
                    .map(|row| width(&row[i]))
                    .chain([self.headers[i].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: &[&str]| {
            let mut text = String::from(" ");
            for (i, cell) in cells.iter().enumerate() {
                text.push(' ');
                text.push_str(cell);
                // The last column is not padded: nothing follows it.
                if i + 1 < cells.len() {
                    text.push_str(&" ".repeat(widths[i] - width(cell) + 1));
                }
            }
            text.push('\n');
            text
        };
        let mut out = format!("\n{title}\n");
        out.push_str(&line(&self.headers));
        for row in rows {
            out.push_str(&line(&row.iter().map(String::as_str).collect::<Vec<_>>()));
        }
        out
    }
}

/// A listing as a table, one line per semaphore.
fn render_listing(root: &str, store: &str, semaphores: &[Summary], now: SystemTime) -> String {
    let place = if root.is_empty() {
        format!("the {store} store")
    } else {
        format!("{root}/ ({store} store)")
    };
    if semaphores.is_empty() {
        return format!("no semaphore in use under {place}\n");
    }
    let headers = ["PREFIX", "LIMIT", "HELD", "WAITING", "OLDEST HOLDER"];
    let rows: Vec<[String; 5]> = semaphores
        .iter()
        .map(|s| {
            // As the waiting line names a holder.
            let oldest = s.oldest_holder.as_ref().map_or_else(
                || "-".to_string(),
                |holder| {
                    Holder {
                        host: holder.host.clone(),
                        pid: holder.pid,
                        since: holder
                            .started
                            .as_deref()
                            .and_then(crate::report::parse_timestamp),
                    }
                    .describe(now)
                },
            );
            [
                crate::report::printable(&s.prefix).into_owned(),
                s.limit.map_or_else(|| "?".to_string(), |l| l.to_string()),
                s.held.to_string(),
                s.waiting.to_string(),
                oldest,
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..headers.len())
        .map(|i| {
            rows.iter()
                .map(|row| width(&row[i]))
                .chain([headers[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: [&str; 5]| {
        let pad = |i: usize| " ".repeat(widths[i] - width(cells[i]));
        // Counts are aligned right, names left.
        format!(
            "{}{}  {}{}  {}{}  {}{}  {}\n",
            cells[0],
            pad(0),
            pad(1),
            cells[1],
            pad(2),
            cells[2],
            pad(3),
            cells[3],
            cells[4]
        )
    };
    let count = match semaphores.len() {
        1 => "1 semaphore".to_string(),
        n => format!("{n} semaphores"),
    };
    let mut out = format!("{count} in use under {place}\n\n");
    out.push_str(&line(headers));
    for row in &rows {
        out.push_str(&line([&row[0], &row[1], &row[2], &row[3], &row[4]]));
    }
    out
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
                    // Store-neutral words: not every store keeps the
                    // limit in a record (PostgreSQL's contenders carry it).
                    (Some(limit), 0) => println!("reset {prefix}: cleared the limit ({limit})"),
                    (Some(limit), n) => println!(
                        "reset {prefix}: {}, cleared the limit ({limit})",
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ContenderInfo;
    use std::time::{Duration, UNIX_EPOCH};

    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_795_305_991)
    }

    fn contender(session: &str, host: &str, pid: u64, age: u64, command: &str) -> ContenderStatus {
        ContenderStatus::new(
            session.to_string(),
            ContenderInfo {
                host: Some(host.to_string()),
                pid: Some(pid),
                command: Some(command.to_string()),
                started: Some(crate::report::timestamp(now() - Duration::from_secs(age))),
            },
            0,
        )
    }

    fn status(
        store: &'static str,
        limit: u32,
        holders: Vec<ContenderStatus>,
        waiters: Vec<ContenderStatus>,
    ) -> Status {
        Status {
            prefix: "service/db".to_string(),
            limit: Some(limit),
            layout: None,
            holders,
            waiters,
            dead_holders: Vec::new(),
            store,
            conflict: None,
            stale: Vec::new(),
            lock_delay_ms: None,
        }
    }

    #[test]
    fn columns_are_sized_to_their_content_and_empty_ones_left_out() {
        let table = render(
            &status(
                "local",
                2,
                vec![
                    contender("12", "web-3", 812, 252, "./nightly.sh"),
                    contender("13", "web-7", 55, 10, "./nightly.sh --full"),
                ],
                vec![contender("14", "web-3", 9001, 3, "./nightly.sh")],
            ),
            now(),
        );
        assert_eq!(
            table,
            "service/db: 2 of 2 slots held, 1 waiting (local store)

HOLDERS
  SESSION  HOST   PID   STARTED    COMMAND
  12       web-3  812   4m12s ago  ./nightly.sh
  13       web-7  55    10s ago    ./nightly.sh --full

WAITING (in arrival order)
  SESSION  HOST   PID   STARTED    COMMAND
  14       web-3  9001  3s ago     ./nightly.sh
"
        );
    }

    #[test]
    fn a_typical_semaphore_fits_80_columns() {
        // Consul: session IDs are UUIDs, and each session has a node.
        let uuid = |n: u32| format!("{n:08x}-5e1c-4c5f-9a3b-0d2e4f6a8b1c");
        let on_consul = |n: u32, age| ContenderStatus {
            node: Some(format!("web-{n}")),
            ..contender(
                &uuid(n),
                &format!("web-{n}.example.com"),
                40_000 + u64::from(n),
                age,
                "./backup.sh --full /srv/data",
            )
        };
        let mut typical = status(
            "consul",
            4,
            (1..=4)
                .map(|n| on_consul(n, 3_600 + u64::from(n) * 61))
                .collect(),
            (5..=7).map(|n| on_consul(n, u64::from(n))).collect(),
        );
        typical.layout = Some("map");
        let table = render(&typical, now());
        for line in table.lines() {
            assert!(
                line.chars().count() <= 80,
                "{} columns: {line}\n{table}",
                line.chars().count()
            );
        }
        // Identifiers are cut to a unique beginning, which release takes.
        assert!(table.contains("  00000001  web-1.example.com"), "{table}");
        assert!(table.contains("1h1m1s ago"), "{table}");
        assert!(
            table.contains("consul lock can share these slots"),
            "{table}"
        );
        assert!(!table.contains("map form"), "{table}");
    }

    #[test]
    fn identifiers_are_cut_where_they_stay_unique() {
        let ids = ["0a1b2c3d4e5f", "0a1b2c3d9999", "77"];
        assert_eq!(short_id("0a1b2c3d4e5f", &ids), "0a1b2c3d4");
        assert_eq!(short_id("0a1b2c3d9999", &ids), "0a1b2c3d9");
        assert_eq!(short_id("77", &ids), "77");
        assert_eq!(
            short_id("ffffffffffffffff", &["ffffffffffffffff"]),
            "ffffffff"
        );
    }

    #[test]
    fn a_semaphore_nobody_uses_is_idle() {
        let mut idle = status("consul", 1, Vec::new(), Vec::new());
        idle.limit = None;
        assert_eq!(
            render(&idle, now()),
            "service/db: idle, nobody holds a slot or waits for one (consul store)\n"
        );
    }

    #[test]
    fn what_a_contender_says_of_itself_is_shown_not_obeyed() {
        let mut holder = contender("1", "web\x1b[2J", 1, 1, "echo \x1b]0;owned\x07");
        holder.started = Some("yesterday".into());
        let table = render(&status("local", 1, vec![holder], Vec::new()), now());
        assert!(!table.contains('\x1b'), "{table:?}");
        assert!(table.contains("web\\x1b[2J"), "{table}");
        assert!(table.contains("yesterday"), "{table}");
    }

    #[test]
    fn a_listing_is_one_line_per_semaphore() {
        let oldest = contender("a", "web-3", 812, 252, "./nightly.sh");
        let semaphores = [
            Summary::new(
                "jobs/nightly".into(),
                Some(2),
                vec![contender("b", "web-7", 55, 10, "x"), oldest],
                1,
            ),
            Summary::new("jobs/x".into(), None, Vec::new(), 12),
        ];
        assert_eq!(
            render_listing("jobs", "redis", &semaphores, now()),
            "2 semaphores in use under jobs/ (redis store)

PREFIX        LIMIT  HELD  WAITING  OLDEST HOLDER
jobs/nightly      2     2        1  web-3 pid 812, started 4m12s ago
jobs/x            ?     0       12  -
"
        );
        assert_eq!(
            render_listing("", "etcd", &[], now()),
            "no semaphore in use under the etcd store\n"
        );
    }

    #[test]
    fn a_root_is_a_prefix_ending_in_a_slash_or_none() {
        let under = |prefix| match scope(prefix) {
            Scope::Under(root) => Some(root),
            Scope::One(_) => None,
        };
        assert_eq!(under(None).as_deref(), Some(""));
        assert_eq!(under(Some("/")).as_deref(), Some(""));
        assert_eq!(under(Some("//")).as_deref(), Some(""));
        assert_eq!(under(Some("jobs/")).as_deref(), Some("jobs/"));
        assert_eq!(under(Some("jobs")), None);
    }
}
