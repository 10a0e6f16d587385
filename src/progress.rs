//! The status line drawn while waiting for a slot, when stderr is a
//! terminal: one line, redrawn in place, erased when the wait ends.
//!
//! `waiting for a slot at service/db: 2/2 held (web-3 pid 812, started 4m12s ago; web-7 pid 55, started 10s ago), 3 ahead of you, 00:14`
//!
//! Where the window is narrower, the holders' details go first, then the
//! wording shortens, down to `service/db: 2/2, 3 ahead, 00:14`: who waits
//! for what, how full it is, the place in line and the time waited stay.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use crate::store::Progress;
use crate::{duration, report};

/// Erases the line: back to its start, then to the end of the screen.
///
/// After each draw the cursor is parked at the line's start (`\r`). So
/// what the terminal echoes (`^C`, `^Z`) lands on the line's first columns
/// instead of wrapping past its end, and where a narrowed window reflowed
/// the line into several rows, they lie below the cursor, where erasing to
/// the end of the screen reaches them.
const ERASE: &str = "\r\x1b[J";

/// Holders named on the line; more are counted.
const NAMED_HOLDERS: usize = 3;

/// Whether a waiting line is on the terminal, for [`make_room`].
static LINE_UP: AtomicBool = AtomicBool::new(false);

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

    /// Draws the line again, fitted to the window's width now (after a
    /// resize too).
    pub fn redraw(&mut self, waited: Duration) {
        if !crate::sys::stderr_in_foreground() {
            return;
        }
        if let Some(progress) = &self.last {
            let picture = Picture::of(&self.prefix, progress, waited, SystemTime::now());
            // One column short of the width: a line that fills the last
            // column wraps on some terminals.
            let columns = crate::sys::stderr_columns().unwrap_or(80);
            let line = picture.fit(columns.saturating_sub(1));
            write(&format!("{ERASE}{line}\r"));
            self.shown = true;
        }
    }

    pub fn erase(&mut self) {
        if self.shown {
            write(ERASE);
            self.shown = false;
        }
    }
}

/// What a line written to stderr while a waiting line may be up must start
/// with: the erase if one is up, so that the message does not land on the
/// line's text (the next tick draws the line again, below the message).
/// Called with stderr locked.
pub fn make_room() -> &'static str {
    if LINE_UP.swap(false, Ordering::Relaxed) {
        ERASE
    } else {
        ""
    }
}

fn write(text: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(text.as_bytes());
    let _ = stderr.flush();
    LINE_UP.store(!text.ends_with(ERASE), Ordering::Relaxed);
}

/// What the line tells, before it is fitted to a width; every part
/// printable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Picture {
    prefix: String,
    held: usize,
    limit: u32,
    /// Each holder as far as it describes itself: `web-3 pid 812, started
    /// 4m12s ago`.
    holders: Vec<String>,
    /// How long the longest-held slot has been held, where told.
    oldest: Option<Duration>,
    ahead: usize,
    clock: String,
}

impl Picture {
    pub fn of(prefix: &str, progress: &Progress, waited: Duration, now: SystemTime) -> Picture {
        let held_for =
            |since: Option<SystemTime>| since.and_then(|since| now.duration_since(since).ok());
        let holders = progress
            .holders
            .iter()
            .map(|holder| holder.describe(now))
            .collect();
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
        Picture {
            prefix: report::abbreviated(&report::printable(prefix)).into_owned(),
            held: progress.holders.len(),
            limit: progress.limit,
            holders,
            oldest: progress
                .holders
                .iter()
                .filter_map(|holder| held_for(holder.since))
                .max(),
            ahead: progress.ahead,
            clock,
        }
    }

    /// The whole line, every detail told.
    pub fn full(&self) -> String {
        self.forms().next().expect("there is always a form")
    }

    /// The line in at most `columns` terminal columns: the most detailed
    /// form that fits; where none does, the shortest with the prefix
    /// shortened to its end; where even that does not fit, cut.
    pub fn fit(&self, columns: usize) -> String {
        if let Some(form) = self.forms().find(|form| width(form) <= columns) {
            return form;
        }
        let rest = self.bare("");
        let end = tail(&self.prefix, columns.saturating_sub(width(&rest) + 1));
        if !end.is_empty() {
            return format!("…{end}{rest}");
        }
        cut(&self.bare(&self.prefix), columns)
    }

    /// The forms of the line, most detailed first: the holders' details
    /// shorten and go first, then the words around the numbers.
    fn forms(&self) -> impl Iterator<Item = String> + '_ {
        let (prefix, held, limit, clock) = (&self.prefix, self.held, self.limit, &self.clock);
        let ahead = match self.ahead {
            0 => "next in line".to_string(),
            n => format!("{n} ahead of you"),
        };
        let detailed = self.details().into_iter().map(move |details| {
            let details = details.map(|d| format!(" ({d})")).unwrap_or_default();
            format!(
                "waiting for a slot at {prefix}: {held}/{limit} held{details}, {ahead}, {clock}"
            )
        });
        let ahead = self.ahead_short();
        detailed.chain([
            format!("waiting for a slot at {prefix}: {held}/{limit} held, {ahead}, {clock}"),
            format!("waiting at {prefix}: {held}/{limit} held, {ahead}, {clock}"),
            format!("waiting at {prefix}: {held}/{limit}, {ahead}, {clock}"),
            self.bare(prefix),
        ])
    }

    /// The shortest form, with `prefix` for the prefix.
    fn bare(&self, prefix: &str) -> String {
        format!(
            "{prefix}: {}/{}, {}, {}",
            self.held,
            self.limit,
            self.ahead_short(),
            self.clock
        )
    }

    fn ahead_short(&self) -> String {
        match self.ahead {
            0 => "next".to_string(),
            n => format!("{n} ahead"),
        }
    }

    /// What the parentheses after `held` say, most first: the holders
    /// named (fewer and fewer, the rest counted), then only how long the
    /// oldest has held, then nothing.
    fn details(&self) -> Vec<Option<String>> {
        let count = self.holders.len();
        let mut details: Vec<Option<String>> = (1..=count.min(NAMED_HOLDERS))
            .rev()
            .map(|named| {
                let mut text = self.holders[..named].join("; ");
                if count > named {
                    text.push_str(&format!("; {} more", count - named));
                }
                Some(text)
            })
            .collect();
        if let Some(oldest) = self.oldest {
            let oldest = duration::whole_seconds(oldest);
            if count > 1 {
                details.push(Some(format!("oldest started {oldest} ago")));
                details.push(Some(format!("oldest {oldest}")));
            } else {
                details.push(Some(format!("started {oldest} ago")));
                details.push(Some(format!("for {oldest}")));
            }
        }
        details.push(None);
        details
    }
}

/// Columns `text` takes on a terminal.
pub fn width(text: &str) -> usize {
    text.chars().map(columns_of).sum()
}

/// The end of `text` that fits in `columns`.
fn tail(text: &str, columns: usize) -> String {
    let mut kept: Vec<char> = Vec::new();
    let mut used = 0;
    for c in text.chars().rev() {
        used += columns_of(c);
        if used > columns {
            break;
        }
        kept.push(c);
    }
    kept.into_iter().rev().collect()
}

/// `line` cut to `columns` terminal columns, with an ellipsis where cut.
pub fn cut(line: &str, columns: usize) -> String {
    if width(line) <= columns {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Holder;
    use proptest::prelude::*;

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000)
    }

    fn holder(host: &str, pid: u64, held: u64) -> Holder {
        Holder {
            host: Some(host.into()),
            pid: Some(pid),
            since: Some(now() - Duration::from_secs(held)),
        }
    }

    /// The issue's picture: `demo`, both slots held, next in line.
    fn demo(waited: u64) -> Picture {
        let progress = Progress {
            limit: 2,
            holders: vec![holder("vm", 12843, 11), holder("vm", 12850, 4)],
            ahead: 0,
        };
        Picture::of("demo", &progress, Duration::from_secs(waited), now())
    }

    #[test]
    fn a_line_is_cut_to_the_terminal_s_width() {
        assert_eq!(cut("waiting", 80), "waiting");
        assert_eq!(cut("waiting for a slot", 10), "waiting f…");
        assert_eq!(cut("waiting for a slot", 10).chars().count(), 10);
        // Wide characters take two columns each.
        assert_eq!(cut("日本日本日本", 7), "日本日…");
        assert_eq!(cut("abc", 0), "");
    }

    #[test]
    fn renders_holders_queue_and_clock() {
        let progress = Progress {
            limit: 2,
            holders: vec![holder("web-3", 812, 252), holder("web-7", 55, 10)],
            ahead: 3,
        };
        assert_eq!(
            Picture::of("service/db", &progress, Duration::from_secs(14), now()).full(),
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
        let picture = Picture::of("jobs", &progress, Duration::from_secs(3725), now());
        assert_eq!(
            picture.full(),
            "waiting for a slot at jobs: 5/5 held (?; ?; ?; 2 more), next in line, 1:02:05"
        );
        // Nothing told of their times: the details go at once.
        assert_eq!(
            picture.fit(70),
            "waiting for a slot at jobs: 5/5 held, next in line, 1:02:05"
        );
    }

    #[test]
    fn the_holders_details_go_first_then_the_words() {
        let picture = demo(2);
        let full = "waiting for a slot at demo: 2/2 held (vm pid 12843, started 11s ago; vm pid 12850, started 4s ago), next in line, 00:02";
        assert_eq!(picture.fit(200), full);
        assert_eq!(picture.fit(width(full)), full);
        // 100 and 80 columns, drawn one short.
        assert_eq!(
            picture.fit(99),
            "waiting for a slot at demo: 2/2 held (vm pid 12843, started 11s ago; 1 more), next in line, 00:02"
        );
        assert_eq!(
            picture.fit(90),
            "waiting for a slot at demo: 2/2 held (oldest started 11s ago), next in line, 00:02"
        );
        assert_eq!(
            picture.fit(79),
            "waiting for a slot at demo: 2/2 held (oldest 11s), next in line, 00:02"
        );
        assert_eq!(
            picture.fit(65),
            "waiting for a slot at demo: 2/2 held, next in line, 00:02"
        );
        assert_eq!(
            picture.fit(55),
            "waiting for a slot at demo: 2/2 held, next, 00:02"
        );
        // 40 columns.
        assert_eq!(picture.fit(39), "waiting at demo: 2/2 held, next, 00:02");
        assert_eq!(picture.fit(35), "waiting at demo: 2/2, next, 00:02");
        assert_eq!(picture.fit(30), "demo: 2/2, next, 00:02");
        // A prefix too long for the window keeps its end.
        assert_eq!(picture.fit(21), "…mo: 2/2, next, 00:02");
        assert_eq!(picture.fit(20), "…o: 2/2, next, 00:02");
        // Below that, nothing useful fits: the line is cut.
        assert_eq!(picture.fit(19), "demo: 2/2, next, 0…");
        assert_eq!(picture.fit(0), "");
    }

    #[test]
    fn one_holder_is_told_by_its_time() {
        let progress = Progress {
            limit: 1,
            holders: vec![holder("build-host-17.example.com", 4242, 3725)],
            ahead: 2,
        };
        let picture = Picture::of("nightly", &progress, Duration::from_secs(61), now());
        assert_eq!(
            picture.fit(99),
            "waiting for a slot at nightly: 1/1 held (started 1h2m5s ago), 2 ahead of you, 01:01"
        );
        assert_eq!(
            picture.fit(79),
            "waiting for a slot at nightly: 1/1 held (for 1h2m5s), 2 ahead of you, 01:01"
        );
    }

    #[test]
    fn the_prefix_is_shown_printable() {
        let progress = Progress {
            limit: 1,
            holders: vec![],
            ahead: 0,
        };
        let picture = Picture::of("a\x1b[2Jb", &progress, Duration::ZERO, now());
        assert!(!picture.full().contains('\x1b'), "{}", picture.full());
    }

    fn picture() -> impl Strategy<Value = (Picture, String)> {
        (
            "[a-z0-9/._-]{1,40}|[^\\p{C}:]{1,20}",
            1u32..1000,
            prop::collection::vec(
                (
                    prop::option::of("[a-z0-9.-]{1,30}"),
                    prop::option::of(1u64..5_000_000),
                    prop::option::of(0u64..100_000),
                ),
                0..12,
            ),
            0usize..1000,
            0u64..36_000,
        )
            .prop_map(|(prefix, limit, holders, ahead, waited)| {
                let progress = Progress {
                    limit,
                    holders: holders
                        .into_iter()
                        .map(|(host, pid, held)| Holder {
                            host,
                            pid,
                            since: held.map(|held| now() - Duration::from_secs(held)),
                        })
                        .collect(),
                    ahead,
                };
                let picture = Picture::of(&prefix, &progress, Duration::from_secs(waited), now());
                (picture, prefix)
            })
    }

    proptest! {
        /// The fitted line never takes more than its columns, and from 32
        /// columns on (40 columns drawn one short leave 39) it keeps who
        /// waits for what (the prefix, or its end), the slots held, the
        /// place in line and the time waited. The numbers are up to three
        /// digits, the wait up to ten hours.
        #[test]
        fn the_fitted_line_fits_and_keeps_what_matters(
            (picture, prefix) in picture(),
            columns in 0usize..260,
        ) {
            let line = picture.fit(columns);
            prop_assert!(width(&line) <= columns, "{line:?} in {columns}");
            prop_assert!(!line.contains(char::is_control));
            if width(&picture.full()) <= columns {
                prop_assert_eq!(&line, &picture.full());
            }
            if columns >= 32 {
                let ahead = match picture.ahead {
                    0 => "next".to_string(),
                    n => format!("{n} ahead"),
                };
                let counts = format!(": {}/{}", picture.held, picture.limit);
                let (shown_prefix, rest) = line.split_once(&counts).expect("the counts");
                prop_assert!(
                    shown_prefix.ends_with(&prefix)
                        || shown_prefix
                            .strip_prefix('…')
                            .is_some_and(|end| !end.is_empty() && prefix.ends_with(end)),
                    "{line:?}"
                );
                prop_assert!(rest.contains(&format!(", {ahead}")), "{line:?}");
                prop_assert!(rest.ends_with(&format!(", {}", picture.clock)), "{line:?}");
            }
        }
    }
}
