//! `status`, `release` and `reset` on a ZooKeeper semaphore: its leases
//! and its mutex's line, consem's and Curator's alike.

use std::time::Duration;

use super::client::{self, Session, ZkError};
use super::{
    failure, recorded_limit, semaphore_path, sequence, Settings, LEASES, LEASE_NAME, LOCKS,
    LOCK_NAME,
};
use crate::store::{
    Admin, ContenderInfo, ContenderStatus, ResetOutcome, Status, StoreError, Summary,
};

/// An operator's commands last a few requests: the shortest session will do.
const ADMIN_SESSION: Duration = Duration::from_secs(10);

pub struct ZkAdmin {
    settings: Settings,
    prefix: String,
    path: String,
}

/// Who a node's data says holds or waits: consem's description, or
/// what Curator writes there by default, the client's IP address (any
/// short line of text), shown as its host.
fn described_by(data: &[u8]) -> ContenderInfo {
    let info = ContenderInfo::parse(data);
    if info != ContenderInfo::default() {
        return info;
    }
    match std::str::from_utf8(data) {
        Ok(text) if !text.is_empty() && text.len() <= 255 && !text.contains(char::is_control) => {
            ContenderInfo {
                host: Some(text.to_string()),
                ..ContenderInfo::default()
            }
        }
        _ => info,
    }
}

impl ZkAdmin {
    pub fn new(settings: Settings, prefix: &str) -> ZkAdmin {
        ZkAdmin {
            settings,
            prefix: prefix.to_string(),
            path: semaphore_path(prefix),
        }
    }

    fn session(&self) -> Result<Session, StoreError> {
        Session::open(&self.settings.connection, ADMIN_SESSION).map_err(failure)
    }

    /// The nodes under `<path>/<parent>` named `name`, in sequence order,
    /// described; none when the parent is missing.
    fn contenders(
        &self,
        session: &mut Session,
        parent: &str,
        name: &str,
    ) -> Result<Vec<ContenderStatus>, ZkError> {
        let parent = format!("{}/{parent}", self.path);
        let mut nodes = match session.children(&parent, false) {
            Ok(nodes) => nodes,
            Err(ZkError::Code(client::NO_NODE)) => return Ok(Vec::new()),
            Err(error) => return Err(error),
        };
        nodes.sort_by_key(|node| sequence(node, name).unwrap_or(u64::MAX));
        let mut described = Vec::new();
        for node in nodes {
            match session.get_data(&format!("{parent}/{node}")) {
                Ok((data, stat)) => described.push(ContenderStatus::new(
                    node,
                    described_by(&data),
                    stat.czxid as u64,
                )),
                Err(ZkError::Code(client::NO_NODE)) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(described)
    }

    /// The session, the recorded limit, the leases and the mutex's line.
    #[allow(clippy::type_complexity)]
    fn read(
        &self,
    ) -> Result<
        (
            Session,
            Option<u32>,
            Vec<ContenderStatus>,
            Vec<ContenderStatus>,
        ),
        StoreError,
    > {
        let mut session = self.session()?;
        let leases_path = format!("{}/{LEASES}", self.path);
        let limit = match session.get_data(&leases_path) {
            Ok((data, _)) => recorded_limit(&data).map_err(|data| {
                StoreError::conflict(format!(
                    "{leases_path} holds '{data}', not a limit consem can read; consem leaves it untouched"
                ))
            })?,
            Err(ZkError::Code(client::NO_NODE)) => None,
            Err(error) => return Err(failure(error)),
        };
        let leases = self
            .contenders(&mut session, LEASES, LEASE_NAME)
            .map_err(failure)?;
        let locks = self
            .contenders(&mut session, LOCKS, LOCK_NAME)
            .map_err(failure)?;
        Ok((session, limit, leases, locks))
    }
}

impl Admin for ZkAdmin {
    fn status(&self) -> Result<Status, StoreError> {
        let (mut session, limit, mut leases, locks) = self.read()?;
        let _ = session.close();
        // Lease nodes are created only under the mutex, one at a time: past
        // the limit, the newest is the one of the mutex's head, which waits
        // (and is listed by its lock node). Without a recorded limit, that
        // of a consem waiting at the head carries its lock node's UUID.
        let holding = match limit {
            Some(limit) => (limit as usize).min(leases.len()),
            None => leases
                .iter()
                .take_while(|lease| {
                    !locks
                        .first()
                        .is_some_and(|head| same_contender(&head.session, &lease.session))
                })
                .count(),
        };
        leases.truncate(holding);
        Ok(Status {
            prefix: self.prefix.clone(),
            // Curator's semaphore keeps no limit (its maxLeases is a
            // convention of its users): only consem's record is known.
            limit,
            layout: None,
            holders: leases,
            waiters: locks,
            // ZooKeeper deletes a contender's nodes when its session ends.
            dead_holders: Vec::new(),
            store: "zookeeper",
            conflict: None,
            stale: Vec::new(),
            lock_delay_ms: None,
        })
    }

    fn release(&self, session_id: &str) -> Result<(), StoreError> {
        let (mut session, _, leases, locks) = self.read()?;
        let found = leases
            .iter()
            .map(|c| format!("{}/{LEASES}/{}", self.path, c.session))
            .chain(
                locks
                    .iter()
                    .map(|c| format!("{}/{LOCKS}/{}", self.path, c.session)),
            )
            .find(|path| path.rsplit('/').next() == Some(session_id));
        let deleted = match found {
            Some(path) => match session.delete(&path) {
                Ok(()) | Err(ZkError::Code(client::NO_NODE)) => Ok(()),
                Err(error) => Err(failure(error)),
            },
            None => Ok(()),
        };
        let _ = session.close();
        deleted
    }

    fn reset(&self, force: bool) -> Result<ResetOutcome, StoreError> {
        let (mut session, limit, leases, locks) = self.read()?;
        let outcome = if limit.is_none() && leases.is_empty() && locks.is_empty() {
            ResetOutcome::Nothing
        } else if !force && !leases.is_empty() {
            ResetOutcome::LiveHolders(leases.iter().map(|c| c.session.clone()).collect())
        } else {
            let mut evicted = 0;
            for lease in &leases {
                match session.delete(&format!("{}/{LEASES}/{}", self.path, lease.session)) {
                    Ok(()) => evicted += 1,
                    Err(ZkError::Code(client::NO_NODE)) => {}
                    Err(error) => return Err(failure(error)),
                }
            }
            if limit.is_some() {
                let cleared = session.set_data(&format!("{}/{LEASES}", self.path), &[], -1);
                if let Err(error) = cleared {
                    return Err(failure(error));
                }
            }
            ResetOutcome::Reset { limit, evicted }
        };
        let _ = session.close();
        Ok(outcome)
    }

    /// ZooKeeper lists one level at a time: a walk of the tree under the
    /// prefix, each node with a `leases` child a semaphore, read as `status`
    /// reads it (in a session of its own). Writes nothing.
    fn list(&self) -> Result<Vec<Summary>, StoreError> {
        let mut session = self.session()?;
        let mut semaphores = Vec::new();
        let mut unvisited = vec![self.path.clone()];
        while let Some(path) = unvisited.pop() {
            let children = match session.children(&path, false) {
                Ok(children) => children,
                // Gone since its parent was listed.
                Err(ZkError::Code(client::NO_NODE)) => continue,
                Err(error) => {
                    let _ = session.close();
                    return Err(failure(error));
                }
            };
            let semaphore = children.iter().any(|child| child == LEASES);
            if semaphore {
                let prefix = path.trim_start_matches('/');
                let status = ZkAdmin::new(self.settings.clone(), prefix).status()?;
                if !status.holders.is_empty() || !status.waiters.is_empty() {
                    semaphores.push(Summary::of(status));
                }
            }
            for child in children {
                // A semaphore's own nodes, and ZooKeeper's.
                let own = semaphore && (child == LEASES || child == LOCKS);
                if own || (path == "/" && child == "zookeeper") {
                    continue;
                }
                unvisited.push(match path.as_str() {
                    "/" => format!("/{child}"),
                    _ => format!("{path}/{child}"),
                });
            }
        }
        let _ = session.close();
        semaphores.sort_by(|a, b| a.prefix.cmp(&b.prefix));
        Ok(semaphores)
    }
}

/// Whether two nodes carry the same protected UUID (`_c_<uuid>-`).
fn same_contender(a: &str, b: &str) -> bool {
    let uuid = |node: &str| {
        node.strip_prefix(super::PROTECTED)
            .and_then(|rest| rest.get(..36))
            .map(str::to_string)
    };
    uuid(a).is_some() && uuid(a) == uuid(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_curator_node_is_described_by_the_address_it_holds() {
        assert_eq!(described_by(b"10.0.4.7").host.as_deref(), Some("10.0.4.7"));
        let ours = br#"{"Host":"web-3","Pid":812}"#;
        assert_eq!(described_by(ours).host.as_deref(), Some("web-3"));
        assert_eq!(described_by(ours).pid, Some(812));
        assert_eq!(described_by(b""), ContenderInfo::default());
        assert_eq!(described_by(b"\x00\x01binary"), ContenderInfo::default());
    }
}
