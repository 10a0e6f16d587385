//! The local store's decisions, free of I/O.

use std::collections::BTreeSet;

use super::record::State;

/// What a contender does after looking at the live holders and waiters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Take a slot.
    Take,
    /// Every slot is held, or promised to a waiter ahead: wait on `wait_on`.
    Full { wait_on: WaitOn },
}

/// What a waiter sleeps on until its turn may have come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitOn {
    /// Any change in the directory (a holder or a waiter ahead leaving):
    /// one departure may give us a slot.
    AnyDeparture,
    /// The queue file of the waiter just ahead, which it unlocks when it
    /// takes its slot, leaves or dies: our turn needs at least two
    /// departures, so its turn comes first.
    Ticket(u64),
}

/// Decides for the contender with ticket `me`, given the live holders and
/// the live waiters (tickets are handed out in order of arrival). Slots go
/// in order of arrival: `me` takes one only while the live holders plus the
/// live waiters that arrived before it are fewer than `limit`.
///
/// ```
/// use consem::store::local::{decide, Decision, WaitOn};
/// assert_eq!(decide(&[1], &[2, 3], 3, 2), Decision::Full { wait_on: WaitOn::AnyDeparture });
/// assert_eq!(decide(&[1], &[2, 3], 2, 2), Decision::Take);
/// assert_eq!(decide(&[1], &[2, 3, 4], 4, 2), Decision::Full { wait_on: WaitOn::Ticket(3) });
/// ```
pub fn decide(holders: &[u64], waiters: &[u64], me: u64, limit: u32) -> Decision {
    let ahead = waiters.iter().copied().filter(|&t| t < me);
    let just_ahead = ahead.clone().max();
    let queued = holders.len() + ahead.count();
    let limit = limit as usize;
    if queued < limit {
        return Decision::Take;
    }
    let wait_on = match just_ahead {
        Some(ticket) if queued > limit => WaitOn::Ticket(ticket),
        _ => WaitOn::AnyDeparture,
    };
    Decision::Full { wait_on }
}

/// What the prefix's directory shows of one ticket that has files there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    pub ticket: u64,
    /// Its contender file is there and locked.
    pub live: bool,
    /// Its queue file is there: a waiter keeps it until it takes its slot.
    pub queued: bool,
    /// The `--limit` its contender file says it joined with.
    pub limit: Option<u32>,
}

/// The record rebuilt from the files present, when `state` is missing (deleted
/// by hand) or was cut short, so that the prefix goes on where it stood:
/// the live contenders without a queue file hold slots, so the limit still
/// holds; the limit is the one the first live contender joined with (a
/// contender with another limit is refused while any is live); tickets go
/// on past every file present; the fence goes on from `fence_floor`, which
/// every acquisition raises before it writes `state`. `found` is in ticket
/// order.
pub fn rebuild(found: &[Found], fence_floor: u64) -> State {
    let live = found.iter().filter(|f| f.live);
    State {
        limit: live.clone().find_map(|f| f.limit),
        next: found.last().map_or(0, |f| f.ticket + 1),
        fence: fence_floor,
        holders: live.filter(|f| !f.queued).map(|f| f.ticket).collect(),
    }
}

/// The first ticket from `next` on that no file uses: a file a dead
/// contender of another user left (which we may not remove), or one put
/// there by hand, keeps its ticket from being handed out again.
pub fn free_ticket(next: u64, used: &BTreeSet<u64>) -> u64 {
    (next..)
        .find(|ticket| !used.contains(ticket))
        .expect("fewer files than tickets")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_a_free_slot_in_turn() {
        assert_eq!(decide(&[], &[], 1, 1), Decision::Take);
        assert_eq!(decide(&[1], &[], 2, 2), Decision::Take);
        // A waiter that arrived first gets the one free slot.
        assert_eq!(
            decide(&[1], &[2], 3, 2),
            Decision::Full {
                wait_on: WaitOn::AnyDeparture
            }
        );
        assert_eq!(decide(&[1], &[2, 3], 2, 2), Decision::Take);
    }

    #[test]
    fn a_waiter_further_back_waits_on_the_one_just_ahead() {
        assert_eq!(
            decide(&[1], &[2, 3, 4], 4, 1),
            Decision::Full {
                wait_on: WaitOn::Ticket(3)
            }
        );
        // One departure away: any change may serve it.
        assert_eq!(
            decide(&[1], &[2], 2, 1),
            Decision::Full {
                wait_on: WaitOn::AnyDeparture
            }
        );
        // More holders than slots (a hand-edited state), nobody ahead.
        assert_eq!(
            decide(&[1, 2, 3], &[4], 4, 2),
            Decision::Full {
                wait_on: WaitOn::AnyDeparture
            }
        );
    }

    fn found(ticket: u64, live: bool, queued: bool, limit: Option<u32>) -> Found {
        Found {
            ticket,
            live,
            queued,
            limit,
        }
    }

    #[test]
    fn a_lost_record_is_rebuilt_from_the_live_contenders() {
        let files = [
            // A dead holder's leftovers, of another user.
            found(2, false, false, Some(2)),
            found(4, true, false, Some(2)),
            found(5, true, true, Some(2)),
            found(7, true, false, Some(2)),
            // A stray queue file with no contender file.
            found(9, false, true, None),
        ];
        assert_eq!(
            rebuild(&files, 41),
            State {
                limit: Some(2),
                next: 10,
                fence: 41,
                holders: vec![4, 7],
            }
        );
        // Nobody live: no limit, the fence and tickets still go on.
        assert_eq!(
            rebuild(&[found(3, false, false, Some(1))], 12),
            State {
                limit: None,
                next: 4,
                fence: 12,
                holders: vec![],
            }
        );
        assert_eq!(rebuild(&[], 0), State::default());
        // A contender file of an older consem says no limit.
        assert_eq!(
            rebuild(
                &[found(1, true, false, None), found(2, true, true, Some(3))],
                0
            )
            .limit,
            Some(3)
        );
    }

    #[test]
    fn a_ticket_with_files_is_never_handed_out_again() {
        assert_eq!(free_ticket(4, &BTreeSet::new()), 4);
        assert_eq!(free_ticket(4, &BTreeSet::from([1, 4, 5, 7])), 6);
        assert_eq!(free_ticket(8, &BTreeSet::from([1, 4, 5, 7])), 8);
    }
}
