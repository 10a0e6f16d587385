//! The semaphore recipe as state machines without I/O: [`Contender`] joins
//! and takes a slot, [`Watcher`] checks that it stays ours. They say which
//! Consul call to make next and take its answer; the Consul backend makes the
//! calls over HTTP, and the simulation in `tests/simulation` makes them
//! against a model, so both run exactly this logic.

use std::collections::BTreeSet;

use crate::store::consul::client::{Acquire, Consistency, Listing};
use crate::store::consul::semaphore::{
    self, Conflict, Decision, Entry, Loss, Snapshot, WaitOn, LOCK_KEY_NAME,
};
use crate::store::Contend;

/// A Consul call the recipe needs next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// Create a session (TTL, behaviour `delete`, no lock-delay).
    CreateSession,
    /// Acquire the contender key `<prefix>/<session>` with the session.
    AcquireKey { session: String },
    /// Read `<prefix>/?recurse`; `block_on` > 0 blocks until the index moves.
    List {
        consistency: Consistency,
        block_on: u64,
    },
    /// Read the one key `<prefix>/<name>`; `block_on` > 0 blocks until that
    /// key's index moves past it (it changes or goes).
    Get {
        name: String,
        consistency: Consistency,
        block_on: u64,
    },
    /// Write `.lock` with `?cas=`.
    PutLock { value: Vec<u8>, cas: u64 },
    /// Ask whether the token may write `.lock`, writing nothing: a CAS on
    /// [`UNMATCHED_CAS`] (with `value`, a `.lock` without holders). Only a
    /// 403 is an answer; anything else means "go on".
    ProbeLock { value: Vec<u8> },
    /// Read the contender key `<prefix>/<name>` of a holder that the listing
    /// shows as dead, before a write prunes it: a listing may leave out a key
    /// the token cannot read without saying so, a direct read answers 403.
    CheckHolder { name: String },
    /// Rewrite our contender key while we wait (CAS, as for a relay), so
    /// that a waiter blocked on it wakes: a consem contender that arrived
    /// after us was handed a slot by a holder that could not see us (an ACL
    /// hides our key from its token), and may sleep on our key.
    /// `mark` (the listing's index) makes the value change.
    Wake {
        session: String,
        mark: u64,
        cas: u64,
    },
}

/// The answer to a [`Call`] that went through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    SessionCreated(String),
    KeyAcquired(Acquire),
    Listing(Listing),
    /// The answer to [`Call::Get`]: at most one entry.
    Key(Listing),
    LockWritten(bool),
    /// The answer to [`Call::ProbeLock`] that was no 403.
    LockProbed,
    /// The answer to [`Call::Wake`], written or not: either way we read again.
    Woken,
    /// The answer to [`Call::CheckHolder`]: at most one entry, or `None`
    /// when the token may not read the key (403).
    HolderKey(Option<Listing>),
}

/// What the contender wants after an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Call(Call),
    /// The slot is ours. `fence` is `.lock`'s ModifyIndex and `key_index`
    /// our contender key's, where watching them starts. `relay`: a waiter
    /// may block on our key alone ([`WaitOn::Key`]), so once the command
    /// has started, the holder rewrites it with a value that names the slot
    /// (`semaphore::holding_value`), which wakes that waiter. The value
    /// must change: Consul (1.6 and later) does not move the index of a
    /// write that changes nothing. The write is a CAS on `key_index` (a CAS
    /// keeps the key's session): if an operator deleted or released the key
    /// since, an acquire would bring it back; the CAS fails instead, and
    /// the watch of our key reports the loss. Made after the start, it
    /// keeps its round trip out of the handoff.
    Acquired {
        fence: u64,
        key_index: u64,
        relay: bool,
    },
    /// `--try` found every slot taken, by these holders.
    NoSlot(WaitPicture),
    /// `.lock` is not ours to write.
    Conflict(Conflict),
    /// Another session holds our contender key (it is named after our own
    /// session, so this means someone else wrote it).
    KeyTaken {
        session: String,
    },
    /// A holder that the listing left out is alive: the token cannot read the
    /// whole prefix, so the listing cannot be trusted to show who holds.
    Hidden {
        session: String,
    },
}

/// Something worth telling the user, noted along the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// Every slot is taken; we wait. Noted when the picture changes.
    Waiting(WaitPicture),
    /// Our contender key vanished (session invalidated, operator): joining again.
    Rejoining,
}

/// Who holds the slots we wait for, and how many wait before us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitPicture {
    /// The live holders' contender keys (their values describe them).
    pub holders: Vec<Entry>,
    /// Live contenders without a slot that arrived before us.
    pub ahead: usize,
}

/// A CAS index no key reaches (Consul's indexes count raft entries), within
/// what both signed and unsigned 64-bit parsers read: the agent checks the
/// token's right to write before it compares indexes, so a write on it
/// answers 403 or false, and changes nothing.
pub const UNMATCHED_CAS: u64 = i64::MAX as u64;

/// Joins the semaphore and takes a slot.
#[derive(Debug, Clone)]
pub struct Contender {
    limit: u32,
    mode: Contend,
    session: Option<String>,
    /// The index to block on; 0 reads at once.
    index: u64,
    /// After a won CAS, or a stale read that shows us holding, the next read
    /// is consistent: the fence and the watch start from the truth. Set
    /// too while a consistent read is answered: blocking reads are
    /// consistent, so a waiter woken by a departure that frees its slot
    /// takes it without a second read.
    confirm: bool,
    /// The last wait picture noted, so that only changes are noted.
    last_picture: Option<WaitPicture>,
    /// The listing a take was decided on, while the holders it prunes are
    /// checked one by one ([`Call::CheckHolder`]).
    checking: Option<Box<Snapshot>>,
    /// Holders a direct read confirmed gone, valid for the listing index
    /// `gone_at`: a new listing is checked again.
    gone: BTreeSet<String>,
    gone_at: u64,
    /// Holders that arrived after us and that we woke for ([`Call::Wake`]),
    /// so that each is woken for once; `waking`, those of the wake in
    /// flight, which a failed call leaves to wake for again.
    woken_for: BTreeSet<String>,
    waking: Vec<String>,
    /// A holder a check found held, though the listing it was checked for
    /// left it out; `came_back_before`, the same for the listing before.
    came_back: Option<String>,
    came_back_before: Option<String>,
    /// Our key was gone and we took it again: until a listing shows us out
    /// of `.lock`, being in it is no slot (see [`Contender::on_snapshot`]).
    rejoined: bool,
    /// Whether we asked, once, whether the token may write `.lock`
    /// ([`Call::ProbeLock`]), and the wait that follows the answer.
    lock_probed: bool,
    after_probe: Option<Call>,
    /// The listing that confirmed the slot, once [`Step::Acquired`].
    confirmed_on: Option<Box<Snapshot>>,
    pending: Call,
    notes: Vec<Note>,
}

impl Contender {
    pub fn new(limit: u32, mode: Contend) -> Contender {
        Contender {
            limit,
            mode,
            session: None,
            index: 0,
            confirm: false,
            last_picture: None,
            checking: None,
            gone: BTreeSet::new(),
            gone_at: 0,
            woken_for: BTreeSet::new(),
            waking: Vec::new(),
            came_back: None,
            came_back_before: None,
            rejoined: false,
            lock_probed: false,
            after_probe: None,
            confirmed_on: None,
            pending: Call::CreateSession,
            notes: Vec::new(),
        }
    }

    /// The first call.
    pub fn start(&mut self) -> Call {
        self.pending.clone()
    }

    /// The session we contend with, once created.
    pub fn session(&self) -> Option<&str> {
        self.session.as_deref()
    }

    /// The listing that confirmed the slot, after [`Step::Acquired`]: the
    /// hand-off at release decides on it ([`semaphore::known_with_lock`]).
    pub fn take_confirmed_on(&mut self) -> Option<Snapshot> {
        self.confirmed_on.take().map(|snapshot| *snapshot)
    }

    /// Notes gathered since the last call.
    pub fn take_notes(&mut self) -> Vec<Note> {
        std::mem::take(&mut self.notes)
    }

    /// The call to make after the previous one failed (no answer, or a
    /// transient error). Reads start over from index 0, since the agent may
    /// have restarted; a CAS whose answer was lost is settled by a read.
    pub fn after_failure(&mut self) -> Call {
        self.pending = match &self.pending {
            Call::List { consistency, .. } => {
                self.index = 0;
                Call::List {
                    consistency: *consistency,
                    block_on: 0,
                }
            }
            Call::Get { .. }
            | Call::PutLock { .. }
            | Call::ProbeLock { .. }
            | Call::Wake { .. } => {
                self.waking.clear();
                self.index = 0;
                self.read()
            }
            other => other.clone(),
        };
        self.pending.clone()
    }

    /// Takes the answer to the pending call and says what comes next.
    pub fn on_answer(&mut self, answer: Answer) -> Step {
        let step = match answer {
            Answer::SessionCreated(id) => {
                self.session = Some(id.clone());
                Step::Call(Call::AcquireKey { session: id })
            }
            Answer::KeyAcquired(Acquire::Held) => Step::Call(self.read()),
            Answer::KeyAcquired(Acquire::UnknownSession) => {
                self.session = None;
                Step::Call(Call::CreateSession)
            }
            Answer::KeyAcquired(Acquire::Refused) => Step::KeyTaken {
                session: self.session.clone().unwrap_or_default(),
            },
            Answer::Listing(listing) => self.on_listing(listing),
            // The key we block on changed or went: the waiter ahead took its
            // slot or left. Look at the whole picture again.
            Answer::Key(_) => Step::Call(Call::List {
                consistency: Consistency::Default,
                block_on: 0,
            }),
            // Our own write moved the index: this read answers at once.
            Answer::Woken => {
                self.woken_for.extend(self.waking.drain(..));
                Step::Call(self.read())
            }
            Answer::HolderKey(read) => self.on_holder_key(read),
            Answer::LockWritten(true) => {
                // Confirm the win with a fresh, consistent read.
                self.confirm = true;
                self.index = 0;
                Step::Call(self.read())
            }
            // Someone wrote first, so the prefix moved past the index we
            // read: blocking on it answers at once, yet cannot spin if a
            // listing hides `.lock` from us.
            Answer::LockWritten(false) => Step::Call(self.read()),
            // Nothing was written: we wait as decided before we asked.
            Answer::LockProbed => {
                Step::Call(self.after_probe.take().unwrap_or_else(|| self.read()))
            }
        };
        if let Step::Call(call) = &step {
            self.pending = call.clone();
        }
        step
    }

    fn on_listing(&mut self, listing: Listing) -> Step {
        // Consul's rule: an index that went backwards (a restarted agent, a
        // new leader) means starting over from 0.
        self.index = if listing.index < self.index {
            0
        } else {
            listing.index
        };
        if listing.index != self.gone_at {
            self.gone.clear();
            self.gone_at = listing.index;
        }
        self.came_back_before = self.came_back.take();
        if let Call::List {
            consistency: Consistency::Consistent,
            ..
        } = self.pending
        {
            self.confirm = true;
        }
        self.on_snapshot(Snapshot::from_entries(listing.entries))
    }

    /// A holder the listing showed as dead was read directly: prune it only
    /// if its key is really gone or no longer held by it. A key the token
    /// may not read (403) means the listing cannot be trusted: the holder
    /// may live (its session cannot tell: agents filter session reads by
    /// ACL without a word too). A key read held came back since the listing
    /// (a holder that rejoined): read the prefix again; if the next listing
    /// leaves it out too, the listing hides it.
    fn on_holder_key(&mut self, read: Option<Listing>) -> Step {
        let Call::CheckHolder { name } = self.pending.clone() else {
            unreachable!("a holder's key is only read when checking it");
        };
        let Some(read) = read else {
            return self.on_holder_checked(name, false);
        };
        let key = read.entries.iter().find(|e| e.name == name);
        if semaphore::check_key(key, &name).is_err() {
            return self.on_holder_checked(name, true);
        }
        if self.came_back_before.as_deref() == Some(name.as_str()) {
            return self.on_holder_checked(name, false);
        }
        self.came_back = Some(name);
        self.checking = None;
        self.index = 0;
        Step::Call(self.read())
    }

    /// Decides again on the listing being checked, now that `holder` is
    /// known to be gone; a holder that may be alive ends the run.
    fn on_holder_checked(&mut self, holder: String, gone: bool) -> Step {
        let snapshot = self
            .checking
            .take()
            .expect("a holder is only checked for a listing");
        if !gone {
            return Step::Hidden { session: holder };
        }
        self.gone.insert(holder);
        self.on_snapshot(*snapshot)
    }

    fn on_snapshot(&mut self, snapshot: Snapshot) -> Step {
        let session = self.session.clone().unwrap_or_default();
        let decision = match semaphore::decide(&snapshot, &session, self.limit) {
            Ok(decision) => decision,
            Err(conflict) => return Step::Conflict(conflict),
        };
        self.rejoined &= matches!(decision, Decision::Holding | Decision::SessionLost);
        match decision {
            Decision::Holding if self.rejoined => {
                // While our key was gone, another contender may have read
                // it gone and be about to prune us from `.lock` with a CAS
                // on `.lock` as it stands: our command would then run
                // uncounted. Leaving `.lock` makes that CAS fail; then we
                // queue again, in our key's place.
                let Ok(Some(mut record)) = snapshot.lock_record(self.limit) else {
                    unreachable!("holding means .lock names us");
                };
                record.holders.retain(|h| *h != session);
                Step::Call(Call::PutLock {
                    value: semaphore::encode_lock(&record),
                    cas: snapshot.lock.as_ref().map_or(0, |lock| lock.modify_index),
                })
            }
            Decision::Holding if self.confirm => {
                let fence = snapshot.lock.as_ref().map_or(0, |lock| lock.modify_index);
                let key_index = snapshot
                    .contenders
                    .get(&session)
                    .map_or(0, |key| key.modify_index);
                // Anyone waiting behind us may block on our key alone.
                let record = snapshot.lock_record(self.limit).ok().flatten();
                let relay =
                    record.is_some_and(|r| semaphore::waiters_behind(&snapshot, &r, &session));
                self.confirmed_on = Some(Box::new(snapshot));
                Step::Acquired {
                    fence,
                    key_index,
                    relay,
                }
            }
            Decision::Holding => {
                self.confirm = true;
                self.index = 0;
                Step::Call(self.read())
            }
            Decision::SessionLost => {
                // Reuse the session while Consul still knows it.
                self.notes.push(Note::Rejoining);
                self.rejoined = true;
                self.index = 0;
                self.confirm = false;
                Step::Call(Call::AcquireKey { session })
            }
            Decision::Full { holders, wait_on } => {
                self.on_full(&snapshot, &holders, wait_on, session)
            }
            Decision::Take { value, cas } => {
                // Taking the slot writes `.lock` without the holders that
                // look dead: each must be confirmed gone first.
                let unconfirmed =
                    snapshot
                        .lock_record(self.limit)
                        .ok()
                        .flatten()
                        .and_then(|record| {
                            semaphore::suspects(&record, &snapshot)
                                .into_iter()
                                .filter(|h| semaphore::can_be_a_contender_key(h))
                                .find(|h| !self.gone.contains(h))
                        });
                match unconfirmed {
                    Some(name) => {
                        self.checking = Some(Box::new(snapshot));
                        Step::Call(Call::CheckHolder { name })
                    }
                    None => Step::Call(Call::PutLock { value, cas }),
                }
            }
        }
    }

    /// Every slot is taken: wake the holders that overtook us (they owe
    /// the waiters behind them a relay), tell who holds, then wait on what
    /// [`semaphore::decide`] said, once `.lock` has been probed.
    fn on_full(
        &mut self,
        snapshot: &Snapshot,
        holders: &[String],
        wait_on: WaitOn,
        session: String,
    ) -> Step {
        self.confirm = false;
        if self.mode == Contend::Try {
            return Step::NoSlot(wait_picture(snapshot, holders, &session));
        }
        let overtaken: Vec<String> =
            semaphore::relaying_holders_behind(snapshot, holders, &session)
                .filter(|h| !self.woken_for.contains(h))
                .collect();
        if let (false, Some(key)) = (overtaken.is_empty(), snapshot.contenders.get(&session)) {
            self.waking = overtaken;
            return Step::Call(Call::Wake {
                session,
                mark: self.index,
                cas: key.modify_index,
            });
        }
        let picture = wait_picture(snapshot, holders, &session);
        if self.last_picture.as_ref() != Some(&picture) {
            self.last_picture = Some(picture.clone());
            self.notes.push(Note::Waiting(picture));
        }
        let wait = match wait_on {
            WaitOn::Prefix => self.read(),
            WaitOn::Key(name) => Call::Get {
                name,
                consistency: Consistency::Default,
                block_on: self.index,
            },
        };
        if self.lock_probed {
            return Step::Call(wait);
        }
        // A waiter's first write of `.lock` may come only when the
        // slot is free, or never: a holder may hand it the slot by
        // naming it there. A token that may not write `.lock` (nor
        // read it: agents leave it out of the listing) would learn
        // it only at its turn, at `--timeout` (75), or at release,
        // leaving itself in `.lock`. Asked now, the agent says 403
        // at once; then we wait as decided.
        self.lock_probed = true;
        self.after_probe = Some(wait);
        Step::Call(Call::ProbeLock {
            value: semaphore::encode_lock(&semaphore::LockRecord::new(self.limit)),
        })
    }

    /// The next listing: consistent to confirm a slot, and when it blocks
    /// (the wake-up of a waiter whose slot a departure freed then tells it
    /// enough).
    fn read(&self) -> Call {
        Call::List {
            consistency: if self.confirm || self.index > 0 {
                Consistency::Consistent
            } else {
                Consistency::Default
            },
            block_on: self.index,
        }
    }
}

fn wait_picture(snapshot: &Snapshot, holders: &[String], me: &str) -> WaitPicture {
    let held: Vec<Entry> = holders
        .iter()
        .filter_map(|h| snapshot.contenders.get(h).cloned())
        .collect();
    let record = semaphore::LockRecord {
        holders: holders.to_vec(),
        ..semaphore::LockRecord::new(1)
    };
    WaitPicture {
        ahead: semaphore::waiters_ahead(snapshot, &record, me),
        holders: held,
    }
}

/// Which key a [`Watcher`] watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watched {
    /// `.lock`: whoever takes a slot away writes it.
    Lock,
    /// Our contender key: it goes the moment our session ends.
    Key,
}

/// Checks, while the command runs, that the slot stays ours: one watcher on
/// `.lock` and one on our contender key, each blocking on its own key, so
/// that the holders do not wake for every waiter that joins or leaves.
#[derive(Debug, Clone)]
pub struct Watcher {
    session: String,
    limit: u32,
    watched: Watched,
    index: u64,
    failures: u32,
    /// Failed reads in a row to bear; `None`: any number (the session's
    /// lease bounds how long the slot lasts without answers).
    retry: Option<u32>,
}

impl Watcher {
    /// Watches from `index` (the key's ModifyIndex from
    /// [`Step::Acquired`]), tolerating `retry` consecutive failed reads.
    pub fn new(
        session: &str,
        limit: u32,
        watched: Watched,
        index: u64,
        retry: Option<u32>,
    ) -> Watcher {
        Watcher {
            session: session.to_string(),
            limit,
            watched,
            index,
            failures: 0,
            retry,
        }
    }

    fn name(&self) -> &str {
        match self.watched {
            Watched::Lock => LOCK_KEY_NAME,
            Watched::Key => &self.session,
        }
    }

    /// The next read: consistent, blocking on the last index.
    pub fn call(&self) -> Call {
        Call::Get {
            name: self.name().to_string(),
            consistency: Consistency::Consistent,
            block_on: self.index,
        }
    }

    /// Checks a read of the watched key; `Err` when the slot is no longer ours.
    pub fn on_read(&mut self, read: Listing) -> Result<(), Loss> {
        self.failures = 0;
        // An index below the one sent is either a wait that ran out (a key
        // answers with its own ModifyIndex) or a restarted agent: reading
        // once without blocking settles both.
        self.index = if read.index < self.index {
            0
        } else {
            read.index
        };
        let entry = read.entries.iter().find(|e| e.name == self.name());
        match self.watched {
            Watched::Lock => semaphore::check_lock(entry, &self.session, self.limit),
            Watched::Key => semaphore::check_key(entry, &self.session),
        }
    }

    /// Counts a failed read; `Err` with the count once more than `retry`
    /// failed in a row. The next read does not block: after an outage the
    /// agent may have restarted with a lower index, and blocking on the old
    /// one would hide a loss for a whole wait.
    pub fn on_failure(&mut self) -> Result<u32, u32> {
        self.failures += 1;
        self.index = 0;
        if self.retry.is_some_and(|retry| self.failures > retry) {
            Err(self.failures)
        } else {
            Ok(self.failures)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::consul::semaphore::{LOCK_KEY_NAME, SEMAPHORE_FLAGS};

    const ME: &str = "aaaaaaaa-0000-0000-0000-000000000001";
    const OTHER: &str = "bbbbbbbb-0000-0000-0000-000000000002";

    fn contender_entry(session: &str) -> Entry {
        Entry {
            name: session.to_string(),
            value: Vec::new(),
            flags: SEMAPHORE_FLAGS,
            session: Some(session.to_string()),
            create_index: 5,
            modify_index: 5,
        }
    }

    fn lock_entry(holders: &[&str], modify_index: u64) -> Entry {
        let holders: Vec<String> = holders.iter().map(|h| format!("\"{h}\":true")).collect();
        Entry {
            name: LOCK_KEY_NAME.to_string(),
            value: format!(r#"{{"Limit":1,"Holders":{{{}}}}}"#, holders.join(",")).into_bytes(),
            flags: SEMAPHORE_FLAGS,
            session: None,
            create_index: 3,
            modify_index,
        }
    }

    fn listing(index: u64, entries: Vec<Entry>) -> Answer {
        Answer::Listing(Listing { index, entries })
    }

    /// `step` is the once-only probe of `.lock` ([`Call::ProbeLock`]): the
    /// step after its answer.
    fn probed(c: &mut Contender, step: Step) -> Step {
        assert!(
            matches!(step, Step::Call(Call::ProbeLock { .. })),
            "{step:?}"
        );
        c.on_answer(Answer::LockProbed)
    }

    fn joined(mode: Contend) -> Contender {
        let mut contender = Contender::new(1, mode);
        assert_eq!(contender.start(), Call::CreateSession);
        contender.on_answer(Answer::SessionCreated(ME.into()));
        contender
    }

    /// A contender that joined and read a listing in which `.lock` names
    /// OTHER but OTHER's contender key is missing: it must check OTHER.
    fn checking_other() -> Contender {
        let mut c = joined(Contend::Wait);
        c.on_answer(Answer::KeyAcquired(Acquire::Held));
        let step = c.on_answer(listing(
            10,
            vec![contender_entry(ME), lock_entry(&[OTHER], 9)],
        ));
        assert_eq!(step, Step::Call(Call::CheckHolder { name: OTHER.into() }));
        c
    }

    fn key_read(entries: Vec<Entry>) -> Answer {
        Answer::HolderKey(Some(Listing { index: 11, entries }))
    }

    #[test]
    fn prunes_a_holder_only_once_a_direct_read_shows_it_gone() {
        let mut c = checking_other();
        let Step::Call(Call::PutLock { value, cas: 9 }) = c.on_answer(key_read(vec![])) else {
            panic!("expected the CAS that prunes the dead holder");
        };
        let record = semaphore::decode_lock(&value).unwrap();
        assert_eq!(record.holders, vec![ME.to_string()]);

        // A key still there but held by no session is as dead.
        let mut c = checking_other();
        let mut released = contender_entry(OTHER);
        released.session = None;
        assert!(matches!(
            c.on_answer(key_read(vec![released])),
            Step::Call(Call::PutLock { .. })
        ));
    }

    #[test]
    fn a_holder_the_listing_hid_ends_the_run() {
        // The key is there, held: the holder may have rejoined since the
        // listing. A second listing that leaves it out too hides it.
        let mut c = checking_other();
        assert_eq!(
            c.on_answer(key_read(vec![contender_entry(OTHER)])),
            Step::Call(Call::List {
                consistency: Consistency::Default,
                block_on: 0
            })
        );
        let again = listing(13, vec![contender_entry(ME), lock_entry(&[OTHER], 9)]);
        assert_eq!(
            c.on_answer(again),
            Step::Call(Call::CheckHolder { name: OTHER.into() })
        );
        assert_eq!(
            c.on_answer(key_read(vec![contender_entry(OTHER)])),
            Step::Hidden {
                session: OTHER.into()
            }
        );
        // The key may not be read (403): the token cannot see the whole
        // prefix, whatever else it could read.
        let mut c = checking_other();
        assert_eq!(
            c.on_answer(Answer::HolderKey(None)),
            Step::Hidden {
                session: OTHER.into()
            }
        );
    }

    #[test]
    fn a_confirmed_death_holds_only_for_the_listing_it_was_read_for() {
        let mut c = checking_other();
        // The CAS loses a race; the same listing index again needs no check,
        // a new one does.
        c.on_answer(key_read(vec![]));
        c.on_answer(Answer::LockWritten(false));
        let same = listing(10, vec![contender_entry(ME), lock_entry(&[OTHER], 9)]);
        assert!(matches!(
            c.on_answer(same),
            Step::Call(Call::PutLock { .. })
        ));
        c.on_answer(Answer::LockWritten(false));
        let newer = listing(12, vec![contender_entry(ME), lock_entry(&[OTHER], 9)]);
        assert_eq!(
            c.on_answer(newer),
            Step::Call(Call::CheckHolder { name: OTHER.into() })
        );
    }

    #[test]
    fn takes_a_free_slot_and_confirms_it() {
        let mut c = joined(Contend::Wait);
        let read = c.on_answer(Answer::KeyAcquired(Acquire::Held));
        assert_eq!(
            read,
            Step::Call(Call::List {
                consistency: Consistency::Default,
                block_on: 0
            })
        );
        let Step::Call(Call::PutLock { cas: 0, .. }) =
            c.on_answer(listing(10, vec![contender_entry(ME)]))
        else {
            panic!("expected a CAS creating .lock");
        };
        assert_eq!(
            c.on_answer(Answer::LockWritten(true)),
            Step::Call(Call::List {
                consistency: Consistency::Consistent,
                block_on: 0
            })
        );
        let confirmed = listing(12, vec![contender_entry(ME), lock_entry(&[ME], 11)]);
        assert_eq!(
            c.on_answer(confirmed),
            Step::Acquired {
                fence: 11,
                key_index: 5,
                relay: false
            }
        );
    }

    #[test]
    fn waits_blocking_on_the_index_and_notes_it_once() {
        let mut c = joined(Contend::Wait);
        c.on_answer(Answer::KeyAcquired(Acquire::Held));
        let full = || {
            listing(
                20,
                vec![
                    contender_entry(ME),
                    contender_entry(OTHER),
                    lock_entry(&[OTHER], 9),
                ],
            )
        };
        let wait = Step::Call(Call::List {
            consistency: Consistency::Consistent,
            block_on: 20,
        });
        let first = c.on_answer(full());
        assert_eq!(probed(&mut c, first), wait);
        assert_eq!(
            c.take_notes(),
            vec![Note::Waiting(WaitPicture {
                holders: vec![contender_entry(OTHER)],
                ahead: 0,
            })]
        );
        assert_eq!(c.on_answer(full()), wait);
        assert_eq!(c.take_notes(), vec![]);
    }

    #[test]
    fn try_gives_up_when_full() {
        let mut c = joined(Contend::Try);
        c.on_answer(Answer::KeyAcquired(Acquire::Held));
        let full = listing(
            20,
            vec![
                contender_entry(ME),
                contender_entry(OTHER),
                lock_entry(&[OTHER], 9),
            ],
        );
        assert_eq!(
            c.on_answer(full),
            Step::NoSlot(WaitPicture {
                holders: vec![contender_entry(OTHER)],
                ahead: 0,
            })
        );
    }

    #[test]
    fn an_index_that_goes_back_starts_over() {
        let mut c = joined(Contend::Wait);
        c.on_answer(Answer::KeyAcquired(Acquire::Held));
        let full = |index| {
            listing(
                index,
                vec![
                    contender_entry(ME),
                    contender_entry(OTHER),
                    lock_entry(&[OTHER], 9),
                ],
            )
        };
        c.on_answer(full(50));
        assert_eq!(
            c.on_answer(full(7)),
            Step::Call(Call::List {
                consistency: Consistency::Default,
                block_on: 0
            })
        );
    }

    #[test]
    fn a_lost_cas_answer_is_settled_by_reading() {
        let mut c = joined(Contend::Wait);
        c.on_answer(Answer::KeyAcquired(Acquire::Held));
        c.on_answer(listing(10, vec![contender_entry(ME)]));
        // The CAS went through, but its answer was lost.
        assert_eq!(
            c.after_failure(),
            Call::List {
                consistency: Consistency::Default,
                block_on: 0
            }
        );
        let won = || listing(12, vec![contender_entry(ME), lock_entry(&[ME], 11)]);
        // A stale read that shows us holding is confirmed consistently.
        assert_eq!(
            c.on_answer(won()),
            Step::Call(Call::List {
                consistency: Consistency::Consistent,
                block_on: 0
            })
        );
        assert_eq!(
            c.on_answer(won()),
            Step::Acquired {
                fence: 11,
                key_index: 5,
                relay: false
            }
        );
    }

    #[test]
    fn rejoins_when_the_contender_key_vanishes() {
        let mut c = joined(Contend::Wait);
        c.on_answer(Answer::KeyAcquired(Acquire::Held));
        let gone = listing(30, vec![contender_entry(OTHER), lock_entry(&[OTHER], 9)]);
        assert_eq!(
            c.on_answer(gone),
            Step::Call(Call::AcquireKey { session: ME.into() })
        );
        assert_eq!(c.take_notes(), vec![Note::Rejoining]);
        // Consul no longer knows the session: a new one.
        assert_eq!(
            c.on_answer(Answer::KeyAcquired(Acquire::UnknownSession)),
            Step::Call(Call::CreateSession)
        );
        assert_eq!(c.session(), None);
    }

    #[test]
    fn a_waiter_asks_once_whether_it_may_write_lock() {
        let mut c = joined(Contend::Wait);
        c.on_answer(Answer::KeyAcquired(Acquire::Held));
        // OTHER, a consem, arrived first; `.lock` is not in the listing
        // (one the token may not read, or one on its way).
        let mut ahead = contender_entry(OTHER);
        ahead.create_index = 4;
        ahead.value = format!(r#"{{"{}":true}}"#, semaphore::RELAYS_FIELD).into_bytes();
        let seen = vec![ahead, contender_entry(ME)];
        let Step::Call(Call::ProbeLock { value }) = c.on_answer(listing(8, seen.clone())) else {
            panic!("no probe of .lock");
        };
        let probed = semaphore::decode_lock(&value).unwrap();
        assert_eq!(probed.holders, Vec::<String>::new());
        // No 403 (and nothing written): we wait as before, and ask no more.
        assert!(matches!(
            c.on_answer(Answer::LockProbed),
            Step::Call(Call::List { block_on: 8, .. })
        ));
        assert!(matches!(
            c.on_answer(listing(8, seen)),
            Step::Call(Call::List { .. } | Call::Get { .. })
        ));
    }

    #[test]
    fn a_rejoined_contender_leaves_lock_before_it_counts_a_slot_there() {
        let mut c = joined(Contend::Wait);
        c.on_answer(Answer::KeyAcquired(Acquire::Held));
        // A holder handed us its slot, then an operator released our key:
        // another contender may read it gone and prune us from `.lock`.
        let mut released = contender_entry(ME);
        released.session = None;
        let handed = listing(30, vec![released, lock_entry(&[ME], 21)]);
        assert_eq!(
            c.on_answer(handed),
            Step::Call(Call::AcquireKey { session: ME.into() })
        );
        c.on_answer(Answer::KeyAcquired(Acquire::Held));
        // Back in our key, still named in `.lock`: not a slot yet. We
        // leave `.lock`, so that a prune planned on the old `.lock` fails.
        let named = vec![contender_entry(ME), lock_entry(&[ME], 21)];
        let Step::Call(Call::PutLock { value, cas }) = c.on_answer(listing(32, named.clone()))
        else {
            panic!("a rejoined contender took the slot .lock names it in");
        };
        assert_eq!(cas, 21);
        assert!(!semaphore::decode_lock(&value).unwrap().holds(ME));
        // That write lost to another: read again, still not a slot.
        c.on_answer(Answer::LockWritten(false));
        assert!(matches!(
            c.on_answer(listing(33, named)),
            Step::Call(Call::PutLock { .. })
        ));
        // Out of `.lock`: we queue as anyone, and take the free slot.
        c.on_answer(Answer::LockWritten(true));
        let out = listing(34, vec![contender_entry(ME), lock_entry(&[], 34)]);
        assert!(matches!(
            c.on_answer(out),
            Step::Call(Call::PutLock { cas: 34, .. })
        ));
        c.on_answer(Answer::LockWritten(true));
        let ours = vec![contender_entry(ME), lock_entry(&[ME], 35)];
        assert!(matches!(
            c.on_answer(listing(36, ours)),
            Step::Acquired { fence: 35, .. }
        ));
    }

    #[test]
    fn reports_conflicts() {
        let mut c = joined(Contend::Wait);
        c.on_answer(Answer::KeyAcquired(Acquire::Held));
        let mut foreign = lock_entry(&[], 9);
        foreign.flags = 0;
        assert_eq!(
            c.on_answer(listing(10, vec![contender_entry(ME), foreign])),
            Step::Conflict(Conflict::ForeignFlags(0))
        );
    }

    fn relaying_entry(session: &str, index: u64) -> Entry {
        Entry {
            value: format!(r#"{{"{}":true}}"#, semaphore::RELAYS_FIELD).into_bytes(),
            create_index: index,
            modify_index: index,
            ..contender_entry(session)
        }
    }

    #[test]
    fn owes_a_waiter_behind_the_relay_once_the_slot_is_confirmed() {
        let mut c = joined(Contend::Wait);
        c.on_answer(Answer::KeyAcquired(Acquire::Held));
        let waiter = relaying_entry(OTHER, 6);
        c.on_answer(listing(10, vec![contender_entry(ME), waiter.clone()]));
        c.on_answer(Answer::LockWritten(true));
        let confirmed = listing(12, vec![contender_entry(ME), waiter, lock_entry(&[ME], 11)]);
        assert_eq!(
            c.on_answer(confirmed),
            Step::Acquired {
                fence: 11,
                key_index: 5,
                relay: true
            }
        );
    }

    #[test]
    fn a_waiter_woken_into_a_free_slot_takes_it_without_reading_again() {
        let mut c = joined(Contend::Wait);
        c.on_answer(Answer::KeyAcquired(Acquire::Held));
        let full = listing(
            20,
            vec![
                contender_entry(ME),
                relaying_entry(OTHER, 3),
                lock_entry(&[OTHER], 9),
            ],
        );
        // Blocking on the prefix: a consistent read.
        let first = c.on_answer(full);
        assert_eq!(
            probed(&mut c, first),
            Step::Call(Call::List {
                consistency: Consistency::Consistent,
                block_on: 20,
            })
        );
        // The holder leaving handed its slot to us in `.lock`.
        let handed = listing(22, vec![contender_entry(ME), lock_entry(&[ME], 21)]);
        assert_eq!(
            c.on_answer(handed),
            Step::Acquired {
                fence: 21,
                key_index: 5,
                relay: false
            }
        );
    }

    #[test]
    fn a_default_read_that_shows_us_holding_is_confirmed() {
        let mut c = joined(Contend::Wait);
        c.on_answer(Answer::KeyAcquired(Acquire::Held));
        let waiter = relaying_entry(OTHER, 3);
        // Woken by the key ahead: a default read of the prefix.
        c.on_answer(listing(
            20,
            vec![waiter.clone(), contender_entry(ME), lock_entry(&[OTHER], 9)],
        ));
        assert_eq!(
            c.on_answer(Answer::Key(Listing {
                index: 21,
                entries: vec![]
            })),
            Step::Call(Call::List {
                consistency: Consistency::Default,
                block_on: 0,
            })
        );
        assert_eq!(
            c.on_answer(listing(
                22,
                vec![contender_entry(ME), lock_entry(&[ME], 21)]
            )),
            Step::Call(Call::List {
                consistency: Consistency::Consistent,
                block_on: 0,
            })
        );
    }

    #[test]
    fn a_waiter_further_back_blocks_on_the_key_ahead_then_looks_again() {
        const THIRD: &str = "cccccccc-0000-0000-0000-000000000003";
        // Limit 1: OTHER holds, THIRD waits first, ME second.
        let mut c = joined(Contend::Wait);
        c.on_answer(Answer::KeyAcquired(Acquire::Held));
        let mut me = contender_entry(ME);
        me.create_index = 8;
        let queue = listing(
            20,
            vec![
                relaying_entry(OTHER, 6),
                relaying_entry(THIRD, 7),
                me,
                lock_entry(&[OTHER], 9),
            ],
        );
        let first = c.on_answer(queue);
        assert_eq!(
            probed(&mut c, first),
            Step::Call(Call::Get {
                name: THIRD.into(),
                consistency: Consistency::Default,
                block_on: 20
            })
        );
        assert_eq!(
            c.take_notes(),
            vec![Note::Waiting(WaitPicture {
                holders: vec![relaying_entry(OTHER, 6)],
                ahead: 1,
            })]
        );
        let moved = Listing {
            index: 23,
            entries: vec![relaying_entry(THIRD, 23)],
        };
        let look_again = Call::List {
            consistency: Consistency::Default,
            block_on: 0,
        };
        assert_eq!(
            c.on_answer(Answer::Key(moved)),
            Step::Call(look_again.clone())
        );
        // A failed blocking read of the key is settled by looking again too.
        assert_eq!(c.after_failure(), look_again);
    }

    #[test]
    fn watchers_count_failures_and_see_losses() {
        let mut w = Watcher::new(ME, 1, Watched::Lock, 11, Some(2));
        assert_eq!(
            w.call(),
            Call::Get {
                name: LOCK_KEY_NAME.into(),
                consistency: Consistency::Consistent,
                block_on: 11
            }
        );
        let held = |index| Listing {
            index,
            entries: vec![lock_entry(&[ME], index)],
        };
        assert_eq!(w.on_read(held(13)), Ok(()));
        assert_eq!(w.on_failure(), Ok(1));
        assert_eq!(
            w.call(),
            Call::Get {
                name: LOCK_KEY_NAME.into(),
                consistency: Consistency::Consistent,
                block_on: 0
            }
        );
        assert_eq!(w.on_failure(), Ok(2));
        assert_eq!(w.on_read(held(14)), Ok(()));
        assert_eq!(w.on_failure(), Ok(1));
        assert_eq!(w.on_failure(), Ok(2));
        assert_eq!(w.on_failure(), Err(3));
        let evicted = Listing {
            index: 15,
            entries: vec![lock_entry(&[], 15)],
        };
        assert_eq!(w.on_read(evicted), Err(Loss::NotInHolders));

        let mut k = Watcher::new(ME, 1, Watched::Key, 5, Some(2));
        assert_eq!(
            k.call(),
            Call::Get {
                name: ME.into(),
                consistency: Consistency::Consistent,
                block_on: 5
            }
        );
        let mine = Listing {
            index: 5,
            entries: vec![contender_entry(ME)],
        };
        assert_eq!(k.on_read(mine), Ok(()));
        let gone = Listing {
            index: 30,
            entries: vec![],
        };
        assert_eq!(k.on_read(gone), Err(Loss::KeyDeleted));
    }

    #[test]
    fn a_waiter_overtaken_by_a_later_consem_holder_wakes_whoever_sleeps_on_its_key() {
        let relaying = |session: &str, index: u64| Entry {
            value: br#"{"Relays":true}"#.to_vec(),
            create_index: index,
            modify_index: index,
            ..contender_entry(session)
        };
        let mut c = joined(Contend::Wait);
        c.on_answer(Answer::KeyAcquired(Acquire::Held));
        let seen = || vec![relaying(ME, 5), relaying(OTHER, 7), lock_entry(&[OTHER], 9)];
        assert_eq!(
            c.on_answer(listing(10, seen())),
            Step::Call(Call::Wake {
                session: ME.into(),
                mark: 10,
                cas: 5
            })
        );
        assert_eq!(
            c.on_answer(Answer::Woken),
            Step::Call(Call::List {
                consistency: Consistency::Consistent,
                block_on: 10
            })
        );
        // Once per holder: the same picture again is an ordinary wait.
        let again = c.on_answer(listing(11, seen()));
        assert_eq!(
            probed(&mut c, again),
            Step::Call(Call::List {
                consistency: Consistency::Consistent,
                block_on: 11
            })
        );
    }
}
