//! A run that ended without a slot, and the line that says why: what it
//! waited for, and who held the slots.
//!
//! `timed out after 10m waiting for a slot at service/db: 2/2 held (web-3 pid 812, started 4m12s ago; web-7 pid 55, started 10s ago), 3 ahead`

use std::time::{Duration, SystemTime};

use crate::store::Progress;
use crate::{duration, report};

/// Holders named in the line; the others are counted, so that a limit of
/// 100 still makes a line one can read.
const NAMED_HOLDERS: usize = 3;

/// Why a run had no slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoSlot {
    /// The `--timeout` that ran out; `None`: one look (`--try`) found every
    /// slot taken.
    pub timeout: Option<Duration>,
    /// Who held the slots, as the store last said; `None` if it had not
    /// said yet.
    pub seen: Option<Progress>,
}

impl NoSlot {
    /// The line, without `consem: ` before it; `now` dates the holders.
    pub fn describe(&self, prefix: &str, now: SystemTime) -> String {
        let prefix = report::abbreviated(prefix);
        let waited = match self.timeout {
            Some(timeout) => format!(
                "timed out after {} waiting for a slot at {prefix}",
                duration::human(timeout)
            ),
            None => format!("no free slot at {prefix}"),
        };
        let Some(seen) = &self.seen else {
            return format!("{waited}, before the store said who holds the slots");
        };
        let mut line = format!("{waited}: {}/{} held", seen.holders.len(), seen.limit);
        let named: Vec<String> = seen
            .holders
            .iter()
            .filter(|holder| holder.host.is_some())
            .take(NAMED_HOLDERS)
            .map(|holder| holder.describe(now))
            .collect();
        if !named.is_empty() {
            let others = seen.holders.len() - named.len();
            let more = if others > 0 {
                format!("; {others} more")
            } else {
                String::new()
            };
            line.push_str(&format!(" ({}{more})", named.join("; ")));
        }
        match (self.timeout, seen.ahead) {
            (Some(_), 0) => line.push_str(", next in line"),
            (Some(_), ahead) => line.push_str(&format!(", {ahead} ahead")),
            (None, 0) => {}
            (None, waiting) => line.push_str(&format!(", {waiting} waiting")),
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Holder;

    fn holder(host: Option<&str>, pid: u64, held: u64, now: SystemTime) -> Holder {
        Holder {
            host: host.map(String::from),
            pid: Some(pid),
            since: Some(now - Duration::from_secs(held)),
        }
    }

    #[test]
    fn a_timeout_says_what_it_waited_for_and_who_held_the_slots() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let seen = Progress {
            limit: 2,
            holders: vec![
                holder(Some("web-3"), 812, 252, now),
                holder(Some("web-7"), 55, 10, now),
            ],
            ahead: 3,
        };
        let timed_out = NoSlot {
            timeout: Some(Duration::from_secs(600)),
            seen: Some(seen.clone()),
        };
        assert_eq!(
            timed_out.describe("service/db", now),
            "timed out after 10m waiting for a slot at service/db: 2/2 held (web-3 pid 812, started 4m12s ago; web-7 pid 55, started 10s ago), 3 ahead"
        );
        let tried = NoSlot {
            timeout: None,
            seen: Some(Progress { ahead: 0, ..seen }),
        };
        assert_eq!(
            tried.describe("service/db", now),
            "no free slot at service/db: 2/2 held (web-3 pid 812, started 4m12s ago; web-7 pid 55, started 10s ago)"
        );
    }

    #[test]
    fn many_holders_are_counted_and_undescribed_ones_not_named() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let many = NoSlot {
            timeout: Some(Duration::from_secs(90)),
            seen: Some(Progress {
                limit: 100,
                holders: (0..100)
                    .map(|i| holder(Some(&format!("web-{i}")), i, 5, now))
                    .collect(),
                ahead: 0,
            }),
        };
        assert_eq!(
            many.describe("jobs", now),
            "timed out after 1m30s waiting for a slot at jobs: 100/100 held (web-0 pid 0, started 5s ago; web-1 pid 1, started 5s ago; web-2 pid 2, started 5s ago; 97 more), next in line"
        );
        // A holder that says nothing of itself (`consul lock`, Redis's
        // permits) is counted, not named as "?".
        let undescribed = NoSlot {
            timeout: None,
            seen: Some(Progress {
                limit: 2,
                holders: vec![holder(None, 1, 5, now), holder(Some("db-1"), 9, 5, now)],
                ahead: 4,
            }),
        };
        assert_eq!(
            undescribed.describe("jobs", now),
            "no free slot at jobs: 2/2 held (db-1 pid 9, started 5s ago; 1 more), 4 waiting"
        );
        // A holder that just started, a host that would drive a terminal,
        // a prefix of a kilobyte: the line stays one readable line.
        let odd = NoSlot {
            timeout: Some(Duration::from_secs(1)),
            seen: Some(Progress {
                limit: 1,
                holders: vec![Holder {
                    host: Some("evil\x1b[2J".into()),
                    pid: None,
                    since: Some(now - Duration::from_millis(300)),
                }],
                ahead: 1,
            }),
        };
        let line = odd.describe(&"p".repeat(1024), now);
        assert!(
            line.ends_with(": 1/1 held (evil\\x1b[2J, started 0s ago), 1 ahead"),
            "{line}"
        );
        assert!(line.len() < 300, "{line}");
        let unanswered = NoSlot {
            timeout: Some(Duration::from_millis(500)),
            seen: None,
        };
        assert_eq!(
            unanswered.describe("jobs", now),
            "timed out after 500ms waiting for a slot at jobs, before the store said who holds the slots"
        );
    }
}
