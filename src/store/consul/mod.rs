//! The Consul store: Consul's semaphore recipe, in the layout `consul lock
//! -n N` writes, over Consul's HTTP API.

pub mod admin;
pub mod client;
pub mod contender;
pub mod recipe;
pub mod semaphore;

pub use client::Client;

use std::sync::Arc;
use std::time::Duration;

use super::kind::{Lease, Store, StoreSettings};
use super::{Admin, ContenderInfo, SlotBackend, StoreError};
use client::ConsulConfig;

/// The highest limit: 1024 holders in map form take about 45 KiB of
/// `.lock`, a tenth of Consul's 512 KiB value limit. Consul accepts session
/// TTLs of 10 s to 24 h.
pub const STORE: Store = Store {
    name: "consul",
    title: "Consul",
    schemes: &[],
    largest_limit: semaphore::MAX_LIMIT,
    lease: Some(Lease {
        shortest: Duration::from_secs(10),
        longest: Duration::from_secs(86_400),
        default_ttl: Duration::from_secs(15),
    }),
    frees_slot_at_death: false,
};

/// What the Consul store needs beyond the store-neutral options.
#[derive(Debug, Clone)]
pub struct Settings {
    pub connection: ConsulConfig,
    pub ttl: Duration,
    /// Failed attempts in a row a holder bears; `None`: as many as fit in
    /// its lease.
    pub monitor_retry: Option<u32>,
    pub session_name: String,
}

impl StoreSettings for Settings {
    fn open_run(
        &self,
        prefix: &str,
        limit: u32,
        info: ContenderInfo,
    ) -> Result<Arc<dyn SlotBackend>, StoreError> {
        let client = Client::new(self.connection.clone())?;
        if !self.connection.tls.verify && self.connection.address.https {
            crate::report::warning(
                "CONSUL_HTTP_SSL_VERIFY=false: the agent's certificate is not checked, so anyone on the path can pose as Consul",
            );
        }
        Ok(Arc::new(recipe::ConsulSemaphore::new(
            client,
            recipe::Settings {
                prefix: prefix.to_string(),
                limit,
                ttl: self.ttl,
                session_name: self.session_name.clone(),
                contender_value: recipe::contender_value(&info),
                monitor_retry: self.monitor_retry,
            },
        )))
    }

    fn open_admin(&self, prefix: &str) -> Result<Box<dyn Admin>, StoreError> {
        let client = Client::new(self.connection.clone())?;
        Ok(Box::new(admin::ConsulAdmin::new(
            client,
            prefix.to_string(),
        )))
    }
}
