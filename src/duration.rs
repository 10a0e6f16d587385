//! Durations as operators write them (`500ms`, `15s`, `2m`, `1h30m`), and as
//! Consul expects them in its API (Go duration strings).

use std::time::Duration;

/// Parses a Go-style duration: one or more `<number><unit>` parts, units
/// `ms`, `s`, `m`, `h` (and `us`, `ns` for completeness); fractions allowed.
/// A bare `0` is zero; any other number needs a unit, so that `15` is not
/// silently read as 15 nanoseconds or 15 hours.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err("empty duration: write it like 500ms, 15s, 2m or 1h30m".into());
    }
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let value: f64 = number.parse().map_err(|_| {
            format!("invalid duration '{text}': write it like 500ms, 15s, 2m or 1h30m")
        })?;
        let seconds_per_unit = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => {
                return Err(format!(
                    "duration '{text}' has no unit: write it like 500ms, 15s, 2m or 1h30m"
                ))
            }
            other => {
                return Err(format!(
                    "unknown unit '{other}' in duration '{text}': use ms, s, m or h"
                ))
            }
        };
        total += value * seconds_per_unit;
        rest = after;
    }
    if total > MAX_SECONDS {
        return Err(format!(
            "duration '{text}' is too long: at most 87600h (10 years)"
        ));
    }
    Duration::try_from_secs_f64(total).map_err(|_| format!("duration '{text}' is out of range"))
}

/// Ten years: longer is "forever" in practice, and it keeps deadlines
/// computed from a duration far from overflowing.
const MAX_SECONDS: f64 = 10.0 * 365.0 * 86_400.0;

/// Formats a duration for Consul's API (a Go duration string) in whole
/// milliseconds, which every Consul version accepts, rounded up: a session
/// then lives at least as long as consem counts on.
pub fn to_go(duration: Duration) -> String {
    format!("{}ms", duration.as_nanos().div_ceil(1_000_000))
}

/// Formats a duration that was measured (time left, time late) for people,
/// to the millisecond: `4.999s`, not `4.999877069s`.
pub fn measured(duration: Duration) -> String {
    human(Duration::from_millis(duration.as_millis() as u64))
}

/// Formats how long something has lasted, in whole seconds: `4m12s`,
/// and `0s` for less than one (not `0ms`).
pub fn whole_seconds(duration: Duration) -> String {
    match duration.as_secs() {
        0 => "0s".to_string(),
        whole => human(Duration::from_secs(whole)),
    }
}

/// Formats a duration for people, exactly, in the form `parse` reads:
/// `15s`, `1m30s`, `250ms`, `1.5s`, `0.1ms` (so that a value is never
/// echoed back as one the operator did not give, nor a limit as the value
/// it refuses).
pub fn human(duration: Duration) -> String {
    let seconds = duration.as_secs();
    let nanos = duration.subsec_nanos();
    if seconds == 0 {
        return format!("{}ms", decimal(nanos / 1_000_000, nanos % 1_000_000, 6));
    }
    let (h, m, s) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || nanos > 0 || out.is_empty() {
        out.push_str(&format!("{}s", decimal(s as u32, nanos, 9)));
    }
    out
}

/// How long before `now` a contender started, in whole seconds: `4m12s
/// ago`. `None` when it is after `now` (the clocks of two hosts disagree).
pub fn ago(since: std::time::SystemTime, now: std::time::SystemTime) -> Option<String> {
    Some(format!(
        "{} ago",
        whole_seconds(now.duration_since(since).ok()?)
    ))
}

/// `whole.fraction`, the fraction `digits` long before its trailing zeros
/// go.
fn decimal(whole: u32, fraction: u32, digits: usize) -> String {
    if fraction == 0 {
        return whole.to_string();
    }
    let fraction = format!("{fraction:0digits$}");
    format!("{whole}.{}", fraction.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_are_said_to_the_second() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let ago_ = |ms| ago(now - Duration::from_millis(ms), now);
        assert_eq!(ago_(252_900).as_deref(), Some("4m12s ago"));
        assert_eq!(ago_(3_600_000).as_deref(), Some("1h ago"));
        assert_eq!(ago_(400).as_deref(), Some("0s ago"));
        assert_eq!(ago(now + Duration::from_secs(3), now), None);
    }

    #[test]
    fn measured_durations_are_shown_to_the_millisecond() {
        assert_eq!(measured(Duration::from_nanos(4_999_877_069)), "4.999s");
        assert_eq!(measured(Duration::from_nanos(999_851_883)), "999ms");
        assert_eq!(measured(Duration::from_micros(300)), "0ms");
    }

    #[test]
    fn reads_the_usual_forms() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("1m0.5s"), Ok(Duration::from_millis(60_500)));
    }

    #[test]
    fn refuses_what_is_ambiguous_or_wrong() {
        assert!(parse("15").unwrap_err().contains("no unit"));
        assert!(parse("").is_err());
        assert!(parse("5x").unwrap_err().contains("unknown unit 'x'"));
        assert!(parse("s").is_err());
        assert!(parse("1..2s").is_err());
        assert!(parse("-5s").is_err());
        assert!(parse("3000000000000000h").unwrap_err().contains("too long"));
        assert!(parse("87600h").is_ok());
    }

    #[test]
    fn formats_for_consul_and_people() {
        assert_eq!(to_go(Duration::from_secs(15)), "15000ms");
        assert_eq!(to_go(Duration::from_micros(10_000_500)), "10001ms");
        assert_eq!(human(Duration::from_secs(90)), "1m30s");
        assert_eq!(human(Duration::from_millis(250)), "250ms");
        assert_eq!(human(Duration::from_secs(3600)), "1h");
        assert_eq!(human(Duration::from_millis(1500)), "1.5s");
        assert_eq!(human(Duration::from_millis(1999)), "1.999s");
        assert_eq!(human(Duration::from_millis(60_050)), "1m0.05s");
        assert_eq!(human(Duration::from_micros(2_000_900)), "2.0009s");
        assert_eq!(human(Duration::from_nanos(6_500_100_000)), "6.5001s");
        assert_eq!(human(Duration::from_micros(100)), "0.1ms");
        assert_eq!(human(Duration::from_nanos(1)), "0.000001ms");
        assert_eq!(human(Duration::from_micros(86_400_000_500)), "24h0.0005s");
        assert_eq!(human(Duration::ZERO), "0ms");
    }

    proptest::proptest! {
        /// What is shown reads back as the duration, to the millisecond.
        #[test]
        fn what_is_shown_reads_back(millis in 0u64..400_000_000) {
            let shown = human(Duration::from_millis(millis));
            proptest::prop_assert_eq!(parse(&shown), Ok(Duration::from_millis(millis)), "{}", shown);
        }
    }
}
