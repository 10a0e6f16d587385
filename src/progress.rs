//! The status line drawn while waiting for a slot, when stderr is a
//! terminal: one line, redrawn in place, erased when the wait ends.
//!
//! `waiting for a slot at service/db: 2/2 held (web-3 pid 812, started 4m12s ago; web-7 pid 55, started 10s ago), 3 ahead of you, 00:14`

use std::io::Write as _;
use std::time::{Duration, SystemTime};

use crate::store::Progress;
use crate::{duration, report};

/// Clears the terminal line and returns to its start.
const CLEAR: &str = "\r\x1b[2K";

/// Holders named on the line; more are counted.
const NAMED_HOLDERS: usize = 3;

pub struct ProgressLine {
    prefix: String,
    last: Option<Progress>,
    shown: bool,
}

impl ProgressLine {
    pub fn new(prefix: &str) -> ProgressLine {
        ProgressLine {
            prefix: prefix.to_string(),
            last: None,
            shown: false,
        }
    }

    /// Whether a line is up (and so wants a redraw every second).
    pub fn shown(&self) -> bool {
        self.shown
    }

    pub fn update(&mut self, progress: Progress, waited: Duration) {
        self.last = Some(progress);
        self.redraw(waited);
    }

    pub fn redraw(&mut self, waited: Duration) {
        if !crate::sys::stderr_in_foreground() {
            return;
        }
        if let Some(progress) = &self.last {
            let line = render(&self.prefix, progress, waited, SystemTime::now());
            // One column short of the width: a line that fills the last
            // column wraps on some terminals, and a wrapped line cannot be
            // erased in place.
            let columns = crate::sys::stderr_columns().unwrap_or(80);
            write(&format!("{CLEAR}{}", fit(&line, columns.saturating_sub(1))));
            self.shown = true;
        }
    }

    pub fn erase(&mut self) {
        if self.shown {
            write(CLEAR);
            self.shown = false;
        }
    }
}

/// `line` cut to `columns` terminal columns, with an ellipsis where cut.
pub fn fit(line: &str, columns: usize) -> String {
    if line.chars().map(columns_of).sum::<usize>() <= columns {
        return line.to_string();
    }
    let mut out = String::new();
    let mut used = 0;
    for c in line.chars() {
        let width = columns_of(c);
        // Room is kept for the ellipsis.
        if used + width + 1 > columns {
            break;
        }
        out.push(c);
        used += width;
    }
    if columns > 0 {
        out.push('…');
    }
    out
}

/// Columns a character takes on a terminal: two for the East Asian wide
/// ranges and most emoji, one for the rest (the line holds no control
/// characters).
fn columns_of(c: char) -> usize {
    match u32::from(c) {
        0x1100..=0x115f
        | 0x2e80..=0xa4cf
        | 0xac00..=0xd7a3
        | 0xf900..=0xfaff
        | 0xfe30..=0xfe4f
        | 0xff00..=0xff60
        | 0xffe0..=0xffe6
        | 0x1f300..=0x1f64f
        | 0x1f900..=0x1f9ff
        | 0x20000..=0x3fffd => 2,
        _ => 1,
    }
}

fn write(text: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(text.as_bytes());
    let _ = stderr.flush();
}

/// The line's text, without control characters.
pub fn render(prefix: &str, progress: &Progress, waited: Duration, now: SystemTime) -> String {
    let named: Vec<String> = progress
        .holders
        .iter()
        .take(NAMED_HOLDERS)
        .map(|holder| {
            let host = holder.host.as_deref().unwrap_or("?");
            let mut text = report::abbreviated(&report::printable(host)).into_owned();
            if let Some(pid) = holder.pid {
                text.push_str(&format!(" pid {pid}"));
            }
            if let Some(up) = holder
                .since
                .and_then(|since| now.duration_since(since).ok())
            {
                text.push_str(&format!(
                    ", started {} ago",
                    duration::human(Duration::from_secs(up.as_secs()))
                ));
            }
            text
        })
        .collect();
    let mut holders = named.join("; ");
    if progress.holders.len() > NAMED_HOLDERS {
        holders.push_str(&format!(
            "; {} more",
            progress.holders.len() - NAMED_HOLDERS
        ));
    }
    let ahead = match progress.ahead {
        0 => "next in line".to_string(),
        n => format!("{n} ahead of you"),
    };
    let seconds = waited.as_secs();
    let clock = if seconds >= 3600 {
        format!(
            "{}:{:02}:{:02}",
            seconds / 3600,
            seconds / 60 % 60,
            seconds % 60
        )
    } else {
        format!("{:02}:{:02}", seconds / 60, seconds % 60)
    };
    format!(
        "waiting for a slot at {prefix}: {}/{} held ({holders}), {ahead}, {clock}",
        progress.holders.len(),
        progress.limit
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Holder;

    #[test]
    fn a_line_is_cut_to_the_terminal_s_width() {
        assert_eq!(fit("waiting", 80), "waiting");
        assert_eq!(fit("waiting for a slot", 10), "waiting f…");
        assert_eq!(fit("waiting for a slot", 10).chars().count(), 10);
        // Wide characters take two columns each.
        assert_eq!(fit("日本日本日本", 7), "日本日…");
        assert_eq!(fit("abc", 0), "");
    }

    #[test]
    fn renders_holders_queue_and_clock() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let holder = |host: &str, pid, held| Holder {
            host: Some(host.into()),
            pid: Some(pid),
            since: Some(now - Duration::from_secs(held)),
        };
        let progress = Progress {
            limit: 2,
            holders: vec![holder("web-3", 812, 252), holder("web-7", 55, 10)],
            ahead: 3,
        };
        assert_eq!(
            render("service/db", &progress, Duration::from_secs(14), now),
            "waiting for a slot at service/db: 2/2 held (web-3 pid 812, started 4m12s ago; web-7 pid 55, started 10s ago), 3 ahead of you, 00:14"
        );
        // A consul lock holder describes nothing; more than three are counted.
        let progress = Progress {
            limit: 5,
            holders: (0..5)
                .map(|_| Holder {
                    host: None,
                    pid: None,
                    since: None,
                })
                .collect(),
            ahead: 0,
        };
        assert_eq!(
            render("jobs", &progress, Duration::from_secs(3725), now),
            "waiting for a slot at jobs: 5/5 held (?; ?; ?; 2 more), next in line, 1:02:05"
        );
    }
}
