//! The semaphore's decisions, free of I/O: decode and encode `.lock`, prune
//! dead holders, decide whether to take a slot, check that a slot is still
//! held, and plan the release. The layout is the one `consul lock -n N` and
//! the Go API's `Semaphore` write, so consem shares a prefix with them:
//!
//! - `<prefix>/<session>`: a contender key, held by its session;
//! - `<prefix>/.lock`: `{"Limit":N,"Holders":{"<session>":true,...}}`, no session.
//!
//! Both carry [`SEMAPHORE_FLAGS`]. A consem holder that takes itself out of
//! `.lock` while its contender key lives writes itself there as `false`
//! ([`LockRecord::leaving`]).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

/// The Go API's semaphore flag value; peers check it to recognise the layout.
pub const SEMAPHORE_FLAGS: u64 = 0xe0f69a2baa414de0;

/// The Go API's `Lock` flag: `consul lock` without `-n` (or with `-n 1`)
/// writes `.lock` as a mutex with it, a layout consem does not share.
pub const MUTEX_FLAGS: u64 = 0x2ddccbc058a50c18;

/// The name of the key that records the limit and the holders.
pub const LOCK_KEY_NAME: &str = ".lock";

/// The field of a contender key's value (a JSON object) by which a contender
/// promises to relay: once it holds a slot it rewrites its contender key if
/// anyone waits behind it, so that the waiter just behind may block on that
/// one key instead of the whole prefix. consem sets it; `consul lock` writes
/// an empty value and does not relay.
pub const RELAYS_FIELD: &str = "Relays";

/// The highest `--limit`: 1024 holders in map form take about 45 KiB, a tenth
/// of Consul's 512 KiB value limit, leaving room for foreign entries.
pub const MAX_LIMIT: u32 = 1024;

/// One key under the prefix, as read from Consul.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The part of the key after `<prefix>/`.
    pub name: String,
    pub value: Vec<u8>,
    pub flags: u64,
    pub session: Option<String>,
    pub create_index: u64,
    pub modify_index: u64,
}

/// How `.lock` spells its holders; written back the way it was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldersForm {
    /// `{"<session>":true}`: what `consul lock` and the Go API write.
    Map,
    /// `["<session>"]`: what Consul's semaphore guide shows.
    List,
}

/// The decoded value of `.lock`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockRecord {
    pub limit: u32,
    /// Holder sessions, without duplicates, in the order found.
    pub holders: Vec<String>,
    /// Sessions named `false` in the map form: consem holders that left
    /// `.lock` while their contender key still lived (a holder that hands
    /// its slot on, until its session ends). Neither holders nor waiters:
    /// they must not be handed a slot, since their session is about to end.
    /// `consul lock` counts them as holders until their keys go (it counts
    /// every name in the map, and prunes those whose session holds no key),
    /// and writes them back as it found them.
    pub leaving: Vec<String>,
    pub form: HoldersForm,
}

/// Why a `.lock` cannot be used: consem reports it and never overwrites it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conflict {
    ForeignFlags(u64),
    LimitMismatch {
        found: u32,
        ours: u32,
    },
    Undecodable(String),
    /// More live holders than the Limit: a hand edit or another tool wrote
    /// them; joining would make one more.
    OverLimit {
        live: usize,
        limit: u32,
    },
}

impl std::fmt::Display for Conflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Conflict::ForeignFlags(MUTEX_FLAGS) => write!(
                f,
                "is a `consul lock` mutex (what it writes without -n or with -n 1), not a semaphore"
            ),
            Conflict::ForeignFlags(flags) => write!(
                f,
                "has Flags {flags}, not the semaphore flag {SEMAPHORE_FLAGS}: it belongs to another tool"
            ),
            Conflict::LimitMismatch { found, ours } => write!(
                f,
                "has Limit {found} but --limit is {ours}: every contender on a prefix must use the same limit"
            ),
            Conflict::Undecodable(why) => write!(f, "is not a semaphore record ({why})"),
            Conflict::OverLimit { live, limit } => write!(
                f,
                "names {live} live holders but its Limit is {limit}: more than the limit hold at once (a hand edit or another tool wrote it)"
            ),
        }
    }
}

impl Conflict {
    /// What consem does about it, and what an operator can do.
    pub fn remedy(&self) -> &'static str {
        match self {
            Conflict::OverLimit { .. } => "consem does not join it (release the extra holders with `consem release`, or wait until they leave)",
            _ => "consem leaves it untouched (use another --prefix, or delete that key if it is stale)",
        }
    }
}

impl LockRecord {
    pub fn new(limit: u32) -> LockRecord {
        LockRecord {
            limit,
            holders: Vec::new(),
            leaving: Vec::new(),
            form: HoldersForm::Map,
        }
    }

    pub fn holds(&self, session: &str) -> bool {
        self.holders.iter().any(|h| h == session)
    }

    /// Whether `session` is a holder or one that left `.lock` while its key
    /// lives ([`LockRecord::leaving`]): either way, no waiter.
    pub fn names(&self, session: &str) -> bool {
        self.holds(session) || self.leaving.iter().any(|h| h == session)
    }
}

/// Decodes a `.lock` value. Holders may be a map of booleans (entries set to
/// `false` are not holders but [`LockRecord::leaving`]), a list of strings,
/// null, or missing.
pub fn decode_lock(value: &[u8]) -> Result<LockRecord, Conflict> {
    let undecodable = |why: &str| Conflict::Undecodable(why.to_string());
    let text = std::str::from_utf8(value).map_err(|_| undecodable("not UTF-8"))?;
    let json: Value =
        serde_json::from_str(text).map_err(|e| Conflict::Undecodable(format!("not JSON: {e}")))?;
    let object = json
        .as_object()
        .ok_or_else(|| undecodable("not a JSON object"))?;
    let limit = match object.get("Limit") {
        Some(Value::Number(n)) => n
            .as_u64()
            .filter(|&l| l >= 1)
            .and_then(|l| u32::try_from(l).ok())
            .ok_or_else(|| Conflict::Undecodable(format!("Limit {n} is not a positive count")))?,
        _ => return Err(undecodable("no numeric Limit")),
    };
    let mut holders: Vec<String> = Vec::new();
    let mut leaving: Vec<String> = Vec::new();
    let mut add = |id: &str| {
        if !holders.iter().any(|h| h == id) {
            holders.push(id.to_string());
        }
    };
    let form = match object.get("Holders") {
        None | Some(Value::Null) => HoldersForm::Map,
        Some(Value::Object(map)) => {
            for (id, held) in map {
                match held {
                    Value::Bool(true) => add(id),
                    Value::Bool(false) => leaving.push(id.clone()),
                    _ => return Err(undecodable("a Holders entry is not true or false")),
                }
            }
            HoldersForm::Map
        }
        Some(Value::Array(list)) => {
            for id in list {
                add(id
                    .as_str()
                    .ok_or_else(|| undecodable("a Holders entry is not a string"))?);
            }
            HoldersForm::List
        }
        Some(_) => return Err(undecodable("Holders is neither a map nor a list")),
    };
    Ok(LockRecord {
        limit,
        holders,
        leaving,
        form,
    })
}

/// `.lock` as written: `Limit` first, as the Go API's struct orders it.
#[derive(serde::Serialize)]
#[serde(rename_all = "PascalCase")]
struct EncodedLock {
    limit: u32,
    holders: Value,
}

/// Encodes a `.lock` value in the record's form (map keys sorted, as Go's
/// encoder writes them). The list form has no way to say
/// [`LockRecord::leaving`]: those are left out of it.
pub fn encode_lock(record: &LockRecord) -> Vec<u8> {
    let holders = match record.form {
        HoldersForm::Map => Value::Object(
            record
                .leaving
                .iter()
                .filter(|h| !record.holds(h))
                .map(|h| (h.clone(), Value::Bool(false)))
                .chain(
                    record
                        .holders
                        .iter()
                        .map(|h| (h.clone(), Value::Bool(true))),
                )
                .collect::<Map<String, Value>>(),
        ),
        HoldersForm::List => Value::Array(
            record
                .holders
                .iter()
                .map(|h| Value::String(h.clone()))
                .collect(),
        ),
    };
    serde_json::to_vec(&EncodedLock {
        limit: record.limit,
        holders,
    })
    .expect("a JSON value always encodes")
}

/// What one listing of `<prefix>/` holds, as the decisions need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// `.lock`, if present, with its ModifyIndex for the CAS.
    pub lock: Option<Entry>,
    /// Direct children of the prefix other than `.lock`, by name.
    pub contenders: BTreeMap<String, Entry>,
    /// Holders whose contender key a direct read showed held, though the
    /// listing left it out: an ACL hides it from us. They count as live.
    pub hidden: BTreeSet<String>,
}

impl Snapshot {
    /// Sorts a listing of `<prefix>/` into `.lock` and contender keys; keys
    /// nested deeper belong to nobody here and are ignored.
    pub fn from_entries(entries: Vec<Entry>) -> Snapshot {
        let mut lock = None;
        let mut contenders = BTreeMap::new();
        for entry in entries {
            if entry.name == LOCK_KEY_NAME {
                lock = Some(entry);
            } else if !entry.name.is_empty() && !entry.name.contains('/') {
                contenders.insert(entry.name.clone(), entry);
            }
        }
        Snapshot {
            lock,
            contenders,
            hidden: BTreeSet::new(),
        }
    }

    /// A session is alive while its contender key exists and is held by it.
    pub fn is_live(&self, session: &str) -> bool {
        self.hidden.contains(session)
            || self
                .contenders
                .get(session)
                .is_some_and(|e| e.session.as_deref() == Some(session))
    }

    /// [`Snapshot::is_live`] for one of our own contender keys, without
    /// looking it up again: run over every key of a listing.
    fn holds_its_key(&self, contender: &Entry) -> bool {
        contender.session.as_deref() == Some(contender.name.as_str())
            || self.hidden.contains(&contender.name)
    }

    /// Decodes `.lock` and checks that it is a semaphore record with our
    /// limit. `None` when there is no `.lock` yet.
    pub fn lock_record(&self, limit: u32) -> Result<Option<LockRecord>, Conflict> {
        self.lock
            .as_ref()
            .map(|entry| lock_record(entry, limit))
            .transpose()
    }

    /// The ModifyIndex to CAS `.lock` against; 0 creates it.
    fn lock_cas(&self) -> u64 {
        self.lock.as_ref().map_or(0, |e| e.modify_index)
    }
}

/// Decodes a `.lock` entry and checks that it is a semaphore record with our
/// limit.
pub fn lock_record(entry: &Entry, limit: u32) -> Result<LockRecord, Conflict> {
    if entry.flags != SEMAPHORE_FLAGS {
        return Err(Conflict::ForeignFlags(entry.flags));
    }
    let record = decode_lock(&entry.value)?;
    if record.limit != limit {
        return Err(Conflict::LimitMismatch {
            found: record.limit,
            ours: limit,
        });
    }
    Ok(record)
}

/// The field a relay adds to the contender key's value: the fence of the
/// slot taken, so that the rewrite always changes the key.
pub const HOLDING_FIELD: &str = "Holding";

/// The contender key's value once it holds the slot `fence`: `value` (a JSON
/// object) with [`HOLDING_FIELD`] set.
pub fn holding_value(value: &[u8], fence: u64) -> Vec<u8> {
    with_field(value, HOLDING_FIELD, fence)
}

/// `value` (a JSON object; anything else counts as an empty one) with
/// `field` set to `number`.
fn with_field(value: &[u8], field: &str, number: u64) -> Vec<u8> {
    let mut object = match serde_json::from_slice::<Value>(value) {
        Ok(Value::Object(object)) => object,
        _ => Map::new(),
    };
    object.insert(field.to_string(), Value::from(number));
    serde_json::to_vec(&object).expect("a JSON value always encodes")
}

/// The field a waiter sets in its own contender key's value to wake
/// whoever blocks on that key; its value only makes the write a change.
pub const WOKEN_FIELD: &str = "Woken";

/// Our contender key's value rewritten to wake the waiter that blocks on it.
pub fn woken_value(value: &[u8], mark: u64) -> Vec<u8> {
    with_field(value, WOKEN_FIELD, mark)
}

/// The field a leaving holder sets in its heir's contender key, to wake the
/// waiter that blocks on that key ([`wake_behind_heir`]); its value (the
/// `.lock` index the hand-off replaced) only makes the write a change.
pub const HANDED_FIELD: &str = "Handed";

/// A CAS write of a contender key, on the ModifyIndex a listing showed: it
/// keeps the key's session, and changes its value, so that whoever blocks
/// on the key wakes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRewrite {
    pub name: String,
    pub value: Vec<u8>,
    pub cas: u64,
}

/// The write a holder makes once it has handed its slot to `heir` (its
/// `.lock` CAS on `handed_at`, decided on `snapshot`): the heir's key,
/// rewritten, which wakes the waiter that may block on it. That waiter is
/// now first in line, and must block on the prefix to see the next
/// departure. The heir's own rewrite (its relay) comes only once its
/// command runs, and never from a heir that is stopped or killed, whose
/// session lives on until its TTL runs out: the waiter slept until then,
/// through the hand-off of its own slot, while waiters behind it that the
/// departure of one in between had woken took slots after it (found by a
/// crowd with stopped waiters). Made whether or not the listing shows a
/// waiter behind the heir: one may have joined since, and seen the heir
/// waiting.
pub fn wake_behind_heir(snapshot: &Snapshot, heir: &str, handed_at: u64) -> Option<KeyRewrite> {
    let entry = snapshot.contenders.get(heir)?;
    Some(KeyRewrite {
        name: heir.to_string(),
        value: with_field(&entry.value, HANDED_FIELD, handed_at),
        cas: entry.modify_index,
    })
}

/// Holders in `holders` that relay and arrived after `me`, a waiter: under
/// the queue's order they could only have got their slot from a holder
/// (or a listing) that did not see `me`, and one of them may sleep on our
/// key, which it took for the key of the waiter just ahead.
pub fn relaying_holders_behind<'a>(
    snapshot: &'a Snapshot,
    holders: &'a [String],
    me: &str,
) -> impl Iterator<Item = String> + 'a {
    let mine = create_index_of(snapshot, me);
    holders
        .iter()
        .filter_map(move |h| snapshot.contenders.get(h))
        .filter(move |e| e.create_index > mine && relays(e))
        .map(|e| e.name.clone())
}

/// Whether a contender key's value promises to relay ([`RELAYS_FIELD`]).
pub fn relays(entry: &Entry) -> bool {
    // Read for every key of every listing: the one field, nothing built.
    #[derive(serde::Deserialize)]
    struct Promise {
        #[serde(rename = "Relays")]
        relays: bool,
    }
    // An object only: a derived struct would also take `[true]`.
    entry.value.trim_ascii_start().first() == Some(&b'{')
        && serde_json::from_slice::<Promise>(&entry.value).is_ok_and(|p| p.relays)
}

/// Holders in `record` that the listing shows without a live contender key:
/// dead, or hidden from us. A listing may leave out keys the token cannot
/// read without saying so (Consul agents that predate the
/// `X-Consul-Results-Filtered-By-ACLs` header), so before a write drops
/// them, a direct read of each key must confirm that it is gone: that read
/// answers 403 for a key the token cannot read.
pub fn suspects(record: &LockRecord, snapshot: &Snapshot) -> Vec<String> {
    record
        .holders
        .iter()
        .filter(|h| !snapshot.is_live(h))
        .cloned()
        .collect()
}

/// Whether a holder named so could have a contender key: a name that is
/// empty, `.`, `..` or has a `/` cannot be addressed as `<prefix>/<name>`
/// (Consul's HTTP server redirects such paths), so such a holder is dead.
pub fn can_be_a_contender_key(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/')
}

/// Drops holders, and leaving ones, whose contender key is gone or no
/// longer held by them.
pub fn prune(record: &LockRecord, snapshot: &Snapshot) -> LockRecord {
    let live = |names: &[String]| {
        names
            .iter()
            .filter(|h| snapshot.is_live(h))
            .cloned()
            .collect()
    };
    LockRecord {
        holders: live(&record.holders),
        leaving: live(&record.leaving),
        ..record.clone()
    }
}

/// What a contender should do after reading the prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// We are already in Holders (an earlier CAS won even if its answer was lost).
    Holding,
    /// Write `value` to `.lock` with `?cas=<cas>` to take a slot.
    Take { value: Vec<u8>, cas: u64 },
    /// Every slot is held by a live holder, or promised to a waiter ahead:
    /// wait for a change, blocking on `wait_on`.
    Full {
        holders: Vec<String>,
        wait_on: WaitOn,
    },
    /// Our own contender key is gone: our session was invalidated.
    SessionLost,
}

/// What a waiter blocks on until its turn may have come.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitOn {
    /// The whole prefix: the next departure of a holder or of a waiter ahead
    /// may give us a slot.
    Prefix,
    /// The contender key of the relaying waiter just ahead of us. Our turn
    /// needs at least two departures ahead of us, so that waiter's turn comes
    /// first; it rewrites this key when it takes its slot, and the key goes
    /// when it leaves or its session ends.
    Key(String),
}

/// Decides whether `me` can take a slot. Pure: the same snapshot always gives
/// the same decision.
///
/// Slots go in order of arrival (the contender key's CreateIndex): `me` takes
/// one only while the live holders plus the live queueing waiters that
/// arrived before it are fewer than Limit, so a late consem contender never
/// overtakes an earlier one. A waiter ahead that does not take its turn
/// holds the others up only until its session goes (2×TTL once it stops
/// renewing) or its blocking read returns. Contenders that do not queue
/// (`consul lock`) are not waited for: they take a free slot whoever came
/// first, and how consem keeps its share beside them is [`plan_release`]'s
/// hand-off. A record with more live holders than its limit is a conflict.
///
/// A waiter that one departure could serve blocks on the prefix; one further
/// back blocks on the key of the waiter just ahead (see [`WaitOn`]), so that
/// a change wakes only the waiters it can serve.
pub fn decide(snapshot: &Snapshot, me: &str, limit: u32) -> Result<Decision, Conflict> {
    let record = snapshot
        .lock_record(limit)?
        .unwrap_or_else(|| LockRecord::new(limit));
    if !snapshot.is_live(me) {
        return Ok(Decision::SessionLost);
    }
    let mut pruned = prune(&record, snapshot);
    check_within_limit(&pruned)?;
    if record.holds(me) {
        return Ok(Decision::Holding);
    }
    let queued = pruned.holders.len() + waiters_ahead(snapshot, &pruned, me);
    if queued >= limit as usize {
        // Every waiter ahead relays (see `waiters_ahead`), so the one just
        // ahead has one departure fewer to wait for than we do.
        let wait_on = match waiters_before(snapshot, &pruned, me).max_by_key(|e| e.create_index) {
            Some(entry) if queued > limit as usize => WaitOn::Key(entry.name.clone()),
            _ => WaitOn::Prefix,
        };
        return Ok(Decision::Full {
            holders: pruned.holders,
            wait_on,
        });
    }
    pruned.holders.push(me.to_string());
    Ok(Decision::Take {
        value: encode_lock(&pruned),
        cas: snapshot.lock_cas(),
    })
}

/// A record whose live holders (`pruned`) exceed its limit is a conflict.
pub fn check_within_limit(pruned: &LockRecord) -> Result<(), Conflict> {
    if pruned.holders.len() > pruned.limit as usize {
        return Err(Conflict::OverLimit {
            live: pruned.holders.len(),
            limit: pruned.limit,
        });
    }
    Ok(())
}

/// Live contenders that queue (they relay) without a slot, that arrived
/// before `me`. Contenders that do not queue (`consul lock`) have no place
/// in the queue: they take a slot whenever they see one free, whoever
/// arrived first, so a consem waiter that let them go first would lose
/// every race to them.
pub fn waiters_ahead(snapshot: &Snapshot, holders: &LockRecord, me: &str) -> usize {
    waiters_before(snapshot, holders, me).count()
}

/// Whether a live contender without a slot arrived after `me`: one that may
/// block on our key, so that taking a slot must relay.
pub fn waiters_behind(snapshot: &Snapshot, holders: &LockRecord, me: &str) -> bool {
    let mine = create_index_of(snapshot, me);
    snapshot
        .contenders
        .values()
        .filter(|e| e.create_index > mine && e.name != me)
        .any(|e| is_waiter(snapshot, holders, e))
}

fn waiters_before<'a>(
    snapshot: &'a Snapshot,
    holders: &'a LockRecord,
    me: &str,
) -> impl Iterator<Item = &'a Entry> + 'a {
    let mine = create_index_of(snapshot, me);
    let me = me.to_string();
    // The cheap tests first: this runs over every key of every listing.
    snapshot
        .contenders
        .values()
        .filter(move |e| e.create_index < mine && e.name != me)
        .filter(|e| is_waiter(snapshot, holders, e) && relays(e))
}

/// Live contenders that `.lock` does not name: neither holders nor holders
/// on their way out.
fn waiters<'a>(
    snapshot: &'a Snapshot,
    holders: &'a LockRecord,
) -> impl Iterator<Item = &'a Entry> + 'a {
    snapshot
        .contenders
        .values()
        .filter(|e| is_waiter(snapshot, holders, e))
}

fn is_waiter(snapshot: &Snapshot, holders: &LockRecord, contender: &Entry) -> bool {
    snapshot.holds_its_key(contender) && !holders.names(&contender.name)
}

fn create_index_of(snapshot: &Snapshot, session: &str) -> u64 {
    snapshot
        .contenders
        .get(session)
        .map_or(u64::MAX, |e| e.create_index)
}

/// Why a held slot counts as lost: what was observed, as it was observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loss {
    /// Our contender key is gone; whether our session went with it is
    /// settled by reading the session ([`Loss::explain_deleted_key`]).
    KeyDeleted,
    /// Our contender key is gone and so is our session: Consul deleted the
    /// key when it invalidated the session.
    SessionInvalidated,
    /// Our contender key is gone while our session lives: deleted by hand
    /// or by another tool.
    KeyDeletedSessionAlive,
    /// Our contender key is there but no session holds it (`?release=`).
    KeyReleased,
    /// Our contender key is held by another session.
    KeyHeldBy(String),
    NotInHolders,
    LockGone,
    LockChanged(Conflict),
}

impl Loss {
    /// Refines [`Loss::KeyDeleted`] once our session was read: `Some(true)`
    /// when Consul still knows it, `None` when the read failed.
    pub fn explain_deleted_key(self, session_alive: Option<bool>) -> Loss {
        match (self, session_alive) {
            (Loss::KeyDeleted, Some(true)) => Loss::KeyDeletedSessionAlive,
            (Loss::KeyDeleted, Some(false)) => Loss::SessionInvalidated,
            (other, _) => other,
        }
    }
}

impl std::fmt::Display for Loss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Loss::KeyDeleted => write!(f, "our contender key was deleted"),
            Loss::SessionInvalidated => write!(
                f,
                "our session was invalidated (consem release, an operator, or Consul), and Consul deleted our contender key with it"
            ),
            Loss::KeyDeletedSessionAlive => write!(
                f,
                "our contender key was deleted while our session is alive (by hand or by another tool)"
            ),
            Loss::KeyReleased => write!(
                f,
                "our contender key was released from our session (by hand or by another tool)"
            ),
            Loss::KeyHeldBy(session) => write!(
                f,
                "our contender key is now held by another session ({})",
                crate::report::printable(session)
            ),
            Loss::NotInHolders => write!(
                f,
                "our session was removed from the holders in .lock (a hand edit, or another tool)"
            ),
            Loss::LockGone => write!(f, "the .lock key was deleted"),
            Loss::LockChanged(conflict) => write!(f, "the .lock key was rewritten: it {conflict}"),
        }
    }
}

/// Checks, while holding, that `.lock` (`None`: missing) still names us.
pub fn check_lock(lock: Option<&Entry>, me: &str, limit: u32) -> Result<(), Loss> {
    match lock.map(|entry| lock_record(entry, limit)) {
        None => Err(Loss::LockGone),
        Some(Err(conflict)) => Err(Loss::LockChanged(conflict)),
        Some(Ok(record)) if record.holds(me) => Ok(()),
        Some(Ok(_)) => Err(Loss::NotInHolders),
    }
}

/// Checks, while holding, that our contender key (`None`: missing) is still
/// held by our session.
pub fn check_key(key: Option<&Entry>, me: &str) -> Result<(), Loss> {
    match key.map(|entry| entry.session.as_deref()) {
        Some(Some(session)) if session == me => Ok(()),
        Some(Some(other)) => Err(Loss::KeyHeldBy(other.to_string())),
        Some(None) => Err(Loss::KeyReleased),
        None => Err(Loss::KeyDeleted),
    }
}

/// The `.lock` write that takes `me` out of the semaphore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseStep {
    /// Write the holders without us (dead ones pruned too) with `?cas=`;
    /// with an `heir`, our slot goes straight to that waiter.
    Rewrite {
        value: Vec<u8>,
        cas: u64,
        heir: Option<String>,
    },
    /// Nobody else is left: delete `.lock` with `?cas=`, so an idle prefix is
    /// empty, as `consul lock` leaves it.
    Delete { cas: u64 },
    /// Nothing to write: we are not a holder and others still use the prefix,
    /// or `.lock` is missing or not ours to touch.
    Nothing,
}

/// Plans the `.lock` part of leaving the semaphore.
pub fn plan_release(snapshot: &Snapshot, me: &str, limit: u32) -> ReleaseStep {
    let Ok(Some(record)) = snapshot.lock_record(limit) else {
        return ReleaseStep::Nothing;
    };
    let mut remaining = prune(&record, snapshot);
    remaining.holders.retain(|h| h != me);
    // Out of `.lock` while our key lives (a hand-off is written before our
    // session ends), we would look like the first waiter to a holder that
    // leaves in that moment, and be handed a slot that the end of our
    // session then leaves to a dead holder. Named `false`, we are neither.
    if snapshot.is_live(me) && !remaining.leaving.iter().any(|h| h == me) {
        remaining.leaving.push(me.to_string());
    }
    // Live contenders only: a key nobody holds (a value an operator put
    // under the prefix) waits for no slot, and must not keep `.lock`; nor
    // does a holder on its way out.
    let others_contend = snapshot
        .contenders
        .keys()
        .any(|name| name != me && snapshot.is_live(name) && !remaining.leaving.contains(name));
    let cas = snapshot.lock_cas();
    if remaining.holders.is_empty() && !others_contend {
        ReleaseStep::Delete { cas }
    } else if record.holds(me) {
        let heir = heir(snapshot, &remaining, me);
        remaining.holders.extend(heir.clone());
        ReleaseStep::Rewrite {
            value: encode_lock(&remaining),
            cas,
            heir,
        }
    } else {
        ReleaseStep::Nothing
    }
}

/// What a leaving holder's hand-off decides on without listing the prefix
/// again: `known`, the listing that confirmed its slot, with `.lock` as read
/// now (`lock`). The listing is as long as the crowd, and reading it on the
/// hand-off's path made each hand-off cost in proportion to the waiters.
///
/// Every waiter that arrived before that listing is in it, and any that
/// arrived since is behind them all (a contender's place is its key's
/// CreateIndex), so while one of the listing's consem waiters still waits,
/// the first of them is the heir [`plan_release`] would pick on a fresh
/// listing. What may be stale is checked by the caller: the heir's key is
/// read directly before the hand-off (a waiter that left is dropped with
/// [`Snapshot::forget`] and the next one tried), and the holders `.lock`
/// names that the listing does not show are read directly as in any
/// release ([`suspects`]). Contenders that the listing's `.lock` named and
/// the fresh one no longer names are holders gone or on their way out, not
/// waiters: they are left out. `None` when the listing cannot tell: it
/// showed a live contender that does not queue (`consul lock`), and the
/// share rule of [`heir`] weighs every live contender, which only a listing
/// shows; or a contender key that its session did not hold (released by
/// hand), which its session may take again with its old CreateIndex, ahead
/// of the listing's waiters (found by the simulation).
pub fn known_with_lock(known: &Snapshot, lock: Entry, limit: u32) -> Option<Snapshot> {
    let was_named = known.lock_record(limit).ok().flatten();
    let named_now = lock_record(&lock, limit).ok();
    let cannot_tell = known
        .contenders
        .values()
        .any(|e| !known.holds_its_key(e) || !relays(e));
    if cannot_tell {
        return None;
    }
    let gone = |name: &str| {
        was_named.as_ref().is_some_and(|r| r.names(name))
            && !named_now.as_ref().is_some_and(|r| r.names(name))
    };
    Some(Snapshot {
        lock: Some(lock),
        contenders: known
            .contenders
            .iter()
            .filter(|(name, _)| !gone(name))
            .map(|(name, entry)| (name.clone(), entry.clone()))
            .collect(),
        hidden: BTreeSet::new(),
    })
}

/// The waiter a leaving holder hands its slot to, in the same write that
/// takes the holder out: the consem waiter that arrived first.
///
/// Among consem contenders alone this is the waiter that would take the slot
/// next anyway; handing it over saves that waiter a CAS. Beside contenders
/// that do not queue (`consul lock`) it is what keeps consem's share: a slot
/// set free goes to whichever of them writes first, and the one consem
/// waiter that reads the prefix is one of many racers, so without the
/// hand-off consem's slots would drain to them. The slot is handed on while
/// consem's contenders, with it, hold no more than their share of the slots
/// (in proportion to how many of the live contenders they are), and
/// beyond that unless every waiting non-queueing contender arrived before
/// that consem waiter: then it is their turn, and the slot is left to them.
pub fn heir(snapshot: &Snapshot, remaining: &LockRecord, me: &str) -> Option<String> {
    if remaining.holders.len() >= remaining.limit as usize {
        return None;
    }
    let waiting = || waiters(snapshot, remaining).filter(|e| e.name != me);
    let first = waiting()
        .filter(|e| relays(e))
        .min_by_key(|e| e.create_index)?;
    let latest_racer = waiting()
        .filter(|e| !relays(e))
        .map(|e| e.create_index)
        .max();
    let Some(latest_racer) = latest_racer else {
        return Some(first.name.clone());
    };
    let live: Vec<&Entry> = snapshot
        .contenders
        .values()
        .filter(|e| snapshot.holds_its_key(e))
        .collect();
    let queueing = live.iter().filter(|e| relays(e)).count();
    let held_by_queueing = remaining
        .holders
        .iter()
        .filter(|h| snapshot.contenders.get(*h).is_some_and(relays))
        .count();
    // With the heir, consem holds `held_by_queueing + 1` slots: within its
    // share of `limit` while that times all live contenders is at most the
    // consem contenders times `limit`.
    let within_share = (held_by_queueing + 1) * live.len() <= queueing * remaining.limit as usize;
    (within_share || latest_racer > first.create_index).then(|| first.name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaa-0000-0000-0000-000000000001";
    const B: &str = "bbbbbbbb-0000-0000-0000-000000000002";
    const C: &str = "cccccccc-0000-0000-0000-000000000003";

    fn contender(session: &str, index: u64) -> Entry {
        Entry {
            name: session.to_string(),
            value: Vec::new(),
            flags: SEMAPHORE_FLAGS,
            session: Some(session.to_string()),
            create_index: index,
            modify_index: index,
        }
    }

    fn lock(value: &str, modify_index: u64) -> Entry {
        Entry {
            name: LOCK_KEY_NAME.to_string(),
            value: value.as_bytes().to_vec(),
            flags: SEMAPHORE_FLAGS,
            session: None,
            create_index: 1,
            modify_index,
        }
    }

    fn snapshot(entries: Vec<Entry>) -> Snapshot {
        Snapshot::from_entries(entries)
    }

    #[test]
    fn decodes_map_list_null_and_missing_holders() {
        let map = decode_lock(br#"{"Limit":2,"Holders":{"a":true,"b":false}}"#).unwrap();
        assert_eq!(map.holders, vec!["a"]);
        assert_eq!(map.leaving, vec!["b"]);
        assert_eq!(map.form, HoldersForm::Map);
        let list = decode_lock(br#"{"Limit":3,"Holders":["a","b","a"]}"#).unwrap();
        assert_eq!(list.holders, vec!["a", "b"]);
        assert_eq!(list.form, HoldersForm::List);
        assert!(decode_lock(br#"{"Limit":1,"Holders":null}"#)
            .unwrap()
            .holders
            .is_empty());
        assert!(decode_lock(br#"{"Limit":1}"#).unwrap().holders.is_empty());
    }

    #[test]
    fn refuses_what_is_not_a_record() {
        for bad in [
            &b"garbage"[..],
            b"\xff\xfe",
            b"[]",
            br#"{"Holders":{}}"#,
            br#"{"Limit":0,"Holders":{}}"#,
            br#"{"Limit":-2,"Holders":{}}"#,
            br#"{"Limit":"2","Holders":{}}"#,
            br#"{"Limit":2,"Holders":{"a":1}}"#,
            br#"{"Limit":2,"Holders":[1]}"#,
            br#"{"Limit":2,"Holders":"a"}"#,
        ] {
            assert!(
                matches!(decode_lock(bad), Err(Conflict::Undecodable(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn encodes_in_the_form_found() {
        let mut record = decode_lock(br#"{"Limit":2,"Holders":["a"]}"#).unwrap();
        record.holders.push("b".into());
        assert_eq!(encode_lock(&record), br#"{"Limit":2,"Holders":["a","b"]}"#);
        let record = LockRecord {
            limit: 2,
            holders: vec!["x".into()],
            leaving: vec!["w".into()],
            form: HoldersForm::Map,
        };
        assert_eq!(
            encode_lock(&record),
            br#"{"Limit":2,"Holders":{"w":false,"x":true}}"#
        );
        assert_eq!(decode_lock(&encode_lock(&record)).unwrap(), record);
        // The list form cannot say that a holder is leaving.
        let list = LockRecord {
            form: HoldersForm::List,
            ..record
        };
        assert_eq!(encode_lock(&list), br#"{"Limit":2,"Holders":["x"]}"#);
    }

    #[test]
    fn takes_a_free_slot_creating_the_lock() {
        let snap = snapshot(vec![contender(A, 5)]);
        assert_eq!(
            decide(&snap, A, 2).unwrap(),
            Decision::Take {
                value: br#"{"Limit":2,"Holders":{"aaaaaaaa-0000-0000-0000-000000000001":true}}"#
                    .to_vec(),
                cas: 0
            }
        );
    }

    #[test]
    fn waits_when_live_holders_fill_the_limit() {
        let value = format!(r#"{{"Limit":2,"Holders":{{"{A}":true,"{B}":true}}}}"#);
        let snap = snapshot(vec![
            lock(&value, 9),
            contender(A, 5),
            contender(B, 6),
            contender(C, 7),
        ]);
        assert_eq!(
            decide(&snap, C, 2).unwrap(),
            Decision::Full {
                holders: vec![A.to_string(), B.to_string()],
                wait_on: WaitOn::Prefix,
            }
        );
    }

    fn relaying(session: &str, index: u64) -> Entry {
        Entry {
            value: format!(r#"{{"Host":"h","{RELAYS_FIELD}":true}}"#).into_bytes(),
            ..contender(session, index)
        }
    }

    #[test]
    fn only_a_waiter_one_departure_could_serve_blocks_on_the_prefix() {
        const D: &str = "dddddddd-0000-0000-0000-000000000004";
        // Limit 1, A holds; B, C and D wait in that order.
        let value = format!(r#"{{"Limit":1,"Holders":{{"{A}":true}}}}"#);
        let queue = |b: Entry, c: Entry| {
            snapshot(vec![lock(&value, 9), relaying(A, 5), b, c, contender(D, 8)])
        };
        let snap = queue(relaying(B, 6), relaying(C, 7));
        let wait_on = |me| match decide(&snap, me, 1).unwrap() {
            Decision::Full { wait_on, .. } => wait_on,
            other => panic!("{other:?}"),
        };
        // B is served by A's departure; C and D need B's turn first.
        assert_eq!(wait_on(B), WaitOn::Prefix);
        assert_eq!(wait_on(C), WaitOn::Key(B.to_string()));
        assert_eq!(wait_on(D), WaitOn::Key(C.to_string()));
        // A waiter that does not queue (`consul lock`) has no place in the
        // queue: D waits on B, the consem waiter just ahead, and would be
        // served by B's departure.
        let snap = queue(relaying(B, 6), contender(C, 7));
        assert!(matches!(
            decide(&snap, D, 1).unwrap(),
            Decision::Full {
                wait_on: WaitOn::Key(ref key),
                ..
            } if key == B
        ));
        let snap = queue(contender(B, 6), contender(C, 7));
        assert!(matches!(
            decide(&snap, D, 1).unwrap(),
            Decision::Full {
                wait_on: WaitOn::Prefix,
                ..
            }
        ));
        // With limit 2 and one holder, B takes and C waits on the prefix.
        let two = format!(r#"{{"Limit":2,"Holders":{{"{A}":true}}}}"#);
        let snap = snapshot(vec![
            lock(&two, 9),
            relaying(A, 5),
            relaying(B, 6),
            relaying(C, 7),
        ]);
        assert!(matches!(
            decide(&snap, B, 2).unwrap(),
            Decision::Take { .. }
        ));
        assert!(matches!(
            decide(&snap, C, 2).unwrap(),
            Decision::Full {
                wait_on: WaitOn::Prefix,
                ..
            }
        ));
    }

    #[test]
    fn knows_who_waits_behind_and_who_relays() {
        let value = format!(r#"{{"Limit":1,"Holders":{{"{A}":true}}}}"#);
        let snap = snapshot(vec![lock(&value, 9), contender(A, 5), contender(B, 6)]);
        let record = snap.lock_record(1).unwrap().unwrap();
        assert!(waiters_behind(&snap, &record, A));
        assert!(!waiters_behind(&snap, &record, B));
        assert!(relays(&relaying(A, 5)));
        assert!(!relays(&contender(A, 5)));
        let mut says_no = relaying(A, 5);
        says_no.value = format!(r#"{{"{RELAYS_FIELD}":"yes"}}"#).into_bytes();
        assert!(!relays(&says_no));
        for value in [r#"{"Relays":false}"#, "[true]", "true", ""] {
            says_no.value = value.as_bytes().to_vec();
            assert!(!relays(&says_no), "{value} promises nothing");
        }
        says_no.value = br#" {"Command":["sh"],"Relays":true,"Pid":7}"#.to_vec();
        assert!(relays(&says_no));
        let held = holding_value(&relaying(A, 5).value, 42);
        assert_eq!(held, br#"{"Holding":42,"Host":"h","Relays":true}"#);
        assert_ne!(holding_value(&held, 43), held);
    }

    #[test]
    fn prunes_dead_holders_to_make_room() {
        // B's key is gone and A's key lost its session: both are dead.
        let value = format!(r#"{{"Limit":2,"Holders":["{A}","{B}"]}}"#);
        let mut released = contender(A, 5);
        released.session = None;
        let snap = snapshot(vec![lock(&value, 9), released, contender(C, 7)]);
        assert_eq!(
            decide(&snap, C, 2).unwrap(),
            Decision::Take {
                value: format!(r#"{{"Limit":2,"Holders":["{C}"]}}"#).into_bytes(),
                cas: 9
            }
        );
    }

    #[test]
    fn slots_go_in_order_of_arrival() {
        // One slot free (limit 2, A holds); B arrived before C.
        let value = format!(r#"{{"Limit":2,"Holders":{{"{A}":true}}}}"#);
        let snap = snapshot(vec![
            lock(&value, 9),
            relaying(A, 5),
            relaying(B, 6),
            relaying(C, 7),
        ]);
        assert!(matches!(
            decide(&snap, C, 2).unwrap(),
            Decision::Full { .. }
        ));
        assert!(matches!(
            decide(&snap, B, 2).unwrap(),
            Decision::Take { .. }
        ));
        // A `consul lock` waiter ahead does not queue, and is not waited for:
        // it would take the slot whenever it sees it free.
        let snap = snapshot(vec![
            lock(&value, 9),
            relaying(A, 5),
            contender(B, 6),
            relaying(C, 7),
        ]);
        assert!(matches!(
            decide(&snap, C, 2).unwrap(),
            Decision::Take { .. }
        ));
        // A waiter ahead whose key is gone (dead) does not hold C up.
        let snap = snapshot(vec![lock(&value, 9), relaying(A, 5), relaying(C, 7)]);
        assert!(matches!(
            decide(&snap, C, 2).unwrap(),
            Decision::Take { .. }
        ));
    }

    #[test]
    fn reports_conflicts_instead_of_writing() {
        let mut foreign = lock(r#"{"Limit":2,"Holders":{}}"#, 3);
        foreign.flags = 0;
        let snap = snapshot(vec![foreign, contender(A, 5)]);
        assert_eq!(decide(&snap, A, 2), Err(Conflict::ForeignFlags(0)));
        let snap = snapshot(vec![
            lock(r#"{"Limit":3,"Holders":{}}"#, 3),
            contender(A, 5),
        ]);
        assert_eq!(
            decide(&snap, A, 2),
            Err(Conflict::LimitMismatch { found: 3, ours: 2 })
        );
        let snap = snapshot(vec![lock("garbage", 3), contender(A, 5)]);
        assert!(matches!(decide(&snap, A, 2), Err(Conflict::Undecodable(_))));
        assert_eq!(plan_release(&snap, A, 2), ReleaseStep::Nothing);
    }

    #[test]
    fn recognises_a_won_cas_and_a_lost_session() {
        let value = format!(r#"{{"Limit":1,"Holders":{{"{A}":true}}}}"#);
        let snap = snapshot(vec![lock(&value, 9), contender(A, 5)]);
        assert_eq!(decide(&snap, A, 1).unwrap(), Decision::Holding);
        let snap = snapshot(vec![lock(&value, 9)]);
        assert_eq!(decide(&snap, A, 1).unwrap(), Decision::SessionLost);
    }

    #[test]
    fn checks_a_held_slot() {
        let value = format!(r#"{{"Limit":2,"Holders":{{"{A}":true}}}}"#);
        assert_eq!(check_lock(Some(&lock(&value, 9)), A, 2), Ok(()));
        let evicted = lock(r#"{"Limit":2,"Holders":{}}"#, 10);
        assert_eq!(check_lock(Some(&evicted), A, 2), Err(Loss::NotInHolders));
        assert_eq!(check_lock(None, A, 2), Err(Loss::LockGone));
        assert!(matches!(
            check_lock(Some(&lock("x", 11)), A, 2),
            Err(Loss::LockChanged(_))
        ));
        assert_eq!(check_key(Some(&contender(A, 5)), A), Ok(()));
        assert_eq!(check_key(None, A), Err(Loss::KeyDeleted));
        let mut released = contender(A, 5);
        released.session = None;
        assert_eq!(check_key(Some(&released), A), Err(Loss::KeyReleased));
        let mut taken = contender(A, 5);
        taken.session = Some(B.to_string());
        assert_eq!(
            check_key(Some(&taken), A),
            Err(Loss::KeyHeldBy(B.to_string()))
        );
        // What is reported says what was seen: a deleted key, and whether our
        // session went with it.
        assert_eq!(
            Loss::KeyDeleted.explain_deleted_key(Some(false)),
            Loss::SessionInvalidated
        );
        assert_eq!(
            Loss::KeyDeleted.explain_deleted_key(Some(true)),
            Loss::KeyDeletedSessionAlive
        );
        assert_eq!(Loss::KeyDeleted.explain_deleted_key(None), Loss::KeyDeleted);
        assert!(Loss::KeyDeletedSessionAlive
            .to_string()
            .contains("session is alive"));
        assert!(!Loss::KeyDeleted.to_string().contains("invalidated"));
    }

    #[test]
    fn release_rewrites_while_others_remain_and_deletes_when_last() {
        let value = format!(r#"{{"Limit":2,"Holders":{{"{A}":true,"{B}":true}}}}"#);
        let both = snapshot(vec![lock(&value, 9), contender(A, 5), contender(B, 6)]);
        // Our key still lives: we leave `.lock` as one on its way out.
        assert_eq!(
            plan_release(&both, A, 2),
            ReleaseStep::Rewrite {
                value: format!(r#"{{"Limit":2,"Holders":{{"{A}":false,"{B}":true}}}}"#)
                    .into_bytes(),
                cas: 9,
                heir: None,
            }
        );
        // Our session (and key) already gone: simply out.
        let gone = snapshot(vec![lock(&value, 9), contender(B, 6)]);
        assert_eq!(
            plan_release(&gone, A, 2),
            ReleaseStep::Rewrite {
                value: format!(r#"{{"Limit":2,"Holders":{{"{B}":true}}}}"#).into_bytes(),
                cas: 9,
                heir: None,
            }
        );
        // B is dead (its key is gone): A is the last one out.
        let last = snapshot(vec![lock(&value, 9), contender(A, 5)]);
        assert_eq!(plan_release(&last, A, 2), ReleaseStep::Delete { cas: 9 });
        // A waiter that never held a slot leaves .lock alone while B holds.
        let holder_b = format!(r#"{{"Limit":2,"Holders":{{"{B}":true}}}}"#);
        let waiting = snapshot(vec![lock(&holder_b, 9), contender(A, 5), contender(B, 6)]);
        assert_eq!(plan_release(&waiting, A, 2), ReleaseStep::Nothing);
        // Another contender that is still waiting keeps .lock in place.
        let only_me = format!(r#"{{"Limit":2,"Holders":{{"{A}":true}}}}"#);
        let queued = snapshot(vec![lock(&only_me, 9), contender(A, 5), contender(C, 7)]);
        assert!(matches!(
            plan_release(&queued, A, 2),
            ReleaseStep::Rewrite { .. }
        ));
        // A key that no session holds is nobody waiting: the last one out
        // deletes .lock, as consul lock does.
        let mut foreign = contender(C, 7);
        foreign.name = "foo".into();
        foreign.session = None;
        let beside_a_value = snapshot(vec![lock(&only_me, 9), contender(A, 5), foreign]);
        assert_eq!(
            plan_release(&beside_a_value, A, 2),
            ReleaseStep::Delete { cas: 9 }
        );
    }

    #[test]
    fn a_leaving_holder_hands_its_slot_to_the_first_consem_waiter() {
        const D: &str = "dddddddd-0000-0000-0000-000000000004";
        let value = format!(r#"{{"Limit":1,"Holders":{{"{A}":true}}}}"#);
        let heir_of = |entries: Vec<Entry>| match plan_release(&snapshot(entries), A, 1) {
            ReleaseStep::Rewrite { value, heir, .. } => {
                let record = decode_lock(&value).unwrap();
                assert_eq!(record.holders, heir.iter().cloned().collect::<Vec<_>>());
                heir
            }
            other => panic!("{other:?}"),
        };
        // Among consem waiters: the first to arrive, in the same write.
        let heir = heir_of(vec![
            lock(&value, 9),
            relaying(A, 5),
            relaying(C, 7),
            relaying(B, 6),
        ]);
        assert_eq!(heir.as_deref(), Some(B));
        // Beside a `consul lock` waiter that arrived later than it.
        let heir = heir_of(vec![
            lock(&value, 9),
            relaying(A, 5),
            relaying(B, 6),
            contender(C, 7),
        ]);
        assert_eq!(heir.as_deref(), Some(B));
        // One `consul lock` waiter later than it is enough, though another
        // arrived first: that one does not queue either.
        let heir = heir_of(vec![
            lock(&value, 9),
            relaying(A, 5),
            contender(B, 6),
            relaying(C, 7),
            contender(D, 8),
        ]);
        assert_eq!(heir.as_deref(), Some(C));
        // Every `consul lock` waiter arrived first, and consem holds its
        // share (one slot of one for two of four contenders): the slot is
        // theirs to race for.
        let heir = heir_of(vec![
            lock(&value, 9),
            relaying(A, 5),
            contender(B, 6),
            contender(C, 7),
            relaying(D, 8),
        ]);
        assert_eq!(heir, None);
        // Within its share consem keeps the slot, whoever arrived first: two
        // slots, a `consul lock` holder E, and consem three of five.
        const E: &str = "eeeeeeee-0000-0000-0000-000000000005";
        let two = format!(r#"{{"Limit":2,"Holders":{{"{A}":true,"{E}":true}}}}"#);
        let entries = vec![
            lock(&two, 9),
            relaying(A, 5),
            contender(E, 4),
            contender(B, 6),
            relaying(C, 7),
            relaying(D, 8),
        ];
        assert!(matches!(
            plan_release(&snapshot(entries), A, 2),
            ReleaseStep::Rewrite { heir: Some(ref heir), .. } if heir == C
        ));
        // ... and not beyond it: consem two of five, holding one slot of two.
        let entries = vec![
            lock(&two, 9),
            relaying(A, 5),
            contender(E, 4),
            contender(B, 6),
            contender(D, 7),
            relaying(C, 8),
        ];
        assert!(matches!(
            plan_release(&snapshot(entries), A, 2),
            ReleaseStep::Rewrite { heir: None, .. }
        ));
        // Nobody consem waits: nothing to hand over.
        let heir = heir_of(vec![lock(&value, 9), relaying(A, 5), contender(B, 6)]);
        assert_eq!(heir, None);
        // A consem contender that already holds is no heir; the slots are full.
        let two = format!(r#"{{"Limit":2,"Holders":{{"{A}":true,"{B}":true}}}}"#);
        let snap = snapshot(vec![lock(&two, 9), relaying(A, 5), relaying(B, 6)]);
        assert!(matches!(
            plan_release(&snap, A, 2),
            ReleaseStep::Rewrite { heir: None, .. }
        ));
        // A holder whose session is gone still hands on the slot it leaves.
        let snap = snapshot(vec![lock(&two, 9), relaying(B, 6), relaying(C, 7)]);
        assert!(matches!(
            plan_release(&snap, A, 2),
            ReleaseStep::Rewrite { heir: Some(ref heir), .. } if heir == C
        ));
        // One taken out of .lock already has nothing to hand on.
        let b_only = format!(r#"{{"Limit":2,"Holders":{{"{B}":true}}}}"#);
        let snap = snapshot(vec![lock(&b_only, 9), relaying(B, 6), relaying(C, 7)]);
        assert_eq!(plan_release(&snap, A, 2), ReleaseStep::Nothing);
    }

    /// A holder hands its slot on before its session ends (and its key with
    /// it). An heir that leaves in that moment must not take the leaving
    /// holder for the first waiter and hand the slot back: the session
    /// would end, and `.lock` name a dead holder.
    #[test]
    fn a_holder_on_its_way_out_is_no_waiter() {
        const D: &str = "dddddddd-0000-0000-0000-000000000004";
        // A handed its slot to B, its key still live.
        let value = format!(r#"{{"Limit":1,"Holders":{{"{A}":true}}}}"#);
        let handing = snapshot(vec![lock(&value, 9), relaying(A, 5), relaying(B, 6)]);
        let ReleaseStep::Rewrite { value, heir, .. } = plan_release(&handing, A, 1) else {
            panic!("a hand-off");
        };
        assert_eq!(heir.as_deref(), Some(B));
        let handed = String::from_utf8(value).unwrap();
        assert_eq!(
            handed,
            format!(r#"{{"Limit":1,"Holders":{{"{A}":false,"{B}":true}}}}"#)
        );
        // B leaves at once: with C waiting, C is its heir, and A stays
        // marked while its key lives.
        let window = |extra: Vec<Entry>| {
            let mut entries = vec![lock(&handed, 10), relaying(A, 5), relaying(B, 6)];
            entries.extend(extra);
            snapshot(entries)
        };
        assert_eq!(
            plan_release(&window(vec![relaying(C, 7)]), B, 1),
            ReleaseStep::Rewrite {
                value: format!(r#"{{"Limit":1,"Holders":{{"{A}":false,"{B}":false,"{C}":true}}}}"#)
                    .into_bytes(),
                cas: 10,
                heir: Some(C.to_string()),
            }
        );
        // Without C, B is the last one out: it deletes `.lock`.
        assert_eq!(
            plan_release(&window(vec![]), B, 1),
            ReleaseStep::Delete { cas: 10 }
        );
        // A waiter does not count A ahead of it, nor block on its key.
        let snap = window(vec![relaying(C, 7), relaying(D, 8)]);
        assert_eq!(
            waiters_ahead(
                &snap,
                &prune(&snap.lock_record(1).unwrap().unwrap(), &snap),
                C
            ),
            0
        );
        assert_eq!(
            decide(&snap, D, 1).unwrap(),
            Decision::Full {
                holders: vec![B.to_string()],
                wait_on: WaitOn::Key(C.to_string()),
            }
        );
        // Once A's key is gone, the next write drops its name.
        let after = snapshot(vec![lock(&handed, 10), relaying(B, 6), relaying(C, 7)]);
        let ReleaseStep::Rewrite { value, .. } = plan_release(&after, B, 1) else {
            panic!("a hand-off");
        };
        assert_eq!(
            value,
            format!(r#"{{"Limit":1,"Holders":{{"{B}":false,"{C}":true}}}}"#).into_bytes()
        );
    }

    #[test]
    fn a_hand_off_wakes_the_waiter_that_sleeps_on_the_heirs_key() {
        let value = format!(r#"{{"Limit":1,"Holders":{{"{A}":true}}}}"#);
        let mut heir = relaying(B, 6);
        heir.modify_index = 8;
        let snap = snapshot(vec![lock(&value, 9), relaying(A, 5), heir]);
        // B's key, rewritten on the index the listing showed (a CAS keeps
        // B's session), with what it said kept.
        let wake = wake_behind_heir(&snap, B, 9).unwrap();
        assert_eq!((wake.name.as_str(), wake.cas), (B, 8));
        let written: Value = serde_json::from_slice(&wake.value).unwrap();
        assert_eq!(written["Host"], "h");
        assert_eq!(written[RELAYS_FIELD], true);
        assert_eq!(written[HANDED_FIELD], 9);
        assert_eq!(wake_behind_heir(&snap, C, 9), None);
    }

    #[test]
    fn a_hand_off_decides_on_the_listing_that_confirmed_the_slot() {
        const D: &str = "dddddddd-0000-0000-0000-000000000004";
        // A took its slot beside holder B, with C and D waiting.
        let then = format!(r#"{{"Limit":2,"Holders":{{"{A}":true,"{B}":true}}}}"#);
        let known = snapshot(vec![
            lock(&then, 9),
            relaying(A, 5),
            relaying(B, 4),
            relaying(C, 6),
            relaying(D, 7),
        ]);
        // Since, B left and handed its slot to C; A leaves now.
        let now = format!(r#"{{"Limit":2,"Holders":{{"{A}":true,"{C}":true}}}}"#);
        let snap = known_with_lock(&known, lock(&now, 12), 2).unwrap();
        assert_eq!(snap.lock.as_ref().map(|l| l.modify_index), Some(12));
        // B, named then and not now, is gone or on its way out: no waiter.
        assert!(!snap.contenders.contains_key(B));
        let ReleaseStep::Rewrite { heir, cas, .. } = plan_release(&snap, A, 2) else {
            panic!("a rewrite");
        };
        assert_eq!((heir.as_deref(), cas), (Some(D), 12));
    }

    #[test]
    fn a_listing_that_cannot_tell_the_heir_is_read_again() {
        let held = format!(r#"{{"Limit":1,"Holders":{{"{A}":true}}}}"#);
        // A `consul lock` waiter: the share rule weighs every contender.
        let racer = snapshot(vec![lock(&held, 9), relaying(A, 5), contender(B, 6)]);
        assert_eq!(known_with_lock(&racer, lock(&held, 9), 1), None);
        // A key its session did not hold (released by hand) may be taken
        // again with its old place, ahead of the listing's waiters.
        let mut released = relaying(B, 6);
        released.session = None;
        let stale = snapshot(vec![
            lock(&held, 9),
            relaying(A, 5),
            released,
            relaying(C, 7),
        ]);
        assert_eq!(known_with_lock(&stale, lock(&held, 9), 1), None);
    }

    #[test]
    fn more_live_holders_than_the_limit_is_a_conflict() {
        let value = format!(r#"{{"Limit":1,"Holders":{{"{A}":true,"{B}":true}}}}"#);
        let snap = snapshot(vec![
            lock(&value, 9),
            relaying(A, 5),
            relaying(B, 6),
            relaying(C, 7),
        ]);
        let over = Conflict::OverLimit { live: 2, limit: 1 };
        assert_eq!(decide(&snap, C, 1), Err(over.clone()));
        // Even for one of those holders: the command must not start.
        assert_eq!(decide(&snap, A, 1), Err(over.clone()));
        assert!(over.to_string().contains("2 live holders"));
        // Dead holders do not count.
        let snap = snapshot(vec![lock(&value, 9), relaying(A, 5), relaying(C, 7)]);
        assert!(matches!(decide(&snap, C, 1), Ok(Decision::Full { .. })));
    }

    #[test]
    fn ignores_nested_keys() {
        let mut nested = contender(B, 6);
        nested.name = format!("sub/{B}");
        let snap = snapshot(vec![contender(A, 5), nested]);
        assert_eq!(snap.contenders.len(), 1);
    }
}
