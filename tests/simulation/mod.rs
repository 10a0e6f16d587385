//! Deterministic simulation of the semaphore recipe: several clients run
//! consem's real state machines (`Contender`, `Watcher`, `plan_release`)
//! against an in-memory model of Consul, one atomic call at a time, in an
//! order a seeded scheduler picks, with faults injected between calls:
//! CAS races, lost answers, transient failures, session TTL expiry (stalled
//! renewals), operator eviction, crashes at any step, and an agent losing
//! every session. In some seeds an ACL hides one client's keys from some of
//! the others, as agents before Consul 1.11 do: left out of their listings
//! without a word, 403 on a direct read. After every step the invariants
//! are checked.
//!
//! `CONSEM_SIM_SEEDS=N` sets how many seeds run (default 2000);
//! `CONSEM_SIM_SEED=S` replays one seed and prints its trace.

mod model;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use consem::store::consul::client::{Acquire, Listing};
use consem::store::consul::contender::{
    Answer, Call, Contender, Step, Watched, Watcher, UNMATCHED_CAS,
};
use consem::store::consul::semaphore::{
    self, Decision, KeyRewrite, ReleaseStep, Snapshot, LOCK_KEY_NAME, RELAYS_FIELD, SEMAPHORE_FLAGS,
};
use consem::store::Contend;

use model::{Consul, Millis};

const PREFIX: &str = "sim/sem";
const DIR: &str = "sim/sem/";
const TTL: Millis = 10_000;
/// A blocking query answers after this long with no change.
const BLOCKING_WAIT: Millis = 60_000;
/// Steps with faults, then a quiet period in which everyone must finish.
const FAULTY_STEPS: usize = 400;
const QUIET_STEPS: usize = 20_000;
const MONITOR_RETRY: u32 = 3;
const RELEASE_CAS_ATTEMPTS: u32 = 8;

/// SplitMix64: small, fast, and the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exit {
    Ran,
    SlotLost,
    /// Refused to go on: a holder it must not prune is hidden from it.
    Refused,
}

/// What a seed throws at the clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trouble {
    /// Every fault: failed calls, lost answers, crashes, stalled renewals,
    /// operators, agents that restart or restore; ACLs that hide a client.
    Everything,
    /// A crowd of consem contenders, and signals only: some are killed or
    /// stopped at any step (they act no more, and their sessions live on
    /// until their TTL runs out), some terminated (they leave at once);
    /// calls do not fail. The order in which the others take their slots
    /// is checked ([`Sim::check_arrival_order`]).
    Signals,
}

#[derive(Debug)]
enum ReleaseStage {
    /// A holder first hands its slot to the first consem waiter, if any.
    HandOff,
    /// Once `.lock` names the heir, its key is rewritten
    /// (`semaphore::wake_behind_heir`); then the session goes, if it has
    /// not yet.
    WakeHeir {
        rewrite: KeyRewrite,
        session_left: bool,
    },
    Session {
        handed_off: bool,
    },
    Lock {
        attempts: u32,
    },
}

/// One of a holder's two watches.
#[derive(Debug)]
struct Watch {
    watcher: Watcher,
    /// The server lost the slot in a way the next read of this key must see.
    must_notice: bool,
    /// Restores seen when its last read was made: a read blocked before a
    /// restore answers at once.
    restores_seen: u64,
}

#[derive(Debug)]
enum Phase {
    Contend {
        contender: Box<Contender>,
        call: Call,
        /// When the pending blocking read started, for its wait to run out.
        blocked_since: Millis,
    },
    Hold {
        /// The watchers of `.lock` and of our contender key.
        watches: [Watch; 2],
        session: String,
        work_left: u32,
        since: Millis,
        /// The relay write owed to a waiter behind, made once the command
        /// runs, as consem makes it.
        relay: Option<Relay>,
    },
    Release {
        session: Option<String>,
        stage: ReleaseStage,
        exit: Exit,
    },
    Done(Exit),
    Crashed,
}

/// A relay write not made yet: the fence it names, the CAS index, and the
/// attempts left (consem tries `--monitor-retry` times more after a failure).
#[derive(Debug, Clone, Copy)]
struct Relay {
    fence: u64,
    cas: u64,
    attempts_left: u32,
}

struct Client {
    phase: Phase,
    /// Relays like consem; otherwise it stands for a peer that does not
    /// (`consul lock`): an empty contender value, and no relay written.
    relays: bool,
    /// The session it had when it crashed or finished, for telling who
    /// waits behind it: a session a failed release could not destroy lives
    /// on until its TTL runs out, as a crashed client's does.
    gone_session: Option<String>,
    /// Its token cannot read the keys of the hidden client (`Sim::hidden`).
    restricted: bool,
    /// Restores seen when its last call was made: a read blocked before a
    /// restore answers at once.
    restores_seen: u64,
    /// Renewals are due then; a stalled renewer (a frozen process, a
    /// partition) skips them until `stalled_until`.
    renew_due: Millis,
    stalled_until: Millis,
    /// The listing that confirmed its slot, which its hand-off decides on
    /// (`semaphore::known_with_lock`), as consem's does.
    known: Option<Snapshot>,
}

impl Client {
    fn session(&self) -> Option<&str> {
        match &self.phase {
            Phase::Contend { contender, .. } => contender.session(),
            Phase::Hold { session, .. } => Some(session),
            Phase::Release { session, .. } => session.as_deref(),
            Phase::Done(_) | Phase::Crashed => None,
        }
    }

    fn finished(&self) -> bool {
        matches!(self.phase, Phase::Done(_) | Phase::Crashed)
    }
}

#[derive(Default, Debug, Clone, Copy)]
struct Stats {
    steps: u64,
    acquisitions: u64,
    losses_noticed: u64,
    crashes: u64,
    evictions: u64,
    expiries_forced: u64,
    restarts: u64,
    failed_calls: u64,
    lost_answers: u64,
    refusals: u64,
    keys_released: u64,
    restores: u64,
    hand_offs: u64,
    signals: u64,
    arrivals_checked: u64,
}

struct Sim {
    rng: Rng,
    consul: Consul,
    clients: Vec<Client>,
    limit: u32,
    /// The client whose keys restricted clients cannot read, and the
    /// sessions it created (its keys are named after them).
    hidden: Option<usize>,
    hidden_sessions: BTreeSet<String>,
    /// Sessions an operator took out of `.lock` (a fault): their holders
    /// lose the slot with their keys still live.
    evicted: BTreeSet<String>,
    /// Contender keys an operator released (a fault): held by no session,
    /// no session's end deletes them.
    released: BTreeSet<String>,
    /// A slot taken out of turn, found while a call took effect; reported
    /// by the next check.
    fifo_violation: Option<Violation>,
    faults: bool,
    trouble: Trouble,
    /// Clients that a crash or a signal reached.
    signalled: BTreeSet<usize>,
    /// Sessions a leaving holder handed its slot to.
    handed: BTreeSet<String>,
    /// Heirs whose key the holder that handed them their slot did not get
    /// to rewrite: it was killed in between.
    wakes_lost: BTreeSet<String>,
    trace: Option<String>,
    stats: Stats,
}

type Violation = String;

impl Sim {
    fn new(seed: u64, trace: bool, trouble: Trouble) -> Sim {
        let mut rng = Rng(seed);
        let (count, limit) = match trouble {
            Trouble::Everything => (2 + rng.below(6) as usize, 1 + rng.below(3) as u32),
            Trouble::Signals => (6 + rng.below(10) as usize, 1 + rng.below(4) as u32),
        };
        // Drawn from a generator of its own, so that the seeds without a
        // hidden client run as they did before it existed.
        let mut acl_rng = Rng(seed ^ 0x05ee_dac1);
        let hidden = (trouble == Trouble::Everything && acl_rng.chance(250)).then_some(0);
        let clients = (0..count)
            .map(|i| Client {
                phase: Phase::Contend {
                    contender: Box::new(Contender::new(limit, Contend::Wait)),
                    call: Call::CreateSession,
                    blocked_since: 0,
                },
                relays: trouble == Trouble::Signals || !rng.chance(250),
                gone_session: None,
                restricted: hidden.is_some() && i > 0 && acl_rng.chance(600),
                restores_seen: 0,
                renew_due: TTL / 2,
                stalled_until: 0,
                known: None,
            })
            .collect();
        Sim {
            rng,
            consul: Consul::default(),
            clients,
            limit,
            hidden,
            hidden_sessions: BTreeSet::new(),
            evicted: BTreeSet::new(),
            released: BTreeSet::new(),
            fifo_violation: None,
            faults: true,
            trouble,
            signalled: BTreeSet::new(),
            handed: BTreeSet::new(),
            wakes_lost: BTreeSet::new(),
            trace: trace.then(String::new),
            stats: Stats::default(),
        }
    }

    fn log(&mut self, text: impl FnOnce() -> String) {
        if let Some(trace) = &mut self.trace {
            let _ = writeln!(trace, "{:>8}ms {}", self.consul.now(), text());
        }
    }

    /// Runs the faulty phase, the quiet phase, and the final checks.
    fn run(&mut self) -> Result<(), Violation> {
        for _ in 0..FAULTY_STEPS {
            self.step()?;
        }
        self.faults = false;
        for client in &mut self.clients {
            client.stalled_until = 0;
        }
        let mut quiet = 0;
        while !self.clients.iter().all(Client::finished) {
            quiet += 1;
            if quiet > QUIET_STEPS {
                return Err(self.describe(
                    "clients still unfinished after the quiet period (a waiter starved?)",
                ));
            }
            self.step()?;
        }
        self.check_clean_after_expiry()
    }

    fn step(&mut self) -> Result<(), Violation> {
        self.stats.steps += 1;
        let elapsed = 1 + self.rng.below(200);
        self.consul.advance(self.consul.now() + elapsed);
        let per_mille = match self.trouble {
            Trouble::Everything => 8,
            Trouble::Signals => 20,
        };
        if self.faults && self.rng.chance(per_mille) {
            match self.trouble {
                Trouble::Everything => self.inject_fault(),
                Trouble::Signals => self.signal(),
            }
        }
        let runnable: Vec<usize> = (0..self.clients.len())
            .filter(|&i| self.runnable(i))
            .collect();
        let renewals: Vec<usize> = (0..self.clients.len())
            .filter(|&i| {
                let c = &self.clients[i];
                c.session().is_some()
                    && self.consul.now() >= c.renew_due
                    && self.consul.now() >= c.stalled_until
            })
            .collect();
        if runnable.is_empty() {
            self.check_no_lost_wakeup()?;
        }
        let choices = runnable.len() + renewals.len();
        if choices == 0 {
            // Everyone blocks: let time pass (waits run out, TTLs expire).
            self.consul.advance(self.consul.now() + 1_000);
            return self.check();
        }
        let pick = self.rng.below(choices as u64) as usize;
        if pick < runnable.len() {
            self.act(runnable[pick])?;
        } else {
            self.renew(renewals[pick - runnable.len()]);
        }
        self.check()
    }

    /// Whether a call fails (or its answer is lost), as faults are being
    /// injected.
    fn call_fails(&mut self) -> bool {
        self.faults && self.trouble == Trouble::Everything && self.rng.chance(30)
    }

    /// A signal to a client still running: SIGKILL or SIGSTOP (it acts no
    /// more; its session lives until its TTL runs out), or SIGTERM (it
    /// leaves at once, handing its slot on if it holds one).
    fn signal(&mut self) {
        let running: Vec<usize> = (0..self.clients.len())
            .filter(|&i| !self.clients[i].finished())
            .collect();
        if running.is_empty() {
            return;
        }
        let victim = running[self.rng.below(running.len() as u64) as usize];
        self.stats.signals += 1;
        self.signalled.insert(victim);
        let terminated = self.rng.chance(333);
        let phase = std::mem::replace(&mut self.clients[victim].phase, Phase::Crashed);
        self.clients[victim].phase = match phase {
            Phase::Contend { contender, .. } if terminated => {
                self.log(|| format!("client {victim} is terminated while it waits"));
                Phase::Release {
                    session: contender.session().map(str::to_string),
                    stage: ReleaseStage::Session { handed_off: false },
                    exit: Exit::Ran,
                }
            }
            Phase::Hold { session, .. } if terminated => {
                self.log(|| format!("client {victim} is terminated while it holds"));
                Phase::Release {
                    session: Some(session),
                    stage: ReleaseStage::HandOff,
                    exit: Exit::Ran,
                }
            }
            phase => {
                if let Phase::Release {
                    stage: ReleaseStage::WakeHeir { rewrite, .. },
                    ..
                } = &phase
                {
                    self.wakes_lost.insert(rewrite.name.clone());
                }
                self.log(|| format!("client {victim} is killed or stopped"));
                self.clients[victim].gone_session = match &phase {
                    Phase::Contend { contender, .. } => contender.session().map(str::to_string),
                    Phase::Hold { session, .. } => Some(session.clone()),
                    Phase::Release { session, .. } => session.clone(),
                    Phase::Done(_) | Phase::Crashed => None,
                };
                Phase::Crashed
            }
        };
    }

    fn inject_fault(&mut self) {
        let live: Vec<usize> = (0..self.clients.len())
            .filter(|&i| !self.clients[i].finished())
            .collect();
        if live.is_empty() {
            return;
        }
        let victim = live[self.rng.below(live.len() as u64) as usize];
        match self.rng.below(100) {
            0..=34 => {
                // A crash at whatever step the client is at: its session
                // lives on until its TTL runs out.
                self.stats.crashes += 1;
                self.log(|| format!("client {victim} crashes"));
                let client = &mut self.clients[victim];
                client.gone_session = client.session().map(str::to_string);
                client.phase = Phase::Crashed;
            }
            35..=49 => {
                if let Some(session) = self.clients[victim].session().map(str::to_string) {
                    self.stats.evictions += 1;
                    self.log(|| format!("operator destroys client {victim}'s session"));
                    self.consul.invalidate(&session);
                }
            }
            50..=62 => {
                if let Some(session) = self.clients[victim].session().map(str::to_string) {
                    self.stats.evictions += 1;
                    self.log(|| format!("operator removes client {victim} from .lock"));
                    self.remove_holder(&session);
                    self.evicted.insert(session);
                }
            }
            63..=70 => {
                if let Some(session) = self.clients[victim].session().map(str::to_string) {
                    let key = format!("{DIR}{session}");
                    if self.consul.release_key(&key) {
                        self.stats.keys_released += 1;
                        self.log(|| format!("operator releases client {victim}'s contender key"));
                        self.released.insert(key);
                    }
                }
            }
            71..=94 => {
                // A frozen renewer: the session expires at 2×TTL.
                self.stats.expiries_forced += 1;
                let until = self.consul.now() + 2 * TTL + 1 + self.rng.below(TTL);
                self.log(|| format!("client {victim}'s renewals stall until {until}ms"));
                self.clients[victim].stalled_until = until;
            }
            95..=97 => {
                self.stats.restarts += 1;
                self.log(|| "the agent restarts and loses every session".to_string());
                self.consul.lose_all_sessions();
            }
            _ => {
                self.stats.restores += 1;
                self.log(|| "a snapshot restore renumbers every index lower".to_string());
                self.consul.restore_with_lower_index();
            }
        }
    }

    /// What `consem release` does: the holder leaves `.lock`, its session
    /// and contender key stay.
    fn remove_holder(&mut self, session: &str) {
        let (_, entries) = self.consul.list(DIR);
        let snapshot = Snapshot::from_entries(entries);
        let (Ok(Some(mut record)), Some(lock)) = (snapshot.lock_record(self.limit), &snapshot.lock)
        else {
            return;
        };
        record.holders.retain(|h| h != session);
        let key = format!("{DIR}{LOCK_KEY_NAME}");
        self.consul.put_cas(
            &key,
            semaphore::encode_lock(&record),
            lock.modify_index,
            SEMAPHORE_FLAGS,
        );
    }

    fn runnable(&self, i: usize) -> bool {
        match &self.clients[i].phase {
            Phase::Contend {
                call: Call::List { block_on, .. },
                blocked_since,
                ..
            } if *block_on > 0 => {
                self.consul.prefix_index(DIR) != *block_on
                    || self.consul.now() >= blocked_since + BLOCKING_WAIT
                    || self.clients[i].restores_seen < self.consul.restores()
            }
            Phase::Contend {
                call: Call::Get { name, block_on, .. },
                blocked_since,
                ..
            } if *block_on > 0 => {
                self.key_index(name) > *block_on
                    || self.consul.now() >= blocked_since + BLOCKING_WAIT
                    || self.clients[i].restores_seen < self.consul.restores()
            }
            Phase::Contend { .. } | Phase::Hold { .. } | Phase::Release { .. } => true,
            Phase::Done(_) | Phase::Crashed => false,
        }
    }

    /// Makes one call with a chance of failing before or after it takes
    /// effect. `None` when it failed.
    fn call(&mut self, i: usize, call: &Call) -> Option<Answer> {
        let fail_before = self.call_fails();
        if fail_before {
            self.stats.failed_calls += 1;
            self.log(|| format!("client {i}: {call:?} fails (5xx)"));
            return None;
        }
        let value = if self.clients[i].relays {
            format!(r#"{{"{RELAYS_FIELD}":true}}"#).into_bytes()
        } else {
            Vec::new()
        };
        let restricted = self.clients[i].restricted;
        let answer = match call {
            Call::CreateSession => {
                let session = self.consul.create_session(TTL);
                if self.hidden == Some(i) {
                    self.hidden_sessions.insert(session.clone());
                }
                Answer::SessionCreated(session)
            }
            Call::AcquireKey { session } => {
                let key = format!("{DIR}{session}");
                Answer::KeyAcquired(
                    match self.consul.acquire(&key, session, value, SEMAPHORE_FLAGS) {
                        None => Acquire::UnknownSession,
                        Some(true) => Acquire::Held,
                        Some(false) => Acquire::Refused,
                    },
                )
            }
            Call::Wake { session, mark, cas } => {
                if self.clients[i].relays {
                    let key = format!("{DIR}{session}");
                    let value = semaphore::woken_value(&value, *mark);
                    self.consul.put_cas(&key, value, *cas, SEMAPHORE_FLAGS);
                }
                Answer::Woken
            }
            Call::List { .. } => {
                let (index, entries) = self.visible_list(restricted);
                Answer::Listing(Listing { index, entries })
            }
            Call::CheckHolder { name } if restricted && self.hidden_sessions.contains(name) => {
                Answer::HolderKey(None)
            }
            Call::CheckHolder { name } => {
                let (index, entry) = self.consul.get(DIR, &format!("{DIR}{name}"));
                let entries = entry.into_iter().collect();
                Answer::HolderKey(Some(Listing { index, entries }))
            }
            Call::Get { name, .. } => {
                let (index, entry) = self.consul.get(DIR, &format!("{DIR}{name}"));
                let entries = entry.into_iter().collect();
                Answer::Key(Listing { index, entries })
            }
            // The simulated agent has no ACLs: a CAS on an index no key
            // reaches writes nothing.
            Call::ProbeLock { value } => {
                let key = format!("{DIR}{LOCK_KEY_NAME}");
                let written =
                    self.consul
                        .put_cas(&key, value.clone(), UNMATCHED_CAS, SEMAPHORE_FLAGS);
                assert!(!written, "a probe of .lock wrote it");
                Answer::LockProbed
            }
            Call::PutLock { value, cas } => {
                let key = format!("{DIR}{LOCK_KEY_NAME}");
                let written = self
                    .consul
                    .put_cas(&key, value.clone(), *cas, SEMAPHORE_FLAGS);
                if written {
                    let me = self.clients[i].session().unwrap_or_default().to_string();
                    if let Err(violation) = self.check_fifo(i, &me, None) {
                        self.fifo_violation.get_or_insert(violation);
                    }
                }
                Answer::LockWritten(written)
            }
        };
        let is_write = !matches!(
            call,
            Call::List { .. } | Call::Get { .. } | Call::CheckHolder { .. }
        );
        if is_write && self.call_fails() {
            self.stats.lost_answers += 1;
            self.log(|| format!("client {i}: {call:?} took effect, answer lost"));
            return None;
        }
        Some(answer)
    }

    /// A listing of the prefix as client `restricted` or not sees it: the
    /// hidden client's keys left out, without a word.
    fn visible_list(
        &self,
        restricted: bool,
    ) -> (u64, Vec<consem::store::consul::semaphore::Entry>) {
        let (index, mut entries) = self.consul.list(DIR);
        if restricted {
            entries.retain(|e| !self.hidden_sessions.contains(&e.name));
        }
        (index, entries)
    }

    fn act(&mut self, i: usize) -> Result<(), Violation> {
        let phase = std::mem::replace(&mut self.clients[i].phase, Phase::Crashed);
        self.clients[i].phase = match phase {
            Phase::Contend {
                mut contender,
                call,
                blocked_since,
            } => {
                let answer = self.call(i, &call);
                // Only an answer that carries an index can tell the
                // contender that the index went back.
                let indexed = matches!(answer, Some(Answer::Listing(_) | Answer::Key(_)));
                let step = match answer {
                    None => Step::Call(contender.after_failure()),
                    Some(answer) => {
                        self.log(|| format!("client {i}: {call:?} -> {answer:?}"));
                        contender.on_answer(answer)
                    }
                };
                self.clients[i].restores_seen = self.consul.restores();
                match step {
                    Step::Call(next) => {
                        let blocks = matches!(next, Call::List { block_on, .. } | Call::Get { block_on, .. } if block_on > 0);
                        // A waiter blocks on the listing's index, for the
                        // prefix or for the key ahead (which wakes only when
                        // that key moves past it).
                        if let (true, Call::List { block_on, .. } | Call::Get { block_on, .. }) =
                            (indexed, &next)
                        {
                            let index = self.consul.prefix_index(DIR);
                            if *block_on > index {
                                return Err(self.describe(&format!(
                                    "client {i} blocks on index {block_on}, above the prefix's {index}: it would miss changes for a whole wait"
                                )));
                            }
                        }
                        let blocked_since = if blocks {
                            self.consul.now()
                        } else {
                            blocked_since
                        };
                        Phase::Contend {
                            contender,
                            call: next,
                            blocked_since,
                        }
                    }
                    Step::Acquired {
                        fence,
                        key_index,
                        relay,
                    } => {
                        self.stats.acquisitions += 1;
                        self.clients[i].known = contender.take_confirmed_on();
                        let session = contender.session().unwrap().to_string();
                        self.log(|| format!("client {i}: acquired, runs its command"));
                        self.check_arrival_order(i, &session)?;
                        let restores_seen = self.consul.restores();
                        let watch = |what, index| Watch {
                            watcher: Watcher::new(
                                &session,
                                self.limit,
                                what,
                                index,
                                Some(MONITOR_RETRY),
                            ),
                            must_notice: false,
                            restores_seen,
                        };
                        Phase::Hold {
                            watches: [watch(Watched::Lock, fence), watch(Watched::Key, key_index)],
                            session,
                            work_left: 1 + self.rng.below(20) as u32,
                            since: self.consul.now(),
                            relay: relay.then_some(Relay {
                                fence,
                                cas: key_index,
                                attempts_left: MONITOR_RETRY + 1,
                            }),
                        }
                    }
                    Step::Hidden { session } => {
                        if !self.clients[i].restricted {
                            return Err(self.describe(&format!(
                                "client {i} sees all keys, yet found holder {session} hidden"
                            )));
                        }
                        self.stats.refusals += 1;
                        self.log(|| {
                            format!("client {i}: holder {session} is hidden from it, refuses")
                        });
                        Phase::Release {
                            session: contender.session().map(str::to_string),
                            stage: ReleaseStage::Session { handed_off: false },
                            exit: Exit::Refused,
                        }
                    }
                    Step::NoSlot(_) | Step::Conflict(_) | Step::KeyTaken { .. } => {
                        // Not reachable with --limit shared by all and no
                        // foreign writers; the invariant check reports it.
                        self.log(|| format!("client {i}: unexpected {step:?}"));
                        Phase::Release {
                            session: contender.session().map(str::to_string),
                            stage: ReleaseStage::Session { handed_off: false },
                            exit: Exit::SlotLost,
                        }
                    }
                }
            }
            Phase::Hold {
                watches,
                session,
                work_left,
                since,
                relay,
            } => self.hold_step(i, watches, session, work_left, since, relay)?,
            Phase::Release {
                session,
                stage,
                exit,
            } => self.release_step(i, session, stage, exit),
            done @ (Phase::Done(_) | Phase::Crashed) => done,
        };
        Ok(())
    }

    /// The command works on, or a watch reads (when its key moved).
    fn hold_step(
        &mut self,
        i: usize,
        mut watches: [Watch; 2],
        session: String,
        work_left: u32,
        since: Millis,
        relay: Option<Relay>,
    ) -> Result<Phase, Violation> {
        let release = |exit| Phase::Release {
            session: Some(session.clone()),
            stage: ReleaseStage::HandOff,
            exit,
        };
        if let Some(owed) = relay {
            // The command runs; the relay write comes first of the holder's
            // requests, retried after a failure, dropped once our key changed.
            let relay = if self.call_fails() {
                self.stats.failed_calls += 1;
                self.log(|| format!("client {i}: relay fails (5xx)"));
                (owed.attempts_left > 1).then_some(Relay {
                    attempts_left: owed.attempts_left - 1,
                    ..owed
                })
            } else {
                if self.clients[i].relays {
                    let key = format!("{DIR}{session}");
                    let value = format!(r#"{{"{RELAYS_FIELD}":true}}"#).into_bytes();
                    let value = semaphore::holding_value(&value, owed.fence);
                    let written = self.consul.put_cas(&key, value, owed.cas, SEMAPHORE_FLAGS);
                    self.log(|| format!("client {i}: relays (written: {written})"));
                }
                None
            };
            return Ok(Phase::Hold {
                watches,
                session,
                work_left,
                since,
                relay,
            });
        }
        let due: Vec<usize> = (0..2)
            .filter(|&w| {
                let Call::Get { name, block_on, .. } = watches[w].watcher.call() else {
                    unreachable!()
                };
                block_on == 0
                    || self.key_index(&name) > block_on
                    || watches[w].restores_seen < self.consul.restores()
            })
            .collect();
        if due.is_empty() || self.rng.chance(500) {
            if work_left == 0 {
                self.log(|| format!("client {i}: command exits, releasing"));
                return Ok(release(Exit::Ran));
            }
            return Ok(Phase::Hold {
                watches,
                session,
                work_left: work_left - 1,
                since,
                relay,
            });
        }
        let w = due[self.rng.below(due.len() as u64) as usize];
        let call = watches[w].watcher.call();
        watches[w].restores_seen = self.consul.restores();
        let Watch {
            watcher,
            must_notice,
            ..
        } = &mut watches[w];
        Ok(match self.call(i, &call) {
            None => match watcher.on_failure() {
                Ok(_) => Phase::Hold {
                    watches,
                    session,
                    work_left,
                    since,
                    relay,
                },
                Err(_) => {
                    self.stats.losses_noticed += 1;
                    self.log(|| format!("client {i}: too many failed watches, stops its command"));
                    release(Exit::SlotLost)
                }
            },
            Some(Answer::Key(read)) => match watcher.on_read(read) {
                Ok(()) if *must_notice => {
                    return Err(self.describe(&format!(
                        "client {i}'s watch ({call:?}) did not see that the slot it holds since {since}ms was lost"
                    )))
                }
                Ok(()) => {
                    if let Call::Get { name, block_on, .. } = watcher.call() {
                        let index = self.key_index(&name);
                        if block_on > index {
                            return Err(self.describe(&format!(
                                "client {i}'s watch of {name} blocks on index {block_on}, above the key's {index}: it would miss changes for a whole wait"
                            )));
                        }
                    }
                    Phase::Hold {
                        watches,
                        session,
                        work_left,
                        since,
                        relay,
                    }
                }
                Err(loss) => {
                    self.stats.losses_noticed += 1;
                    self.log(|| format!("client {i}: watch sees the loss ({loss}), stops its command"));
                    release(Exit::SlotLost)
                }
            },
            Some(other) => unreachable!("a watch read answered {other:?}"),
        })
    }

    /// Whether `<prefix>/<session>` exists and is held by that session.
    fn held_by_own_session(&self, session: &str) -> bool {
        let (_, key) = self.consul.get(DIR, &format!("{DIR}{session}"));
        key.is_some_and(|k| k.session.as_deref() == Some(session))
    }

    /// Slots go in order of arrival among consem contenders: when `me` has
    /// just been written into `.lock` (by its own CAS, or by a holder that
    /// handed it its slot), the other live holders plus the live waiters
    /// that queue (they relay) and arrived before it (lower CreateIndex) are
    /// fewer than Limit (a holder that hands its slot on is leaving, not
    /// waiting). Writes by clients that cannot see every key are exempt: a
    /// waiter hidden from them can be overtaken (never a holder: they refuse
    /// to prune it).
    fn check_fifo(&self, writer: usize, me: &str, leaving: Option<&str>) -> Result<(), Violation> {
        if self.clients[writer].restricted {
            return Ok(());
        }
        let i = self
            .clients
            .iter()
            .position(|c| c.session() == Some(me))
            .unwrap_or(writer);
        let (_, entries) = self.consul.list(DIR);
        let snapshot = Snapshot::from_entries(entries);
        let Ok(Some(record)) = snapshot.lock_record(self.limit) else {
            return Ok(());
        };
        let Some(mine) = snapshot.contenders.get(me).map(|e| e.create_index) else {
            return Ok(());
        };
        let holders = record
            .holders
            .iter()
            .filter(|h| **h != me && self.held_by_own_session(h))
            .count();
        let ahead: Vec<&String> = snapshot
            .contenders
            .values()
            .filter(|e| e.create_index < mine && !record.names(&e.name))
            .filter(|e| Some(e.name.as_str()) != leaving)
            .filter(|e| semaphore::relays(e) && self.held_by_own_session(&e.name))
            .map(|e| &e.name)
            .collect();
        if holders + ahead.len() >= self.limit as usize {
            return Err(self.describe(&format!(
                "client {i} took a slot out of turn: {holders} other live holder(s) and waiters {ahead:?} ahead of it, limit {}",
                self.limit
            )));
        }
        Ok(())
    }

    /// Among clients that no signal reached, slots are taken in order of
    /// arrival (their contender keys' CreateIndex), the order a crowd sees
    /// from outside: when client `b` (holding `session`) starts its command,
    /// each such client that arrived before it and still waits is awake
    /// (its turn came with `b`'s, and the scheduler ran `b` first), or
    /// cannot take a slot, or sleeps on a key that a client still running
    /// will write. The skips allowed are behind a signalled client whose
    /// session lives on: one killed or stopped while it waited (it still
    /// counts), or after it took a free slot itself but before its relay,
    /// or after a holder handed it its slot but was itself killed before it
    /// rewrote the heir's key.
    fn check_arrival_order(&mut self, b: usize, session: &str) -> Result<(), Violation> {
        if self.trouble != Trouble::Signals || self.signalled.contains(&b) {
            return Ok(());
        }
        let (_, entries) = self.consul.list(DIR);
        let snapshot = Snapshot::from_entries(entries);
        let Some(arrived) = snapshot.contenders.get(session).map(|e| e.create_index) else {
            return Ok(());
        };
        for (a, client) in self.clients.iter().enumerate() {
            let Phase::Contend {
                contender, call, ..
            } = &client.phase
            else {
                continue;
            };
            let Some(waiter) = contender.session() else {
                continue;
            };
            let earlier = snapshot
                .contenders
                .get(waiter)
                .is_some_and(|e| e.create_index < arrived);
            if a == b || !earlier || self.signalled.contains(&a) || self.runnable(a) {
                continue;
            }
            let could_take = matches!(
                semaphore::decide(&snapshot, waiter, self.limit),
                Ok(Decision::Take { .. } | Decision::Holding)
            );
            let excused = match call {
                Call::Get { name, .. } => {
                    self.will_write(name, self.clients.len())
                        || self.signalled_ahead(name, &snapshot)
                }
                _ => false,
            };
            if could_take && !excused {
                return Err(self.describe(&format!(
                    "client {a} arrived before client {b} and could take a slot, but sleeps ({call:?}) while client {b} starts its command"
                )));
            }
        }
        self.stats.arrivals_checked += 1;
        Ok(())
    }

    /// Whether a client still running will write the contender key `name`
    /// (or delete it): its owner will take its slot and relay, or leaves,
    /// or a holder that handed it its slot is about to rewrite it. `depth`
    /// bounds the chain of waiters, each asleep on the key of the one ahead.
    fn will_write(&self, name: &str, depth: usize) -> bool {
        let waking = self.clients.iter().any(|c| {
            matches!(&c.phase, Phase::Release { stage: ReleaseStage::WakeHeir { rewrite, .. }, .. } if rewrite.name == name)
        });
        let Some(owner) = self.clients.iter().position(|c| c.session() == Some(name)) else {
            return waking;
        };
        waking
            || match &self.clients[owner].phase {
                Phase::Contend { call, .. } => {
                    depth > 0
                        && (self.runnable(owner)
                            || matches!(call, Call::Get { name, .. } if self.will_write(name, depth - 1)))
                }
                Phase::Hold { relay, .. } => relay.is_some(),
                Phase::Release { .. } => true,
                Phase::Done(_) | Phase::Crashed => false,
            }
    }

    /// Whether the contender key `name` is that of a signalled client whose
    /// session lives on, in one of the ways [`Sim::check_arrival_order`]
    /// allows to be waited for.
    fn signalled_ahead(&self, name: &str, snapshot: &Snapshot) -> bool {
        let signalled = self.signalled.iter().any(|&c| {
            self.clients[c].gone_session.as_deref() == Some(name)
                && matches!(self.clients[c].phase, Phase::Crashed)
        });
        let granted = snapshot
            .lock_record(self.limit)
            .ok()
            .flatten()
            .is_some_and(|record| record.holds(name));
        signalled && (!granted || !self.handed.contains(name) || self.wakes_lost.contains(name))
    }

    /// X-Consul-Index of a read of `<prefix>/<name>`.
    fn key_index(&self, name: &str) -> u64 {
        self.consul.get(DIR, &format!("{DIR}{name}")).0
    }

    /// When no client can move, no live waiter may be able to take a slot:
    /// that would be a wake-up lost, a waiter blocked on a key that no longer
    /// tells it anything. The one stall allowed is behind a crashed waiter,
    /// directly or through a chain of waiters each blocked on the key of the
    /// one ahead: the crashed one's key goes when its session expires (2×TTL).
    fn check_no_lost_wakeup(&self) -> Result<(), Violation> {
        let (_, entries) = self.consul.list(DIR);
        let snapshot = Snapshot::from_entries(entries);
        // Who blocks on whose key, by session.
        let mut blocks_on: BTreeMap<&str, &str> = BTreeMap::new();
        for client in &self.clients {
            if let Phase::Contend {
                contender,
                call: Call::Get { name, .. },
                ..
            } = &client.phase
            {
                if let Some(session) = contender.session() {
                    blocks_on.insert(session, name);
                }
            }
        }
        let crashed: Vec<&str> = self
            .clients
            .iter()
            .filter(|c| matches!(c.phase, Phase::Crashed | Phase::Done(_)))
            .filter_map(|c| c.gone_session.as_deref())
            .collect();
        let behind_crashed = |start: &str| {
            let mut session = start;
            for _ in 0..self.clients.len() {
                match blocks_on.get(session) {
                    Some(ahead) if crashed.contains(ahead) => return true,
                    Some(ahead) => session = ahead,
                    None => return false,
                }
            }
            false
        };
        for (i, client) in self.clients.iter().enumerate() {
            let Phase::Contend {
                contender, call, ..
            } = &client.phase
            else {
                continue;
            };
            let Some(session) = contender.session() else {
                continue;
            };
            if behind_crashed(session) {
                continue;
            }
            // A waiter handed a slot (Holding) must wake to take it, as one
            // that could take a free slot must.
            if let Ok(Decision::Take { .. } | Decision::Holding) =
                semaphore::decide(&snapshot, session, self.limit)
            {
                return Err(self.describe(&format!(
                    "client {i} could take a slot but nothing will wake it (it waits with {call:?})"
                )));
            }
        }
        Ok(())
    }

    /// One step of `ConsulSemaphore::release`: the session (and with it
    /// the contender key), then `.lock`.
    fn release_step(
        &mut self,
        i: usize,
        session: Option<String>,
        stage: ReleaseStage,
        exit: Exit,
    ) -> Phase {
        let Some(id) = session.clone() else {
            return Phase::Done(exit);
        };
        self.clients[i].gone_session = Some(id.clone());
        let fails = self.call_fails();
        match stage {
            ReleaseStage::HandOff => {
                let mut handed_off = false;
                let known = self.clients[i].known.take();
                let decided = match (fails, known) {
                    (false, Some(known)) => self.hand_off_known(i, &id, known),
                    _ => Err(()),
                };
                if let Ok(handed) = decided {
                    if let Some((heir, cas, snapshot)) = handed {
                        if let Some(rewrite) = semaphore::wake_behind_heir(&snapshot, &heir, cas) {
                            return Phase::Release {
                                session,
                                stage: ReleaseStage::WakeHeir {
                                    rewrite,
                                    session_left: true,
                                },
                                exit,
                            };
                        }
                        handed_off = true;
                    }
                } else if fails {
                    self.stats.failed_calls += 1;
                } else {
                    let (_, entries) = self.visible_list(self.clients[i].restricted);
                    let mut snapshot = Snapshot::from_entries(entries);
                    self.reveal_hidden(i, &mut snapshot);
                    if let ReleaseStep::Rewrite {
                        value,
                        cas,
                        heir: Some(heir),
                    } = semaphore::plan_release(&snapshot, &id, self.limit)
                    {
                        let lock_key = format!("{DIR}{LOCK_KEY_NAME}");
                        handed_off = self.consul.put_cas(&lock_key, value, cas, SEMAPHORE_FLAGS);
                        if handed_off {
                            self.handed_over(i, &heir, &id);
                            if let Some(rewrite) =
                                semaphore::wake_behind_heir(&snapshot, &heir, cas)
                            {
                                return Phase::Release {
                                    session,
                                    stage: ReleaseStage::WakeHeir {
                                        rewrite,
                                        session_left: true,
                                    },
                                    exit,
                                };
                            }
                        }
                    }
                }
                Phase::Release {
                    session,
                    stage: ReleaseStage::Session { handed_off },
                    exit,
                }
            }
            ReleaseStage::WakeHeir {
                rewrite,
                session_left,
            } => {
                if fails {
                    self.stats.failed_calls += 1;
                } else {
                    let key = format!("{DIR}{}", rewrite.name);
                    let written =
                        self.consul
                            .put_cas(&key, rewrite.value, rewrite.cas, SEMAPHORE_FLAGS);
                    self.log(|| {
                        format!("client {i}: rewrites its heir's key (written: {written})")
                    });
                }
                if session_left {
                    return Phase::Release {
                        session,
                        stage: ReleaseStage::Session { handed_off: true },
                        exit,
                    };
                }
                self.log(|| format!("client {i}: done ({exit:?})"));
                Phase::Done(exit)
            }
            ReleaseStage::Session { handed_off } => {
                if fails {
                    self.stats.failed_calls += 1;
                } else {
                    self.consul.invalidate(&id);
                }
                if handed_off {
                    self.log(|| format!("client {i}: done ({exit:?})"));
                    return Phase::Done(exit);
                }
                Phase::Release {
                    session,
                    stage: ReleaseStage::Lock { attempts: 0 },
                    exit,
                }
            }
            ReleaseStage::Lock { attempts } => {
                if fails {
                    // Release gives up on `.lock` after an error: the next
                    // contender prunes us.
                    self.stats.failed_calls += 1;
                    self.log(|| format!("client {i}: done ({exit:?}), .lock left to prune"));
                    return Phase::Done(exit);
                }
                let (_, entries) = self.visible_list(self.clients[i].restricted);
                let mut snapshot = Snapshot::from_entries(entries);
                self.reveal_hidden(i, &mut snapshot);
                let lock_key = format!("{DIR}{LOCK_KEY_NAME}");
                let written = match semaphore::plan_release(&snapshot, &id, self.limit) {
                    ReleaseStep::Nothing => true,
                    ReleaseStep::Rewrite { value, cas, heir } => {
                        let written = self.consul.put_cas(&lock_key, value, cas, SEMAPHORE_FLAGS);
                        if let (true, Some(heir)) = (written, heir) {
                            self.handed_over(i, &heir, &id);
                            if let Some(rewrite) =
                                semaphore::wake_behind_heir(&snapshot, &heir, cas)
                            {
                                return Phase::Release {
                                    session,
                                    stage: ReleaseStage::WakeHeir {
                                        rewrite,
                                        session_left: false,
                                    },
                                    exit,
                                };
                            }
                        }
                        written
                    }
                    ReleaseStep::Delete { cas } => self.consul.delete(&lock_key, Some(cas)),
                };
                self.log(|| format!("client {i}: release .lock -> {written}"));
                if written || attempts + 1 >= RELEASE_CAS_ATTEMPTS {
                    self.log(|| format!("client {i}: done ({exit:?})"));
                    Phase::Done(exit)
                } else {
                    Phase::Release {
                        session,
                        stage: ReleaseStage::Lock {
                            attempts: attempts + 1,
                        },
                        exit,
                    }
                }
            }
        }
    }

    /// Client `i`, leaving as `leaving`, wrote `heir` into `.lock` in its
    /// place: the slot must be the heir's turn. A holder that an operator
    /// took out of `.lock` by hand, its key still live, looks like a waiter,
    /// and may be handed a slot before its watch saw the loss: it then holds
    /// again, counted in `.lock`, and has no loss left to notice.
    /// `ConsulSemaphore::hand_off_known`: the hand-off decided on the
    /// listing that confirmed the slot, `.lock` and the heir's key read
    /// afresh. `Err` when a fresh listing must decide; `Ok(None)` when no
    /// hand-off was made; else the heir, the CAS index and the snapshot.
    #[allow(clippy::type_complexity)]
    fn hand_off_known(
        &mut self,
        i: usize,
        id: &str,
        known: Snapshot,
    ) -> Result<Option<(String, u64, Snapshot)>, ()> {
        let lock_key = format!("{DIR}{LOCK_KEY_NAME}");
        for _ in 0..RELEASE_CAS_ATTEMPTS {
            let (_, lock) = self.consul.get(DIR, &lock_key);
            let Some(lock) = lock else {
                return Ok(None);
            };
            let mut snapshot = semaphore::known_with_lock(&known, lock, self.limit).ok_or(())?;
            self.reveal_hidden(i, &mut snapshot);
            let ReleaseStep::Rewrite {
                value,
                cas,
                heir: Some(heir),
            } = semaphore::plan_release(&snapshot, id, self.limit)
            else {
                return Err(());
            };
            let (_, entry) = self.consul.get(DIR, &format!("{DIR}{heir}"));
            match entry {
                Some(entry) if semaphore::check_key(Some(&entry), &heir).is_ok() => {
                    snapshot.contenders.insert(heir.clone(), entry);
                }
                _ => return Err(()),
            }
            if self.consul.put_cas(&lock_key, value, cas, SEMAPHORE_FLAGS) {
                self.handed_over(i, &heir, id);
                return Ok(Some((heir, cas, snapshot)));
            }
        }
        Err(())
    }

    fn handed_over(&mut self, i: usize, heir: &str, leaving: &str) {
        self.stats.hand_offs += 1;
        self.handed.insert(heir.to_string());
        self.log(|| format!("client {i}: hands its slot to {heir}"));
        if let Err(violation) = self.check_fifo(i, heir, Some(leaving)) {
            self.fifo_violation.get_or_insert(violation);
        }
        // A holder that handed its slot on and whose session is about to
        // end is no heir: `.lock` would name a dead holder.
        let on_its_way_out = self.clients.iter().position(|c| {
            c.session() == Some(heir)
                && matches!(
                    c.phase,
                    Phase::Release {
                        stage: ReleaseStage::WakeHeir {
                            session_left: true,
                            ..
                        } | ReleaseStage::Session { handed_off: true },
                        ..
                    }
                )
        });
        if let Some(j) = on_its_way_out {
            let violation = self.describe(&format!(
                "client {i} handed its slot to client {j}, which handed its own on and is ending its session"
            ));
            self.fifo_violation.get_or_insert(violation);
        }
        for client in &mut self.clients {
            if let Phase::Hold {
                session, watches, ..
            } = &mut client.phase
            {
                if session == heir {
                    watches[0].must_notice = false;
                }
            }
        }
    }

    /// What `Client::reveal_hidden` does before release writes `.lock`:
    /// each holder the listing shows as dead is read directly, and kept as
    /// hidden when its key is held, or unreadable while its session lives.
    fn reveal_hidden(&self, i: usize, snapshot: &mut Snapshot) {
        let Ok(Some(record)) = snapshot.lock_record(self.limit) else {
            return;
        };
        for suspect in semaphore::suspects(&record, snapshot) {
            let held = if self.clients[i].restricted && self.hidden_sessions.contains(&suspect) {
                true
            } else {
                let (_, key) = self.consul.get(DIR, &format!("{DIR}{suspect}"));
                semaphore::check_key(key.as_ref(), &suspect).is_ok()
            };
            if held {
                snapshot.hidden.insert(suspect);
            }
        }
    }

    fn renew(&mut self, i: usize) {
        let now = self.consul.now();
        let client = &mut self.clients[i];
        client.renew_due = now + TTL / 2;
        let Some(session) = client.session().map(str::to_string) else {
            return;
        };
        if self.consul.renew(&session) {
            return;
        }
        // A 404 while holding is a loss the renewer reports.
        if let Phase::Hold { session, .. } = &client.phase {
            let session = session.clone();
            self.stats.losses_noticed += 1;
            self.log(|| format!("client {i}: renewal answers 404, stops its command"));
            self.clients[i].phase = Phase::Release {
                session: Some(session),
                stage: ReleaseStage::HandOff,
                exit: Exit::SlotLost,
            };
        }
    }

    /// The invariants that hold after every step.
    fn check(&mut self) -> Result<(), Violation> {
        if let Some(violation) = self.fifo_violation.take() {
            return Err(violation);
        }
        let (_, entries) = self.consul.list(DIR);
        let snapshot = Snapshot::from_entries(entries);
        let record = match snapshot.lock_record(self.limit) {
            Ok(record) => record,
            Err(conflict) => {
                return Err(self.describe(&format!(".lock became unusable: {conflict}")))
            }
        };
        // Liveness as Consul has it, not as consem's code computes it: the
        // contender key exists and is held by the holder's own session.
        // 1. `.lock` never lists more than Limit live holders.
        if let Some(record) = &record {
            let live = record
                .holders
                .iter()
                .filter(|h| self.held_by_own_session(h))
                .count();
            if live > self.limit as usize {
                return Err(self.describe(&format!(
                    "{live} live holders in .lock with limit {}",
                    self.limit
                )));
            }
        }
        // 2. A client that believes it holds is a live holder, or learns of
        // the loss at its next read of the key that shows it: `.lock` when
        // it is no longer a holder there, its contender key when that went.
        // 3. Nobody prunes a live holder: a holder leaves `.lock` with its
        // key live only when an operator removes it.
        for i in 0..self.clients.len() {
            let Phase::Hold { session, .. } = &self.clients[i].phase else {
                continue;
            };
            let in_lock = record.as_ref().is_some_and(|r| r.holds(session));
            let key_held = self.held_by_own_session(session);
            if !in_lock && key_held && !self.evicted.contains(session.as_str()) {
                let session = session.clone();
                return Err(self.describe(&format!(
                    "client {i} was dropped from .lock while its key {session} is live"
                )));
            }
            if let Phase::Hold { watches, .. } = &mut self.clients[i].phase {
                watches[0].must_notice |= !in_lock;
                watches[1].must_notice |= !key_held;
            }
        }
        Ok(())
    }

    /// Once everyone is done or crashed and every TTL has run out, nothing
    /// is left but, at most, a `.lock` naming dead holders, which the next
    /// contender prunes and removes on its way out.
    fn check_clean_after_expiry(&mut self) -> Result<(), Violation> {
        self.consul.advance(self.consul.now() + 3 * TTL);
        if self.consul.session_count() > 0 {
            return Err(self.describe("sessions left after every TTL ran out"));
        }
        // A key an operator released is held by no session, so no session's
        // end deletes it: the operator who released it deletes it.
        for key in std::mem::take(&mut self.released) {
            let (_, entry) = self.consul.get(DIR, &key);
            if entry.is_some_and(|e| e.session.is_none()) {
                self.log(|| format!("operator deletes the released key {key}"));
                self.consul.delete(&key, None);
            }
        }
        let leftovers: Vec<String> = self
            .consul
            .keys()
            .into_iter()
            .filter(|k| !k.ends_with(LOCK_KEY_NAME))
            .collect();
        if !leftovers.is_empty() {
            return Err(self.describe(&format!("keys left: {leftovers:?}")));
        }
        self.clients = vec![Client {
            phase: Phase::Contend {
                contender: Box::new(Contender::new(self.limit, Contend::Wait)),
                call: Call::CreateSession,
                blocked_since: 0,
            },
            relays: true,
            gone_session: None,
            restricted: false,
            restores_seen: self.consul.restores(),
            renew_due: self.consul.now() + TTL / 2,
            stalled_until: 0,
            known: None,
        }];
        for _ in 0..1_000 {
            if self.clients[0].finished() {
                break;
            }
            self.step()?;
        }
        if !matches!(self.clients[0].phase, Phase::Done(Exit::Ran))
            || !self.consul.keys().is_empty()
        {
            return Err(self.describe(&format!(
                "a last contender did not leave the prefix empty: {:?}",
                self.consul.keys()
            )));
        }
        Ok(())
    }

    fn describe(&self, what: &str) -> Violation {
        let keys: Vec<String> = self
            .consul
            .keys()
            .into_iter()
            .map(|k| match self.consul.value(&k) {
                Some(v) if !v.is_empty() => format!("{k}={}", String::from_utf8_lossy(v)),
                _ => k,
            })
            .collect();
        format!(
            "{what} (limit {}, {} clients, at {}ms; keys {keys:?}; prefix {PREFIX})",
            self.limit,
            self.clients.len(),
            self.consul.now()
        )
    }
}

fn run_seed(
    seed: u64,
    trace: bool,
    trouble: Trouble,
) -> (Result<(), Violation>, Stats, Option<String>) {
    let mut sim = Sim::new(seed, trace, trouble);
    let outcome = sim.run();
    (outcome, sim.stats, sim.trace)
}

impl std::ops::AddAssign for Stats {
    fn add_assign(&mut self, other: Stats) {
        self.steps += other.steps;
        self.acquisitions += other.acquisitions;
        self.losses_noticed += other.losses_noticed;
        self.crashes += other.crashes;
        self.evictions += other.evictions;
        self.expiries_forced += other.expiries_forced;
        self.restarts += other.restarts;
        self.failed_calls += other.failed_calls;
        self.lost_answers += other.lost_answers;
        self.refusals += other.refusals;
        self.keys_released += other.keys_released;
        self.restores += other.restores;
        self.hand_offs += other.hand_offs;
        self.signals += other.signals;
        self.arrivals_checked += other.arrivals_checked;
    }
}

/// Runs `CONSEM_SIM_SEEDS` seeds (else `default_seeds`) with `trouble` and
/// returns the totals, or replays the one seed `CONSEM_SIM_SEED` and prints
/// its trace (then `None`). `test` names the test, for the replay.
fn run_seeds(test: &str, trouble: Trouble, default_seeds: u64) -> Option<Stats> {
    if let Ok(seed) = std::env::var("CONSEM_SIM_SEED") {
        let seed: u64 = seed.parse().expect("CONSEM_SIM_SEED is a number");
        let (outcome, stats, trace) = run_seed(seed, true, trouble);
        println!("{}", trace.unwrap_or_default());
        println!("{stats:?}");
        if let Err(violation) = outcome {
            panic!("seed {seed}: {violation}");
        }
        return None;
    }
    let seeds: u64 = std::env::var("CONSEM_SIM_SEEDS").map_or(default_seeds, |n| {
        n.parse().expect("CONSEM_SIM_SEEDS is a number")
    });
    let mut total = Stats::default();
    for seed in 0..seeds {
        let (outcome, stats, _) = run_seed(seed, false, trouble);
        if let Err(violation) = outcome {
            panic!("seed {seed}: {violation}\nreplay it with: CONSEM_SIM_SEED={seed} cargo test --test suite simulation::{test} -- --nocapture");
        }
        total += stats;
    }
    println!("simulation ({trouble:?}): {seeds} seeds, 0 violations; totals: {total:?}");
    Some(total)
}

#[test]
fn the_recipe_keeps_its_invariants_under_faults() {
    let Some(total) = run_seeds(
        "the_recipe_keeps_its_invariants_under_faults",
        Trouble::Everything,
        2_000,
    ) else {
        return;
    };
    // The paths worth checking were taken.
    assert!(
        total.hand_offs > 0 && total.acquisitions > total.hand_offs,
        "{total:?}"
    );
}

/// A crowd of consem contenders, some killed, stopped or terminated while
/// they wait or hold: the others take their slots in order of arrival,
/// but for the skips `Sim::check_arrival_order` allows.
#[test]
fn a_crowd_takes_its_slots_in_order_of_arrival() {
    let Some(total) = run_seeds(
        "a_crowd_takes_its_slots_in_order_of_arrival",
        Trouble::Signals,
        500,
    ) else {
        return;
    };
    assert!(
        total.signals > 0 && total.hand_offs > 0 && total.arrivals_checked > 0,
        "{total:?}"
    );
}

#[test]
fn a_seed_replays_the_same_way() {
    for trouble in [Trouble::Everything, Trouble::Signals] {
        let (first, stats_a, trace_a) = run_seed(42, true, trouble);
        let (second, stats_b, trace_b) = run_seed(42, true, trouble);
        assert_eq!(first, second);
        assert_eq!(trace_a, trace_b);
        assert_eq!(stats_a.steps, stats_b.steps);
    }
}
