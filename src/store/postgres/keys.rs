//! What the PostgreSQL store keeps in the server's lock table, and what a
//! reading of `pg_locks` tells, without I/O. A semaphore is a family of
//! session-level advisory locks in the two-int form `(prefix key, n)`:
//! the slots `(p, 0)` to `(p, limit - 1)`, held exclusively by the
//! holders; the line `(p, LINE)`, held by the first waiter, the others
//! queued behind it in the server's lock queue; and the limit's mark
//! `(p, MARK + limit)`, held shared by every contender from its join to
//! its leaving, so that a contender with another limit sees it. Nothing
//! else is written: everything goes with the session.

use crate::store::{ContenderInfo, ContenderStatus, Holder, Progress, Status};

/// The second key of the line lock.
pub const LINE: u32 = 2_000_000_000;
/// The second key of a limit's mark is `MARK + limit`.
pub const MARK: u32 = 1_000_000_000;
/// The largest limit: slots are `0..limit`, below every mark.
pub const LARGEST_LIMIT: u32 = 10_000;

/// The first key of a prefix's locks: FNV-1a of the prefix, 32 bits, as
/// the signed int4 that `pg_advisory_lock(int4, int4)` takes. Two prefixes
/// with the same key (one chance in four billion) share their slots: never
/// more holders than the limit, maybe fewer.
pub fn prefix_key(prefix: &str) -> i32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in prefix.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash as i32
}

/// The prefix key as `pg_locks.classid` shows it (an oid, unsigned).
pub fn classid(key: i32) -> u32 {
    key as u32
}

/// The channel a leaving holder notifies and the first waiter listens to.
pub fn channel(key: i32) -> String {
    format!("consem_{:08x}", classid(key))
}

/// A statement that runs `call` (an expression, or a query of one value
/// in parentheses) only on the session `pid`, and says which session it
/// ran on: `(pid, value as text)`, the value NULL where it did not run. A
/// pooler that hands server sessions from one client to another between
/// transactions (PgBouncer's transaction and statement pooling) would let
/// a statement reach a session whose advisory locks are another
/// contender's, and advisory locks are re-entrant: two contenders would
/// then hold the same slot.
pub fn guarded(pid: i32, call: &str) -> String {
    let call = if call.starts_with("SELECT ") {
        format!("({call})")
    } else {
        call.to_string()
    };
    format!("SELECT pg_backend_pid(), CASE WHEN pg_backend_pid() = {pid} THEN ({call})::text END")
}

/// The statements of a contender's first round trip, after the session's
/// setup and [`SESSION_CHECK`] in the same message (one transaction, so
/// one server session even behind a pooler): the mark, a look for another
/// limit, the line and a free slot, tried without waiting; with a slot,
/// the fence (and its [`FENCE_RECORD`]) and letting the line go. Each statement gives one row; the
/// second records what was taken (see [`Joined`]) for the last two, and
/// nothing is taken on a session that is not fresh. An uncontended
/// contender is done in this one round trip; any other goes on from where
/// it stands, one statement at a time.
pub fn join(key: i32, limit: u32) -> String {
    let fresh = "current_setting('consem.fresh') = 'true'";
    let slot_taken = "current_setting('consem.taken') ~ '^[0-9]+$'";
    format!(
        "SELECT CASE WHEN {fresh} THEN pg_advisory_lock_shared({key}, {mark})::text END;\n\
         SELECT set_config('consem.taken', CASE WHEN NOT {fresh} THEN 'stale' \
         WHEN EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND granted \
         AND classid = {classid} AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND objid BETWEEN {MARK} AND {last_mark} AND objid <> {mark}) THEN 'other limit' \
         WHEN pg_try_advisory_lock({key}, {LINE}) THEN coalesce((SELECT k FROM generate_series(0, {last_slot}) AS k \
         WHERE pg_try_advisory_lock({key}, k) LIMIT 1)::text, 'line') \
         ELSE 'behind' END, true);\n\
         SELECT CASE WHEN {slot_taken} THEN txid_current() END;\n\
         SELECT CASE WHEN {slot_taken} THEN {FENCE_RECORD} END;\n\
         SELECT CASE WHEN {slot_taken} THEN pg_advisory_unlock({key}, {LINE}) END",
        mark = MARK + limit,
        classid = classid(key),
        last_mark = MARK + LARGEST_LIMIT,
        last_slot = limit - 1,
    )
}

/// A record written to the server's log in the transaction that reads the
/// fence: a transaction that writes nothing commits without waiting for
/// its commit to reach the disk, and a crash a moment later would hand
/// its transaction id, the fence, out again.
pub const FENCE_RECORD: &str = "pg_logical_emit_message(true, 'consem', 'fence')";

/// The statement that reads the session's backend and whether the server
/// is a standby, and records for the rest of its transaction, as
/// `consem.fresh`, that the session may be used: on a primary, holding no
/// advisory lock (a new session holds none; one that does was another
/// client's, handed to us by a pooler).
/// Its last column is the port the server took the connection on (NULL
/// on a Unix socket): another than the one consem dialed means something
/// in between, maybe a pooler.
pub const SESSION_CHECK: &str = "SELECT pg_backend_pid(), pg_is_in_recovery(), \
     set_config('consem.fresh', (NOT pg_is_in_recovery() AND NOT EXISTS \
     (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()))::text, true), \
     inet_server_port()";

/// What a contender's first round trip took (see [`join`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Joined {
    /// A slot, and the fence read while holding it; the line let go.
    Slot { slot: u32, fence: u64 },
    /// The line, with every slot taken: the first waiter.
    Line,
    /// Someone else has the line.
    Behind,
    /// A contender with another limit is there (or was, as we looked).
    OtherLimit,
}

impl Joined {
    /// From the recorded outcome and the fence's row; `None` for a session
    /// that was not fresh (nothing taken).
    pub fn read(taken: &str, fence: Option<&str>) -> Option<Joined> {
        Some(match taken {
            "line" => Joined::Line,
            "behind" => Joined::Behind,
            "other limit" => Joined::OtherLimit,
            slot => Joined::Slot {
                slot: slot.parse().ok()?,
                fence: fence?.parse().ok()?,
            },
        })
    }
}

/// The comment that opens a described statement; the description
/// follows, to the end of the line (see [`described`]).
const TAG: &str = "-- consem ";

/// The longest statement `pg_stat_activity.query` keeps by default
/// (`track_activity_query_size`, 1024 bytes), less a margin: a longer
/// description would be cut and unreadable.
const SHOWN_QUERY: usize = 1000;

/// `statement` with the contender's description before it, as a comment
/// line: `pg_stat_activity.query` shows a session's last statement, so
/// that `consem status` reads who holds and who waits from there. The
/// description comes first because the server keeps only a statement's
/// first kilobyte; the JSON is one line (serde escapes every control
/// character), so that the comment cannot end early; a command too long
/// for the kept part is cut.
pub fn described(statement: &str, info: &ContenderInfo, prefix: &str) -> String {
    let mut info = info.clone();
    loop {
        let mut fields = info.to_json();
        if prefix.len() <= NAMED_PREFIX {
            fields.insert(PREFIX_FIELD.into(), prefix.into());
        }
        let comment = format!("{TAG}{}", serde_json::Value::Object(fields));
        match &mut info.command {
            Some(command) if comment.len() > SHOWN_QUERY && !command.is_empty() => {
                let cut = (0..command.len().saturating_sub(comment.len() - SHOWN_QUERY))
                    .rev()
                    .find(|&i| command.is_char_boundary(i))
                    .unwrap_or(0);
                command.truncate(cut);
            }
            _ => return format!("{comment}\n{statement}"),
        }
    }
}

/// The field of a description that names the prefix: the lock table
/// keeps only the prefix's key, and a listing names each semaphore from
/// its contenders' descriptions.
const PREFIX_FIELD: &str = "Prefix";

/// The longest prefix a description names: a longer one would crowd the
/// command out of the statement, and its semaphore is listed by its key.
const NAMED_PREFIX: usize = 256;

/// The description's JSON in a statement of [`described`].
fn description_json(query: &str) -> Option<&str> {
    let rest = query.strip_prefix(TAG)?;
    Some(rest.split('\n').next().unwrap_or(rest))
}

/// The prefix a statement of [`described`] names.
fn named_prefix(query: &str) -> Option<String> {
    let fields: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(description_json(query)?).ok()?;
    Some(fields.get(PREFIX_FIELD)?.as_str()?.to_string())
}

/// The prefix a statement of [`described`] names, if its key is `key`.
pub fn prefix_named(query: &str, key: i32) -> Option<String> {
    named_prefix(query).filter(|prefix| prefix_key(prefix) == key)
}

/// The description a statement of [`described`] carries.
pub fn description(query: &str) -> ContenderInfo {
    match description_json(query) {
        Some(json) => ContenderInfo::parse(json.as_bytes()),
        None => ContenderInfo::default(),
    }
}

/// One row of a prefix's advisory locks, joined with its session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockRow {
    pub pid: i32,
    /// The second key (`pg_locks.objid`).
    pub key: u32,
    pub granted: bool,
    /// When the session started, in microseconds since the epoch: the
    /// contenders' order of arrival.
    pub since_micros: i64,
    /// Its last statement, if the reader may see it.
    pub query: Option<String>,
}

/// A contender, as the lock table shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub pid: i32,
    pub limit: Option<u32>,
    pub slot: Option<u32>,
    pub since_micros: i64,
    pub info: ContenderInfo,
}

/// The contenders of a prefix, in order of arrival: every session with a
/// mark or a slot (a session that holds only the line, or waits for it, is
/// still joining or has a mark too).
/// Two prefixes whose keys collide share the lock rows: a contender whose
/// description names another prefix is that one's, and left out.
pub fn contenders(prefix: &str, rows: &[LockRow]) -> Vec<Seen> {
    let mut seen: Vec<Seen> = Vec::new();
    let others: std::collections::BTreeSet<i32> = rows
        .iter()
        .filter(|row| {
            row.query
                .as_deref()
                .and_then(named_prefix)
                .is_some_and(|named| named != prefix)
        })
        .map(|row| row.pid)
        .collect();
    for row in rows.iter().filter(|row| !others.contains(&row.pid)) {
        let index = match seen.iter().position(|s| s.pid == row.pid) {
            Some(index) => index,
            None => {
                seen.push(Seen {
                    pid: row.pid,
                    limit: None,
                    slot: None,
                    since_micros: row.since_micros,
                    info: row.query.as_deref().map(description).unwrap_or_default(),
                });
                seen.len() - 1
            }
        };
        let contender = &mut seen[index];
        match row.key {
            key if key < LARGEST_LIMIT && row.granted => contender.slot = Some(key),
            key if (MARK..=MARK + LARGEST_LIMIT).contains(&key) && row.granted => {
                contender.limit = Some(key - MARK)
            }
            _ => {}
        }
    }
    seen.retain(|s| s.limit.is_some() || s.slot.is_some());
    seen.sort_by_key(|s| (s.since_micros, s.pid));
    seen
}

/// The limit the prefix is in use with, as the holders' marks say (else
/// the oldest contender's); `None` when nobody is there.
pub fn limit_in_use(seen: &[Seen]) -> Option<u32> {
    seen.iter()
        .filter(|s| s.slot.is_some())
        .chain(seen)
        .find_map(|s| s.limit)
}

/// Another limit than `ours` among the holders (or, where nobody holds,
/// among the others): the conflict a contender refuses to join.
pub fn other_limit(seen: &[Seen], ours: u32, me: i32) -> Option<u32> {
    let others = || seen.iter().filter(move |s| s.pid != me);
    let holders_limit = others()
        .filter(|s| s.slot.is_some())
        .find_map(|s| s.limit.filter(|&l| l != ours));
    if others().any(|s| s.slot.is_some()) {
        return holders_limit;
    }
    others().find_map(|s| s.limit.filter(|&l| l != ours))
}

fn holder(seen: &Seen) -> Holder {
    Holder::from(&seen.info)
}

/// What a waiter tells of the slots it waits for.
pub fn progress(seen: &[Seen], limit: u32, me: i32) -> Progress {
    let mine = seen.iter().find(|s| s.pid == me);
    Progress {
        limit,
        holders: seen
            .iter()
            .filter(|s| s.slot.is_some())
            .map(holder)
            .collect(),
        ahead: seen
            .iter()
            .filter(|s| s.slot.is_none() && s.pid != me)
            .filter(|s| mine.is_none_or(|m| (s.since_micros, s.pid) < (m.since_micros, m.pid)))
            .count(),
    }
}

fn contender_status(seen: &Seen) -> ContenderStatus {
    ContenderStatus::new(
        seen.pid.to_string(),
        seen.info.clone(),
        u64::try_from(seen.since_micros).unwrap_or_default(),
    )
}

/// `consem status` of a prefix, from its lock rows.
pub fn status(prefix: &str, rows: &[LockRow]) -> Status {
    let seen = contenders(prefix, rows);
    let limit = limit_in_use(&seen);
    let mut status = Status {
        prefix: prefix.to_string(),
        limit,
        layout: None,
        holders: seen
            .iter()
            .filter(|s| s.slot.is_some())
            .map(contender_status)
            .collect(),
        waiters: seen
            .iter()
            .filter(|s| s.slot.is_none())
            .map(contender_status)
            .collect(),
        // A slot goes with its session: no holder outlives its consem.
        dead_holders: Vec::new(),
        store: "postgres",
        conflict: None,
        stale: Vec::new(),
        lock_delay_ms: None,
    };
    let limits: std::collections::BTreeSet<u32> = seen.iter().filter_map(|s| s.limit).collect();
    status.conflict = status.over_limit().or_else(|| {
        (limits.len() > 1).then(|| {
            format!(
                "{prefix} is in use with several limits ({}): the contenders of the later ones wait to be refused",
                limits
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
    });
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pid: i32, key: u32, granted: bool, since: i64) -> LockRow {
        LockRow {
            pid,
            key,
            granted,
            since_micros: since,
            query: None,
        }
    }

    #[test]
    fn a_prefix_key_is_fnv1a_and_stable() {
        // FNV-1a 32 of "" and "a", as published.
        assert_eq!(classid(prefix_key("")), 0x811c_9dc5);
        assert_eq!(classid(prefix_key("a")), 0xe40c_292c);
        assert_ne!(prefix_key("jobs/a"), prefix_key("jobs/b"));
        assert_eq!(channel(prefix_key("a")), "consem_e40c292c");
    }

    #[test]
    fn a_guarded_call_runs_only_on_its_session_and_says_where_it_ran() {
        assert_eq!(
            guarded(42, "pg_try_advisory_lock(1, 2)"),
            "SELECT pg_backend_pid(), CASE WHEN pg_backend_pid() = 42 THEN (pg_try_advisory_lock(1, 2))::text END"
        );
        assert!(guarded(42, "SELECT k FROM t LIMIT 1")
            .contains("THEN ((SELECT k FROM t LIMIT 1))::text"));
    }

    #[test]
    fn a_description_rides_in_a_comment_and_reads_back() {
        let info = ContenderInfo {
            host: Some("h".into()),
            pid: Some(7),
            command: Some("echo 'x' \n-- consem {}\x1b".into()),
            started: Some("2026-11-27T10:00:00.000Z".into()),
        };
        let text = described("SELECT 1;\nSELECT 2", &info, "jobs/a");
        assert!(text.starts_with("-- consem {"), "{text}");
        assert!(text.ends_with("}\nSELECT 1;\nSELECT 2"), "{text}");
        assert_eq!(text.lines().count(), 3, "one comment line: {text:?}");
        assert_eq!(description(&text), info);
        assert_eq!(
            prefix_named(&text, prefix_key("jobs/a")),
            Some("jobs/a".into())
        );
        assert_eq!(prefix_named(&text, prefix_key("jobs/b")), None);
        assert_eq!(description("SELECT 1"), ContenderInfo::default());
        let long = ContenderInfo {
            command: Some("é".repeat(2000)),
            ..info
        };
        // The kept kilobyte holds the whole description, however long the
        // statements after it.
        let text = described(&"SELECT 1;".repeat(500), &long, "jobs/a");
        let kept = &text[..SHOWN_QUERY];
        assert!(description(kept).command.unwrap().starts_with('é'));
    }

    #[test]
    fn the_first_round_trip_says_what_it_took() {
        assert_eq!(
            Joined::read("2", Some("7301")),
            Some(Joined::Slot {
                slot: 2,
                fence: 7301
            })
        );
        assert_eq!(Joined::read("line", None), Some(Joined::Line));
        assert_eq!(Joined::read("behind", None), Some(Joined::Behind));
        assert_eq!(Joined::read("other limit", None), Some(Joined::OtherLimit));
        assert_eq!(Joined::read("stale", None), None);
        assert_eq!(Joined::read("2", None), None);
        let join = join(prefix_key("a"), 3);
        assert_eq!(join.matches(";\n").count(), 4, "five statements: {join}");
        assert!(join.contains("pg_advisory_lock_shared(-468965076, 1000000003)"));
        assert!(join.contains("generate_series(0, 2)"));
        assert!(join.contains("objid <> 1000000003"));
    }

    #[test]
    fn holders_waiters_and_the_limit_come_from_the_lock_rows() {
        let rows = [
            row(30, MARK + 2, true, 300),
            row(30, LINE, false, 300),
            row(10, MARK + 2, true, 100),
            row(10, 1, true, 100),
            row(20, MARK + 2, true, 200),
            row(20, LINE, true, 200),
            row(40, MARK + 2, true, 50),
            row(40, 0, true, 50),
            row(50, 3, false, 10),
        ];
        let status = status("p", &rows);
        assert_eq!(status.limit, Some(2));
        let pids = |list: &[ContenderStatus]| {
            list.iter()
                .map(|c| c.session.clone())
                .collect::<Vec<String>>()
        };
        assert_eq!(pids(&status.holders), ["40", "10"]);
        assert_eq!(pids(&status.waiters), ["20", "30"]);
        assert_eq!(status.conflict, None);
        let seen = contenders("p", &rows);
        assert_eq!(progress(&seen, 2, 30).ahead, 1);
        assert_eq!(progress(&seen, 2, 20).ahead, 0);
        assert_eq!(progress(&seen, 2, 20).holders.len(), 2);
        assert_eq!(other_limit(&seen, 2, 20), None);
        assert_eq!(other_limit(&seen, 3, 20), Some(2));
    }

    /// Two prefixes whose keys collide share the lock rows: each sees only
    /// the contenders whose descriptions name it (or name nothing).
    #[test]
    fn a_colliding_prefix_s_contenders_are_left_out() {
        assert_eq!(prefix_key("p2039599"), prefix_key("p2222382"));
        let info = ContenderInfo::default();
        let described_row = |pid: i32, key: u32, prefix: &str| LockRow {
            query: Some(described("SELECT 1", &info, prefix)),
            ..row(pid, key, true, i64::from(pid))
        };
        let rows = [
            described_row(1, MARK + 1, "p2039599"),
            described_row(1, 0, "p2039599"),
            described_row(2, MARK + 2, "p2222382"),
            described_row(2, 1, "p2222382"),
            row(3, MARK + 1, true, 3),
        ];
        let pids = |prefix: &str| -> Vec<i32> {
            contenders(prefix, &rows).iter().map(|s| s.pid).collect()
        };
        assert_eq!(pids("p2039599"), [1, 3]);
        assert_eq!(pids("p2222382"), [2, 3]);
        assert_eq!(status("p2222382", &rows).holders.len(), 1);
        assert_eq!(other_limit(&contenders("p2222382", &rows), 2, 9), None);
    }

    #[test]
    fn another_limit_counts_among_holders_first() {
        // A waiter with limit 3 behind holders of limit 2: the holders'
        // limit stands; the newcomer with 2 joins.
        let rows = [
            row(1, MARK + 2, true, 1),
            row(1, 0, true, 1),
            row(2, MARK + 3, true, 2),
        ];
        let seen = contenders("p", &rows);
        assert_eq!(other_limit(&seen, 2, 9), None);
        assert_eq!(other_limit(&seen, 3, 2), Some(2));
        assert_eq!(limit_in_use(&seen), Some(2));
        assert!(status("p", &rows)
            .conflict
            .unwrap()
            .contains("several limits (2, 3)"));
        // Nobody holds: any other limit among the contenders.
        let rows = [row(2, MARK + 3, true, 2)];
        assert_eq!(other_limit(&contenders("p", &rows), 2, 9), Some(3));
        assert_eq!(other_limit(&contenders("p", &rows), 3, 9), None);
    }
}
