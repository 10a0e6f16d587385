//! An in-memory model of the parts of Consul the semaphore uses: KV with
//! raft-like indexes, CAS, acquire, sessions with TTL and the `delete`
//! behaviour, on a simulated clock. Each call is atomic, as it is on a Consul
//! server; the scheduler interleaves calls from many clients.

use std::collections::BTreeMap;

use consem::store::consul::semaphore::Entry;

/// Simulated time, in milliseconds.
pub type Millis = u64;

#[derive(Debug, Clone)]
struct Session {
    ttl: Millis,
    renewed_at: Millis,
}

#[derive(Debug, Clone)]
struct Value {
    value: Vec<u8>,
    flags: u64,
    session: Option<String>,
    create_index: u64,
    modify_index: u64,
}

#[derive(Debug, Default, Clone)]
pub struct Consul {
    index: u64,
    now: Millis,
    next_session: u64,
    sessions: BTreeMap<String, Session>,
    kv: BTreeMap<String, Value>,
    /// Index of the latest delete under each key, so listings never go back.
    tombstones: BTreeMap<String, u64>,
    /// How many restores happened: a blocking read started before one
    /// answers at once, as Consul abandons blocking queries on a restore.
    restores: u64,
}

impl Consul {
    pub fn now(&self) -> Millis {
        self.now
    }

    /// Moves the clock and invalidates sessions whose TTL ran out. Consul
    /// invalidates somewhere between TTL and 2×TTL; the model uses 2×TTL, the
    /// latest, which is what a client must survive.
    pub fn advance(&mut self, to: Millis) {
        self.now = self.now.max(to);
        let expired: Vec<String> = self
            .sessions
            .iter()
            .filter(|(_, s)| self.now > s.renewed_at + 2 * s.ttl)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            self.invalidate(&id);
        }
    }

    fn bump(&mut self) -> u64 {
        self.index += 1;
        self.index
    }

    pub fn create_session(&mut self, ttl: Millis) -> String {
        self.next_session += 1;
        let id = format!(
            "{:08x}-0000-4000-8000-{:012x}",
            self.next_session, self.next_session
        );
        self.bump();
        self.sessions.insert(
            id.clone(),
            Session {
                ttl,
                renewed_at: self.now,
            },
        );
        id
    }

    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// `PUT renew`: false for an unknown session (Consul's 404).
    pub fn renew(&mut self, id: &str) -> bool {
        match self.sessions.get_mut(id) {
            Some(session) => {
                session.renewed_at = self.now;
                true
            }
            None => false,
        }
    }

    /// Destroy, TTL expiry, or an agent losing it: the `delete` behaviour
    /// removes every key the session holds.
    pub fn invalidate(&mut self, id: &str) {
        if self.sessions.remove(id).is_none() {
            return;
        }
        let held: Vec<String> = self
            .kv
            .iter()
            .filter(|(_, v)| v.session.as_deref() == Some(id))
            .map(|(k, _)| k.clone())
            .collect();
        for key in held {
            self.delete_key(&key);
        }
        self.bump();
    }

    /// Every session vanishes at once (a dev agent restart keeps the KV store
    /// here: the harder case, since `.lock` still names the old holders).
    pub fn lose_all_sessions(&mut self) {
        let ids: Vec<String> = self.sessions.keys().cloned().collect();
        for id in ids {
            self.invalidate(&id);
        }
    }

    /// `PUT ?acquire=`: None for an unknown session (Consul's 500).
    pub fn acquire(
        &mut self,
        key: &str,
        session: &str,
        value: Vec<u8>,
        flags: u64,
    ) -> Option<bool> {
        if !self.sessions.contains_key(session) {
            return None;
        }
        match self.kv.get(key) {
            Some(v) if v.session.as_deref().is_some_and(|s| s != session) => return Some(false),
            // Consul 1.6 and later skip a write that changes nothing: the
            // index stays, and nobody blocking on the key wakes.
            Some(v)
                if v.session.as_deref() == Some(session)
                    && v.value == value
                    && v.flags == flags =>
            {
                return Some(true)
            }
            _ => {}
        }
        let index = self.bump();
        let create_index = self.kv.get(key).map_or(index, |v| v.create_index);
        self.kv.insert(
            key.to_string(),
            Value {
                value,
                flags,
                session: Some(session.to_string()),
                create_index,
                modify_index: index,
            },
        );
        Some(true)
    }

    /// `PUT ?release=<session>` by an operator: the key stays, held by no
    /// session (so no session's end deletes it). False if it is not held.
    pub fn release_key(&mut self, key: &str) -> bool {
        if self.kv.get(key).is_none_or(|v| v.session.is_none()) {
            return false;
        }
        let index = self.bump();
        let value = self.kv.get_mut(key).expect("checked above");
        value.session = None;
        value.modify_index = index;
        true
    }

    /// `consul snapshot restore` onto servers whose raft log is shorter:
    /// every key and session kept, every index renumbered from the bottom
    /// in the same order, so clients see indexes lower than they sent.
    pub fn restore_with_lower_index(&mut self) {
        let mut used: Vec<u64> = self
            .kv
            .values()
            .flat_map(|v| [v.create_index, v.modify_index])
            .chain(self.tombstones.values().copied())
            .collect();
        used.sort_unstable();
        used.dedup();
        let rank = |index: u64| 2 + used.binary_search(&index).unwrap_or(0) as u64;
        for value in self.kv.values_mut() {
            value.create_index = rank(value.create_index);
            value.modify_index = rank(value.modify_index);
        }
        for index in self.tombstones.values_mut() {
            *index = rank(*index);
        }
        self.index = 2 + used.len() as u64;
        self.restores += 1;
    }

    pub fn restores(&self) -> u64 {
        self.restores
    }

    /// `PUT ?cas=`: 0 creates only.
    pub fn put_cas(&mut self, key: &str, value: Vec<u8>, cas: u64, flags: u64) -> bool {
        let current = self.kv.get(key).map(|v| v.modify_index);
        let ok = match (cas, current) {
            (0, None) => true,
            (0, Some(_)) => false,
            (cas, Some(index)) => cas == index,
            (_, None) => false,
        };
        if !ok {
            return false;
        }
        let index = self.bump();
        let (create_index, session) = self
            .kv
            .get(key)
            .map_or((index, None), |v| (v.create_index, v.session.clone()));
        self.kv.insert(
            key.to_string(),
            Value {
                value,
                flags,
                session,
                create_index,
                modify_index: index,
            },
        );
        true
    }

    /// `DELETE`, with `?cas=` when given.
    pub fn delete(&mut self, key: &str, cas: Option<u64>) -> bool {
        match (cas, self.kv.get(key)) {
            (Some(cas), Some(v)) if v.modify_index != cas => false,
            (_, None) => true,
            _ => {
                self.delete_key(key);
                true
            }
        }
    }

    fn delete_key(&mut self, key: &str) {
        if self.kv.remove(key).is_some() {
            let index = self.bump();
            self.tombstones.insert(key.to_string(), index);
        }
    }

    /// `GET <dir>?recurse`: the listing and its X-Consul-Index.
    pub fn list(&self, dir: &str) -> (u64, Vec<Entry>) {
        let entries = self
            .kv
            .range(dir.to_string()..)
            .take_while(|(k, _)| k.starts_with(dir))
            .map(|(k, v)| Entry {
                name: k[dir.len()..].to_string(),
                value: v.value.clone(),
                flags: v.flags,
                session: v.session.clone(),
                create_index: v.create_index,
                modify_index: v.modify_index,
            })
            .collect();
        (self.prefix_index(dir), entries)
    }

    /// `GET <key>`: X-Consul-Index (the key's ModifyIndex, or the index of
    /// its delete) and the entry, named relative to `dir`.
    pub fn get(&self, dir: &str, key: &str) -> (u64, Option<Entry>) {
        match self.kv.get(key) {
            Some(v) => (
                v.modify_index,
                Some(Entry {
                    name: key[dir.len()..].to_string(),
                    value: v.value.clone(),
                    flags: v.flags,
                    session: v.session.clone(),
                    create_index: v.create_index,
                    modify_index: v.modify_index,
                }),
            ),
            None => (self.tombstones.get(key).copied().unwrap_or(0).max(1), None),
        }
    }

    /// The highest index of a live key or a delete under `dir`, at least 1.
    pub fn prefix_index(&self, dir: &str) -> u64 {
        let live = self
            .kv
            .range(dir.to_string()..)
            .take_while(|(k, _)| k.starts_with(dir))
            .map(|(_, v)| v.modify_index);
        let dead = self
            .tombstones
            .range(dir.to_string()..)
            .take_while(|(k, _)| k.starts_with(dir))
            .map(|(_, i)| *i);
        live.chain(dead).max().unwrap_or(0).max(1)
    }

    pub fn keys(&self) -> Vec<String> {
        self.kv.keys().cloned().collect()
    }

    pub fn value(&self, key: &str) -> Option<&[u8]> {
        self.kv.get(key).map(|v| v.value.as_slice())
    }
}
