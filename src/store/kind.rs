//! What a store says of itself to the layers above it: its name, the
//! `--store` texts that choose it, its rules (the largest limit, its lease,
//! whether a dead consem frees its slot at once), and how its validated
//! settings open it ([`StoreSettings`]). Each store describes itself once,
//! as the `STORE` constant of its folder; `options::stores` lists them.

use std::sync::Arc;
use std::time::Duration;

use super::{Admin, ContenderInfo, SlotBackend, StoreError};

#[derive(Debug)]
pub struct Store {
    /// What `--store` says to choose it.
    pub name: &'static str,
    /// How a sentence names it: "the {title} store".
    pub title: &'static str,
    /// How the `--store` texts that choose it with an address begin
    /// (`redis://`, `local:`), besides its name alone.
    pub schemes: &'static [&'static str],
    pub largest_limit: u32,
    /// `None`: a slot lasts as long as its consem.
    pub lease: Option<Lease>,
    /// Whether a consem that dies frees its slot at once (kernel locks), or
    /// the slot outlives it until its lease runs out: what the watchdog
    /// allows the command once consem is gone.
    pub frees_slot_at_death: bool,
}

/// The TTLs a store's leases may have.
#[derive(Debug)]
pub struct Lease {
    pub shortest: Duration,
    pub longest: Duration,
    pub default_ttl: Duration,
}

/// A limit or a TTL outside a store's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleError {
    LimitAbove {
        limit: u32,
        most: u32,
    },
    TtlOutside {
        ttl: Duration,
        shortest: Duration,
        longest: Duration,
    },
}

impl Store {
    /// Whether `text` (`--store`'s, trimmed) chooses this store.
    pub fn chosen_by(&self, text: &str) -> bool {
        text == self.name || self.schemes.iter().any(|scheme| text.starts_with(scheme))
    }

    pub fn check_limit(&self, limit: u32) -> Result<(), RuleError> {
        if limit > self.largest_limit {
            return Err(RuleError::LimitAbove {
                limit,
                most: self.largest_limit,
            });
        }
        Ok(())
    }

    /// The TTL of a slot's lease, `asked` or the default; `None` for a
    /// store without leases.
    pub fn ttl(&self, asked: Option<Duration>) -> Result<Option<Duration>, RuleError> {
        let Some(lease) = &self.lease else {
            return Ok(None);
        };
        let ttl = asked.unwrap_or(lease.default_ttl);
        if ttl < lease.shortest || ttl > lease.longest {
            return Err(RuleError::TtlOutside {
                ttl,
                shortest: lease.shortest,
                longest: lease.longest,
            });
        }
        Ok(Some(ttl))
    }
}

/// A store's settings, validated: what opens it for a run or for an
/// operator's command.
pub trait StoreSettings: std::fmt::Debug + std::any::Any + Send + Sync {
    /// The backend of one run of `limit` slots at `prefix`, for the
    /// contender `info`.
    fn open_run(
        &self,
        prefix: &str,
        limit: u32,
        info: ContenderInfo,
    ) -> Result<Arc<dyn SlotBackend>, StoreError>;

    /// The operators' side of `prefix`.
    fn open_admin(&self, prefix: &str) -> Result<Box<dyn Admin>, StoreError>;
}
