//! The registry of stores: every store consem knows, in the order messages
//! list them, each as its folder describes it (`store::<name>::STORE`)
//! together with how the command line speaks of it and the module that
//! turns its flags and environment into its settings. Adding a store is an
//! entry here (see docs/design.md, "Adding a store").

use crate::store::kind::Store;
use crate::store::{consul, etcd, local, redis};

use super::Configure;

/// The store when neither `--store` nor `CONSEM_STORE` chooses one.
pub const DEFAULT_STORE: &str = "consul";

#[derive(Debug)]
pub struct Entry {
    pub store: &'static Store,
    /// How `--store` is written to choose it, for messages.
    pub written: &'static [&'static str],
    /// Its own options: any other store refuses them.
    pub options: &'static [&'static str],
    /// Run options of other stores that do not apply to it either, and
    /// why: "… does not apply to the local store, which {because}" (empty
    /// where it refuses none).
    pub refuses: &'static [&'static str],
    pub because: &'static str,
    /// What bounds its limit and its TTLs, in the words of "--limit N is
    /// more than {limit_bound_by}" and "--ttl T is outside what
    /// {ttl_bound_by}" (the latter empty for a store without leases).
    pub limit_bound_by: &'static str,
    pub ttl_bound_by: &'static str,
    pub configure: Configure,
}

pub static STORES: &[Entry] = &[
    Entry {
        store: &consul::STORE,
        written: &["consul"],
        options: &[
            "--http-addr",
            "--token",
            "--token-file",
            "--datacenter",
            "--namespace",
            "--partition",
            "--ca-file",
            "--ca-path",
            "--client-cert",
            "--client-key",
            "--tls-server-name",
        ],
        refuses: &[],
        because: "",
        limit_bound_by: "the Consul store holds in .lock",
        ttl_bound_by: "Consul accepts",
        configure: super::consul::configure,
    },
    Entry {
        store: &local::STORE,
        written: &["local", "local:DIR"],
        options: &[],
        refuses: &["--ttl", "--monitor-retry", "--name"],
        because: "holds a slot with a kernel lock that ends with consem",
        limit_bound_by: "the local store keeps",
        ttl_bound_by: "",
        configure: super::local::configure,
    },
    Entry {
        store: &redis::STORE,
        written: &["redis://host:port"],
        options: &[
            "--redis-allow-eviction",
            "--redis-wait-replicas",
            "--cacert",
            "--cert",
            "--key",
        ],
        refuses: &["--name"],
        because: "keeps no sessions",
        limit_bound_by: "the Redis store keeps",
        ttl_bound_by: "the Redis store takes",
        configure: super::redis::configure,
    },
    Entry {
        store: &etcd::STORE,
        written: &["etcd://host:port"],
        options: &["--user", "--password", "--cacert", "--cert", "--key"],
        refuses: &["--name"],
        because: "names a contender by its lease",
        limit_bound_by: "the etcd store keeps",
        ttl_bound_by: "the etcd store takes",
        configure: super::etcd::configure,
    },
];

impl Entry {
    /// How a message names `--store` when it chose this store: by its
    /// scheme where it has an address (`redis://`), else by its name.
    pub fn shown(&self) -> &'static str {
        self.store
            .schemes
            .iter()
            .copied()
            .find(|scheme| scheme.ends_with("://"))
            .unwrap_or(self.store.name)
    }
}

/// The store a `--store` text (trimmed) chooses.
pub fn chosen_by(text: &str) -> Option<&'static Entry> {
    STORES.iter().find(|entry| entry.store.chosen_by(text))
}

/// How `--store` may be written: "consul, local, …, redis://host:port or
/// etcd://host:port".
pub fn every_way_to_write() -> String {
    let ways: Vec<&str> = STORES
        .iter()
        .flat_map(|entry| entry.written)
        .copied()
        .collect();
    match ways.split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}
