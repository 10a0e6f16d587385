//! The operators' side of the Consul store: `status` reads the prefix,
//! `release` frees a slot held by a hung job, `reset` deletes `.lock` so that
//! a new limit can be used. They create no session; every write is a CAS on
//! what was read.

use crate::store::consul::client::{hidden_holder, Client, Consistency, ConsulError};
use crate::store::consul::semaphore::{
    decode_lock, encode_lock, Conflict, HoldersForm, LockRecord, Snapshot, LOCK_KEY_NAME,
    SEMAPHORE_FLAGS,
};
use std::collections::BTreeMap;

use crate::store::consul::semaphore::Entry;
use crate::store::{
    Admin, ContenderInfo, ContenderStatus, ResetOutcome, Status, StoreError, Summary,
};

/// Attempts at a CAS on `.lock` against concurrent writers.
const CAS_ATTEMPTS: u32 = 8;

/// The operators' commands on one Consul prefix.
pub struct ConsulAdmin {
    client: Client,
    prefix: String,
}

fn failure(error: ConsulError) -> StoreError {
    match error {
        ConsulError::Denied(why) => StoreError::denied(format!("permission denied: {why}")),
        other => StoreError::unavailable(other.to_string()),
    }
}

impl ConsulAdmin {
    pub fn new(client: Client, prefix: String) -> ConsulAdmin {
        ConsulAdmin { client, prefix }
    }

    fn read(&self) -> Result<Snapshot, StoreError> {
        let listing = self
            .client
            .list(&self.prefix, Consistency::Consistent, None)
            .map_err(failure)?;
        Ok(Snapshot::from_entries(listing.entries))
    }

    /// Reads the prefix, and directly each holder the listing shows as
    /// dead: calling a holder dead (status) or deleting `.lock` under it
    /// (reset) must not rest on a listing that an ACL filtered. Refuses
    /// (77) when a holder is hidden from the token; reads again when one
    /// came back since.
    fn read_checked(&self) -> Result<Snapshot, StoreError> {
        for _ in 0..CAS_ATTEMPTS {
            let mut snapshot = self.read()?;
            let Some((record, _)) = self.lock_record(&snapshot)? else {
                // A `.lock` the token may not read is left out of the
                // listing too: "no semaphore" would be wrong.
                if let Err(ConsulError::Denied(why)) =
                    self.client
                        .get(&self.prefix, LOCK_KEY_NAME, Consistency::Consistent, None)
                {
                    return Err(StoreError::denied(format!("permission denied: {why}")));
                }
                return Ok(snapshot);
            };
            let revealed = self
                .client
                .reveal_hidden(&self.prefix, &record, &mut snapshot)
                .map_err(failure)?;
            if let Some(session) = revealed.hidden.first() {
                return Err(StoreError::denied(format!(
                    "permission denied: {}",
                    hidden_holder(&self.prefix, session)
                )));
            }
            if revealed.revived.is_empty() {
                return Ok(snapshot);
            }
        }
        Err(StoreError::unavailable(format!(
            "the holders at {} kept changing while consem read them; try again",
            self.prefix
        )))
    }

    /// `.lock` decoded whatever its limit, or why it cannot be.
    fn lock_record(&self, snapshot: &Snapshot) -> Result<Option<(LockRecord, u64)>, StoreError> {
        let Some(lock) = &snapshot.lock else {
            return Ok(None);
        };
        let conflict = |why: String| StoreError::conflict(format!("{}/.lock {why}", self.prefix));
        if lock.flags != SEMAPHORE_FLAGS {
            return Err(conflict(Conflict::ForeignFlags(lock.flags).to_string()));
        }
        let record = decode_lock(&lock.value).map_err(|c| conflict(c.to_string()))?;
        Ok(Some((record, lock.modify_index)))
    }

    /// Takes `session` out of `.lock` with CAS, retried against other writers.
    fn remove_holder(&self, session: &str) -> Result<(), StoreError> {
        let key = format!("{}/{LOCK_KEY_NAME}", self.prefix);
        for _ in 0..CAS_ATTEMPTS {
            let snapshot = self.read()?;
            let Some((mut record, index)) = self.lock_record(&snapshot)? else {
                return Ok(());
            };
            if !record.holds(session) {
                return Ok(());
            }
            record.holders.retain(|h| h != session);
            // The last one out deletes `.lock`, as a leaving consem does.
            let nobody_left =
                record.holders.is_empty() && snapshot.contenders.keys().all(|name| name == session);
            let written = if nobody_left {
                self.client.delete(&key, Some(index))
            } else {
                self.client
                    .put_cas(&key, encode_lock(&record), index, SEMAPHORE_FLAGS)
            };
            if written.map_err(failure)? {
                return Ok(());
            }
        }
        Err(StoreError::unavailable(format!(
            "{key} kept changing while consem tried to update it; try again"
        )))
    }
}

impl Admin for ConsulAdmin {
    fn status(&self) -> Result<Status, StoreError> {
        let snapshot = self.read_checked()?;
        let record = self.lock_record(&snapshot)?;
        let describe = |name: &str| -> Result<ContenderStatus, StoreError> {
            let entry = &snapshot.contenders[name];
            let session = entry.session.clone().unwrap_or_default();
            let info = self.client.session_info(&session).map_err(failure)?;
            Ok(ContenderStatus {
                node: info.as_ref().map(|i| i.node.clone()),
                session_name: info.map(|i| i.name),
                ..ContenderStatus::new(
                    session,
                    ContenderInfo::parse(&entry.value),
                    entry.create_index,
                )
            })
        };
        let held: Vec<String> = record
            .as_ref()
            .map(|(r, _)| r.holders.clone())
            .unwrap_or_default();
        let mut holders = Vec::new();
        let mut dead_holders = Vec::new();
        for id in &held {
            if snapshot.contenders.contains_key(id) && snapshot.is_live(id) {
                holders.push(describe(id)?);
            } else {
                dead_holders.push(id.clone());
            }
        }
        let mut waiting: Vec<_> = snapshot
            .contenders
            .values()
            .filter(|e| snapshot.is_live(&e.name) && !held.contains(&e.name))
            .collect();
        waiting.sort_by_key(|e| e.create_index);
        let waiters = waiting
            .into_iter()
            .map(|e| describe(&e.name))
            .collect::<Result<_, _>>()?;
        Ok(Status {
            prefix: self.prefix.clone(),
            limit: record.as_ref().map(|(r, _)| r.limit),
            layout: record.as_ref().map(|(r, _)| match r.form {
                HoldersForm::Map => "map",
                HoldersForm::List => "list",
            }),
            holders,
            waiters,
            dead_holders,
            store: "consul",
            conflict: None,
            stale: Vec::new(),
            lock_delay_ms: None,
        })
    }

    fn release(&self, session: &str) -> Result<(), StoreError> {
        // Destroying the session deletes its contender key: the consem that
        // held the slot sees the loss and stops its command. Only then is
        // `.lock` tidied, so that a failure here leaves nothing half done.
        self.client.destroy_session(session).map_err(failure)?;
        self.remove_holder(session)
    }

    fn reset(&self, force: bool) -> Result<ResetOutcome, StoreError> {
        let key = format!("{}/{LOCK_KEY_NAME}", self.prefix);
        let mut evicted = 0;
        // With --force, only the holders live when reset began are evicted:
        // waiters that take the freed slots afterwards started after the reset.
        let mut evictable: Option<Vec<String>> = None;
        for _ in 0..CAS_ATTEMPTS {
            let snapshot = self.read_checked()?;
            let Some((record, index)) = self.lock_record(&snapshot)? else {
                // With evictions, the last evicted consem deleted .lock on
                // its way out.
                return Ok(if evicted > 0 {
                    ResetOutcome::Reset {
                        limit: None,
                        evicted,
                    }
                } else {
                    ResetOutcome::Nothing
                });
            };
            let live: Vec<String> = record
                .holders
                .iter()
                .filter(|h| snapshot.is_live(h))
                .cloned()
                .collect();
            if !live.is_empty() {
                if !force {
                    return Ok(ResetOutcome::LiveHolders(live));
                }
                let first = evictable.get_or_insert_with(|| live.clone());
                let targets: Vec<&String> = live.iter().filter(|id| first.contains(id)).collect();
                if targets.is_empty() {
                    return Ok(ResetOutcome::NewHolders);
                }
                for id in targets {
                    self.client.destroy_session(id).map_err(failure)?;
                    evicted += 1;
                }
                continue;
            }
            if self.client.delete(&key, Some(index)).map_err(failure)? {
                return Ok(ResetOutcome::Reset {
                    limit: Some(record.limit),
                    evicted,
                });
            }
        }
        Err(StoreError::unavailable(format!(
            "{key} kept changing while consem tried to delete it; try again"
        )))
    }

    /// One recursive read of the prefix (of the whole KV store for the
    /// empty one): a semaphore is a `.lock` with the semaphore's flags,
    /// its contenders the keys beside it. Holders' sessions are not looked
    /// up, as `status` does for their node: that would be a call each.
    fn list(&self) -> Result<Vec<Summary>, StoreError> {
        let listing = self
            .client
            .list_tree(&self.prefix, Consistency::Consistent)
            .map_err(failure)?;
        // Keys by the prefix they are right under, named from there.
        let mut beside: BTreeMap<String, Vec<Entry>> = BTreeMap::new();
        for entry in listing.entries {
            if let Some((prefix, name)) = entry.name.rsplit_once('/') {
                let prefix = prefix.to_string();
                let name = name.to_string();
                beside
                    .entry(prefix)
                    .or_default()
                    .push(Entry { name, ..entry });
            }
        }
        let mut semaphores = Vec::new();
        for (prefix, entries) in beside {
            let snapshot = Snapshot::from_entries(entries);
            // `consul lock` without -n keeps a mutex's `.lock` without the
            // semaphore's flags: not a semaphore.
            let Some(lock) = snapshot
                .lock
                .as_ref()
                .filter(|l| l.flags == SEMAPHORE_FLAGS)
            else {
                continue;
            };
            let record = decode_lock(&lock.value).ok();
            let held: Vec<&String> = record
                .as_ref()
                .map(|r| r.holders.iter().filter(|h| snapshot.is_live(h)).collect())
                .unwrap_or_default();
            let describe = |entry: &Entry| {
                ContenderStatus::new(
                    entry.name.clone(),
                    ContenderInfo::parse(&entry.value),
                    entry.create_index,
                )
            };
            let holders = held
                .iter()
                .map(|id| describe(&snapshot.contenders[id.as_str()]))
                .collect();
            let waiting = snapshot
                .contenders
                .values()
                .filter(|e| snapshot.is_live(&e.name) && !held.contains(&&e.name))
                .count();
            semaphores.push(Summary::new(
                prefix,
                record.map(|r| r.limit),
                holders,
                waiting,
            ));
        }
        Ok(semaphores)
    }
}
