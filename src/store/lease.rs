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

/// The longest `--kill-grace` that fits in the lease: SIGTERM goes at the
/// lease's end less the grace, which must come after the next renewal is
/// due (TTL/3 after the last) with a second to spare for its answer.
pub fn max_kill_grace(ttl: Duration) -> Duration {
    (ttl - ttl / MARGIN_DIVISOR - renew_period(ttl)).saturating_sub(Duration::from_secs(1))
}

/// The kill grace for a store with leases of `ttl`: one asked for that does
/// not fit is refused; the default is shortened to fit.
pub fn fit_kill_grace(
    asked: Option<Duration>,
    ttl: Duration,
    store: &str,
) -> Result<Duration, String> {
    let most = max_kill_grace(ttl);
    match asked {
        Some(grace) if grace > most => Err(format!(
            "--kill-grace {} does not fit in the lease of --ttl {}: consem must have stopped the command before {store} may free the slot; use at most {}, or a longer --ttl",
            crate::duration::human(grace),
            crate::duration::human(ttl),
            crate::duration::human(most)
        )),
        Some(grace) => Ok(grace),
        None => Ok(crate::options::DEFAULT_KILL_GRACE.min(most)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kill_grace_fits_between_the_next_renewal_and_the_lease_end() {
        let millis = |d: Duration| d.as_millis();
        let ttl = Duration::from_secs(10);
        assert_eq!(millis(max_kill_grace(ttl)), 4000);
        assert_eq!(millis(max_kill_grace(Duration::from_secs(15))), 6500);
        assert!(fit_kill_grace(Some(Duration::from_secs(5)), ttl, "Consul").is_err());
        assert_eq!(fit_kill_grace(None, ttl, "Consul").map(millis), Ok(4000));
        assert_eq!(
            fit_kill_grace(None, Duration::from_secs(60), "Consul"),
            Ok(Duration::from_secs(5))
        );
    }
}
