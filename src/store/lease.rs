//! Leases, for the stores whose slots outlive consem until a TTL runs out
//! (Consul's sessions, Redis's permits). The store keeps a slot at least
//! one TTL after the renewal it answered; consem counts its lease from the
//! moment the last confirmed renewal was sent plus the TTL, less a sixth of
//! it (clocks that do not run at quite the same rate, the time the kill
//! takes), and renews every TTL/3, so that a lease always has room for a
//! renewal that fails and the retry after it.

use std::time::{Duration, Instant};

const MARGIN_DIVISOR: u32 = 6;
const RENEW_DIVISOR: u32 = 3;

/// How often a holder renews.
pub fn renew_period(ttl: Duration) -> Duration {
    ttl / RENEW_DIVISOR
}

/// The lease a renewal sent at `sent` gives, for a TTL of `ttl`.
pub fn lease_end(sent: Instant, ttl: Duration) -> Instant {
    sent + ttl - ttl / MARGIN_DIVISOR
}

/// The longest kill grace that fits in the lease: SIGTERM goes at the
/// lease's end less the grace, which must come after the next renewal is
/// due (TTL/3 after the last) with a second to spare for its answer.
pub fn max_kill_grace(ttl: Duration) -> Duration {
    (ttl - ttl / MARGIN_DIVISOR - renew_period(ttl)).saturating_sub(Duration::from_secs(1))
}

/// The first pause after a failed attempt to reach the store while
/// holding; later pauses are `RETRY_PAUSE`. Half a second, then a second:
/// a restart of the store (a second or two) is ridden out, and a store
/// that is down is not hammered.
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(500);
const RETRY_PAUSE: Duration = Duration::from_secs(1);

/// What a holder does after `failures` failed attempts in a row to reach
/// the store (a renewal, a watch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    /// Try again after this pause.
    RetryIn(Duration),
    /// More failures in a row than the holder was told to bear
    /// (`monitor_retry`).
    TooMany { failures: u32, bearable: u32 },
    /// The lease ran out before the store answered again: no renewal
    /// could give the slot back now.
    LeaseOver,
}

impl std::fmt::Display for AfterFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AfterFailure::RetryIn(pause) => {
                write!(f, "trying again in {}", crate::duration::human(*pause))
            }
            AfterFailure::TooMany { failures, bearable } => {
                write!(
                    f,
                    "{failures} failures in a row, --monitor-retry is {bearable}"
                )
            }
            AfterFailure::LeaseOver => f.write_str("tried again until the lease ran out"),
        }
    }
}

/// Decides, for a holder whose lease ends at `lease_end`: retry while the
/// lease lasts (the store keeps the slot at least that long, and the
/// command is stopped at its end whatever happens), unless `monitor_retry`
/// bounds the failures in a row. The same on every store with leases.
pub fn after_failure(
    failures: u32,
    monitor_retry: Option<u32>,
    lease_end: Instant,
    now: Instant,
) -> AfterFailure {
    match monitor_retry {
        Some(bearable) if failures > bearable => AfterFailure::TooMany { failures, bearable },
        _ if now >= lease_end => AfterFailure::LeaseOver,
        _ if failures <= 1 => AfterFailure::RetryIn(FIRST_RETRY_PAUSE),
        _ => AfterFailure::RetryIn(RETRY_PAUSE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_retries_while_its_lease_lasts_unless_told_to_give_up_sooner() {
        let now = Instant::now();
        let later = now + Duration::from_secs(5);
        assert_eq!(
            after_failure(1, None, later, now),
            AfterFailure::RetryIn(FIRST_RETRY_PAUSE)
        );
        assert_eq!(
            after_failure(40, None, later, now),
            AfterFailure::RetryIn(RETRY_PAUSE)
        );
        assert_eq!(after_failure(1, None, now, now), AfterFailure::LeaseOver);
        assert_eq!(
            after_failure(3, Some(3), later, now),
            AfterFailure::RetryIn(RETRY_PAUSE)
        );
        assert_eq!(
            after_failure(4, Some(3), later, now),
            AfterFailure::TooMany {
                failures: 4,
                bearable: 3
            }
        );
        assert_eq!(
            after_failure(4, Some(3), later, now).to_string(),
            "4 failures in a row, --monitor-retry is 3"
        );
        // A 2 s restart of the store, with a failure every attempt: the
        // pauses alone span it well within a lease of 12.5 s (TTL 15 s).
        let pauses: Duration = (1..=3)
            .map(|n| match after_failure(n, None, later, now) {
                AfterFailure::RetryIn(pause) => pause,
                other => panic!("{other:?}"),
            })
            .sum();
        assert!(pauses >= Duration::from_millis(2500), "{pauses:?}");
    }

    /// The store counts a renewal's TTL from when it received it, which
    /// is before its answer came back: a slow answer (a congested link, a
    /// store that stalled) leaves consem less lease, never more.
    #[test]
    fn a_lease_counts_from_when_its_renewal_was_sent_not_from_its_answer() {
        let ttl = Duration::from_secs(15);
        let sent = Instant::now()
            .checked_sub(Duration::from_secs(4))
            .expect("the clock has run for 4 s");
        // Answered 4 s after it was sent: 8.5 s of the 12.5 s are left.
        assert_eq!(lease_end(sent, ttl), sent + Duration::from_millis(12_500));
        assert!(lease_end(sent, ttl) < Instant::now() + Duration::from_millis(8_600));
        // The same arithmetic whenever it is asked.
        let later = sent + Duration::from_secs(100);
        assert_eq!(lease_end(later, ttl) - lease_end(sent, ttl), later - sent);
        assert_eq!(
            lease_end(sent, Duration::from_secs(6)),
            sent + Duration::from_secs(5)
        );
    }

    #[test]
    fn the_kill_grace_fits_between_the_next_renewal_and_the_lease_end() {
        let millis = |d: Duration| d.as_millis();
        let ttl = Duration::from_secs(10);
        assert_eq!(millis(max_kill_grace(ttl)), 4000);
        assert_eq!(millis(max_kill_grace(Duration::from_secs(15))), 6500);
    }
}
