//! The decisions of the etcd recipe, as pure functions of a listing of the
//! prefix: who holds, where a contender stands, and which one key it waits
//! on. The contenders are the keys under `<prefix>/` attached to a lease,
//! oldest first by create revision: the first `limit` hold. A key keeps its
//! create revision until it goes, so a contender among the first `limit`
//! stays there until it leaves: holding needs no write, and never more than
//! `limit` hold at any revision.

use super::client::KeyValue;

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
        .filter(|kv| kv.lease != 0 && kv.key != limit_key)
        .collect();
    contenders.sort_by_key(|kv| kv.create_revision);
    contenders
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
