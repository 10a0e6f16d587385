//! Failures of a store while a contender joins or waits, and when to give
//! up: the first contact fails at once (a wrong address should say so
//! now); later outages are retried with a pause that doubles, for up to
//! one TTL, after which the session or lease is gone anyway.

use std::time::{Duration, Instant};

/// First pause after a failed call; doubles up to [`MAX_BACKOFF`], so that
/// an error loop never spins. The cap is short because the queue moves
/// only when its first waiter reads: the waiters behind it wait on it.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(200);
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// A pause that doubles after each failure in a row, from
/// [`FIRST_BACKOFF`] to [`MAX_BACKOFF`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff(FIRST_BACKOFF)
    }
}

impl Backoff {
    /// The pause before the next attempt; the one after it doubles.
    pub fn next_pause(&mut self) -> Duration {
        let pause = self.0;
        self.0 = (self.0 * 2).min(MAX_BACKOFF);
        pause
    }
}

pub struct Outage {
    ttl: Duration,
    ever_reached: bool,
    since: Option<Instant>,
    backoff: Backoff,
}

impl Outage {
    pub fn new(ttl: Duration) -> Outage {
        Outage {
            ttl,
            ever_reached: false,
            since: None,
            backoff: Backoff::default(),
        }
    }

    /// A call went through.
    pub fn recovered(&mut self) {
        self.ever_reached = true;
        self.since = None;
        self.backoff = Backoff::default();
    }

    /// After a failure worth retrying: how long to pause before the next
    /// attempt, or `None` to give up (the store was never reached, or has
    /// been failing for longer than the TTL).
    pub fn retry_after(&mut self) -> Option<Duration> {
        self.retry_at(Instant::now(), false)
    }

    /// [`Outage::retry_after`] for a call the store took but did not answer
    /// in time: a store that is there but busy, so retried for up to a TTL
    /// even before it ever answered (a frozen one, that never answers, ends
    /// the run then).
    pub fn retry_slow(&mut self) -> Option<Duration> {
        self.retry_at(Instant::now(), true)
    }

    /// [`Outage::retry_after`], for a failure at `now`; `took`: the store
    /// took the call.
    fn retry_at(&mut self, now: Instant, took: bool) -> Option<Duration> {
        let since = *self.since.get_or_insert(now);
        if !(self.ever_reached || took) || now.duration_since(since) > self.ttl {
            return None;
        }
        Some(self.backoff.next_pause())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_contact_fails_at_once_later_ones_back_off_to_a_second() {
        let mut outage = Outage::new(Duration::from_secs(60));
        assert_eq!(outage.retry_after(), None, "never reached");
        outage.recovered();
        let pauses: Vec<_> = (0..5).map(|_| outage.retry_after().unwrap()).collect();
        assert_eq!(
            pauses,
            [200, 400, 800, 1000, 1000].map(Duration::from_millis)
        );
        outage.recovered();
        assert_eq!(outage.retry_after(), Some(FIRST_BACKOFF));
    }

    /// Outages in a row, each shorter than the TTL, with the store
    /// answering in between: each is judged by its own length, not by the
    /// time since the first began.
    #[test]
    fn each_outage_counts_from_its_own_start() {
        let ttl = Duration::from_secs(15);
        let mut outage = Outage::new(ttl);
        outage.recovered();
        let first = Instant::now();
        assert!(outage.retry_at(first, false).is_some());
        assert!(outage
            .retry_at(first + Duration::from_secs(2), false)
            .is_some());
        outage.recovered();
        // A second outage, 20 s after the first began and 1 s long.
        let second = first + Duration::from_secs(20);
        assert_eq!(outage.retry_at(second, false), Some(FIRST_BACKOFF));
        assert!(outage
            .retry_at(second + Duration::from_secs(1), false)
            .is_some());
        assert!(
            outage.retry_at(second + ttl, false).is_some(),
            "one TTL into it"
        );
        assert_eq!(
            outage.retry_at(second + ttl + Duration::from_millis(1), false),
            None,
            "longer than the TTL"
        );
    }

    #[test]
    fn an_outage_longer_than_the_ttl_ends_the_run() {
        let ttl = Duration::from_secs(15);
        let mut outage = Outage::new(ttl);
        outage.recovered();
        let began = Instant::now();
        assert!(outage.retry_at(began, false).is_some());
        assert!(outage.retry_at(began + ttl, false).is_some(), "one TTL in");
        assert_eq!(
            outage.retry_at(began + ttl + Duration::from_millis(1), false),
            None
        );
    }

    /// A store that took the first call and did not answer in time is
    /// there, busy: retried for up to a TTL, not given up at once as one
    /// that refuses or cannot be connected to.
    #[test]
    fn a_slow_first_contact_is_retried_for_a_ttl() {
        let ttl = Duration::from_secs(15);
        let mut outage = Outage::new(ttl);
        let began = Instant::now();
        assert_eq!(outage.retry_at(began, true), Some(FIRST_BACKOFF));
        assert!(outage.retry_at(began + ttl, true).is_some(), "one TTL in");
        assert_eq!(
            outage.retry_at(began + ttl + Duration::from_millis(1), true),
            None,
            "never answered within a TTL"
        );
        let mut refused = Outage::new(ttl);
        assert_eq!(refused.retry_at(began, false), None);
    }
}
