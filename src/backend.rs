//! The seam between the command line and child supervision on one side and a
//! semaphore store on the other. Consul is the first store; others (Redis, a
//! local one) implement the same small interface.

use std::sync::Arc;

/// What the backend reports from its helper threads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotEvent {
    /// A slot is held; `fence` grows from one acquisition to the next.
    Acquired { fence: u64 },
    /// `--try` found every slot taken.
    NoSlot,
    /// Every slot is taken; this is who holds them (sent when it changes).
    Waiting(Progress),
    /// A held slot is no longer ours; the child must stop.
    Lost(String),
    /// The backend cannot go on.
    Failed(BackendError),
}

/// What a waiter can tell about the slots it waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub limit: u32,
    pub holders: Vec<Holder>,
    /// Waiters that arrived before us.
    pub ahead: usize,
}

/// A holder, as far as it describes itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub host: Option<String>,
    pub pid: Option<u64>,
    pub since: Option<std::time::SystemTime>,
}

/// Failures that end a run, each with its own exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendError {
    /// The semaphore's record disagrees with us or is not a semaphore.
    Conflict(String),
    /// The store cannot be reached or keeps failing.
    Unavailable(String),
    /// The store refused us for lack of permission.
    Denied(String),
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendError::Conflict(m) | BackendError::Unavailable(m) | BackendError::Denied(m) => {
                f.write_str(m)
            }
        }
    }
}

/// Where a backend sends its events.
pub type Notify = Arc<dyn Fn(SlotEvent) + Send + Sync>;

/// How long to contend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contend {
    /// Wait until a slot is free (the caller enforces any deadline).
    Wait,
    /// One look: take a free slot or report [`SlotEvent::NoSlot`].
    Try,
}

/// A distributed counting semaphore as the supervisor sees it.
pub trait SlotBackend: Send + Sync {
    /// Starts contending for a slot on helper threads and returns at once.
    /// Reports `Acquired` once, then watches the slot and reports `Lost` if
    /// it goes; or reports `NoSlot` or `Failed`.
    fn contend(self: Arc<Self>, mode: Contend, notify: Notify);

    /// Leaves the semaphore: gives up the slot or the place in the queue and
    /// removes every trace. Stops the helpers' writes first, so that a slot
    /// won while shutting down is released too. Idempotent; returns within
    /// `budget` (plus one request's timeout at worst), even if the store is
    /// down, saying what it could not clean up.
    fn release(&self, budget: std::time::Duration) -> Result<(), String>;

    /// Variables that tell the child about its slot.
    fn child_env(&self) -> Vec<(String, String)>;
}
