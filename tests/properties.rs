//! Property tests of the pure parts: `.lock` decoding and encoding, the
//! decisions over arbitrary (also hostile) prefixes, and key encoding.

use std::collections::BTreeSet;

use proptest::prelude::*;

use consem::store::consul::client::encode_path;
use consem::store::consul::semaphore::{
    self, decode_lock, encode_lock, Decision, Entry, HoldersForm, LockRecord, ReleaseStep,
    Snapshot, WaitOn, LOCK_KEY_NAME, RELAYS_FIELD, SEMAPHORE_FLAGS,
};

/// Session-like names, a few of them so that collisions happen.
fn session() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u8..6).prop_map(|n| format!("0000000{n}-0000-4000-8000-00000000000{n}")),
        "[a-z0-9-]{1,12}",
    ]
}

fn record() -> impl Strategy<Value = LockRecord> {
    (
        1u32..=8,
        prop::collection::btree_set(session(), 0..10),
        prop::collection::btree_set(session(), 0..3),
        prop::bool::ANY,
    )
        .prop_map(|(limit, holders, leaving, list)| LockRecord {
            limit,
            // Holders on their way out, named `false`: the list form
            // cannot say so.
            leaving: leaving
                .into_iter()
                .filter(|h| !list && !holders.contains(h))
                .collect(),
            // Go writes map keys sorted; a BTreeSet gives that order.
            holders: holders.into_iter().collect(),
            form: if list {
                HoldersForm::List
            } else {
                HoldersForm::Map
            },
        })
}

/// A contender key: held by its own session, by nobody, or by another.
fn contender() -> impl Strategy<Value = Entry> {
    (
        session(),
        0u8..3,
        prop::bool::ANY,
        1u64..100,
        prop::bool::ANY,
    )
        .prop_map(|(name, held, semaphore_flags, index, relays)| Entry {
            session: match held {
                0 => Some(name.clone()),
                1 => None,
                _ => Some("someone-else".into()),
            },
            name,
            // consem's value promises to relay; `consul lock`'s is empty.
            value: if relays {
                format!(r#"{{"{RELAYS_FIELD}":true}}"#).into_bytes()
            } else {
                Vec::new()
            },
            flags: if semaphore_flags { SEMAPHORE_FLAGS } else { 0 },
            create_index: index,
            modify_index: index,
        })
}

/// A `.lock` value: ours, another limit's, or hostile bytes.
fn lock_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => record().prop_map(|r| encode_lock(&r)),
        1 => prop::collection::vec(any::<u8>(), 0..64),
        1 => Just(br#"{"Limit":2,"Holders":null}"#.to_vec()),
        1 => Just(br#"{"Limit":-1,"Holders":{}}"#.to_vec()),
        1 => Just(br#"{"Limit":2,"Holders":["a","a","not-a-uuid"]}"#.to_vec()),
    ]
}

fn snapshot() -> impl Strategy<Value = Snapshot> {
    (
        prop::option::of((lock_value(), prop::bool::weighted(0.9), 1u64..1000)),
        prop::collection::vec(contender(), 0..8),
    )
        .prop_map(|(lock, contenders)| {
            let mut entries = contenders;
            if let Some((value, semaphore_flags, index)) = lock {
                entries.push(Entry {
                    name: LOCK_KEY_NAME.into(),
                    value,
                    flags: if semaphore_flags { SEMAPHORE_FLAGS } else { 7 },
                    session: None,
                    create_index: 1,
                    modify_index: index,
                });
            }
            Snapshot::from_entries(entries)
        })
}

fn live_holders(record: &LockRecord, snapshot: &Snapshot) -> usize {
    record
        .holders
        .iter()
        .filter(|h| snapshot.is_live(h))
        .count()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn encoding_round_trips(record in record()) {
        prop_assert_eq!(decode_lock(&encode_lock(&record)).unwrap(), record);
    }

    #[test]
    fn decoding_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_lock(&bytes);
    }

    #[test]
    fn taking_a_slot_never_exceeds_the_limit(snap in snapshot(), me in session(), limit in 1u32..=4) {
        match semaphore::decide(&snap, &me, limit) {
            Ok(Decision::Take { value, cas }) => {
                let written = decode_lock(&value).unwrap();
                prop_assert_eq!(written.limit, limit);
                prop_assert!(written.holds(&me));
                // Every other holder written is live; with us, at most Limit.
                prop_assert!(written.holders.iter().all(|h| h == &me || snap.is_live(h)));
                prop_assert!(written.holders.len() <= limit as usize);
                // Nobody who arrived earlier is overtaken.
                prop_assert!(written.holders.len() + semaphore::waiters_ahead(&snap, &written, &me) <= limit as usize);
                prop_assert_eq!(cas, snap.lock.as_ref().map_or(0, |l| l.modify_index));
                // A record that exists keeps its form.
                if let Ok(Some(found)) = snap.lock_record(limit) {
                    prop_assert_eq!(written.form, found.form);
                }
            }
            Ok(Decision::Full { holders, wait_on }) => {
                // Full, or full once the waiters that arrived first are in.
                let leaving = snap
                    .lock_record(limit)
                    .ok()
                    .flatten()
                    .map(|r| semaphore::prune(&r, &snap).leaving)
                    .unwrap_or_default();
                let record = LockRecord { holders: holders.clone(), leaving, ..LockRecord::new(limit) };
                let queued = holders.len() + semaphore::waiters_ahead(&snap, &record, &me);
                prop_assert!(queued >= limit as usize);
                prop_assert!(holders.iter().all(|h| snap.is_live(h)));
                if let WaitOn::Key(ahead) = wait_on {
                    // Only a waiter that one departure cannot serve blocks on
                    // a key, and only on the relaying waiter just ahead of it.
                    prop_assert!(queued > limit as usize);
                    let entry = &snap.contenders[&ahead];
                    prop_assert!(semaphore::relays(entry) && snap.is_live(&ahead) && !record.holds(&ahead));
                    let mine = snap.contenders[&me].create_index;
                    prop_assert!(entry.create_index < mine);
                    let skipped = snap.contenders.values().any(|e| {
                        snap.is_live(&e.name)
                            && semaphore::relays(e)
                            && !record.names(&e.name)
                            && e.create_index > entry.create_index
                            && e.create_index < mine
                    });
                    prop_assert!(!skipped);
                }
            }
            Ok(Decision::Holding) => {
                prop_assert!(snap.lock_record(limit).unwrap().unwrap().holds(&me));
            }
            Ok(Decision::SessionLost) => prop_assert!(!snap.is_live(&me)),
            // A conflict is exactly a `.lock` that is not ours to write, or
            // one that names more live holders than its limit.
            Err(_) => {
                let conflict = match snap.lock_record(limit) {
                    Err(_) => true,
                    Ok(Some(record)) => live_holders(&record, &snap) > limit as usize,
                    Ok(None) => false,
                };
                prop_assert!(conflict);
            }
        }
    }

    #[test]
    fn a_foreign_lock_is_never_written(snap in snapshot(), me in session(), limit in 1u32..=4) {
        if snap.lock_record(limit).is_err() {
            prop_assert!(semaphore::decide(&snap, &me, limit).is_err());
            prop_assert_eq!(semaphore::plan_release(&snap, &me, limit), ReleaseStep::Nothing);
        }
    }

    #[test]
    fn releasing_takes_us_out_and_keeps_the_live(snap in snapshot(), me in session(), limit in 1u32..=4) {
        let Ok(Some(before)) = snap.lock_record(limit) else {
            return Ok(());
        };
        match semaphore::plan_release(&snap, &me, limit) {
            ReleaseStep::Rewrite { value, cas, heir } => {
                let after = decode_lock(&value).unwrap();
                prop_assert!(!after.holds(&me));
                // Out of `.lock` while our key lives, we are named as one
                // on its way out, whom nobody hands a slot to.
                if snap.is_live(&me) && after.form == HoldersForm::Map {
                    prop_assert!(after.leaving.contains(&me));
                }
                let handed = usize::from(heir.is_some());
                prop_assert_eq!(live_holders(&after, &snap), live_holders(&before, &snap) - usize::from(snap.is_live(&me) && before.holds(&me)) + handed);
                prop_assert_eq!(cas, snap.lock.as_ref().unwrap().modify_index);
                if let Some(heir) = heir {
                    // A hand-off never adds a holder beyond the limit, and
                    // goes to the live consem waiter that arrived first.
                    prop_assert!(after.holders.len() <= limit as usize);
                    prop_assert!(after.holds(&heir) && !before.holds(&heir));
                    let entry = &snap.contenders[&heir];
                    prop_assert!(semaphore::relays(entry) && snap.is_live(&heir));
                    prop_assert!(!before.leaving.contains(&heir));
                    let overtaken = snap.contenders.values().any(|e| {
                        e.name != me
                            && semaphore::relays(e)
                            && snap.is_live(&e.name)
                            && !before.names(&e.name)
                            && e.create_index < entry.create_index
                    });
                    prop_assert!(!overtaken);
                }
            }
            ReleaseStep::Delete { .. } => {
                // Only when no other live contender is left on the prefix
                // (a key that no session holds waits for nothing, nor does
                // a holder on its way out).
                prop_assert!(snap
                    .contenders
                    .keys()
                    .all(|k| k == &me || !snap.is_live(k) || before.leaving.contains(k)));
                prop_assert!(before.holders.iter().all(|h| h == &me || !snap.is_live(h)));
            }
            ReleaseStep::Nothing => prop_assert!(!before.holds(&me)),
        }
    }

    #[test]
    fn keys_encode_to_url_safe_text_and_back(key in any::<String>()) {
        let encoded = encode_path(&key);
        prop_assert!(encoded.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~/%".contains(&b)));
        prop_assert_eq!(percent_decode(&encoded), key.into_bytes());
    }
}

fn percent_decode(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            out.push(u8::from_str_radix(&text[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

#[test]
fn hostile_lock_values_are_conflicts_or_safe() {
    let distinct =
        |holders: &[String]| holders.iter().collect::<BTreeSet<_>>().len() == holders.len();
    // Duplicates collapse; non-UUID holders are just dead holders.
    let record = decode_lock(br#"{"Limit":2,"Holders":["a","a","x y"]}"#).unwrap();
    assert!(distinct(&record.holders));
    assert_eq!(record.holders.len(), 2);
    // Null holders are an empty set.
    assert!(decode_lock(br#"{"Limit":2,"Holders":null}"#)
        .unwrap()
        .holders
        .is_empty());
    // Zero, negative, fractional and huge limits are not records.
    for value in [
        &br#"{"Limit":0,"Holders":{}}"#[..],
        br#"{"Limit":-3,"Holders":{}}"#,
        br#"{"Limit":1.5,"Holders":{}}"#,
        br#"{"Limit":99999999999,"Holders":{}}"#,
    ] {
        assert!(
            decode_lock(value).is_err(),
            "{}",
            String::from_utf8_lossy(value)
        );
    }
    // A huge value decodes and its dead holders are pruned.
    let many: Vec<String> = (0..20_000).map(|i| format!("\"dead-{i}\":true")).collect();
    let value = format!(r#"{{"Limit":2,"Holders":{{{}}}}}"#, many.join(","));
    let entries = vec![
        Entry {
            name: LOCK_KEY_NAME.into(),
            value: value.into_bytes(),
            flags: SEMAPHORE_FLAGS,
            session: None,
            create_index: 1,
            modify_index: 9,
        },
        Entry {
            name: "me".into(),
            value: Vec::new(),
            flags: SEMAPHORE_FLAGS,
            session: Some("me".into()),
            create_index: 5,
            modify_index: 5,
        },
    ];
    let Decision::Take { value, cas: 9 } =
        semaphore::decide(&Snapshot::from_entries(entries), "me", 2).unwrap()
    else {
        panic!("the dead are pruned and the slot taken");
    };
    assert_eq!(decode_lock(&value).unwrap().holders, vec!["me"]);
}
