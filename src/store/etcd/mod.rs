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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use client::{Client, Compare, EtcdError, Op, Revoked, TxnReply, WatchRequest, Watched};
use queue::{AfterChange, AfterRead, OwnKey};

use super::driver::{self, Failures, Gate, Grant, Recipe, Stop};
use super::kind::{Lease, Store, StoreSettings};
use super::lease;
use super::outage::{Backoff, Outage, FIRST_BACKOFF};
use super::{
    Admin, Contend, ContenderInfo, ErrorKind, Notify, Progress, ReleaseError, Released,
    SlotBackend, SlotEvent, StoreError, Unfinished,
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

/// What the helper threads share with `release`, beside the [`Gate`]'s
/// own (a lease grant or a join may be under way: release waits for it).
#[derive(Default)]
pub struct Shared {
    lease: Option<i64>,
    /// When the last renewal etcd confirmed (or the grant) was sent: the
    /// lease lasts a TTL from then, at least.
    renewed: Option<Instant>,
    /// Our key's create revision: the fence.
    fence: Option<i64>,
    /// Our key was found among the first `limit`: a slot, not only a
    /// place in the queue, is given up on leaving.
    held: bool,
}

/// What ends the run on a failure while contending, or how long to pause
/// before trying again.
fn on_failure(outage: &mut Outage, error: EtcdError) -> Result<Duration, StoreError> {
    let fail = |kind, message: String| Err(StoreError::new(kind, message).caused_by(error.clone()));
    match &error {
        EtcdError::Denied(why) => fail(ErrorKind::Denied, why.clone()),
        EtcdError::Failed(why) => fail(ErrorKind::Unavailable, why.clone()),
        EtcdError::LeaseGone => fail(
            ErrorKind::Unavailable,
            "etcd dropped our lease while we joined".into(),
        ),
        EtcdError::Transient(why) | EtcdError::NotReady(why) => {
            let Some(pause) = outage.retry_after() else {
                return fail(ErrorKind::Unavailable, why.clone());
            };
            report::event("retry", &[("error", why)]);
            Ok(pause)
        }
        // etcd is there, busy: waited for as long as an outage may last,
        // even before its first answer.
        EtcdError::Slow(why) => {
            let Some(pause) = outage.retry_slow() else {
                return fail(
                    ErrorKind::Unavailable,
                    format!("{why}, and answered nothing within --ttl"),
                );
            };
            report::event("retry", &[("error", why)]);
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
    gate: Gate<Shared>,
}

/// What joining found.
enum Joined {
    /// Our key, created at this revision, and a glimpse of the queue as
    /// the join transaction read it (none when an earlier attempt had gone
    /// through).
    At(i64, Option<queue::Glimpse>),
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
        let client = Client::new(settings.connection.clone())?;
        let base = format!("{prefix}/").into_bytes();
        Ok(EtcdSemaphore {
            client,
            range: (base.clone(), client::prefix_end(&base)),
            limit_key: format!("{prefix}/{}", queue::LIMIT_KEY_NAME).into_bytes(),
            info: serde_json::to_vec(info).expect("a description always encodes"),
            prefix: prefix.to_string(),
            limit,
            settings,
            gate: Gate::default(),
        })
    }

    fn key(&self, lease: i64) -> Vec<u8> {
        queue::contender_key(&self.prefix, lease)
    }

    /// The reads of a glimpse of the queue: the head, and the keys created
    /// at `fence` or before, newest first (0: the newest, for the join
    /// transaction, which has just created ours).
    fn glimpse_ops(&self, fence: i64) -> [Op<'_>; 2] {
        let (from, to) = (&self.range.0[..], &self.range.1[..]);
        [
            Op::Oldest(from, to, i64::from(self.limit + queue::HEAD_SLACK)),
            Op::NewestUpTo(from, to, fence, queue::NEAR),
        ]
    }

    /// Where our key (created at `fence`) stands: a glimpse of the queue,
    /// or the whole prefix when the glimpse cannot tell. Its revision, and
    /// the number of keys in the prefix.
    fn read_queue(
        &self,
        key: &[u8],
        fence: i64,
        glimpse: Option<queue::Glimpse>,
        outage: &mut Outage,
    ) -> Result<Result<(queue::Seen, i64, usize), EtcdError>, Stop> {
        let glimpse = match glimpse {
            Some(glimpse) => glimpse,
            None => {
                let ops = self.glimpse_ops(fence);
                match self.retrying(outage, || self.client.txn(&[], &ops, &[]))? {
                    Ok(reply) => queue::Glimpse {
                        head: reply.listing(0),
                        near: reply.listing(1),
                    },
                    Err(error) => return Ok(Err(error)),
                }
            }
        };
        let revision = glimpse.head.header.revision;
        let total = usize::try_from(glimpse.head.count).unwrap_or(0);
        if let Some(seen) = queue::glimpsed(glimpse, key, self.limit, &self.limit_key) {
            return Ok(Ok((seen, revision, total)));
        }
        Ok(self
            .retrying(outage, || self.client.range(&self.range.0, &self.range.1))?
            .map(|listing| {
                let total = listing.kvs.len();
                (
                    queue::Seen::whole(listing.kvs),
                    listing.header.revision,
                    total,
                )
            }))
    }

    /// Runs `call`, a write, unless release began; release waits for it
    /// to finish, so that it can undo what it wrote.
    fn writing<T>(&self, call: impl FnOnce() -> T) -> Result<T, Stop> {
        self.gate
            .write(|_| {}, call, |_, _| {})
            .ok_or(Stop::Closing)
    }

    /// Runs `call` until it answers, within the outage policy.
    fn retrying<T>(
        &self,
        outage: &mut Outage,
        mut call: impl FnMut() -> Result<T, EtcdError>,
    ) -> Result<Result<T, EtcdError>, Stop> {
        loop {
            if self.gate.closing() {
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
                    if self.gate.pause(pause) {
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
            let granted = self
                .gate
                .write(
                    |_| {},
                    || self.client.grant(self.settings.ttl),
                    |shared, granted| {
                        if let Ok(lease) = granted {
                            shared.lease = Some(*lease);
                            shared.renewed = Some(sent);
                        }
                    },
                )
                .ok_or(Stop::Closing)?;
            match granted {
                Ok(lease) => {
                    outage.recovered();
                    report::event("lease", &[("lease", &format!("{lease:x}"))]);
                    return Ok((lease, sent));
                }
                Err(error) => {
                    let pause = on_failure(outage, error)?;
                    if self.gate.pause(pause) {
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
        let [head, near] = self.glimpse_ops(0);
        let record_and_key = [
            Op::Put(&self.limit_key, limit.as_bytes(), 0),
            Op::Put(&key, &self.info, lease),
            head,
            near,
        ];
        loop {
            let tried = self.joining_txn(
                outage,
                &[
                    Compare::Created(&key, 0),
                    Compare::Value(&self.limit_key, limit.as_bytes()),
                ],
                &[Op::Put(&key, &self.info, lease), head, near],
                &[Op::Get(&self.limit_key), Op::Get(&key)],
            )?;
            let reply = match tried {
                Ok(reply) => reply,
                Err(_) => return Ok(Joined::LeaseGone),
            };
            if reply.succeeded {
                return Ok(Joined::At(
                    reply.header.revision,
                    Some(glimpse_of(&reply, 1)),
                ));
            }
            if let Some(ours) = reply.range(1).first() {
                // An earlier attempt that went through without an answer.
                if ours.lease == lease {
                    return Ok(Joined::At(ours.create_revision, None));
                }
                // Our key's name, written by hand on no lease or another:
                // no contender, and never ours (taking it as ours, we
                // found ourselves gone at every look, and joined again
                // at once, for ever). A new lease gives a key of another
                // name; this one goes now rather than at its end.
                report::event(
                    "rejoin",
                    &[("why", &"our key was written again without our lease")],
                );
                let now = Instant::now();
                let _ = self.revoke(lease, now, now);
                return Ok(Joined::LeaseGone);
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
                        return Ok(Joined::At(
                            reply.header.revision,
                            Some(glimpse_of(&reply, 2)),
                        ))
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
                        return Err(Stop::Failed(StoreError::conflict(format!(
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
                    return Ok(Joined::At(
                        reply.header.revision,
                        Some(glimpse_of(&reply, 2)),
                    ));
                }
                // Someone arrived meanwhile: look again.
                Ok(_) => continue,
                Err(_) => return Ok(Joined::LeaseGone),
            }
        }
    }

    fn limit_conflict(&self, value: &[u8]) -> StoreError {
        let key = String::from_utf8_lossy(&self.limit_key);
        StoreError::conflict(match queue::read_limit(value) {
            queue::Recorded::Limit(recorded) => format!(
                "{key} records a limit of {recorded} but --limit is {}: every contender on a prefix must use the same limit (consem reset --store etcd://… --prefix {} once it is idle)",
                self.limit, self.prefix
            ),
            queue::Recorded::Unreadable(what) => format!(
                "{key} holds '{what}', not a limit consem can read; consem leaves it untouched: use another --prefix, or delete the key if it is stale"
            ),
        })
    }

    /// Contends until the slot is ours: grants a lease, joins, and waits
    /// (a rejoin when our key or our lease goes).
    fn take_slot(&self, mode: Contend) -> Result<HeldSlot, Stop> {
        let mut outage = Outage::new(self.settings.ttl);
        let mut lease: Option<(i64, Instant)> = None;
        let mut told: Option<Progress> = None;
        loop {
            let (id, renewed) = match lease {
                Some(lease) => lease,
                None => self.grant(&mut outage)?,
            };
            let (fence, joined) = match self.join(id, &mut outage)? {
                Joined::At(revision, listing) => (revision, listing),
                Joined::LeaseGone => {
                    lease = None;
                    continue;
                }
            };
            self.gate.lock().fence = Some(fence);
            let mut contender = Contender {
                lease: id,
                key: self.key(id),
                fence,
                renewed,
                joined,
                ahead_at_most: usize::MAX,
                wait: None,
            };
            let waited = self.wait_for_slot(&mut contender, mode, &mut outage, &mut told)?;
            lease = Some((id, contender.renewed));
            match waited {
                Waited::Holding { seen, relay_owed } => {
                    self.gate.lock().held = true;
                    return Ok(HeldSlot {
                        lease: id,
                        fence,
                        key: contender.key,
                        renewed: contender.renewed,
                        seen,
                        relay_owed,
                        renew_now: false,
                        failures: Failures::new(self.settings.monitor_retry),
                    });
                }
                Waited::LeaseGone => lease = None,
                Waited::KeyGone => {}
            }
        }
    }

    /// Waits in the queue, once joined, while a thread of its own keeps
    /// the lease alive ([`EtcdSemaphore::renew_while_waiting`]).
    fn wait_for_slot(
        &self,
        contender: &mut Contender,
        mode: Contend,
        outage: &mut Outage,
        told: &mut Option<Progress>,
    ) -> Result<Waited, Stop> {
        let renewals = Renewals::new(contender.renewed);
        let lease_id = contender.lease;
        let waited = thread::scope(|scope| {
            let renewer = scope.spawn(|| self.renew_while_waiting(lease_id, &renewals));
            let waited = self.wait_in_queue(contender, mode, outage, told, &renewals);
            renewals.done.store(true, Ordering::SeqCst);
            renewer.thread().unpark();
            waited
        });
        contender.renewed = renewals.last().at;
        waited
    }

    /// Keeps a waiter's lease alive every TTL/3 until `renewals` is done
    /// or release begins. A waiter's watch stays open across the
    /// keep-alives: one opened again at each cost etcd (a watch stream
    /// through the gateway, and a read or a catch-up) more than the
    /// keep-alive itself, for every waiter of a crowd. A failure is sent
    /// again 200 ms doubling to 1 s apart; whether the lease outlived it,
    /// the waiter judges.
    fn renew_while_waiting(&self, lease_id: i64, renewals: &Renewals) {
        let period = lease::renew_period(self.settings.ttl);
        let mut next = renewals.last().at + period;
        let mut backoff = Backoff::default();
        loop {
            loop {
                if renewals.done.load(Ordering::SeqCst) || self.gate.closing() {
                    return;
                }
                let now = Instant::now();
                if now >= next {
                    break;
                }
                thread::park_timeout(next - now);
            }
            let sent = Instant::now();
            match self.client.keep_alive(lease_id, period.min(RENEW_TIMEOUT)) {
                Ok(()) => {
                    renewals.renewed(sent);
                    self.gate.lock().renewed = Some(sent);
                    backoff = Backoff::default();
                    next = sent + period;
                }
                Err(EtcdError::LeaseGone) => {
                    renewals.gone();
                    return;
                }
                Err(error) => {
                    report::event("retry", &[("error", &error)]);
                    next = Instant::now() + backoff.next_pause();
                }
            }
        }
    }

    /// Reads the prefix, watches what [`queue::after_read`] says, until
    /// the slot is ours or our key or lease goes.
    fn wait_in_queue(
        &self,
        contender: &mut Contender,
        mode: Contend,
        outage: &mut Outage,
        told: &mut Option<Progress>,
        renewals: &Renewals,
    ) -> Result<Waited, Stop> {
        loop {
            // A watch lasts at most until the lease could end: the waiter
            // looks at its renewals then.
            let renewed = renewals.last();
            contender.renewed = renewed.at;
            let left = self.settings.ttl.saturating_sub(renewed.at.elapsed());
            if renewed.gone || left < client::SHORTEST_WATCH {
                report::event("rejoin", &[("why", &"our lease ended while we waited")]);
                return Ok(Waited::LeaseGone);
            }
            if let Some(wait) = &mut contender.wait {
                match self.watch_queue(wait, &contender.key, left, outage)? {
                    Watching::Holding => {
                        // Whoever joined since may watch our key.
                        return Ok(Waited::Holding {
                            seen: wait.waiting.seen,
                            relay_owed: true,
                        });
                    }
                    Watching::Again => continue,
                    Watching::Read => {}
                }
            }
            let joined = contender.joined.take();
            let read = self.read_queue(&contender.key, contender.fence, joined, outage)?;
            let Ok((read, seen, total)) = read else {
                continue;
            };
            let range = (self.range.0.as_slice(), self.range.1.as_slice());
            match queue::after_read(
                &read.kvs,
                seen,
                &contender.key,
                self.limit,
                range,
                &self.limit_key,
            ) {
                AfterRead::Foreign(foreign) => return Err(self.foreign(foreign).into()),
                // A linearizable read showed our key among the first
                // `limit`: the slot is ours. A waiter may watch our key
                // unless the read saw every key, none behind ours.
                AfterRead::Holding { relay_owed } => {
                    return Ok(Waited::Holding {
                        seen,
                        relay_owed: relay_owed || !read.complete,
                    })
                }
                AfterRead::Gone => {
                    report::event("rejoin", &[("why", &"our key was deleted")]);
                    return Ok(Waited::KeyGone);
                }
                AfterRead::Wait(_, picture) if mode == Contend::Try => {
                    return Err(Stop::NoSlot(picture))
                }
                AfterRead::Wait(waiting, mut picture) => {
                    if !read.up_to_us {
                        let others = read
                            .kvs
                            .iter()
                            .filter(|kv| !queue::is_contender(kv, &self.limit_key))
                            .count();
                        let at_most = total.saturating_sub(1 + others + self.limit as usize);
                        picture.ahead = contender.ahead_at_most.min(at_most);
                    }
                    contender.ahead_at_most = picture.ahead;
                    // A watch of the same keys, made before this read, goes
                    // on from it.
                    let watch = contender
                        .wait
                        .take()
                        .filter(|old| old.waiting.watches_as(&waiting))
                        .and_then(|old| old.watch)
                        .filter(|watch| watch.created_at <= seen);
                    contender.wait = Some(Wait { waiting, watch });
                    self.gate.waiting_if_changed(&self.prefix, picture, told);
                }
            }
        }
    }

    /// Opens the watch `waiting` needs, for `left` at most; `None` if the
    /// wait ended first.
    fn open_watch(
        &self,
        waiting: &queue::Waiting,
        left: Duration,
        outage: &mut Outage,
    ) -> Result<Option<client::Watch>, Stop> {
        let request = WatchRequest {
            key: &waiting.watched,
            end: waiting.end.as_deref(),
            deletions_only: waiting.end.is_some(),
            after: waiting.may_watch_late().then_some(waiting.seen),
        };
        Ok(self
            .retrying(outage, || self.client.watch(&request, left))?
            .ok()
            .flatten())
    }

    /// Watches what a waiter waits on, for `left` at most (the next
    /// keep-alive is due then). A watch from where etcd stands tells what
    /// changed after etcd created it; what changed between our read and
    /// then, we read. A waiter further back watches from what it saw.
    fn watch_queue(
        &self,
        wait: &mut Wait,
        key: &[u8],
        left: Duration,
        outage: &mut Outage,
    ) -> Result<Watching, Stop> {
        let watch = match &mut wait.watch {
            Some(watch) => watch,
            None => match self.open_watch(&wait.waiting, left, outage)? {
                Some(watch) => wait.watch.insert(watch),
                // The wait ended first: renew.
                None => return Ok(Watching::Again),
            },
        };
        if watch.created_at > wait.waiting.seen {
            return Ok(Watching::Read);
        }
        let watched = self.client.next_change(watch, wait.waiting.seen);
        if self.gate.closing() {
            return Err(Stop::Closing);
        }
        let next = match watched {
            Err(error) => {
                wait.watch = None;
                let pause = on_failure(outage, error)?;
                if self.gate.pause(pause) {
                    return Err(Stop::Closing);
                }
                return Ok(Watching::Again);
            }
            // Renew, then watch again.
            Ok(Watched::Quiet) => {
                outage.recovered();
                wait.watch = None;
                return Ok(Watching::Again);
            }
            Ok(Watched::Changed(changes)) => {
                outage.recovered();
                wait.waiting.after_change(changes, key, self.limit)
            }
            // etcd ended the watch: read.
            Ok(Watched::Ended) => {
                outage.recovered();
                AfterChange::Read
            }
        };
        match next {
            AfterChange::Holding => Ok(Watching::Holding),
            AfterChange::WatchOn => Ok(Watching::Again),
            AfterChange::Read => {
                wait.watch = None;
                Ok(Watching::Read)
            }
            // First in line, most likely: the watch for departures opens
            // before the read, which then covers what the watch does not,
            // and the watch goes on from it.
            AfterChange::AheadWritten => {
                wait.waiting.first_in_line((&self.range.0, &self.range.1));
                wait.watch = self.open_watch(&wait.waiting, left, outage)?;
                Ok(Watching::Read)
            }
        }
    }

    fn foreign(&self, foreign: &client::KeyValue) -> StoreError {
        StoreError::conflict(format!(
            "{} is a key on a lease with no consem description: etcdctl lock, or another client of etcd's concurrency.Mutex, uses {}/ too; consem leaves it untouched. The two cannot share a name (etcdctl lock waits for every older key, {} included): use another --prefix",
            String::from_utf8_lossy(&foreign.key),
            self.prefix,
            queue::LIMIT_KEY_NAME
        ))
    }

    /// Keeps the lease alive every TTL/3 and watches our key between
    /// renewals, once the command has started (its first requests wait
    /// for it); returns why the slot is lost, or `None` once release
    /// began.
    fn keep_holding(&self, slot: &mut HeldSlot) -> Option<String> {
        let period = lease::renew_period(self.settings.ttl);
        self.gate
            .wait_for_command(period.saturating_sub(slot.renewed.elapsed()));
        loop {
            if self.gate.closing() {
                return None;
            }
            if let Err(end) = self.hold_once(slot, period) {
                return end;
            }
        }
    }

    /// One round of holding: the relay write if owed, a keep-alive if
    /// due, then the watch of our key until the next is due.
    fn hold_once(&self, slot: &mut HeldSlot, period: Duration) -> Result<(), Ended> {
        if slot.relay_owed && !slot.renew_now {
            self.relay(slot)?;
        }
        if (slot.renew_now || renewal_due(slot.renewed, period)) && !self.renew(slot)? {
            return Ok(());
        }
        self.watch_own_key(slot)
    }

    /// The relay write, owed to the waiter behind us: it wakes when our
    /// key changes. Until it is made, that waiter sleeps, so a failure is
    /// retried as a renewal's is.
    fn relay(&self, slot: &mut HeldSlot) -> Result<(), Ended> {
        match self.client.txn(
            &[Compare::Created(&slot.key, slot.fence)],
            &[Op::Put(&slot.key, &self.info, slot.lease)],
            &[],
        ) {
            Ok(reply) if reply.succeeded => {
                slot.relay_owed = false;
                slot.seen = reply.header.revision;
            }
            Ok(_) => {
                return Err(Some(format!(
                    "our key {} was deleted while our lease lives (consem release, or by hand)",
                    slot.shown_key()
                )))
            }
            Err(_) => slot.renew_now = true,
        }
        Ok(())
    }

    /// Sends a keep-alive, and tells the supervisor the lease it gives.
    /// `Ok(false)` after a failure, once the pause before the next attempt
    /// is over.
    fn renew(&self, slot: &mut HeldSlot) -> Result<bool, Ended> {
        let ttl = self.settings.ttl;
        let period = lease::renew_period(ttl);
        let sent = Instant::now();
        match self.client.keep_alive(slot.lease, period.min(RENEW_TIMEOUT)) {
            Ok(()) => {
                slot.failures.reset();
                slot.renew_now = false;
                slot.renewed = sent;
                self.gate.lock().renewed = Some(sent);
                self.gate.notify(SlotEvent::Leased {
                    until: lease::lease_end(sent, ttl),
                });
                Ok(true)
            }
            Err(EtcdError::LeaseGone) => Err(Some(format!(
                "our lease {:x} is gone: etcd let it expire (no keep-alive within --ttl {}) or someone revoked it (consem release, etcdctl lease revoke)",
                slot.lease,
                crate::duration::human(ttl)
            ))),
            Err(EtcdError::Denied(why)) => Err(Some(why)),
            Err(error) => {
                slot.renew_now = true;
                let lease_end = lease::lease_end(slot.renewed, ttl);
                slot.failures.retry(
                    &self.gate,
                    lease_end,
                    "cannot keep our lease alive: ",
                    &error,
                )?;
                Ok(false)
            }
        }
    }

    /// Watches our own key until the next keep-alive is due: a deletion,
    /// or our key written again, is a loss unless our own release made it.
    fn watch_own_key(&self, slot: &mut HeldSlot) -> Result<(), Ended> {
        let left = lease::renew_period(self.settings.ttl).saturating_sub(slot.renewed.elapsed());
        let request = WatchRequest {
            key: &slot.key,
            end: None,
            deletions_only: false,
            after: None,
        };
        let mut watch = match self.client.watch(&request, left) {
            Ok(Some(watch)) => watch,
            Ok(None) => return Ok(()),
            Err(_) => return self.renew_after_failure(slot),
        };
        // What changed between what we saw and the watch's start, we read.
        let mut check = watch.created_at > slot.seen;
        loop {
            if check {
                match self.client.range(&slot.key, &[]) {
                    Ok(reply) => {
                        self.check_own_key(slot, &reply.kvs)?;
                        slot.seen = reply.header.revision;
                    }
                    Err(_) => {
                        slot.renew_now = true;
                        return Ok(());
                    }
                }
            }
            let watched = self.client.next_change(&mut watch, slot.seen);
            // Our own release: it deleted the key.
            if self.gate.closing() {
                return Err(None);
            }
            match watched {
                Ok(Watched::Changed(_)) => check = true,
                // Renew, or watch again: what changed meanwhile is read
                // then.
                Ok(Watched::Quiet | Watched::Ended) => return Ok(()),
                Err(_) => return self.renew_after_failure(slot),
            }
        }
    }

    /// A watch failed: renewing tells whether etcd is there, and counts.
    fn renew_after_failure(&self, slot: &mut HeldSlot) -> Result<(), Ended> {
        slot.renew_now = true;
        if self.gate.pause(FIRST_BACKOFF) {
            return Err(None);
        }
        Ok(())
    }

    /// Our key as a read of it found it: the loss, unless it is ours.
    fn check_own_key(&self, slot: &HeldSlot, kvs: &[client::KeyValue]) -> Result<(), Ended> {
        let shown_key = slot.shown_key();
        let lease_id = slot.lease;
        Err(Some(match queue::own_key(kvs, slot.lease, slot.fence) {
            OwnKey::Ours => return Ok(()),
            OwnKey::Gone => self.why_gone(lease_id, &shown_key),
            OwnKey::WithoutOurLease => format!(
                "our key {shown_key} was written again without our lease {lease_id:x} (by hand, etcdctl put): it no longer counts as a contender, and the next may take the slot"
            ),
            OwnKey::Recreated => format!(
                "our key {shown_key} was deleted and written again (by hand): it stands behind every other contender now"
            ),
        }))
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

    /// Revokes the lease (our key goes with it), trying again while etcd
    /// has no leader or is down, until `revoke_until` (a member without a
    /// leader) or `down_until` (one that cannot be reached).
    fn revoke(
        &self,
        lease: i64,
        revoke_until: Instant,
        down_until: Instant,
    ) -> Result<Revoked, EtcdError> {
        let left = |floor: Duration| {
            revoke_until
                .saturating_duration_since(Instant::now())
                .max(floor)
        };
        let mut resent = false;
        loop {
            match self
                .client
                .revoke(lease, left(Duration::from_millis(100)), &mut resent)
            {
                Err(EtcdError::NotReady(why) | EtcdError::Slow(why))
                    if left(Duration::ZERO) > 2 * FIRST_BACKOFF =>
                {
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
                revoked => return revoked,
            }
        }
    }

    /// The last one out drops the limit record, unless a contender
    /// arrived since the listing. Only a record of our own limit: one that
    /// is not consem's, or holds another limit, is reported by `join` and
    /// left as it is.
    fn drop_limit_record_if_last(&self, within: Duration) {
        // A few keys tell whether a contender is left, whatever the crowd
        // (the limit record comes first in key order, then the others): the
        // whole prefix is read only when they do not (keys without a
        // lease, or etcdctl's, among them).
        let (from, to) = (&self.range.0[..], &self.range.1[..]);
        let few = [Op::FirstByKey(from, to, i64::from(1 + queue::HEAD_SLACK))];
        let Ok(reply) = self.client.txn_within(&[], &few, &[], within) else {
            return;
        };
        let few = reply.listing(0);
        let listing = if !few.more {
            few
        } else if queue::contenders(&few.kvs, &self.limit_key)
            .iter()
            .any(|kv| queue::is_consem(kv))
        {
            return;
        } else {
            let Ok(listing) = self
                .client
                .range_within(&self.range.0, &self.range.1, within)
            else {
                return;
            };
            listing
        };
        // Keys of etcdctl lock count for nothing: they wait for the record
        // to go.
        let contenders = queue::contenders(&listing.kvs, &self.limit_key);
        let ours = listing.kvs.iter().any(|kv| {
            kv.key == self.limit_key
                && queue::read_limit(&kv.value) == queue::Recorded::Limit(self.limit)
        });
        if ours && contenders.iter().all(|kv| !queue::is_consem(kv)) {
            let _ = self.client.txn_within(
                &[Compare::UnchangedSince(
                    &self.range.0,
                    &self.range.1,
                    listing.header.revision,
                )],
                &[Op::Delete(&self.limit_key)],
                &[],
                within,
            );
        }
    }
}

/// The glimpse of the queue a join transaction read, its reads from the
/// `first`th operation on.
fn glimpse_of(reply: &TxnReply, first: usize) -> queue::Glimpse {
    queue::Glimpse {
        head: reply.listing(first),
        near: reply.listing(first + 1),
    }
}

/// Whether the next keep-alive is due: too little is left before it for
/// a watch.
fn renewal_due(renewed: Instant, period: Duration) -> bool {
    period.saturating_sub(renewed.elapsed()) < client::SHORTEST_WATCH
}

/// A waiter's keep-alives, as its renewing thread tells them.
struct Renewals {
    last: Mutex<Renewed>,
    /// The waiting is over: the renewing thread stops.
    done: AtomicBool,
}

#[derive(Clone, Copy)]
struct Renewed {
    /// When the last keep-alive etcd confirmed (or the grant) was sent.
    at: Instant,
    /// etcd no longer has the lease.
    gone: bool,
}

impl Renewals {
    fn new(renewed: Instant) -> Renewals {
        Renewals {
            last: Mutex::new(Renewed {
                at: renewed,
                gone: false,
            }),
            done: AtomicBool::new(false),
        }
    }

    fn last(&self) -> Renewed {
        *self.last.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn renewed(&self, sent: Instant) {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).at = sent;
    }

    fn gone(&self) {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).gone = true;
    }
}

/// Why holding ended: the slot is lost, or (`None`) release began.
type Ended = Option<String>;

/// A contender between its steps, from joining to a slot.
struct Contender {
    lease: i64,
    key: Vec<u8>,
    /// When the last keep-alive etcd confirmed (or the grant) was sent.
    renewed: Instant,
    /// Our key's create revision.
    fence: i64,
    /// The queue as the join read it, used for the first decision.
    joined: Option<queue::Glimpse>,
    /// Waiters ahead of us, at most: exact when a read saw every key up to
    /// ours; otherwise what the last one that did, or the size of the
    /// prefix, allows (keys ahead only ever leave).
    ahead_at_most: usize,
    wait: Option<Wait>,
}

/// Where a waiter waits, and its watch.
struct Wait {
    waiting: queue::Waiting,
    watch: Option<client::Watch>,
}

/// How waiting ended.
enum Waited {
    /// The slot is ours; our key is known to be there through `seen`;
    /// `relay_owed`: a waiter may be watching our key.
    Holding { seen: i64, relay_owed: bool },
    /// Our lease ended: grant another, and join again.
    LeaseGone,
    /// Our key was deleted: join again on the same lease.
    KeyGone,
}

/// What one look at a waiter's watch says.
enum Watching {
    /// The slot is ours.
    Holding,
    /// Renew if due, then watch again.
    Again,
    /// Read the prefix.
    Read,
}

/// A slot held, between the holder's steps.
pub struct HeldSlot {
    lease: i64,
    /// Our key's create revision.
    fence: i64,
    key: Vec<u8>,
    /// When the last keep-alive etcd confirmed was sent.
    renewed: Instant,
    /// The revision through which our key is known to be ours.
    seen: i64,
    /// The relay write is owed to a waiter behind us.
    relay_owed: bool,
    /// Something failed: keep the lease alive before anything else.
    renew_now: bool,
    failures: Failures,
}

impl HeldSlot {
    fn shown_key(&self) -> String {
        String::from_utf8_lossy(&self.key).into_owned()
    }
}

impl Recipe for EtcdSemaphore {
    type Shared = Shared;
    type Held = HeldSlot;

    fn gate(&self) -> &Gate<Shared> {
        &self.gate
    }

    fn prefix(&self) -> &str {
        &self.prefix
    }

    fn acquire(self: &Arc<Self>, mode: Contend) -> Result<Grant<HeldSlot>, Stop> {
        let slot = self.take_slot(mode)?;
        Ok(Grant {
            fence: slot.fence as u64,
            lease: Some(lease::lease_end(slot.renewed, self.settings.ttl)),
            held: slot,
        })
    }

    fn hold(self: &Arc<Self>, mut slot: HeldSlot) -> Option<String> {
        self.keep_holding(&mut slot)
    }
}

impl SlotBackend for EtcdSemaphore {
    fn contend(self: Arc<Self>, mode: Contend, notify: Notify) {
        driver::contend(self, mode, notify);
    }

    fn release(&self, budget: Duration) -> Result<Released, ReleaseError> {
        let deadline = Instant::now() + budget;
        let (lease, renewed, held) = {
            let (shared, _) = self.gate.stop(budget / 2);
            (shared.lease, shared.renewed, shared.held)
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
        // A member that lost its leader refuses until another is elected,
        // and an etcd that is down may be restarting: try again meanwhile,
        // the latter for an election's time at most.
        let down_until = deadline.min(Instant::now() + ELECTION);
        let revoked = self.revoke(lease, revoke_until, down_until);
        report::event(driver::leaving_event(held), &[("prefix", &self.prefix)]);
        let released = match revoked {
            Ok(Revoked::Now) => Released::Left,
            Ok(Revoked::AlreadyGone) => Released::TakenBefore(format!(
                "our lease {lease:x} was gone before we left: revoked (consem release, etcdctl lease revoke) or expired"
            )),
            Err(error) => {
                return Err(ReleaseError(vec![Unfinished::step(format!(
                    "leaving {}",
                    self.prefix
                ))
                .because(error)
                .cleanup(format!(
                    "etcd drops our lease {lease:x} by itself within --ttl {} of its last renewal (or of etcd's restart)",
                    crate::duration::human(self.settings.ttl)
                ))]));
            }
        };
        self.drop_limit_record_if_last(
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(100)),
        );
        Ok(released)
    }

    fn own_child_env(&self) -> Vec<(String, String)> {
        let shared = self.gate.lock();
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
        self.gate.command_started();
    }
}
