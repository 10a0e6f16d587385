//! The operators' commands on one prefix. Everything is read from
//! `pg_locks` (who holds which lock, who waits) and `pg_stat_activity`
//! (when each session started, and the description its last statement
//! carries). Releasing a holder is ending its session
//! (`pg_terminate_backend`): its locks go, its consem sees the loss and
//! stops its command (76), and the first waiter takes the slot.

use std::time::Duration;

use super::keys::{self, LockRow};
use super::link::{failure, number, text, Link, Row};
use super::Settings;
use std::collections::BTreeMap;

use crate::store::{is_under, Admin, ResetOutcome, Status, StoreError, Summary};

pub struct PostgresAdmin {
    settings: Settings,
    prefix: String,
    key: i32,
}

/// The prefix's advisory locks in the current database, with their
/// sessions' start and last statement.
pub fn lock_rows_query(key: i32) -> String {
    format!(
        "SELECT l.pid, l.objid, l.granted, (extract(epoch FROM a.backend_start) * 1000000)::bigint, a.query \
         FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.classid = {} \
         AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        keys::classid(key)
    )
}

/// Every two-int advisory lock in the current database, as
/// [`lock_rows_query`] reads them, each with its first key (column 5).
fn all_lock_rows_query() -> &'static str {
    "SELECT l.pid, l.objid, l.granted, (extract(epoch FROM a.backend_start) * 1000000)::bigint, a.query, l.classid \
     FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
     WHERE l.locktype = 'advisory' AND l.objsubid = 2 \
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
}

pub fn lock_rows(rows: &[Row]) -> Vec<LockRow> {
    rows.iter()
        .filter_map(|row| {
            Some(LockRow {
                pid: number(row, 0)? as i32,
                key: number(row, 1)? as u32,
                granted: text(row, 2) == "t",
                since_micros: number(row, 3).unwrap_or_default(),
                query: row.get(4).cloned().flatten(),
            })
        })
        .collect()
}

impl PostgresAdmin {
    pub fn new(settings: Settings, prefix: &str) -> PostgresAdmin {
        PostgresAdmin {
            settings,
            prefix: prefix.to_string(),
            key: keys::prefix_key(prefix),
        }
    }

    fn open(&self) -> Result<Link, StoreError> {
        Link::open(&self.settings.connection, self.settings.ttl)
    }

    fn read(&self, link: &Link) -> Result<Vec<LockRow>, StoreError> {
        let rows = link
            .run(&lock_rows_query(self.key))
            .map_err(|e| failure(&self.settings.connection, "reading pg_locks", &e))?;
        Ok(lock_rows(&rows))
    }

    /// Ends the sessions `pids`, and waits until the server has dropped
    /// their locks.
    fn terminate(&self, link: &Link, pids: &[i32]) -> Result<(), StoreError> {
        if pids.is_empty() {
            return Ok(());
        }
        let list: Vec<String> = pids.iter().map(i32::to_string).collect();
        link.run(&format!(
            "SELECT pg_terminate_backend(pid) FROM unnest(ARRAY[{}]) AS pid",
            list.join(",")
        ))
        .map_err(|e| {
            let error = failure(&self.settings.connection, "ending a holder's session", &e);
            if error.kind == crate::store::ErrorKind::Denied {
                StoreError::denied(format!(
                    "{error} (ending another role's session takes membership in pg_signal_backend)"
                ))
            } else {
                error
            }
        })?;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            let left = keys::contenders(&self.prefix, &self.read(link)?);
            if !left.iter().any(|s| pids.contains(&s.pid)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

impl Admin for PostgresAdmin {
    fn status(&self) -> Result<Status, StoreError> {
        let link = self.open()?;
        Ok(keys::status(&self.prefix, &self.read(&link)?))
    }

    fn release(&self, session: &str) -> Result<(), StoreError> {
        let link = self.open()?;
        let seen = keys::contenders(&self.prefix, &self.read(&link)?);
        match seen
            .iter()
            .find(|s| s.slot.is_some() && s.pid.to_string() == session)
        {
            Some(holder) => self.terminate(&link, &[holder.pid]),
            None => Ok(()),
        }
    }

    fn reset(&self, force: bool) -> Result<ResetOutcome, StoreError> {
        let link = self.open()?;
        let seen = keys::contenders(&self.prefix, &self.read(&link)?);
        let Some(limit) = keys::limit_in_use(&seen) else {
            return Ok(ResetOutcome::Nothing);
        };
        let holders: Vec<i32> = seen
            .iter()
            .filter(|s| s.slot.is_some())
            .map(|s| s.pid)
            .collect();
        if !force && !holders.is_empty() {
            return Ok(ResetOutcome::LiveHolders(
                holders.iter().map(i32::to_string).collect(),
            ));
        }
        // The limit is carried by the contenders' marks: it goes with
        // the last of them.
        let everyone: Vec<i32> = seen.iter().map(|s| s.pid).collect();
        self.terminate(&link, &everyone)?;
        Ok(ResetOutcome::Reset {
            limit: Some(limit),
            evicted: holders.len(),
        })
    }

    /// One read of every advisory lock of the database, by prefix key. The
    /// lock table keeps keys, not names: each semaphore is named by its
    /// contenders' descriptions, or by its key (`#1a2b3c4d`, listed only
    /// for the whole store) where none names it. Locks without a limit's
    /// mark are another program's.
    fn list(&self) -> Result<Vec<Summary>, StoreError> {
        let link = self.open()?;
        let rows = link
            .run(all_lock_rows_query())
            .map_err(|e| failure(&self.settings.connection, "reading pg_locks", &e))?;
        let mut by_key: BTreeMap<u32, Vec<Row>> = BTreeMap::new();
        for row in rows {
            if let Some(classid) = number(&row, 5).and_then(|k| u32::try_from(k).ok()) {
                by_key.entry(classid).or_default().push(row);
            }
        }
        let mut semaphores = Vec::new();
        for (classid, rows) in by_key {
            let rows = lock_rows(&rows);
            let key = classid as i32;
            let named = rows
                .iter()
                .find_map(|row| keys::prefix_named(row.query.as_deref()?, key));
            let prefix = match named {
                Some(prefix) if is_under(&prefix, &self.prefix) => prefix,
                None if self.prefix.is_empty() => format!("#{classid:08x}"),
                _ => continue,
            };
            let status = keys::status(&prefix, &rows);
            if status.limit.is_some() {
                semaphores.push(Summary::of(status));
            }
        }
        semaphores.sort_by(|a, b| a.prefix.cmp(&b.prefix));
        Ok(semaphores)
    }
}
