//! The local store: N slots on one host, with no server. A slot is held
//! through kernel locks on open files, so a consem that dies (SIGKILL, the
//! OOM killer) gives its slot back at once, with no TTL and nothing to
//! clean. See docs/design.md, "The local store".
//!
//! One directory per prefix holds:
//! - `meta`: its `flock` serialises every decision;
//!   it also keeps the fence floor;
//! - `state`: the limit, the next ticket, the fence, where the queue starts
//!   and the holders
//!   (JSON, rewritten in place under `meta`, with a check);
//! - `<ticket>.c` per contender: its description, locked for its life;
//! - `<ticket>.q` per waiter: locked while it waits, so the waiter behind
//!   it can block on it;
//! - `<ticket>.w` per contender: the FIFO that wakes it once it holds.

mod decide;
mod files;
mod record;

pub use decide::{decide, Decision, WaitOn};

use decide::{find_just_ahead, room_for_all_ahead, Clear};

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use files::{Change, MetaLock, PrefixDir, StaleFile, WakeFifo, Waker};

use super::driver::{self, Gate, Grant, Recipe, Stop};
use super::kind::{Store, StoreSettings};
use super::{
    Admin, Contend, ContenderInfo, ContenderStatus, Holder, Notify, Progress, ReleaseError,
    Released, ResetOutcome, SlotBackend, Status, StoreError, Summary, Unfinished,
};
use crate::report;

/// The highest limit: every decision looks at each holder. A slot
/// is a kernel lock, so it has no lease and is free when its consem dies.
pub const STORE: Store = Store {
    name: "local",
    title: "local",
    schemes: &["local:"],
    largest_limit: 1024,
    lease: None,
    frees_slot_at_death: true,
};

/// A blocked waiter or holder looks again this often even if nothing woke
/// it, in case a wake-up was lost (an overflowing inotify queue).
const RECHECK: Duration = Duration::from_secs(60);

/// A holder looks at its files this often even if nothing woke it: one
/// whose files were deleted by hand (`rm -rf` of the prefix's directory,
/// which wakes nobody) must stop its command before long, since the next
/// contender takes the slot at once. A look is a few system calls.
const HOLDER_RECHECK: Duration = Duration::from_secs(1);

/// What the local store needs beyond the store-neutral options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The directory that holds one directory per prefix.
    pub base: PathBuf,
}

impl StoreSettings for Settings {
    fn open_run(
        &self,
        prefix: &str,
        limit: u32,
        info: ContenderInfo,
    ) -> Result<Arc<dyn SlotBackend>, StoreError> {
        Ok(Arc::new(LocalSemaphore::open(self, prefix, limit, info)?))
    }

    fn open_admin(&self, prefix: &str) -> Result<Box<dyn Admin>, StoreError> {
        Ok(Box::new(LocalAdmin::open(self, prefix)?))
    }
}

/// `/run/lock/consem`, shared by every user of the host (so that the cron
/// jobs of different users share slots), where `/run/lock` can be written;
/// else `<runtime_dir>/consem` (`XDG_RUNTIME_DIR`: this user only); else
/// `/tmp/consem-<uid>`.
pub fn default_base(runtime_dir: Option<String>) -> PathBuf {
    let shared = Path::new("/run/lock/consem");
    if shared.is_dir() || files::writable(Path::new("/run/lock")) {
        return shared.to_path_buf();
    }
    if let Some(runtime) = runtime_dir.filter(|d| !d.is_empty()) {
        return Path::new(&runtime).join("consem");
    }
    // SAFETY: getuid cannot fail.
    PathBuf::from(format!("/tmp/consem-{}", unsafe { libc::getuid() }))
}

/// What the contender thread and `release` share (release began: take no
/// slot from now on).
#[derive(Default)]
pub struct Shared {
    /// Our ticket and our two locked files, once joined.
    ticket: Option<u64>,
    contender_file: Option<File>,
    queue_file: Option<File>,
    /// Read end of our wake FIFO (made when we join).
    wake_fifo: Option<Arc<WakeFifo>>,
    /// A slot was taken (not only a place in the queue).
    held: bool,
}

/// A semaphore at one prefix on this host, for one run.
pub struct LocalSemaphore {
    prefix: String,
    limit: u32,
    info: ContenderInfo,
    place: PrefixDir,
    gate: Gate<Shared>,
}

impl LocalSemaphore {
    /// Opens (creating it if need be) the prefix's directory.
    pub fn open(
        settings: &Settings,
        prefix: &str,
        limit: u32,
        info: ContenderInfo,
    ) -> Result<LocalSemaphore, StoreError> {
        Ok(LocalSemaphore {
            prefix: prefix.to_string(),
            limit,
            info,
            place: PrefixDir::open(&settings.base, prefix, true)?,
            gate: Gate::default(),
        })
    }

    fn conflict(&self, found: u32) -> StoreError {
        StoreError::conflict(format!(
            "the local semaphore {} has Limit {found} but --limit is {}: every contender on a prefix must use the same limit (consem reset --store local --prefix {} once it is idle)",
            self.prefix, self.limit, self.prefix
        ))
    }

    /// Takes a ticket and locks our files, under the directory's lock,
    /// which it returns still held for the first look. `None` if release
    /// began first.
    fn join(&self) -> Result<Option<(u64, MetaLock)>, StoreError> {
        let meta = self.place.lock()?;
        if self.gate.closing() {
            return Ok(None);
        }
        let mut state = self.place.read_state()?;
        match state.limit {
            Some(found) if found != self.limit && self.place.anyone_live()? => {
                return Err(self.conflict(found))
            }
            _ => state.limit = Some(self.limit),
        }
        let joined = self
            .place
            .create_contender(state.next, &self.info, self.limit)?;
        let ticket = joined.ticket;
        state.next = ticket + 1;
        // All or nothing: files left by a join that failed would be taken
        // for a dead contender's, or hold up a ticket, for ever.
        if let Err(error) = self.place.write_state(&state) {
            self.place.remove_files(ticket);
            return Err(error);
        }
        let mut shared = self.gate.lock();
        shared.ticket = Some(ticket);
        shared.contender_file = Some(joined.contender);
        shared.queue_file = Some(joined.queue);
        shared.wake_fifo = Some(Arc::new(joined.wake));
        Ok(Some((ticket, meta)))
    }

    /// Joins, and waits until the slot is ours: its fence.
    fn take_slot(&self, mode: Contend) -> Result<u64, Stop> {
        // Made only when we first have to wait for any departure: an
        // uncontended run never sets up inotify (closing an inotify
        // descriptor waits for the kernel's grace period, about 10 ms).
        let mut waker: Option<Waker> = None;
        let Some((ticket, joined)) = self.join()? else {
            return Err(Stop::Closing);
        };
        let mut joined = Some(joined);
        // Nobody waits in [clear.from, ticket): see `decide::Clear`.
        let mut clear = Clear { from: ticket };
        let mut last_picture: Option<Progress> = None;
        // The limit and holders that the record said when we last went to
        // sleep first in the queue: a wake for the record alone that finds
        // them as they were (a contender joined behind us) needs no look at
        // the holders, whose leaving or dying wakes us by their files.
        let mut asleep_first_on: Option<(Option<u32>, Vec<u64>)> = None;
        loop {
            let meta = match joined.take() {
                Some(meta) => meta,
                None => self.place.lock()?,
            };
            if self.gate.closing() {
                return Err(Stop::Closing);
            }
            let change = match &mut waker {
                Some(waker) => {
                    waker.drain();
                    waker.take_change()
                }
                None => Change::Ahead,
            };
            if !self.still_registered(ticket) {
                // The directory was removed by hand (and maybe made again
                // by newcomers, whose record does not know our ticket):
                // taking a slot in it would be beside holders it forgot.
                return Err(StoreError::unavailable(format!(
                    "our contender file {} was deleted while we waited (the prefix's directory removed by hand?): the command was not run; run it again to join afresh",
                    self.place.contender_path(ticket).display()
                ))
                .into());
            }
            let mut state = self.place.read_state()?;
            let as_read = (state.limit, state.holders.clone());
            if let (Change::Record, Some(waker)) = (change, &mut waker) {
                if asleep_first_on.as_ref() == Some(&as_read) {
                    drop(meta);
                    waker.wait(RECHECK);
                    continue;
                }
            }
            asleep_first_on = None;
            match state.limit {
                Some(found) if found != self.limit => return Err(self.conflict(found).into()),
                // Reset while we waited: the limit is ours to set again.
                None => state.limit = Some(self.limit),
                Some(_) => {}
            }
            let just_ahead = find_just_ahead(&mut clear, state.waiting_from, |t| {
                self.place.look_at_waiter(t)
            });
            // A waiter with one ahead waits on it whatever the holders are.
            if just_ahead.is_none() || mode == Contend::Try {
                self.place.prune_holders(&mut state);
            }
            let decision = match decide(state.holders.len(), just_ahead, self.limit) {
                Decision::Full {
                    wait_on: WaitOn::Ticket(ahead),
                } if mode == Contend::Try
                    && room_for_all_ahead(
                        state.holders.len(),
                        ahead,
                        state.waiting_from,
                        self.limit,
                        |t| self.place.look_at_waiter(t),
                    ) =>
                {
                    Decision::Take
                }
                decision => decision,
            };
            match decision {
                Decision::Take => {
                    state.holders.push(ticket);
                    state.fence += 1;
                    if just_ahead.is_none() {
                        // Nobody waits ahead of us: the queue starts behind us.
                        state.waiting_from = state.waiting_from.max(ticket + 1);
                    }
                    self.place.raise_fence_floor(state.fence);
                    self.place.write_state(&state)?;
                    if let Some(waker) = waker.take() {
                        waker.retire();
                    }
                    let mut shared = self.gate.lock();
                    shared.held = true;
                    // Wakes the waiter blocked on our queue file.
                    self.place.remove_queue_file(ticket);
                    shared.queue_file = None;
                    drop(meta);
                    return Ok(state.fence);
                }
                Decision::Full {
                    wait_on: WaitOn::AnyDeparture,
                } if waker.is_none() && mode == Contend::Wait => {
                    // Watch first, then look again: a departure between
                    // our look and the watch is seen by the second look.
                    waker = Some(Waker::new(self.place.path(), ticket)?);
                    drop(meta);
                }
                Decision::Full { wait_on } => {
                    drop(meta);
                    // Read outside the lock: a holder gone meanwhile is
                    // described as unknown, and the next look says so.
                    let picture = Progress {
                        limit: self.limit,
                        holders: state
                            .holders
                            .iter()
                            .map(|&t| Holder::from(&self.place.describe(t)))
                            .collect(),
                        // Every ticket from the queue's start to the waiter
                        // just ahead: exact unless one of them has gone
                        // since without our looking (we wait on one only).
                        ahead: just_ahead
                            .map_or(0, |t| (t + 1).saturating_sub(state.waiting_from) as usize),
                    };
                    if mode == Contend::Try {
                        return Err(Stop::NoSlot(picture));
                    }
                    self.gate
                        .waiting_if_changed(&self.prefix, picture, &mut last_picture);
                    match (wait_on, &mut waker) {
                        (WaitOn::AnyDeparture, Some(waker)) => {
                            asleep_first_on = Some(as_read);
                            waker.wait(RECHECK)
                        }
                        (WaitOn::AnyDeparture, None) => unreachable!("a waker is made first"),
                        (WaitOn::Ticket(ahead), _) => self.place.wait_for_queue_file(ahead),
                    }
                }
            }
        }
    }

    /// Whether our contender file is where we made it: deleted by hand, or
    /// replaced by a newcomer's in a directory made again, it is not.
    fn still_registered(&self, ticket: u64) -> bool {
        let shared = self.gate.lock();
        shared
            .contender_file
            .as_ref()
            .is_some_and(|ours| self.place.contender_file_is(ticket, ours))
    }

    /// Watches the slot while the command runs; returns why it was lost, or
    /// `None` once release begins.
    /// An operator's `release` or `reset` writes to our wake FIFO after it
    /// changes the record; we also look every `HOLDER_RECHECK`.
    fn watch(&self) -> Option<String> {
        let (ticket, fifo) = {
            let shared = self.gate.lock();
            (shared.ticket?, Arc::clone(shared.wake_fifo.as_ref()?))
        };
        loop {
            if self.gate.closing() {
                return None;
            }
            // Under the lock: `state` is rewritten in place, and a record
            // lost by hand is rebuilt from the files as they stand.
            let state = match self.place.lock().and_then(|_meta| self.place.read_state()) {
                Ok(state) => state,
                Err(error) => return Some(error.to_string()),
            };
            if state.limit != Some(self.limit) {
                return Some(
                    "the semaphore was reset (consem reset): its limit record is gone".into(),
                );
            }
            if !state.holders.contains(&ticket) {
                return Some(
                    "we were removed from the holders (consem release, or reset --force)".into(),
                );
            }
            if !self.still_registered(ticket) {
                return Some(format!(
                    "our contender file {} was deleted",
                    self.place.contender_path(ticket).display()
                ));
            }
            fifo.wait(HOLDER_RECHECK);
        }
    }
}

impl Recipe for LocalSemaphore {
    type Shared = Shared;
    /// Nothing: the slot lasts as long as our files' locks.
    type Held = ();

    fn gate(&self) -> &Gate<Shared> {
        &self.gate
    }

    fn prefix(&self) -> &str {
        &self.prefix
    }

    fn acquire(self: &Arc<Self>, mode: Contend) -> Result<Grant<()>, Stop> {
        let fence = self.take_slot(mode)?;
        Ok(Grant {
            fence,
            lease: None,
            held: (),
        })
    }

    fn hold(self: &Arc<Self>, (): ()) -> Option<String> {
        self.watch()
    }
}

impl SlotBackend for LocalSemaphore {
    fn contend(self: Arc<Self>, mode: Contend, notify: Notify) {
        driver::contend(self, mode, notify);
    }

    fn release(&self, budget: Duration) -> Result<Released, ReleaseError> {
        // From here on the contender thread neither joins nor takes a slot: it
        // looks under the directory's lock, which release then takes, so a
        // join or a take under way is finished (and undone here) first.
        drop(self.gate.stop(Duration::ZERO));
        let meta = self.place.lock_within(Instant::now() + budget);
        let (ticket, files, held) = {
            let mut shared = self.gate.lock();
            let files = (
                shared.contender_file.take(),
                shared.queue_file.take(),
                shared.wake_fifo.take(),
            );
            (shared.ticket.take(), files, shared.held)
        };
        let Some(ticket) = ticket else {
            return Ok(Released::Left);
        };
        let ours_still_there = files
            .0
            .as_ref()
            .is_some_and(|ours| self.place.contender_file_is(ticket, ours));
        let outcome = match meta {
            // Our directory was removed by hand: a directory made again
            // since is others', and a file of our ticket in it a newcomer's.
            Ok(_meta) if !ours_still_there => Ok(()),
            Ok(_meta) => self.place.leave(ticket).map_err(Unfinished::failed),
            Err(error) => Err(Unfinished::failed(error).cleanup(
                "the kernel frees our slot as consem exits, and the next contender prunes us",
            )),
        };
        // Closing the files gives up their locks: from here on others see
        // us gone even where `leave` could not tidy up.
        drop(files);
        report::event(
            driver::leaving_event(held),
            &[("prefix", &self.prefix), ("ticket", &ticket)],
        );
        ReleaseError::or_left(outcome.err().into_iter().collect())
    }

    fn frees_slot_at_death(&self) -> bool {
        STORE.frees_slot_at_death
    }
}

/// The operators' commands on a local prefix.
pub struct LocalAdmin {
    prefix: String,
    base: PathBuf,
    place: Option<PrefixDir>,
}

impl LocalAdmin {
    /// Opens the prefix's directory if it exists: operators' commands
    /// create nothing. The empty prefix, of a listing, has none.
    pub fn open(settings: &Settings, prefix: &str) -> Result<LocalAdmin, StoreError> {
        Ok(LocalAdmin {
            prefix: prefix.to_string(),
            base: settings.base.clone(),
            place: match prefix {
                "" => None,
                _ => PrefixDir::open_existing(&settings.base, prefix)?,
            },
        })
    }

    /// The semaphore in `place`; call with its directory locked.
    fn read_status(place: &PrefixDir, prefix: &str) -> Result<Status, StoreError> {
        let state = place.read_state()?;
        let stale = place.stale_files()?;
        let live: BTreeSet<u64> = place.live_tickets()?.into_iter().collect();
        let describe = |t: u64| ContenderStatus::new(t.to_string(), place.describe(t), t);
        let (holders, dead): (Vec<u64>, Vec<u64>) =
            state.holders.iter().partition(|t| live.contains(t));
        Ok(Status {
            limit: state.limit,
            holders: holders.into_iter().map(describe).collect(),
            waiters: live
                .iter()
                .copied()
                .filter(|t| !state.holders.contains(t))
                .map(describe)
                .collect(),
            dead_holders: dead.iter().map(u64::to_string).collect(),
            stale: stale_lines(&stale),
            ..empty_status(prefix)
        })
    }
}

/// The status of a prefix with nothing in it.
fn empty_status(prefix: &str) -> Status {
    Status {
        prefix: prefix.to_string(),
        limit: None,
        layout: None,
        holders: Vec::new(),
        waiters: Vec::new(),
        dead_holders: Vec::new(),
        store: "local",
        conflict: None,
        stale: Vec::new(),
        lock_delay_ms: None,
    }
}

impl Admin for LocalAdmin {
    fn status(&self) -> Result<Status, StoreError> {
        let Some(place) = &self.place else {
            return Ok(empty_status(&self.prefix));
        };
        let _meta = place.lock()?;
        LocalAdmin::read_status(place, &self.prefix)
    }

    fn release(&self, session: &str) -> Result<(), StoreError> {
        let place = self.place.as_ref().ok_or_else(|| self.nothing())?;
        let ticket: u64 = session
            .parse()
            .map_err(|_| StoreError::usage(format!("'{session}' is not a ticket of the local store: see consem status --store local --prefix {}", self.prefix)))?;
        let _meta = place.lock()?;
        let mut state = place.read_state()?;
        state.holders.retain(|&t| t != ticket);
        place.write_state(&state)?;
        place.wake_holder(ticket);
        Ok(())
    }

    fn reset(&self, force: bool) -> Result<ResetOutcome, StoreError> {
        let Some(place) = &self.place else {
            return Ok(ResetOutcome::Nothing);
        };
        let _meta = place.lock()?;
        let mut state = place.read_state()?;
        let stale = place.stale_files()?;
        let stuck = place.remove_stale_files(&stale);
        if !stuck.is_empty() {
            report::warning(&self.stuck(&stuck));
        }
        let Some(limit) = state.limit else {
            // Stale files were all there was to reset.
            return Ok(if stale.len() > stuck.len() {
                ResetOutcome::Reset {
                    limit: None,
                    evicted: 0,
                }
            } else {
                ResetOutcome::Nothing
            });
        };
        let live: BTreeSet<u64> = place.live_tickets()?.into_iter().collect();
        let live_holders: Vec<String> = state
            .holders
            .iter()
            .filter(|t| live.contains(t))
            .map(u64::to_string)
            .collect();
        if !live_holders.is_empty() && !force {
            return Ok(ResetOutcome::LiveHolders(live_holders));
        }
        // The holders see the record go and stop their commands (76);
        // waiters see another limit, or none, and take it up again.
        state.limit = None;
        let evicted = std::mem::take(&mut state.holders);
        place.write_state(&state)?;
        for ticket in evicted {
            place.wake_holder(ticket);
        }
        Ok(ResetOutcome::Reset {
            limit: Some(limit),
            evicted: live_holders.len(),
        })
    }

    /// One directory per prefix under the store's: each read under its
    /// lock, as `status` reads it, but with a shared lock that creates
    /// nothing. A directory no contender uses is left out.
    fn list(&self) -> Result<Vec<Summary>, StoreError> {
        let entries = match std::fs::read_dir(&self.base) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(files::io_error("cannot list", &self.base, e)),
        };
        let mut prefixes: Vec<String> = entries
            .flatten()
            .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|entry| files::prefix_of(entry.file_name().to_str()?))
            .filter(|prefix| super::is_under(prefix, &self.prefix))
            .collect();
        prefixes.sort();
        let mut semaphores = Vec::new();
        for prefix in prefixes {
            // Gone since the listing: nothing to show.
            let Some(place) = PrefixDir::open_existing(&self.base, &prefix)? else {
                continue;
            };
            let Some(_meta) = place.lock_to_read()? else {
                continue;
            };
            let status = LocalAdmin::read_status(&place, &prefix)?;
            if status.limit.is_some() || !status.holders.is_empty() || !status.waiters.is_empty() {
                semaphores.push(Summary::of(status));
            }
        }
        Ok(semaphores)
    }
}

impl LocalAdmin {
    fn nothing(&self) -> StoreError {
        StoreError::usage(format!(
            "no local semaphore at {}: nothing to release",
            self.prefix
        ))
    }

    /// What to say of stale files that `reset` could not remove.
    fn stuck(&self, stuck: &[StaleFile]) -> String {
        format!(
            "could not remove the stale files {} at {} (in a shared directory only their owner or root may): consem skips them, so they are in nobody's way; to remove them, run consem reset on this prefix as {}",
            listing(stuck),
            self.prefix,
            removers(stuck)
        )
    }
}

/// One line per ticket whose contender is gone: its files, their owners,
/// and what removes them.
fn stale_lines(stale: &[StaleFile]) -> Vec<String> {
    let mut by_ticket: BTreeMap<u64, Vec<StaleFile>> = BTreeMap::new();
    for file in stale {
        by_ticket.entry(file.ticket).or_default().push(file.clone());
    }
    let uid = files::effective_uid();
    by_ticket
        .into_iter()
        .map(|(ticket, left)| {
            let remover = if uid == 0 || left.iter().all(|f| f.owner == uid) {
                String::new()
            } else {
                format!(" as {}", removers(&left))
            };
            format!(
                "{}: files of ticket {ticket}, whose contender is gone; consem skips them, and consem reset{remover} removes them",
                listing(&left)
            )
        })
        .collect()
}

/// Who may remove `files` in a shared directory: `nobody or root`.
fn removers(files: &[StaleFile]) -> String {
    let mut names: BTreeSet<String> = files.iter().map(|f| files::user_name(f.owner)).collect();
    names.insert("root".into());
    names.into_iter().collect::<Vec<_>>().join(" or ")
}

/// Stale files as `path (owner), ...`.
fn listing(files: &[StaleFile]) -> String {
    files
        .iter()
        .map(|f| format!("{} ({})", f.path.display(), files::user_name(f.owner)))
        .collect::<Vec<_>>()
        .join(", ")
}
