//! The operators' commands on one etcd prefix. Releasing a holder is
//! revoking its lease: its key goes, its consem sees the loss and stops
//! its command (exit 76), and the next waiter takes the slot.

use super::client::{self, Client, Compare, EtcdError, KeyValue, Op};
use super::queue;
use super::Settings;
use std::collections::BTreeMap;

use crate::store::{
    Admin, ContenderInfo, ContenderStatus, ResetOutcome, Status, StoreError, Summary,
};

pub struct EtcdAdmin {
    client: Client,
    prefix: String,
    range: (Vec<u8>, Vec<u8>),
    limit_key: Vec<u8>,
}

fn failure(error: EtcdError) -> StoreError {
    match error {
        EtcdError::Denied(why) => StoreError::denied(why),
        other => StoreError::unavailable(other.to_string()),
    }
}

/// A contender's identifier: its lease ID in hex, as its key names it.
fn session(kv: &KeyValue) -> String {
    format!("{:x}", kv.lease)
}

impl EtcdAdmin {
    pub fn new(settings: Settings, prefix: &str) -> Result<EtcdAdmin, StoreError> {
        let base = format!("{prefix}/").into_bytes();
        Ok(EtcdAdmin {
            client: Client::new(settings.connection)?,
            prefix: prefix.to_string(),
            range: (base.clone(), client::prefix_end(&base)),
            limit_key: format!("{prefix}/{}", queue::LIMIT_KEY_NAME).into_bytes(),
        })
    }

    /// The listing, the recorded limit, and the contenders oldest first.
    fn read(&self) -> Result<(client::RangeReply, Option<u32>), StoreError> {
        let listing = self
            .client
            .range(&self.range.0, &self.range.1)
            .map_err(failure)?;
        let limit = match listing.kvs.iter().find(|kv| kv.key == self.limit_key) {
            None => None,
            Some(record) => match queue::read_limit(&record.value) {
                queue::Recorded::Limit(limit) => Some(limit),
                queue::Recorded::Unreadable(what) => {
                    return Err(StoreError::conflict(format!(
                        "{} holds '{what}', not a limit consem can read; consem leaves it untouched: delete the key if it is stale",
                        String::from_utf8_lossy(&self.limit_key)
                    )))
                }
            },
        };
        Ok((listing, limit))
    }

    fn describe(kv: &KeyValue) -> ContenderStatus {
        ContenderStatus::new(
            session(kv),
            ContenderInfo::parse(&kv.value),
            kv.create_revision as u64,
        )
    }

    fn revoke(&self, lease: i64) -> Result<(), StoreError> {
        self.client
            .revoke(lease, client::CALL_TIMEOUT, &mut false)
            .map(|_| ())
            .map_err(failure)
    }
}

impl Admin for EtcdAdmin {
    fn status(&self) -> Result<Status, StoreError> {
        let (listing, limit) = self.read()?;
        let contenders = queue::contenders(&listing.kvs, &self.limit_key);
        // Without a record, nobody holds: a contender is still joining.
        let holding = limit
            .map_or(0, |limit| limit as usize)
            .min(contenders.len());
        Ok(Status {
            prefix: self.prefix.clone(),
            limit,
            layout: None,
            holders: contenders[..holding]
                .iter()
                .map(|kv| Self::describe(kv))
                .collect(),
            waiters: contenders[holding..]
                .iter()
                .map(|kv| Self::describe(kv))
                .collect(),
            // etcd deletes a contender's key when its lease ends.
            dead_holders: Vec::new(),
            store: "etcd",
            conflict: queue::foreign(&contenders).map(|kv| {
                format!(
                    "{} is a key of etcdctl lock (or another client of etcd's concurrency.Mutex): it waits for every older key under {}/, the limit record included, and consem refuses to join it; use another prefix for one of them",
                    String::from_utf8_lossy(&kv.key),
                    self.prefix
                )
            }),
            // Left when every contender ended while etcd could not be
            // reached (a quorum lost): nobody can delete it then.
            stale: limit
                .filter(|_| contenders.is_empty())
                .map(|limit| {
                    format!(
                        "{} (limit {limit}) with no contender: the next contender replaces it, or consem reset removes it",
                        String::from_utf8_lossy(&self.limit_key)
                    )
                })
                .into_iter()
                .collect(),
            lock_delay_ms: None,
        })
    }

    fn release(&self, session_id: &str) -> Result<(), StoreError> {
        let (listing, _) = self.read()?;
        let contenders = queue::contenders(&listing.kvs, &self.limit_key);
        match contenders.iter().find(|kv| session(kv) == session_id) {
            Some(kv) => self.revoke(kv.lease),
            None => Ok(()),
        }
    }

    fn reset(&self, force: bool) -> Result<ResetOutcome, StoreError> {
        let (listing, limit) = self.read()?;
        let contenders = queue::contenders(&listing.kvs, &self.limit_key);
        if limit.is_none() && contenders.is_empty() {
            return Ok(ResetOutcome::Nothing);
        }
        let mut revision = listing.header.revision;
        let mut evicted = 0;
        if !contenders.is_empty() {
            let holding = limit.map_or(contenders.len(), |limit| limit as usize);
            if !force {
                return Ok(ResetOutcome::LiveHolders(
                    contenders
                        .iter()
                        .take(holding)
                        .map(|kv| session(kv))
                        .collect(),
                ));
            }
            for kv in contenders.iter().take(holding) {
                self.revoke(kv.lease)?;
                evicted += 1;
            }
            let (after, _) = self.read()?;
            if !queue::contenders(&after.kvs, &self.limit_key).is_empty() {
                return Ok(ResetOutcome::NewHolders);
            }
            revision = after.header.revision;
        }
        // Only if no contender arrived since the listing.
        let deleted = self
            .client
            .txn(
                &[Compare::UnchangedSince(
                    &self.range.0,
                    &self.range.1,
                    revision,
                )],
                &[Op::Delete(&self.limit_key)],
                &[],
            )
            .map_err(failure)?;
        if !deleted.succeeded {
            return Ok(ResetOutcome::NewHolders);
        }
        Ok(ResetOutcome::Reset { limit, evicted })
    }

    /// One range over the prefix (the whole key space for the empty one):
    /// a semaphore is a limit record, its contenders the keys beside it.
    fn list(&self) -> Result<Vec<Summary>, StoreError> {
        let (from, to) = if self.prefix.is_empty() {
            (vec![0], vec![0])
        } else {
            self.range.clone()
        };
        let listing = self.client.range(&from, &to).map_err(failure)?;
        // Keys by the prefix they are right under.
        let mut beside: BTreeMap<&[u8], Vec<KeyValue>> = BTreeMap::new();
        for kv in &listing.kvs {
            if let Some(slash) = kv.key.iter().rposition(|&b| b == b'/') {
                beside.entry(&kv.key[..slash]).or_default().push(kv.clone());
            }
        }
        let suffix = format!("/{}", queue::LIMIT_KEY_NAME);
        let mut semaphores = Vec::new();
        for record in &listing.kvs {
            let Some(prefix) = record.key.strip_suffix(suffix.as_bytes()) else {
                continue;
            };
            let keys = beside.get(prefix).map_or(&[][..], Vec::as_slice);
            let contenders = queue::contenders(keys, &record.key);
            // A record consem cannot read holds nobody it can tell.
            let limit = match queue::read_limit(&record.value) {
                queue::Recorded::Limit(limit) => Some(limit),
                queue::Recorded::Unreadable(_) => None,
            };
            let holding = limit
                .map_or(0, |limit| limit as usize)
                .min(contenders.len());
            semaphores.push(Summary::new(
                String::from_utf8_lossy(prefix).into_owned(),
                limit,
                contenders[..holding]
                    .iter()
                    .map(|kv| Self::describe(kv))
                    .collect(),
                contenders.len() - holding,
            ));
        }
        semaphores.sort_by(|a, b| a.prefix.cmp(&b.prefix));
        Ok(semaphores)
    }
}
