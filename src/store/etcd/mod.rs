//! The etcd store: N slots on etcd v3. Each contender takes a lease, kept
//! alive while it waits and holds, and puts the key `<prefix>/<lease ID>`
//! with it, only if absent; the first `--limit` keys by create revision
//! hold (`queue`). A waiter watches one thing: the first in line watches for
//! a deletion under the prefix (any holder leaving), one further back the
//! key just ahead of it, which its contender rewrites when it takes its slot
//! (the relay write). One departure wakes one waiter. The limit is recorded
//! once in `<prefix>/.limit`, and dropped by the last contender to leave.
//! Leaving is revoking the lease: the key goes with it.
//!
//! Spoken to through etcd's JSON gateway over HTTP (`client`).

pub mod admin;
pub mod client;
pub mod queue;

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use client::{Client, Compare, EtcdError, Op, Revoked, TxnReply, WatchRequest, Watched};
use queue::Place;

use super::kind::{Lease, Store, StoreSettings};
use super::lease;
use super::outage::{Outage, FIRST_BACKOFF};
use super::{
    Admin, Contend, ContenderInfo, Holder, Notify, Progress, Released, SlotBackend, SlotEvent,
    StoreError,
};
use crate::report;

pub use admin::EtcdAdmin;

/// Leases may have TTLs of 2 s to 24 h (etcd counts them in whole seconds).
pub const STORE: Store = Store {
    name: "etcd",
    title: "etcd",
    schemes: &["etcd://", "etcds://"],
    largest_limit: 1024,
    lease: Some(Lease {
        shortest: Duration::from_secs(2),
        longest: Duration::from_secs(86_400),
        default_ttl: Duration::from_secs(15),
    }),
    frees_slot_at_death: false,
};

/// The longest a keep-alive may take: one stuck behind a dead leader is
/// sent again, to another member, while the lease still has room (a leader
/// election takes about a second with etcd's defaults).
const RENEW_TIMEOUT: Duration = Duration::from_secs(1);
/// About how long etcd takes to elect a leader (with its defaults) or to
/// come back after a restart: what a release waits for etcd at least,
/// within its budget, and how long it tries again an etcd that is down.
const ELECTION: Duration = Duration::from_secs(3);

/// What the etcd store needs beyond the store-neutral options.
#[derive(Debug, Clone)]
pub struct Settings {
    pub connection: client::Connection,
    pub ttl: Duration,
    /// Failed attempts in a row a holder bears; `None`: as many as fit in
    /// its lease.
    pub monitor_retry: Option<u32>,
}

impl StoreSettings for Settings {
    fn open_run(
        &self,
        prefix: &str,
        limit: u32,
        info: ContenderInfo,
    ) -> Result<Arc<dyn SlotBackend>, StoreError> {
        Ok(Arc::new(EtcdSemaphore::new(
            self.clone(),
            prefix,
            limit,
            &info,
        )?))
    }

    fn open_admin(&self, prefix: &str) -> Result<Box<dyn Admin>, StoreError> {
        Ok(Box::new(EtcdAdmin::new(self.clone(), prefix)?))
    }
}

#[derive(Default)]
struct Shared {
    closing: bool,
    /// A lease grant or a join may be under way: release waits for it.
    writing: bool,
    lease: Option<i64>,
    /// When the last renewal etcd confirmed (or the grant) was sent: the
    /// lease lasts a TTL from then, at least.
    renewed: Option<Instant>,
    /// Our key's create revision: the fence.
    fence: Option<i64>,
    /// The command has started: the holder's first requests wait for it.
    command_started: bool,
}

/// Where a waiter waits, and what it has seen.
struct Wait {
    request_key: Vec<u8>,
    /// `Some`: the whole prefix, for deletions only (the first waiter).
    end: Option<Vec<u8>>,
    /// The revision the waiter has seen through: its listing's, then the
    /// last event's.
    seen: i64,
    /// The keys ahead of ours in the last listing.
    ahead: Vec<Vec<u8>>,
    /// Those of them, and others, seen deleted since: every one, for a
    /// watch of the whole prefix (`end`).
    deleted: Vec<Vec<u8>>,
    watch: Option<client::Watch>,
}

/// What ends the run on a failure while contending, or how long to pause
/// before trying again.
fn on_failure(outage: &mut Outage, error: EtcdError) -> Result<Duration, StoreError> {
    match error {
        EtcdError::Denied(why) => Err(StoreError::Denied(why)),
        EtcdError::Failed(why) => Err(StoreError::Unavailable(why)),
        EtcdError::LeaseGone => Err(StoreError::Unavailable(
            "etcd dropped our lease while we joined".into(),
        )),
        EtcdError::Transient(why) | EtcdError::NotReady(why) => {
            let pause = outage
                .retry_after()
                .ok_or(StoreError::Unavailable(why.clone()))?;
            report::event("retry", &[("error", &why)]);
            Ok(pause)
        }
    }
}

/// A semaphore at one prefix on etcd, for one run.
pub struct EtcdSemaphore {
    client: Client,
    settings: Settings,
    prefix: String,
    limit: u32,
    /// `<prefix>/`, and the end of its range.
    range: (Vec<u8>, Vec<u8>),
    limit_key: Vec<u8>,
    info: Vec<u8>,
    shared: Mutex<Shared>,
    changed: Condvar,
}

/// Why acquiring stopped without a slot.
enum Stop {
    Closing,
    Failed(StoreError),
}

impl From<StoreError> for Stop {
    fn from(error: StoreError) -> Stop {
        Stop::Failed(error)
    }
}

/// What joining found.
enum Joined {
    /// Our key, created at this revision, and the prefix as the join
    /// transaction read it (none when an earlier attempt had gone through).
    At(i64, Option<client::RangeReply>),
    /// The lease is gone: grant another.
    LeaseGone,
}

impl EtcdSemaphore {
    pub fn new(
        settings: Settings,
        prefix: &str,
        limit: u32,
        info: &ContenderInfo,
    ) -> Result<EtcdSemaphore, StoreError> {
        let client = Client::new(settings.connection.clone()).map_err(StoreError::Usage)?;
        let base = format!("{prefix}/").into_bytes();
        Ok(EtcdSemaphore {
            client,
            range: (base.clone(), client::prefix_end(&base)),
            limit_key: format!("{prefix}/{}", queue::LIMIT_KEY_NAME).into_bytes(),
            info: serde_json::to_vec(info).expect("a description always encodes"),
            prefix: prefix.to_string(),
            limit,
            settings,
            shared: Mutex::new(Shared::default()),
            changed: Condvar::new(),
        })
    }

    fn shared(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sleeps for `pause` unless release begins; true if it did.
    fn pause(&self, pause: Duration) -> bool {
        let shared = self.shared();
        let (shared, _) = self
            .changed
            .wait_timeout_while(shared, pause, |s| !s.closing)
            .unwrap_or_else(|e| e.into_inner());
        shared.closing
    }

    fn key(&self, lease: i64) -> Vec<u8> {
        queue::contender_key(&self.prefix, lease)
    }

    /// Runs `call`, a write, unless release began; release waits for it
    /// to finish, so that it can undo what it wrote.
    fn writing<T>(&self, call: impl FnOnce() -> T) -> Result<T, Stop> {
        {
            let mut shared = self.shared();
            if shared.closing {
                return Err(Stop::Closing);
            }
            shared.writing = true;
        }
        let result = call();
        self.shared().writing = false;
        self.changed.notify_all();
        Ok(result)
    }

    /// Runs `call` until it answers, within the outage policy.
    fn retrying<T>(
        &self,
        outage: &mut Outage,
        mut call: impl FnMut() -> Result<T, EtcdError>,
    ) -> Result<Result<T, EtcdError>, Stop> {
        loop {
            if self.shared().closing {
                return Err(Stop::Closing);
            }
            match call() {
                Ok(value) => {
                    outage.recovered();
                    return Ok(Ok(value));
                }
                Err(EtcdError::LeaseGone) => {
                    outage.recovered();
                    return Ok(Err(EtcdError::LeaseGone));
                }
                Err(error) => {
                    let pause = on_failure(outage, error)?;
                    if self.pause(pause) {
                        return Err(Stop::Closing);
                    }
                }
            }
        }
    }

    /// A transaction of the join, until it answers (within the outage
    /// policy), as a write that release waits for.
    fn joining_txn(
        &self,
        outage: &mut Outage,
        compare: &[Compare],
        success: &[Op],
        failure: &[Op],
    ) -> Result<Result<TxnReply, EtcdError>, Stop> {
        self.retrying(outage, || {
            self.writing(|| self.client.txn(compare, success, failure))
                .unwrap_or_else(|_| Err(EtcdError::Transient("closing".into())))
        })
    }

    fn grant(&self, outage: &mut Outage) -> Result<(i64, Instant), Stop> {
        loop {
            let sent = Instant::now();
            // Recorded before release may look, so that it revokes it.
            let granted = self.writing(|| {
                let granted = self.client.grant(self.settings.ttl);
                if let Ok(lease) = granted {
                    let mut shared = self.shared();
                    shared.lease = Some(lease);
                    shared.renewed = Some(sent);
                }
                granted
            })?;
            match granted {
                Ok(lease) => {
                    outage.recovered();
                    report::event("lease", &[("lease", &format!("{lease:x}"))]);
                    return Ok((lease, sent));
                }
                Err(error) => {
                    let pause = on_failure(outage, error)?;
                    if self.pause(pause) {
                        return Err(Stop::Closing);
                    }
                }
            }
        }
    }

    /// Puts our key if absent, with the limit record if there is none.
    fn join(&self, lease: i64, outage: &mut Outage) -> Result<Joined, Stop> {
        let key = self.key(lease);
        let limit = self.limit.to_string();
        // Writes the limit record and our key, and lists the prefix.
        let record_and_key = [
            Op::Put(&self.limit_key, limit.as_bytes(), 0),
            Op::Put(&key, &self.info, lease),
            Op::List(&self.range.0, &self.range.1),
        ];
        loop {
            let tried = self.joining_txn(
                outage,
                &[
                    Compare::Created(&key, 0),
                    Compare::Value(&self.limit_key, limit.as_bytes()),
                ],
                &[
                    Op::Put(&key, &self.info, lease),
                    Op::List(&self.range.0, &self.range.1),
                ],
                &[Op::Get(&self.limit_key), Op::Get(&key)],
            )?;
            let reply = match tried {
                Ok(reply) => reply,
                Err(_) => return Ok(Joined::LeaseGone),
            };
            if reply.succeeded {
                return Ok(Joined::At(reply.header.revision, Some(reply.listing(1))));
            }
            // An earlier attempt that went through without an answer.
            if let Some(ours) = reply.range(1).first() {
                return Ok(Joined::At(ours.create_revision, None));
            }
            let record = reply.range(0).into_iter().next();
            if let Some(record) = &record {
                if let queue::Recorded::Unreadable(_) = queue::read_limit(&record.value) {
                    return Err(Stop::Failed(self.limit_conflict(&record.value)));
                }
            } else {
                // No record: the first contender writes it, with its key,
                // if the prefix is empty.
                let created = self.joining_txn(
                    outage,
                    &[
                        Compare::Created(&self.limit_key, 0),
                        Compare::NoKeyIn(&self.range.0, &self.range.1),
                    ],
                    &record_and_key,
                    &[],
                )?;
                match created {
                    Ok(reply) if reply.succeeded => {
                        return Ok(Joined::At(reply.header.revision, Some(reply.listing(2))))
                    }
                    Ok(_) => {}
                    Err(_) => return Ok(Joined::LeaseGone),
                }
            }
            // Another limit, or no record beside other keys. A limit binds
            // only while someone uses it: the record of contenders that all
            // died is replaced; one that is missing while contenders are
            // there (deleted by hand) leaves their limit unknown.
            let listing =
                self.retrying(outage, || self.client.range(&self.range.0, &self.range.1))?;
            let Ok(listing) = listing else {
                return Ok(Joined::LeaseGone);
            };
            let contenders = queue::contenders(&listing.kvs, &self.limit_key);
            if !contenders.is_empty() {
                match listing.kvs.iter().find(|kv| kv.key == self.limit_key) {
                    // Written by another contender since: join under it.
                    Some(record)
                        if queue::read_limit(&record.value) == queue::Recorded::Limit(self.limit) =>
                    {
                        continue
                    }
                    Some(record) => return Err(Stop::Failed(self.limit_conflict(&record.value))),
                    None if record.is_some() => continue,
                    None => {
                        return Err(Stop::Failed(StoreError::Conflict(format!(
                            "{} has {} contender(s) but no limit record {} (deleted by hand?): consem cannot tell their limit; restore it (etcdctl put {} N), or wait until they leave",
                            self.prefix,
                            contenders.len(),
                            String::from_utf8_lossy(&self.limit_key),
                            String::from_utf8_lossy(&self.limit_key),
                        ))))
                    }
                }
            }
            let replaced = self.joining_txn(
                outage,
                &[
                    Compare::UnchangedSince(&self.range.0, &self.range.1, listing.header.revision),
                    Compare::Created(&key, 0),
                ],
                &record_and_key,
                &[],
            )?;
            match replaced {
                Ok(reply) if reply.succeeded => {
                    if record.is_some() {
                        report::event("limit-replaced", &[("limit", &self.limit)]);
                    }
                    return Ok(Joined::At(reply.header.revision, Some(reply.listing(2))));
                }
                // Someone arrived meanwhile: look again.
                Ok(_) => continue,
                Err(_) => return Ok(Joined::LeaseGone),
            }
        }
    }

    fn limit_conflict(&self, value: &[u8]) -> StoreError {
        let key = String::from_utf8_lossy(&self.limit_key);
        StoreError::Conflict(match queue::read_limit(value) {
            queue::Recorded::Limit(recorded) => format!(
                "{key} records a limit of {recorded} but --limit is {}: every contender on a prefix must use the same limit (consem reset --store etcd://… --prefix {} once it is idle)",
                self.limit, self.prefix
            ),
            queue::Recorded::Unreadable(what) => format!(
                "{key} holds '{what}', not a limit consem can read; consem leaves it untouched: use another --prefix, or delete the key if it is stale"
            ),
        })
    }

    /// Contends until the slot is ours: the fence, when the lease was last
    /// renewed, the revision through which our key is known to be there,
    /// and whether a waiter may be watching our key (it is owed the relay
    /// write).
    fn acquire(&self, mode: Contend, notify: &Notify) -> Result<(i64, Instant, i64, bool), Stop> {
        let ttl = self.settings.ttl;
        let period = lease::renew_period(ttl);
        let mut outage = Outage::new(ttl);
        let mut lease: Option<(i64, Instant)> = None;
        let mut last_picture: Option<Progress> = None;
        'join: loop {
            let (id, mut renewed) = match lease {
                Some(lease) => lease,
                None => self.grant(&mut outage)?,
            };
            lease = Some((id, renewed));
            let (fence, mut joined) = match self.join(id, &mut outage)? {
                Joined::At(revision, listing) => (revision, listing),
                Joined::LeaseGone => {
                    lease = None;
                    continue 'join;
                }
            };
            self.shared().fence = Some(fence);
            let key = self.key(id);
            let mut wait: Option<Wait> = None;
            loop {
                if period.saturating_sub(renewed.elapsed()) < client::SHORTEST_WATCH {
                    let sent = Instant::now();
                    match self.retrying(&mut outage, || self.client.keep_alive(id, period))? {
                        Ok(()) => {
                            renewed = sent;
                            self.shared().renewed = Some(sent);
                        }
                        Err(_) => {
                            report::event("rejoin", &[("why", &"our lease ended while we waited")]);
                            lease = None;
                            continue 'join;
                        }
                    }
                    lease = Some((id, renewed));
                }
                if let Some(waiting) = &mut wait {
                    let watch = match &mut waiting.watch {
                        Some(watch) => watch,
                        None => {
                            let left = period.saturating_sub(renewed.elapsed());
                            let request = WatchRequest {
                                key: &waiting.request_key,
                                end: waiting.end.as_deref(),
                                deletions_only: waiting.end.is_some(),
                            };
                            match self
                                .retrying(&mut outage, || self.client.watch(&request, left))?
                            {
                                Ok(Some(watch)) => waiting.watch.insert(watch),
                                // The wait ended first: renew.
                                _ => continue,
                            }
                        }
                    };
                    // A watch tells what changed after etcd created it;
                    // what changed between our read and then, we read.
                    if watch.created_at <= waiting.seen {
                        let watched = self.client.next_change(watch, waiting.seen);
                        if self.shared().closing {
                            return Err(Stop::Closing);
                        }
                        match watched {
                            Err(error) => {
                                waiting.watch = None;
                                let pause = on_failure(&mut outage, error)?;
                                if self.pause(pause) {
                                    return Err(Stop::Closing);
                                }
                                continue;
                            }
                            // Renew, then watch again.
                            Ok(Watched::Quiet) => {
                                outage.recovered();
                                waiting.watch = None;
                                continue;
                            }
                            Ok(Watched::Changed(changes)) if !changes.deleted.contains(&key) => {
                                outage.recovered();
                                waiting.seen = changes.through;
                                waiting.deleted.extend(changes.deleted);
                                // Departures alone can tell that the slot is
                                // ours: the next command starts without another
                                // read. Whoever joined since may watch our key.
                                if queue::holds_after(&waiting.ahead, &waiting.deleted, self.limit)
                                {
                                    return Ok((fence, renewed, waiting.seen, true));
                                }
                                // The first waiter sees every departure: one
                                // from behind it changes nothing.
                                if waiting.end.is_some() {
                                    continue;
                                }
                            }
                            // Our key went, or etcd ended the watch: read.
                            Ok(_) => outage.recovered(),
                        }
                        waiting.watch = None;
                    }
                }
                let listing = match joined.take() {
                    Some(listing) => listing,
                    None => match self.retrying(&mut outage, || {
                        self.client.range(&self.range.0, &self.range.1)
                    })? {
                        Ok(listing) => listing,
                        Err(_) => continue,
                    },
                };
                let contenders = queue::contenders(&listing.kvs, &self.limit_key);
                if let Some(foreign) = queue::foreign(&contenders) {
                    return Err(Stop::Failed(StoreError::Conflict(format!(
                        "{} is a key on a lease with no consem description: etcdctl lock, or another client of etcd's concurrency.Mutex, uses {}/ too; consem leaves it untouched. The two cannot share a name (etcdctl lock waits for every older key, {} included): use another --prefix",
                        String::from_utf8_lossy(&foreign.key),
                        self.prefix,
                        queue::LIMIT_KEY_NAME
                    ))));
                }
                let place = queue::place(&contenders, &key, self.limit);
                let seen = listing.header.revision;
                let (request_key, end) = match &place {
                    Place::Holding => {
                        // A linearizable read showed our key among the
                        // first `limit`: the slot is ours. A waiter that
                        // read before us, and may watch our key, is behind
                        // us in this listing.
                        let behind = contenders.last().is_some_and(|last| last.key != key);
                        return Ok((fence, renewed, seen, behind));
                    }
                    Place::Gone => {
                        report::event("rejoin", &[("why", &"our key was deleted")]);
                        continue 'join;
                    }
                    _ if mode == Contend::Try => {
                        notify(SlotEvent::NoSlot);
                        return Err(Stop::Closing);
                    }
                    Place::First => (self.range.0.clone(), Some(self.range.1.clone())),
                    Place::Behind {
                        ahead: just_ahead, ..
                    } => (just_ahead.clone(), None),
                };
                // A watch of the same keys, made before this read, goes on
                // from it.
                let watch = wait
                    .take()
                    .filter(|w| w.request_key == request_key && w.end == end)
                    .and_then(|w| w.watch)
                    .filter(|watch| watch.created_at <= seen);
                wait = Some(Wait {
                    request_key,
                    end,
                    seen,
                    ahead: contenders
                        .iter()
                        .take_while(|kv| kv.key != key)
                        .map(|kv| kv.key.clone())
                        .collect(),
                    deleted: Vec::new(),
                    watch,
                });
                let picture = Progress {
                    limit: self.limit,
                    holders: contenders
                        .iter()
                        .take(self.limit as usize)
                        .map(|kv| Holder::from(&ContenderInfo::parse(&kv.value)))
                        .collect(),
                    ahead: match &place {
                        Place::Behind { waiters_ahead, .. } => *waiters_ahead,
                        _ => 0,
                    },
                };
                if last_picture.as_ref() != Some(&picture) {
                    report::event(
                        "waiting",
                        &[
                            ("prefix", &self.prefix),
                            ("held", &format!("{}/{}", picture.holders.len(), self.limit)),
                            ("ahead", &picture.ahead),
                        ],
                    );
                    notify(SlotEvent::Waiting(picture.clone()));
                    last_picture = Some(picture);
                }
            }
        }
    }

    /// Keeps the lease alive every TTL/3 and watches our key between
    /// renewals; returns why the slot is lost, or `None` once release
    /// began.
    #[allow(clippy::too_many_arguments)]
    fn hold(
        &self,
        lease_id: i64,
        fence: i64,
        mut renewed: Instant,
        mut seen: i64,
        mut relay_owed: bool,
        notify: &Notify,
    ) -> Option<String> {
        let ttl = self.settings.ttl;
        let period = lease::renew_period(ttl);
        let key = self.key(lease_id);
        let shown_key = String::from_utf8_lossy(&key).into_owned();
        let mut failures = 0;
        let mut renew_now = false;
        {
            let left = period.saturating_sub(renewed.elapsed());
            let _ = self
                .changed
                .wait_timeout_while(self.shared(), left, |s| !s.command_started && !s.closing);
        }
        loop {
            if self.shared().closing {
                return None;
            }
            if relay_owed && !renew_now {
                // The relay write, owed to the waiter behind us: it wakes
                // when our key changes. Until it is made, that waiter
                // sleeps, so a failure is retried as a renewal's is.
                match self.client.txn(
                    &[Compare::Created(&key, fence)],
                    &[Op::Put(&key, &self.info, lease_id)],
                    &[],
                ) {
                    Ok(reply) if reply.succeeded => {
                        relay_owed = false;
                        seen = reply.header.revision;
                    }
                    Ok(_) => {
                        return Some(format!(
                            "our key {shown_key} was deleted while our lease lives (consem release, or by hand)"
                        ))
                    }
                    Err(_) => renew_now = true,
                }
            }
            if renew_now || period.saturating_sub(renewed.elapsed()) < client::SHORTEST_WATCH {
                let sent = Instant::now();
                match self.client.keep_alive(lease_id, period.min(RENEW_TIMEOUT)) {
                    Ok(()) => {
                        failures = 0;
                        renew_now = false;
                        renewed = sent;
                        self.shared().renewed = Some(sent);
                        notify(SlotEvent::Leased {
                            until: lease::lease_end(sent, ttl),
                        });
                    }
                    Err(EtcdError::LeaseGone) => {
                        return Some(format!(
                            "our lease {lease_id:x} is gone: etcd let it expire (no keep-alive within --ttl {}) or someone revoked it (consem release, etcdctl lease revoke)",
                            crate::duration::human(ttl)
                        ))
                    }
                    Err(EtcdError::Denied(why)) => return Some(why),
                    Err(error) => {
                        failures += 1;
                        let pause = match lease::after_failure(
                            failures,
                            self.settings.monitor_retry,
                            lease::lease_end(renewed, ttl),
                            Instant::now(),
                        ) {
                            lease::AfterFailure::RetryIn(pause) => pause,
                            gave_up => {
                                return Some(format!(
                                    "cannot keep our lease alive: {error} ({gave_up})"
                                ))
                            }
                        };
                        report::event("watch-retry", &[("failures", &failures), ("error", &error)]);
                        renew_now = true;
                        if self.pause(pause) {
                            return None;
                        }
                        continue;
                    }
                }
            }
            let left = period.saturating_sub(renewed.elapsed());
            let request = WatchRequest {
                key: &key,
                end: None,
                deletions_only: false,
            };
            let mut watch = match self.client.watch(&request, left) {
                Ok(Some(watch)) => watch,
                Ok(None) => continue,
                Err(_) => {
                    // Renewing tells whether etcd is there, and counts.
                    renew_now = true;
                    if self.pause(FIRST_BACKOFF) {
                        return None;
                    }
                    continue;
                }
            };
            // What changed between what we saw and the watch's start, we
            // read.
            let mut check = watch.created_at > seen;
            loop {
                if check {
                    match self.client.range(&key, &[]) {
                        Ok(reply) if reply.kvs.is_empty() => {
                            return Some(self.why_gone(lease_id, &shown_key))
                        }
                        // Put again without our lease (etcdctl put), or
                        // deleted and put again: no longer our contender,
                        // or no longer where it stood in the queue.
                        Ok(reply) if reply.kvs[0].lease != lease_id => {
                            return Some(format!(
                                "our key {shown_key} was written again without our lease {lease_id:x} (by hand, etcdctl put): it no longer counts as a contender, and the next may take the slot"
                            ))
                        }
                        Ok(reply) if reply.kvs[0].create_revision != fence => {
                            return Some(format!(
                                "our key {shown_key} was deleted and written again (by hand): it stands behind every other contender now"
                            ))
                        }
                        Ok(reply) => seen = reply.header.revision,
                        Err(_) => {
                            renew_now = true;
                            break;
                        }
                    }
                }
                let watched = self.client.next_change(&mut watch, seen);
                // Our own release: it deleted the key.
                if self.shared().closing {
                    return None;
                }
                match watched {
                    Ok(Watched::Changed(_)) => check = true,
                    // Renew, or watch again: what changed meanwhile is read
                    // then.
                    Ok(Watched::Quiet | Watched::Ended) => break,
                    Err(_) => {
                        renew_now = true;
                        if self.pause(FIRST_BACKOFF) {
                            return None;
                        }
                        break;
                    }
                }
            }
        }
    }

    /// Why our key is gone: the lease tells who took it away.
    fn why_gone(&self, lease_id: i64, shown_key: &str) -> String {
        match self.client.keep_alive(lease_id, RENEW_TIMEOUT) {
            Err(EtcdError::LeaseGone) => format!(
                "our lease {lease_id:x} was revoked (consem release, etcdctl lease revoke) or expired, and our key {shown_key} with it"
            ),
            _ => format!(
                "our key {shown_key} was deleted while our lease lives (by hand, etcdctl del)"
            ),
        }
    }
}

impl SlotBackend for EtcdSemaphore {
    fn contend(self: Arc<Self>, mode: Contend, notify: Notify) {
        thread::Builder::new()
            .name("consem-contend".into())
            .spawn(move || match self.acquire(mode, &notify) {
                Ok((fence, renewed, seen, relay_owed)) => {
                    report::event("acquired", &[("prefix", &self.prefix), ("fence", &fence)]);
                    notify(SlotEvent::Acquired {
                        fence: fence as u64,
                        lease: Some(lease::lease_end(renewed, self.settings.ttl)),
                    });
                    let lease = self.shared().lease.unwrap_or_default();
                    if let Some(reason) =
                        self.hold(lease, fence, renewed, seen, relay_owed, &notify)
                    {
                        if !self.shared().closing {
                            notify(SlotEvent::Lost(reason));
                        }
                    }
                }
                Err(Stop::Closing) => {}
                Err(Stop::Failed(error)) => notify(SlotEvent::Failed(error)),
            })
            .expect("cannot start the semaphore thread");
    }

    fn release(&self, budget: Duration) -> Result<Released, String> {
        let deadline = Instant::now() + budget;
        let (lease, renewed) = {
            let mut shared = self.shared();
            shared.closing = true;
            self.changed.notify_all();
            let (shared, _) = self
                .changed
                .wait_timeout_while(shared, budget / 2, |s| s.writing)
                .unwrap_or_else(|e| e.into_inner());
            (shared.lease, shared.renewed)
        };
        let Some(lease) = lease else {
            return Ok(Released::Left);
        };
        // Waiting for etcd much longer than the lease has left is of no
        // use: the key goes with the lease either way. But a restarted etcd,
        // or a new leader, extends every lease: it gets the time of an
        // election even past the lease's end, within the budget.
        let ends = renewed.map(|sent| sent + self.settings.ttl);
        let revoke_until = ends.map_or(deadline, |ends| {
            deadline.min(ends.max(Instant::now() + ELECTION))
        });
        let left = |floor: Duration| {
            revoke_until
                .saturating_duration_since(Instant::now())
                .max(floor)
        };
        // A member that lost its leader refuses until another is elected,
        // and an etcd that is down may be restarting: try again meanwhile,
        // the latter for an election's time at most.
        let down_until = deadline.min(Instant::now() + ELECTION);
        let mut resent = false;
        let revoked = loop {
            match self
                .client
                .revoke(lease, left(Duration::from_millis(100)), &mut resent)
            {
                Err(EtcdError::NotReady(why)) if left(Duration::ZERO) > 2 * FIRST_BACKOFF => {
                    // etcd may have taken it all the same.
                    resent = true;
                    report::event("retry", &[("error", &why)]);
                    thread::sleep(FIRST_BACKOFF);
                }
                Err(EtcdError::Transient(why))
                    if down_until.saturating_duration_since(Instant::now()) > 2 * FIRST_BACKOFF =>
                {
                    resent = true;
                    report::event("retry", &[("error", &why)]);
                    thread::sleep(FIRST_BACKOFF);
                }
                revoked => break revoked,
            }
        };
        report::event("released", &[("prefix", &self.prefix)]);
        let released = match revoked {
            Ok(Revoked::Now) => Released::Left,
            Ok(Revoked::AlreadyGone) => Released::TakenBefore(format!(
                "our lease {lease:x} was gone before we left: revoked (consem release, etcdctl lease revoke) or expired"
            )),
            Err(error) => {
                return Err(format!(
                    "leaving {}: {error}; etcd drops our lease {lease:x} by itself within --ttl {} of its last renewal (or of etcd's restart)",
                    self.prefix,
                    crate::duration::human(self.settings.ttl)
                ));
            }
        };
        // The last one out drops the limit record, unless a contender
        // arrived since the listing.
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        if let Ok(listing) = self.client.range_within(&self.range.0, &self.range.1, left) {
            // Keys of etcdctl lock count for nothing: they wait for the
            // record to go.
            let contenders = queue::contenders(&listing.kvs, &self.limit_key);
            if contenders.iter().all(|kv| !queue::is_consem(kv))
                && listing.kvs.iter().any(|kv| kv.key == self.limit_key)
            {
                let _ = self.client.txn_within(
                    &[Compare::UnchangedSince(
                        &self.range.0,
                        &self.range.1,
                        listing.header.revision,
                    )],
                    &[Op::Delete(&self.limit_key)],
                    &[],
                    left,
                );
            }
        }
        Ok(released)
    }

    fn own_child_env(&self) -> Vec<(String, String)> {
        let shared = self.shared();
        let fence = shared.fence.unwrap_or_default().to_string();
        let key = shared
            .lease
            .map(|lease| String::from_utf8_lossy(&self.key(lease)).into_owned())
            .unwrap_or_default();
        vec![
            // As `etcdctl lock` sets them for its command.
            ("ETCD_LOCK_KEY".into(), key),
            ("ETCD_LOCK_REV".into(), fence),
        ]
    }

    fn frees_slot_at_death(&self) -> bool {
        STORE.frees_slot_at_death
    }

    fn command_started(&self) {
        self.shared().command_started = true;
        self.changed.notify_all();
    }
}
