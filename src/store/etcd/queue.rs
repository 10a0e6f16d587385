//! The decisions of the etcd recipe, as pure functions of a listing of the
//! prefix: who holds, where a contender stands, and which one key it waits
//! on. The contenders are the keys under `<prefix>/` attached to a lease,
//! oldest first by create revision: the first `limit` hold. A key keeps its
//! create revision until it goes, so a contender among the first `limit`
//! stays there until it leaves: holding needs no write, and never more than
//! `limit` hold at any revision.

use super::client::{Changes, KeyValue, RangeReply};
use crate::store::{ContenderInfo, Holder, Progress};

/// The name of the limit record under the prefix.
pub const LIMIT_KEY_NAME: &str = ".limit";

/// Where a contender stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// Among the first `limit`: the slot is ours.
    Holding,
    /// Next in line: any holder's departure may free a slot for us, so we
    /// wait for a deletion anywhere under the prefix.
    First,
    /// Further back: we wait on the key just ahead, which changes when its
    /// contender leaves or takes its slot (its relay write). Watching the
    /// key `limit` places ahead would miss a holder further ahead leaving
    /// first.
    Behind {
        ahead: Vec<u8>,
        waiters_ahead: usize,
    },
    /// Our key is not in the listing: it was deleted, or its lease ended.
    Gone,
}

/// The contenders of a listing: keys with a lease, oldest first; the limit
/// record and keys without a lease (not a contender's: nothing removes
/// them) are left out.
pub fn contenders<'a>(listing: &'a [KeyValue], limit_key: &[u8]) -> Vec<&'a KeyValue> {
    let mut contenders: Vec<&KeyValue> = listing
        .iter()
        .filter(|kv| is_contender(kv, limit_key))
        .collect();
    contenders.sort_by_key(|kv| kv.create_revision);
    contenders
}

/// True if `kv` is a contender's key: on a lease, not the limit record, and
/// right under the prefix. A key further down is a contender of a nested
/// prefix (`a/b` under `a`), whose range the prefix's own takes in: counted,
/// it made `a`'s waiters wait for `a/b`'s holders, and `a` a conflict with
/// "contenders but no limit record".
pub fn is_contender(kv: &KeyValue, limit_key: &[u8]) -> bool {
    let under = &limit_key[..limit_key.len().saturating_sub(LIMIT_KEY_NAME.len())];
    kv.lease != 0
        && kv.key != limit_key
        && kv
            .key
            .strip_prefix(under)
            .is_some_and(|name| !name.contains(&b'/'))
}

/// True if `contender` is consem's: it describes itself with a JSON
/// object. `etcdctl lock` and etcd's `concurrency.Mutex` write keys of the
/// same form with an empty value.
pub fn is_consem(contender: &KeyValue) -> bool {
    serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&contender.value).is_ok()
}

/// The first contender that is not consem's.
pub fn foreign<'a>(contenders: &[&'a KeyValue]) -> Option<&'a KeyValue> {
    contenders.iter().copied().find(|kv| !is_consem(kv))
}

/// Where the contender with key `me` stands among `contenders` (oldest
/// first).
pub fn place(contenders: &[&KeyValue], me: &[u8], limit: u32) -> Place {
    let Some(position) = contenders.iter().position(|kv| kv.key == me) else {
        return Place::Gone;
    };
    let limit = limit as usize;
    if position < limit {
        Place::Holding
    } else if position == limit {
        Place::First
    } else {
        Place::Behind {
            ahead: contenders[position - 1].key.clone(),
            waiters_ahead: position - limit,
        }
    }
}

/// Whether the slot is ours, now that the keys `deleted` are gone, for a
/// waiter that listed `ahead` ahead of its own key and has watched since:
/// keys only ever leave the queue ahead of a contender (a newcomer's
/// create revision is higher), so what is left of `ahead` bounds it. A
/// waiter woken by a holder's departure starts without reading again.
pub fn holds_after(ahead: &[Vec<u8>], deleted: &[Vec<u8>], limit: u32) -> bool {
    ahead.iter().filter(|key| !deleted.contains(key)).count() < limit as usize
}

/// Where a waiter waits, and what it has seen since it read the prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// The key watched, or the start of the prefix.
    pub watched: Vec<u8>,
    /// `Some`: the whole prefix up to this end, for deletions only (the
    /// first waiter).
    pub end: Option<Vec<u8>>,
    /// The revision the waiter has seen through: its listing's, then the
    /// last event's.
    pub seen: i64,
    /// The keys ahead of ours in the listing.
    pub ahead: Vec<Vec<u8>>,
    /// Those of them, and others, seen deleted since: every one, for a
    /// watch of the whole prefix (`end`).
    pub deleted: Vec<Vec<u8>>,
}

/// How many keys past the first `limit` a glimpse of the head of the queue
/// reads: the limit record, and a key without a lease.
pub const HEAD_SLACK: u32 = 2;
/// How many keys a glimpse of a contender's place reads, newest first from
/// its own: its own, the one just ahead, and the limit record, which the
/// first contender writes with its key, at the same revision.
pub const NEAR: i64 = 3;

/// A narrowed read of the prefix, whose size does not grow with the crowd:
/// its oldest `limit + HEAD_SLACK` keys (`head`) and the `NEAR` newest
/// created no later than our key (`near`), in one transaction. etcd still
/// walks the whole prefix in memory to sort it, but answers (and the
/// gateway turns into JSON) a dozen keys, not every contender's.
#[derive(Debug, Clone, Default)]
pub struct Glimpse {
    pub head: RangeReply,
    pub near: RangeReply,
}

/// The keys of a read that [`after_read`] decides on as it would on the
/// whole prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub kvs: Vec<KeyValue>,
    /// Every key of the prefix up to ours is among `kvs`: where we stand
    /// counts them all.
    pub up_to_us: bool,
    /// Every key of the prefix is among `kvs`.
    pub complete: bool,
}

impl Seen {
    /// A read of the whole prefix.
    pub fn whole(kvs: Vec<KeyValue>) -> Seen {
        Seen {
            kvs,
            up_to_us: true,
            complete: true,
        }
    }
}

/// What `glimpse` shows of the queue for the contender with key `me`:
/// `None` if it cannot tell where `me` stands (keys without a lease crowd
/// out the contenders it needs), and the whole prefix must be read.
///
/// The head is the start of the queue in order, so it tells the first
/// `limit` contenders (who holds) once it holds `limit` of them, or the
/// whole prefix. `near` is the stretch of the queue that ends with our key,
/// so it tells the contender just ahead of ours, the one a waiter further
/// back watches. Between the two, keys may be missing: then our place is
/// known only as past the first `limit` and behind the key ahead, which is
/// all a waiter further back needs; a first waiter, or a holder, is
/// adjacent to the head or in it, and sees every key up to its own.
pub fn glimpsed(glimpse: Glimpse, me: &[u8], limit: u32, limit_key: &[u8]) -> Option<Seen> {
    let Glimpse { head, near } = glimpse;
    let is_contender = |kv: &KeyValue| is_contender(kv, limit_key);
    let in_head = |key: &[u8]| head.kvs.iter().any(|kv| kv.key == key);
    let head_contenders: Vec<&KeyValue> = head.kvs.iter().filter(|kv| is_contender(kv)).collect();
    let holding = head_contenders
        .iter()
        .take(limit as usize)
        .any(|kv| kv.key == me);
    if !(!head.more || holding || head_contenders.len() >= limit as usize) {
        return None;
    }
    let ours = near.kvs.iter().position(|kv| kv.key == me);
    if let Some(ours) = ours {
        let ahead_known = near.kvs[ours + 1..].iter().any(is_contender);
        if !(ahead_known || !near.more || holding) {
            return None;
        }
    }
    let up_to_us = !head.more
        || in_head(me)
        || !near.more
        || near.kvs.last().is_some_and(|oldest| in_head(&oldest.key));
    let total = usize::try_from(head.count).unwrap_or(usize::MAX);
    let mut kvs = head.kvs;
    for kv in near.kvs {
        if !kvs.iter().any(|seen| seen.key == kv.key) {
            kvs.push(kv);
        }
    }
    Some(Seen {
        complete: kvs.len() >= total,
        up_to_us,
        kvs,
    })
}

/// What a contender does once it has read the prefix.
#[derive(Debug, PartialEq, Eq)]
pub enum AfterRead<'a> {
    /// A key on a lease that is not consem's shares the prefix.
    Foreign(&'a KeyValue),
    /// The slot is ours; `relay_owed`: a waiter that read before us, and
    /// may watch our key, is behind us in the listing.
    Holding { relay_owed: bool },
    /// Our key is gone: join again.
    Gone,
    /// Every slot is taken: wait there, telling who holds.
    Wait(Waiting, Progress),
}

/// Decides on a listing of the prefix (`kvs`, read at `revision`) for the
/// contender with key `me`; `range` is the prefix's.
pub fn after_read<'a>(
    kvs: &'a [KeyValue],
    revision: i64,
    me: &[u8],
    limit: u32,
    range: (&[u8], &[u8]),
    limit_key: &[u8],
) -> AfterRead<'a> {
    let contenders = contenders(kvs, limit_key);
    if let Some(foreign) = foreign(&contenders) {
        return AfterRead::Foreign(foreign);
    }
    let place = place(&contenders, me, limit);
    let (watched, end, waiters_ahead) = match place {
        Place::Holding => {
            let relay_owed = contenders.last().is_some_and(|last| last.key != me);
            return AfterRead::Holding { relay_owed };
        }
        Place::Gone => return AfterRead::Gone,
        Place::First => (range.0.to_vec(), Some(range.1.to_vec()), 0),
        Place::Behind {
            ahead,
            waiters_ahead,
        } => (ahead, None, waiters_ahead),
    };
    let waiting = Waiting {
        watched,
        end,
        seen: revision,
        ahead: contenders
            .iter()
            .take_while(|kv| kv.key != me)
            .map(|kv| kv.key.clone())
            .collect(),
        deleted: Vec::new(),
    };
    let picture = Progress {
        limit,
        holders: contenders
            .iter()
            .take(limit as usize)
            .map(|kv| Holder::from(&ContenderInfo::parse(&kv.value)))
            .collect(),
        ahead: waiters_ahead,
    };
    AfterRead::Wait(waiting, picture)
}

/// What a change its watch showed tells a waiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterChange {
    /// Departures alone tell that the slot is ours: the command starts
    /// without another read.
    Holding,
    /// Nothing that concerns us (the first waiter sees every departure,
    /// one from behind it too): watch on.
    WatchOn,
    /// Our key went, the key ahead went, or etcd ended the watch: read the
    /// prefix again.
    Read,
    /// The key ahead was written again: its contender took its slot (the
    /// relay write), so we are first in line now, or hold. Read the prefix
    /// again, watching for departures first.
    AheadWritten,
}

impl Waiting {
    /// Takes in `changes`, the events of a watch, for the contender with
    /// key `me`.
    pub fn after_change(&mut self, changes: Changes, me: &[u8], limit: u32) -> AfterChange {
        if changes.deleted.iter().any(|key| key == me) {
            return AfterChange::Read;
        }
        self.seen = changes.through;
        // Further back, one change of the key ahead never frees a slot:
        // `limit` keys at least are ahead of it.
        if self.end.is_none() {
            return if changes.deleted.is_empty() {
                AfterChange::AheadWritten
            } else {
                AfterChange::Read
            };
        }
        self.deleted.extend(changes.deleted);
        if holds_after(&self.ahead, &self.deleted, limit) {
            AfterChange::Holding
        } else {
            AfterChange::WatchOn
        }
    }

    /// Watches as the first in line does: every departure under the
    /// prefix `range`.
    pub fn first_in_line(&mut self, range: (&[u8], &[u8])) {
        self.watched = range.0.to_vec();
        self.end = Some(range.1.to_vec());
    }

    /// Whether a watch may start from what the waiter has seen, though
    /// etcd serves it up to 100 ms late: a waiter further back, whose key
    /// ahead is a waiter too. The first in line watches from where etcd
    /// stands, so that a departure reaches it at once.
    pub fn may_watch_late(&self) -> bool {
        self.end.is_none()
    }

    /// Whether it watches what `other` watches.
    pub fn watches_as(&self, other: &Waiting) -> bool {
        self.watched == other.watched && self.end == other.end
    }
}

/// What a holder's read of its own key shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnKey {
    /// Still ours, where it stood in the queue.
    Ours,
    /// Gone (its lease ended, or deleted).
    Gone,
    /// Put again without our lease (`etcdctl put`): no longer a
    /// contender.
    WithoutOurLease,
    /// Deleted and put again: it stands behind every waiter now.
    Recreated,
}

/// Reads our key as a range read of it found it (`kvs`), for the lease
/// `lease` that created it at revision `fence`.
pub fn own_key(kvs: &[KeyValue], lease: i64, fence: i64) -> OwnKey {
    match kvs.first() {
        None => OwnKey::Gone,
        Some(kv) if kv.lease != lease => OwnKey::WithoutOurLease,
        Some(kv) if kv.create_revision != fence => OwnKey::Recreated,
        Some(_) => OwnKey::Ours,
    }
}

/// What the limit record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    Limit(u32),
    /// Not a limit consem wrote: reported, never overwritten.
    Unreadable(String),
}

pub fn read_limit(value: &[u8]) -> Recorded {
    let text = String::from_utf8_lossy(value);
    match text.trim().parse::<u32>() {
        Ok(limit) if limit > 0 => Recorded::Limit(limit),
        _ => Recorded::Unreadable(crate::report::abbreviated(&text).to_string()),
    }
}

/// A contender's key: `<prefix>/<lease ID in hex>`, as etcd's own
/// `concurrency.Mutex` names its keys.
pub fn contender_key(prefix: &str, lease: i64) -> Vec<u8> {
    format!("{prefix}/{lease:x}").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(name: &str, revision: i64, lease: i64) -> KeyValue {
        KeyValue {
            key: format!("p/{name}").into_bytes(),
            create_revision: revision,
            mod_revision: revision,
            value: Vec::new(),
            lease,
        }
    }

    #[test]
    fn the_oldest_limit_contenders_hold_and_each_waiter_watches_the_key_ahead() {
        let listing = vec![
            kv("c", 7, 3),
            kv(".limit", 2, 0),
            kv("a", 5, 1),
            kv("stray", 1, 0),
            kv("b", 6, 2),
            kv("nested/e", 3, 5),
            kv("d", 9, 4),
        ];
        let contenders = contenders(&listing, b"p/.limit");
        let names: Vec<&[u8]> = contenders.iter().map(|kv| kv.key.as_slice()).collect();
        assert_eq!(names, [&b"p/a"[..], b"p/b", b"p/c", b"p/d"]);
        assert_eq!(place(&contenders, b"p/b", 2), Place::Holding);
        assert_eq!(place(&contenders, b"p/c", 2), Place::First);
        assert_eq!(
            place(&contenders, b"p/d", 2),
            Place::Behind {
                ahead: b"p/c".to_vec(),
                waiters_ahead: 1
            }
        );
        assert_eq!(place(&contenders, b"p/x", 2), Place::Gone);
    }

    #[test]
    fn keys_of_etcdctl_lock_are_told_from_consems() {
        let mut mutex = kv("694d7a8f", 3, 7);
        let mut ours = kv("694d7a90", 4, 8);
        ours.value = br#"{"Host":"web-1","Pid":12}"#.to_vec();
        assert!(is_consem(&ours));
        assert!(!is_consem(&mutex));
        assert_eq!(foreign(&[&ours, &mutex]), Some(&mutex));
        mutex.value = b"[1]".to_vec();
        assert_eq!(foreign(&[&ours, &mutex]), Some(&mutex));
        assert_eq!(foreign(&[&ours]), None);
    }

    #[test]
    fn a_limit_record_is_a_positive_number_or_reported() {
        assert_eq!(read_limit(b"3"), Recorded::Limit(3));
        assert_eq!(read_limit(b"0"), Recorded::Unreadable("0".into()));
        assert_eq!(read_limit(b"lots"), Recorded::Unreadable("lots".into()));
    }

    #[test]
    fn a_waiter_holds_once_fewer_than_limit_of_those_it_listed_ahead_remain() {
        let ahead = vec![b"p/1".to_vec(), b"p/2".to_vec()];
        assert!(!holds_after(&ahead, &[], 2));
        assert!(
            !holds_after(&ahead, &[b"p/9".to_vec()], 2),
            "one behind left"
        );
        assert!(holds_after(&ahead, &[b"p/2".to_vec()], 2));
        assert!(!holds_after(&ahead, &[b"p/2".to_vec()], 1));
        assert!(holds_after(&ahead, &[b"p/2".to_vec(), b"p/1".to_vec()], 1));
    }

    fn described(name: &str, revision: i64) -> KeyValue {
        KeyValue {
            value: br#"{"Host":"h"}"#.to_vec(),
            ..kv(name, revision, revision)
        }
    }

    #[test]
    fn a_read_says_hold_rejoin_or_wait_on_what() {
        let range: (&[u8], &[u8]) = (b"p/", b"p0");
        let listing = vec![
            described("a", 5),
            described("b", 6),
            described("c", 7),
            kv(".limit", 2, 0),
        ];
        let read = |me: &[u8]| after_read(&listing, 9, me, 1, range, b"p/.limit");
        assert_eq!(read(b"p/a"), AfterRead::Holding { relay_owed: true });
        assert_eq!(
            after_read(&listing, 9, b"p/c", 3, range, b"p/.limit"),
            AfterRead::Holding { relay_owed: false }
        );
        assert_eq!(read(b"p/x"), AfterRead::Gone);
        let AfterRead::Wait(first, picture) = read(b"p/b") else {
            panic!("the second of limit 1 waits");
        };
        assert_eq!(first.watched, b"p/");
        assert_eq!(first.end.as_deref(), Some(&b"p0"[..]));
        assert_eq!(
            (first.seen, first.ahead.clone()),
            (9, vec![b"p/a".to_vec()])
        );
        assert_eq!((picture.holders.len(), picture.ahead), (1, 0));
        assert_eq!(picture.holders[0].host.as_deref(), Some("h"));
        let AfterRead::Wait(behind, picture) = read(b"p/c") else {
            panic!("the third of limit 1 waits");
        };
        assert_eq!(
            (behind.watched.as_slice(), behind.end.clone()),
            (&b"p/b"[..], None)
        );
        assert_eq!(picture.ahead, 1);
        assert!(!behind.watches_as(&first));
        let mut foreign = listing.clone();
        foreign.push(kv("m", 8, 8));
        assert_eq!(
            after_read(&foreign, 9, b"p/a", 1, range, b"p/.limit"),
            AfterRead::Foreign(&foreign[4])
        );
    }

    #[test]
    fn a_waiter_holds_on_departures_ahead_and_reads_on_any_other_change() {
        let changes = |deleted: &[&[u8]], through| Changes {
            deleted: deleted.iter().map(|k| k.to_vec()).collect(),
            through,
        };
        let waiting = |end: Option<&[u8]>| Waiting {
            watched: b"p/".to_vec(),
            end: end.map(<[u8]>::to_vec),
            seen: 9,
            ahead: vec![b"p/a".to_vec(), b"p/b".to_vec()],
            deleted: Vec::new(),
        };
        let mut first = waiting(Some(b"p0"));
        assert_eq!(
            first.after_change(changes(&[b"p/z"], 10), b"p/c", 2),
            AfterChange::WatchOn,
            "a departure from behind"
        );
        assert_eq!(
            first.after_change(changes(&[b"p/a"], 11), b"p/c", 2),
            AfterChange::Holding
        );
        assert_eq!(first.seen, 11);
        let mut behind = waiting(None);
        assert_eq!(
            behind.after_change(changes(&[], 10), b"p/c", 1),
            AfterChange::AheadWritten,
            "the key ahead rewritten"
        );
        assert_eq!(
            behind
                .clone()
                .after_change(changes(&[b"p/b"], 11), b"p/c", 1),
            AfterChange::Read,
            "the key ahead gone"
        );
        assert_eq!(
            behind.after_change(changes(&[b"p/c"], 12), b"p/c", 2),
            AfterChange::Read,
            "our own key gone"
        );
        assert_eq!(behind.seen, 10, "our key's deletion is read, not counted");
    }

    /// A queue of `n` described contenders after the limit record, the
    /// i-th created at revision 10 + i; a glimpse of it as etcd answers
    /// one for the contender created at `fence`, with `head` keys of the
    /// head and `near` keys up to ours.
    fn glimpse_of(listing: &[KeyValue], fence: i64, head: usize, near: usize) -> Glimpse {
        let mut oldest = listing.to_vec();
        oldest.sort_by_key(|kv| kv.create_revision);
        let mut newest: Vec<KeyValue> = oldest
            .iter()
            .filter(|kv| kv.create_revision <= fence)
            .cloned()
            .collect();
        newest.reverse();
        let reply = |kvs: Vec<KeyValue>, limit: usize| RangeReply {
            more: kvs.len() > limit,
            kvs: kvs.into_iter().take(limit).collect(),
            count: listing.len() as i64,
            ..RangeReply::default()
        };
        Glimpse {
            head: reply(oldest, head),
            near: reply(newest, near),
        }
    }

    fn queue_of(n: i64) -> Vec<KeyValue> {
        let mut listing = vec![kv(".limit", 10, 0)];
        listing.extend((1..=n).map(|i| described(&format!("{i:x}"), 10 + i)));
        listing
    }

    /// On a glimpse, a waiter decides as on the whole prefix: who holds,
    /// whether it is first, and which key it watches further back, even
    /// with keys between the head and its own that it did not read.
    #[test]
    fn a_glimpse_decides_as_the_whole_prefix_would() {
        let listing = queue_of(30);
        let limit = 3;
        let range: (&[u8], &[u8]) = (b"p/", b"p0");
        let head = (limit + HEAD_SLACK) as usize;
        for i in 1..=30i64 {
            let me = format!("p/{i:x}").into_bytes();
            let glimpse = glimpse_of(&listing, 10 + i, head, NEAR as usize);
            let seen = glimpsed(glimpse, &me, limit, b"p/.limit").expect("a glimpse tells");
            let whole = after_read(&listing, 99, &me, limit, range, b"p/.limit");
            let part = after_read(&seen.kvs, 99, &me, limit, range, b"p/.limit");
            match (whole, part) {
                (AfterRead::Holding { .. }, AfterRead::Holding { .. }) => {}
                (AfterRead::Wait(whole, all), AfterRead::Wait(part, some)) => {
                    assert_eq!((&whole.watched, &whole.end), (&part.watched, &part.end));
                    assert_eq!(all.holders, some.holders);
                    if whole.end.is_some() {
                        assert_eq!(whole.ahead, part.ahead, "the first waiter counts them all");
                    }
                    if seen.up_to_us {
                        assert_eq!(all.ahead, some.ahead, "contender {i}");
                    }
                }
                (whole, part) => panic!("contender {i}: {whole:?} against {part:?}"),
            }
            assert!(!seen.complete || i == 30, "contender {i} saw them all");
        }
        let gone = glimpse_of(&listing, 10 + 31, head, NEAR as usize);
        let seen = glimpsed(gone, b"p/ff", limit, b"p/.limit").unwrap();
        assert_eq!(
            after_read(&seen.kvs, 99, b"p/ff", limit, range, b"p/.limit"),
            AfterRead::Gone
        );
    }

    /// Keys without a lease among those a glimpse read can hide who holds,
    /// or the key ahead: then the whole prefix is read.
    #[test]
    fn a_glimpse_crowded_by_keys_without_a_lease_asks_for_the_whole_prefix() {
        let mut listing = queue_of(10);
        listing.extend((0..4).map(|i| kv(&format!("stray{i}"), 5 + i, 0)));
        let glimpse = glimpse_of(&listing, 20, 5, NEAR as usize);
        assert_eq!(glimpsed(glimpse, b"p/a", 3, b"p/.limit"), None, "head");
        let mut listing = queue_of(10);
        listing.extend((0..4).map(|i| kv(&format!("stray{i}"), 30 + i, 0)));
        let me = described("me", 40);
        listing.push(me.clone());
        let glimpse = glimpse_of(&listing, 40, 5, NEAR as usize);
        assert_eq!(glimpsed(glimpse, &me.key, 3, b"p/.limit"), None, "near");
    }

    #[test]
    fn a_holder_tells_its_key_from_one_written_again() {
        assert_eq!(own_key(&[], 7, 5), OwnKey::Gone);
        assert_eq!(own_key(&[kv("7", 5, 7)], 7, 5), OwnKey::Ours);
        assert_eq!(own_key(&[kv("7", 5, 0)], 7, 5), OwnKey::WithoutOurLease);
        assert_eq!(own_key(&[kv("7", 8, 7)], 7, 5), OwnKey::Recreated);
    }

    #[test]
    fn contender_keys_are_named_as_etcds_mutex_names_them() {
        assert_eq!(contender_key("jobs", 0x694d_7a8f), b"jobs/694d7a8f");
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the arrivals and departures, at most `limit` contenders
        /// see themselves holding, and one that held goes on holding until
        /// its key goes.
        #[test]
        fn never_more_than_limit_hold_and_a_holder_stays_one(
            limit in 1u32..5,
            steps in proptest::collection::vec((any::<bool>(), 0usize..8), 1..60),
        ) {
            let mut live: Vec<KeyValue> = Vec::new();
            let mut held: Vec<Vec<u8>> = Vec::new();
            let mut revision = 1;
            for (arrive, pick) in steps {
                if arrive || live.is_empty() {
                    revision += 1;
                    live.push(KeyValue {
                        key: format!("p/{revision:x}").into_bytes(),
                        create_revision: revision,
                        mod_revision: revision,
                        value: Vec::new(),
                        lease: revision,
                    });
                } else {
                    let gone = live.remove(pick % live.len());
                    held.retain(|k| *k != gone.key);
                }
                let contenders = contenders(&live, b"p/.limit");
                let holding: Vec<Vec<u8>> = live
                    .iter()
                    .filter(|kv| place(&contenders, &kv.key, limit) == Place::Holding)
                    .map(|kv| kv.key.clone())
                    .collect();
                prop_assert!(holding.len() <= limit as usize);
                for key in &held {
                    prop_assert!(holding.contains(key), "a holder stopped holding");
                }
                held = holding;
                // Each waiter watches a distinct key: one departure wakes one.
                let mut watched: Vec<Vec<u8>> = live
                    .iter()
                    .filter_map(|kv| match place(&contenders, &kv.key, limit) {
                        Place::Behind { ahead, .. } => Some(ahead),
                        _ => None,
                    })
                    .collect();
                let count = watched.len();
                watched.sort();
                watched.dedup();
                prop_assert_eq!(watched.len(), count);
            }
        }

        /// A waiter that counts departures from what it listed ahead of it
        /// never believes it holds before it does, whichever of the
        /// departures it saw; one that saw them all (the first waiter
        /// watches every deletion) knows it holds the moment it does.
        #[test]
        fn counting_departures_never_claims_a_slot_too_early(
            limit in 1u32..5,
            before in 1usize..10,
            steps in proptest::collection::vec((any::<bool>(), 0usize..12, any::<bool>()), 0..40),
        ) {
            let kv = |revision: i64| KeyValue {
                key: format!("p/{revision:x}").into_bytes(),
                create_revision: revision,
                mod_revision: revision,
                value: Vec::new(),
                lease: revision,
            };
            let mut live: Vec<KeyValue> = (1..=before as i64).map(kv).collect();
            let me = kv(before as i64 + 1);
            live.push(me.clone());
            let listed = contenders(&live, b"p/.limit");
            let ahead: Vec<Vec<u8>> = listed
                .iter()
                .take_while(|c| c.key != me.key)
                .map(|c| c.key.clone())
                .collect();
            let (mut seen, mut every) = (Vec::new(), Vec::new());
            let mut revision = before as i64 + 1;
            for (arrive, pick, noticed) in steps {
                let others: Vec<usize> = (0..live.len()).filter(|&i| live[i].key != me.key).collect();
                if arrive || others.is_empty() {
                    revision += 1;
                    live.push(kv(revision));
                } else {
                    let gone = live.remove(others[pick % others.len()]);
                    if noticed {
                        seen.push(gone.key.clone());
                    }
                    every.push(gone.key);
                }
                let now = contenders(&live, b"p/.limit");
                let holding = place(&now, &me.key, limit) == Place::Holding;
                if holds_after(&ahead, &seen, limit) {
                    prop_assert!(holding, "claimed a slot that is not free");
                }
                prop_assert_eq!(holds_after(&ahead, &every, limit), holding);
            }
        }
    }
}
