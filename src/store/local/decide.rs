//! The local store's one decision, free of I/O.

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
}
