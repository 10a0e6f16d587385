//! What consem says on stderr. Quiet by default: errors, warnings, and the
//! line that says why a `--timeout` ran out (`-q` leaves that out); `-v`
//! adds one line per lifecycle event, in a stable, greppable format:
//!
//! `2026-11-22T10:04:05.123Z consem[4242] acquired prefix=service/db fence=57`
//!
//! or, with `--log-format json`, one JSON object per line for log collectors:
//!
//! `{"time":"2026-11-22T10:04:05.123Z","consem_pid":4242,"level":"info","event":"acquired","prefix":"service/db","fence":"57"}`
//!
//! consem never writes to stdout: it belongs to the child.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

static VERBOSE: AtomicBool = AtomicBool::new(false);
static JSON: AtomicBool = AtomicBool::new(false);

pub fn set_verbose(on: bool) {
    VERBOSE.store(on, Ordering::Relaxed);
}

/// How lines on stderr are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// `<time> consem[<pid>] <event> key=value ...`; errors as `consem: error: ...`
    #[default]
    Text,
    /// One JSON object per line: time, pid, level, event or message, details
    Json,
}

pub fn set_format(format: LogFormat) {
    JSON.store(format == LogFormat::Json, Ordering::Relaxed);
}

fn json_line(level: &str, fields: &[(&str, String)]) -> String {
    let mut object = serde_json::Map::new();
    object.insert("time".into(), timestamp(SystemTime::now()).into());
    object.insert("consem_pid".into(), std::process::id().into());
    object.insert("level".into(), level.into());
    for (key, value) in fields {
        object.insert((*key).into(), value.clone().into());
    }
    serde_json::Value::Object(object).to_string()
}

/// A lifecycle event, shown with `-v`: a word for what happened, then
/// `key=value` details.
pub fn event(what: &str, details: &[(&str, &dyn std::fmt::Display)]) {
    if !VERBOSE.load(Ordering::Relaxed) {
        return;
    }
    if JSON.load(Ordering::Relaxed) {
        let mut fields = vec![("event", what.to_string())];
        fields.extend(
            details
                .iter()
                .map(|(key, value)| (*key, abbreviated(&value.to_string()).into_owned())),
        );
        write_line(&json_line("info", &fields));
        return;
    }
    let mut line = format!(
        "{} consem[{}] {what}",
        timestamp(SystemTime::now()),
        std::process::id()
    );
    for (key, value) in details {
        let value = value.to_string();
        let value = abbreviated(&value);
        if value.is_empty()
            || value.contains(char::is_whitespace)
            || value.contains('"')
            || value.contains(char::is_control)
        {
            line.push_str(&format!(" {key}={value:?}"));
        } else {
            line.push_str(&format!(" {key}={value}"));
        }
    }
    write_line(&line);
}

/// An error that ends the run.
pub fn error(message: &str) {
    if JSON.load(Ordering::Relaxed) {
        write_line(&json_line("error", &[("message", message.to_string())]));
    } else {
        write_line(&format!("consem: error: {message}"));
    }
}

/// How a run ended when that is not an error (no slot within
/// `--timeout`): a line of its own, without `-v`.
pub fn notice(message: &str) {
    if JSON.load(Ordering::Relaxed) {
        write_line(&json_line("notice", &[("message", message.to_string())]));
    } else {
        write_line(&format!("consem: {message}"));
    }
}

/// Something the user should know that does not change the exit code.
pub fn warning(message: &str) {
    if JSON.load(Ordering::Relaxed) {
        write_line(&json_line("warning", &[("message", message.to_string())]));
    } else {
        write_line(&format!("consem: warning: {message}"));
    }
}

fn write_line(line: &str) {
    // One write per line, so that lines from threads never interleave.
    let mut stderr = std::io::stderr().lock();
    let room = crate::progress::make_room();
    let _ = stderr.write_all(format!("{room}{}\n", printable(line)).as_bytes());
}

/// `text` with its control characters escaped (`\n`, `\t`, `\x1b`, ...):
/// values from the store and the command line are written by whoever can
/// write there, and must not drive an operator's terminal.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return text.into();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() && (c as u32) < 0x100 => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.into()
}

/// The longest value shown whole in a message: longer ones keep their
/// start and end, so that a 100 KB prefix does not flood stderr.
const LONGEST_SHOWN: usize = 160;

/// `text`, shortened to about `LONGEST_SHOWN` characters with an ellipsis
/// that says how much was left out.
pub fn abbreviated(text: &str) -> std::borrow::Cow<'_, str> {
    let count = text.chars().count();
    if count <= LONGEST_SHOWN {
        return text.into();
    }
    let (head, tail) = (LONGEST_SHOWN * 3 / 4, LONGEST_SHOWN / 5);
    let start: String = text.chars().take(head).collect();
    let end: String = text.chars().skip(count - tail).collect();
    format!("{start}...({} characters)...{end}", count - head - tail).into()
}

/// RFC 3339 UTC with milliseconds.
pub fn timestamp(at: SystemTime) -> String {
    let since_epoch = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since_epoch.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        since_epoch.subsec_millis()
    )
}

/// Reads back what [`timestamp`] writes; `None` for anything else.
pub fn parse_timestamp(text: &str) -> Option<SystemTime> {
    let text = text.strip_suffix('Z')?;
    let (date, time) = text.split_once('T')?;
    let mut date = date.splitn(3, '-').map(str::parse::<i64>);
    let (year, month, day) = (date.next()?.ok()?, date.next()?.ok()?, date.next()?.ok()?);
    let (clock, millis) = time.split_once('.').unwrap_or((time, "0"));
    let mut clock = clock.splitn(3, ':').map(str::parse::<u64>);
    let (h, m, s) = (
        clock.next()?.ok()?,
        clock.next()?.ok()?,
        clock.next()?.ok()?,
    );
    let days = days_from_civil(year, u32::try_from(month).ok()?, u32::try_from(day).ok()?);
    let seconds = u64::try_from(days).ok()? * 86_400 + h * 3600 + m * 60 + s;
    Some(
        UNIX_EPOCH
            + std::time::Duration::from_secs(seconds)
            + std::time::Duration::from_millis(millis.parse().ok()?),
    )
}

/// The inverse of [`civil_from_days`] (same algorithm, same source).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = year - i64::from(month <= 2);
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let month = i64::from(month);
    let doy = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// algorithm), so that timestamps need no date crate.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    #[test]
    fn control_characters_are_escaped_and_long_values_shortened() {
        use super::{abbreviated, printable};
        assert_eq!(printable("plain é"), "plain é");
        assert_eq!(
            printable("a\nb\tc\x1b[2J\u{9b}d\x7f"),
            "a\\nb\\tc\\x1b[2J\\x9bd\\x7f"
        );
        let long = "x".repeat(100_000);
        let short = abbreviated(&long);
        assert!(short.len() < 200, "{short}");
        assert!(short.contains("...(99848 characters)..."), "{short}");
        assert_eq!(abbreviated("service/db"), "service/db");
    }

    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_utc_timestamps() {
        assert_eq!(timestamp(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let at = UNIX_EPOCH + Duration::from_millis(1_795_305_991_123);
        assert_eq!(timestamp(at), "2026-11-22T00:06:31.123Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(timestamp(leap), "2000-02-29T00:00:00.000Z");
        for at in [UNIX_EPOCH, at, leap] {
            assert_eq!(parse_timestamp(&timestamp(at)), Some(at));
        }
        assert_eq!(parse_timestamp("yesterday"), None);
    }
}
