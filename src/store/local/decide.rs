//! The local store's decisions, free of I/O.

use super::record::State;

/// What a contender does after looking at the live holders and the queue
/// ahead of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Take a slot.
    Take,
    /// Every slot is held, or a waiter ahead goes first: wait on `wait_on`.
    Full { wait_on: WaitOn },
}

/// What a waiter sleeps on until its turn may have come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitOn {
    /// A holder leaving (or dying), or the record changing: we are first in
    /// the queue, and one departure gives us a slot.
    AnyDeparture,
    /// The queue file of the live waiter just ahead, which it unlocks when
    /// it takes its slot, leaves or dies: its turn comes first.
    Ticket(u64),
}

/// Decides for a contender, given how many holders are live and the live
/// waiter just ahead of it, if any. Slots go in order of arrival: a
/// contender with a waiter ahead waits for that one to go first, and the
/// first in the queue takes a slot while the live holders are fewer than
/// `limit`. So a decision needs the holders (at most `limit` of them) and one
/// waiter, never the whole queue.
pub fn decide(live_holders: usize, just_ahead: Option<u64>, limit: u32) -> Decision {
    match just_ahead {
        Some(ticket) => Decision::Full {
            wait_on: WaitOn::Ticket(ticket),
        },
        None if live_holders < limit as usize => Decision::Take,
        None => Decision::Full {
            wait_on: WaitOn::AnyDeparture,
        },
    }
}

/// What one ticket's files show of it, to a contender looking for the
/// waiter just ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Its queue file is there and locked: a live waiter.
    Waiting,
    /// No queue file: it holds a slot, left, or was never there.
    NotWaiting,
    /// Its queue file is there and nobody locks it: it died while it
    /// waited. Its files are removed where this user may.
    Dead,
}

/// The tickets a waiter knows no live waiter among: `[from, me)`. Nothing
/// makes a waiter of a ticket again once it is not one (tickets are
/// handed out once, in rising order; a holder never waits again), so this
/// only narrows: a waiter never looks at the same ticket twice, save the
/// one it waits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clear {
    pub from: u64,
}

/// Looks for the live waiter just ahead of a contender, from the ticket
/// below `clear.from` down to `waiting_from` (below which nobody waits),
/// and stops at the first one found: the tickets looked at are those
/// between the contender and that waiter (one, in a queue of contenders
/// that all wait), never the whole queue. Narrows `clear`.
pub fn find_just_ahead(
    clear: &mut Clear,
    waiting_from: u64,
    mut look: impl FnMut(u64) -> Seen,
) -> Option<u64> {
    while clear.from > waiting_from {
        let ticket = clear.from - 1;
        if look(ticket) == Seen::Waiting {
            return Some(ticket);
        }
        clear.from = ticket;
    }
    None
}

/// Whether a contender that does not wait (`--try`) may take a slot ahead
/// of the waiters before it, as when there is room for them all: the live
/// holders plus the live waiters ahead are fewer than `limit`. Counts down
/// from the waiter just ahead to `waiting_from`, and stops once they fill
/// the slots: at most `limit` waiters, whatever the queue.
pub fn room_for_all_ahead(
    live_holders: usize,
    just_ahead: u64,
    waiting_from: u64,
    limit: u32,
    mut look: impl FnMut(u64) -> Seen,
) -> bool {
    let mut queued = live_holders + 1;
    for ticket in (waiting_from..just_ahead).rev() {
        if queued >= limit as usize {
            return false;
        }
        if look(ticket) == Seen::Waiting {
            queued += 1;
        }
    }
    queued < limit as usize
}

/// The first live waiter from `from` on, below `next`: a holder leaving
/// looks for one before it drops the limit, and stops at the first.
pub fn first_waiter(from: u64, next: u64, mut look: impl FnMut(u64) -> Seen) -> Option<u64> {
    (from..next).find(|&ticket| look(ticket) == Seen::Waiting)
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

/// The lowest ticket that may wait, from the files present: the first
/// live contender with a queue file, else `next` (nobody waits).
pub fn waiting_from(found: &[Found], next: u64) -> u64 {
    found
        .iter()
        .find(|f| f.live && f.queued)
        .map_or(next, |f| f.ticket)
}

/// The record rebuilt from the files present, when `state` is missing (deleted
/// by hand) or was cut short, so that the prefix goes on where it stood:
/// the live contenders without a queue file hold slots, so the limit still
/// holds; the limit is the one the first live contender joined with (a
/// contender with another limit is refused while any is live); tickets go
/// on past every file present; the fence goes on from `fence_floor`, which
/// every acquisition raises before it writes `state`; the queue starts at
/// the first live waiter. `found` is in ticket order.
pub fn rebuild(found: &[Found], fence_floor: u64) -> State {
    let live = found.iter().filter(|f| f.live);
    let next = found.last().map_or(0, |f| f.ticket + 1);
    State {
        limit: live.clone().find_map(|f| f.limit),
        next,
        fence: fence_floor,
        waiting_from: waiting_from(found, next),
        holders: live.filter(|f| !f.queued).map(|f| f.ticket).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::cell::Cell;

    #[test]
    fn the_first_in_the_queue_takes_a_free_slot() {
        assert_eq!(decide(0, None, 1), Decision::Take);
        assert_eq!(decide(1, None, 2), Decision::Take);
        assert_eq!(
            decide(2, None, 2),
            Decision::Full {
                wait_on: WaitOn::AnyDeparture
            }
        );
        // More holders than slots (a hand-edited state).
        assert_eq!(
            decide(3, None, 2),
            Decision::Full {
                wait_on: WaitOn::AnyDeparture
            }
        );
    }

    #[test]
    fn a_waiter_ahead_goes_first_even_with_a_slot_free() {
        // Its turn came first; ours comes when it has taken its slot.
        assert_eq!(
            decide(0, Some(7), 3),
            Decision::Full {
                wait_on: WaitOn::Ticket(7)
            }
        );
    }

    /// A queue of `waiters` live waiters after `holders` holders, tickets
    /// from 0, nobody gone: what each ticket's files show.
    fn crowd(holders: u64, waiters: u64) -> impl Fn(u64) -> Seen {
        move |ticket| {
            if ticket >= holders && ticket < holders + waiters {
                Seen::Waiting
            } else {
                Seen::NotWaiting
            }
        }
    }

    /// The tickets one look touches, at every size of queue: a handoff's
    /// work does not grow with the queue.
    #[test]
    fn a_handoff_looks_at_as_many_tickets_whatever_the_queue() {
        for waiters in [2, 10, 1_000, 100_000] {
            let limit = 10;
            let front = limit;
            let second = front + 1;
            let last = limit + waiters - 1;
            let files = crowd(limit, waiters);
            let looked = Cell::new(0);
            let counting = |t| {
                looked.set(looked.get() + 1);
                files(t)
            };
            // A newcomer at the back finds the waiter just ahead at once.
            let mut clear = Clear { from: last };
            assert_eq!(find_just_ahead(&mut clear, front, counting), Some(last - 1));
            assert_eq!(
                looked.replace(0),
                1,
                "{waiters} waiters: the newcomer's look"
            );
            // The second waiter, woken when the front one takes its slot
            // (which moves the queue's start past it), looks at nobody.
            let mut clear = Clear { from: second };
            assert_eq!(find_just_ahead(&mut clear, front + 1, counting), None);
            assert_eq!(
                looked.replace(0),
                0,
                "{waiters} waiters: the second waiter's look"
            );
            // A holder leaving finds a waiter at the queue's start.
            assert_eq!(first_waiter(front, last + 1, counting), Some(front));
            assert_eq!(
                looked.replace(0),
                1,
                "{waiters} waiters: the leaving holder's look"
            );
        }
    }

    #[test]
    fn a_dead_waiter_is_skipped_and_looked_at_once() {
        // 5 waits, 6 died, 7 left, 8 waits on 6 (and wakes when it dies).
        let files = |t| match t {
            5 => Seen::Waiting,
            6 => Seen::Dead,
            _ => Seen::NotWaiting,
        };
        let mut looked = Vec::new();
        let mut clear = Clear { from: 7 };
        let found = find_just_ahead(&mut clear, 2, |t| {
            looked.push(t);
            files(t)
        });
        assert_eq!(found, Some(5));
        assert_eq!(looked, [6, 5]);
        assert_eq!(clear, Clear { from: 6 });
    }

    #[test]
    fn a_contender_that_does_not_wait_takes_a_slot_only_with_room_for_all_ahead() {
        let files = crowd(2, 3); // holders 0 and 1, waiters 2, 3 and 4
        let looked = Cell::new(0);
        let counting = |t| {
            looked.set(looked.get() + 1);
            files(t)
        };
        assert!(room_for_all_ahead(2, 4, 2, 6, counting));
        assert!(!room_for_all_ahead(2, 4, 2, 5, counting));
        // The waiter just ahead and one more fill the slots: no further look.
        looked.set(0);
        assert!(!room_for_all_ahead(2, 4, 0, 4, counting));
        assert_eq!(looked.get(), 1);
    }

    fn seen() -> impl Strategy<Value = Seen> {
        prop_oneof![
            Just(Seen::Waiting),
            Just(Seen::NotWaiting),
            Just(Seen::Dead)
        ]
    }

    proptest! {
        /// The waiter found is the live waiter just ahead; a waiter that
        /// looks again (its own just ahead gone) finds the next one without
        /// looking at any ticket twice, save the one it waited on.
        #[test]
        fn the_waiter_just_ahead_is_found_looking_at_no_ticket_twice(
            tickets in proptest::collection::vec(seen(), 0..60),
            waiting_from in 0u64..10,
        ) {
            let me = tickets.len() as u64 + waiting_from;
            let mut files: Vec<Seen> = tickets;
            let at = |files: &[Seen], t: u64| files[(t - waiting_from) as usize];
            let mut clear = Clear { from: me };
            let mut looked = std::collections::BTreeMap::<u64, usize>::new();
            loop {
                let expected = (waiting_from..me).rev().find(|&t| at(&files, t) == Seen::Waiting);
                let found = find_just_ahead(&mut clear, waiting_from, |t| {
                    *looked.entry(t).or_default() += 1;
                    at(&files, t)
                });
                prop_assert_eq!(found, expected);
                let Some(ahead) = found else { break };
                // It goes: it takes its slot or dies, and we look again.
                files[(ahead - waiting_from) as usize] = Seen::NotWaiting;
                *looked.entry(ahead).or_default() -= 1;
            }
            prop_assert!(looked.values().all(|&n| n <= 1), "{:?}", looked);
        }
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
            // A dead waiter's.
            found(5, false, true, Some(2)),
            found(6, true, true, Some(2)),
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
                waiting_from: 6,
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
                waiting_from: 4,
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
}
