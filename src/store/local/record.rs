//! The prefix's record (`state`) and the fence floor (in `meta`) as they
//! are stored, free of I/O.
//!
//! Both are rewritten in place, under the `meta` lock, by whichever user's
//! consem changes them: in a sticky directory nobody may rename over
//! another user's file. A write cut short (a consem killed inside a write
//! of more than a page, a power loss) must then be told from a whole
//! record: a record starts with a check of the rest, and every write
//! starts at the first byte, so a record cut short keeps the check of the
//! record it was writing and fails it.

use serde::{Deserialize, Serialize};

/// The prefix's record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// `None` once nobody contends (after the last one leaves, or a reset):
    /// the next contender sets it.
    pub limit: Option<u32>,
    /// The next ticket: tickets give the order of arrival.
    pub next: u64,
    /// The last fence handed out; never reset, so it grows from one
    /// acquisition to the next for the life of the directory.
    pub fence: u64,
    /// No contender with a lower ticket waits: each one holds a slot, left
    /// or died. Raised past its own ticket by each contender that takes a
    /// slot (the first in the queue), so that a waiter looking for the
    /// waiter just ahead, or a holder leaving looking for the first one,
    /// never looks below it.
    pub waiting_from: u64,
    pub holders: Vec<u64>,
}

/// The record as written: `State`'s fields after a check of them.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    /// FNV-1a of the record's other fields as JSON; absent in a record of
    /// an older consem (written whole, with a rename) or written by hand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    check: Option<String>,
    limit: Option<u32>,
    next: u64,
    fence: u64,
    /// Absent in a record of an older consem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    waiting_from: Option<u64>,
    holders: Vec<u64>,
}

/// The fields that the check covers, in the order they are written.
#[derive(Serialize)]
struct Checked<'a> {
    limit: Option<u32>,
    next: u64,
    fence: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    waiting_from: Option<u64>,
    holders: &'a [u64],
}

impl Stored {
    fn checked(&self) -> Checked<'_> {
        Checked {
            limit: self.limit,
            next: self.next,
            fence: self.fence,
            waiting_from: self.waiting_from,
            holders: &self.holders,
        }
    }
}

/// How every record that consem writes begins.
const CHECKED_START: &[u8] = br#"{"check":""#;

/// What the bytes of `state` are.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// A whole record.
    Whole(State),
    /// A whole record of an older consem, which kept no `waiting_from`
    /// (this one's is 0): the caller finds it from the files present.
    Older(State),
    /// One of ours cut short (or empty: made, never written): the caller
    /// rebuilds the record from the files present.
    CutShort,
    /// Not a record of consem's: left untouched; the parse error says why.
    Foreign(String),
}

/// The bytes to write for `state`.
pub fn encode(state: &State) -> Vec<u8> {
    let mut stored = Stored {
        check: None,
        limit: state.limit,
        next: state.next,
        fence: state.fence,
        waiting_from: Some(state.waiting_from),
        holders: state.holders.clone(),
    };
    stored.check = Some(check(&stored.checked()));
    serde_json::to_vec(&stored).expect("a record always encodes")
}

pub fn decode(bytes: &[u8]) -> Read {
    if bytes.is_empty() {
        return Read::CutShort;
    }
    match serde_json::from_slice::<Stored>(bytes) {
        Ok(stored)
            if stored
                .check
                .as_ref()
                .is_some_and(|c| *c != check(&stored.checked())) =>
        {
            Read::CutShort
        }
        Ok(stored) => {
            let state = State {
                limit: stored.limit,
                next: stored.next,
                fence: stored.fence,
                waiting_from: stored.waiting_from.unwrap_or(0),
                holders: stored.holders,
            };
            match stored.waiting_from {
                Some(_) => Read::Whole(state),
                None => Read::Older(state),
            }
        }
        Err(_) if bytes.starts_with(CHECKED_START) => Read::CutShort,
        Err(error) => Read::Foreign(error.to_string()),
    }
}

/// Of the fields as JSON: an older consem's record (no `waiting_from`)
/// checks as that consem wrote it.
fn check(checked: &Checked<'_>) -> String {
    let bytes = serde_json::to_vec(checked).expect("a record always encodes");
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{hash:016x}")
}

/// The fence floor's bytes in `meta`: one width, so that a rewrite covers
/// the whole of the last one and needs no truncation.
pub fn encode_floor(fence: u64) -> [u8; FLOOR_LEN] {
    let mut bytes = [0u8; FLOOR_LEN];
    bytes.copy_from_slice(format!("{fence:020}\n").as_bytes());
    bytes
}

pub const FLOOR_LEN: usize = 21;

/// The fence floor kept in `meta`; 0 where there is none (a `meta` made by
/// an older consem is empty) or it cannot be read.
pub fn decode_floor(bytes: &[u8]) -> u64 {
    match bytes {
        [digits @ .., b'\n'] if digits.len() == FLOOR_LEN - 1 => std::str::from_utf8(digits)
            .ok()
            .and_then(|d| d.parse().ok())
            .unwrap_or(0),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> State {
        State {
            limit: Some(2),
            next: 15,
            fence: 7,
            waiting_from: 5,
            holders: vec![3, 4],
        }
    }

    #[test]
    fn a_record_reads_back_whole() {
        let bytes = encode(&sample());
        assert!(bytes.starts_with(CHECKED_START));
        assert_eq!(decode(&bytes), Read::Whole(sample()));
        // The helpers of the tests and operators read it as plain JSON.
        let plain: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(plain["holders"], serde_json::json!([3, 4]));
    }

    /// Writes `new` over `old` from the first byte, stopped at every
    /// length (the truncation to its own length not done yet): what is
    /// read is one of the two records, or a record cut short.
    fn cut_short_anywhere(old: &State, new: &State) {
        let (old_bytes, new_bytes) = (encode(old), encode(new));
        for written in 0..=new_bytes.len() {
            let mut bytes = old_bytes.clone();
            bytes.resize(bytes.len().max(written), 0);
            bytes[..written].copy_from_slice(&new_bytes[..written]);
            match decode(&bytes) {
                Read::Whole(state) => assert!(
                    (bytes == old_bytes && &state == old) || (bytes == new_bytes && &state == new),
                    "{written}: {state:?}"
                ),
                Read::CutShort => {}
                Read::Older(state) => panic!("{written}: read as an older record: {state:?}"),
                Read::Foreign(error) => panic!("{written}: {error}"),
            }
        }
    }

    #[test]
    fn a_record_cut_short_anywhere_is_never_read_as_a_record() {
        let longer = State {
            holders: vec![3, 4, 5, 6, 7, 8],
            ..sample()
        };
        let shorter = State {
            fence: 8,
            holders: vec![4, 5, 60],
            ..sample()
        };
        cut_short_anywhere(&longer, &shorter);
        cut_short_anywhere(&shorter, &longer);
        cut_short_anywhere(&State::default(), &sample());
        assert_eq!(decode(b""), Read::CutShort);
    }

    #[test]
    fn a_record_of_an_older_consem_is_whole_and_anything_else_foreign() {
        let older = br#"{"limit":2,"next":15,"fence":7,"holders":[3,4]}"#;
        let without_queue_start = State {
            waiting_from: 0,
            ..sample()
        };
        assert_eq!(decode(older), Read::Older(without_queue_start.clone()));
        // One that checked its record, before the queue's start was kept.
        let checked = Checked {
            limit: Some(2),
            next: 15,
            fence: 7,
            waiting_from: None,
            holders: &[3, 4],
        };
        let older_checked = format!(
            r#"{{"check":"{}","limit":2,"next":15,"fence":7,"holders":[3,4]}}"#,
            check(&checked)
        );
        assert_eq!(
            decode(older_checked.as_bytes()),
            Read::Older(without_queue_start)
        );
        assert!(matches!(decode(b"not a record"), Read::Foreign(_)));
        assert!(matches!(decode(b"{\"limit\":2}"), Read::Foreign(_)));
        // A hand edit that keeps the check fails it: rebuilt, not trusted.
        let edited = String::from_utf8(encode(&sample()))
            .unwrap()
            .replace("\"fence\":7", "\"fence\":9");
        assert_eq!(decode(edited.as_bytes()), Read::CutShort);
    }

    #[test]
    fn the_floor_reads_back_and_anything_else_is_zero() {
        assert_eq!(decode_floor(&encode_floor(0)), 0);
        assert_eq!(decode_floor(&encode_floor(u64::MAX)), u64::MAX);
        assert_eq!(decode_floor(&encode_floor(57)), 57);
        assert_eq!(decode_floor(b""), 0);
        assert_eq!(decode_floor(b"57\n"), 0);
        assert_eq!(decode_floor(b"0000000000000000005x\n"), 0);
    }
}
