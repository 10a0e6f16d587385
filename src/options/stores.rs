//! The registry of stores: every store consem knows, in the order messages
//! list them, each as its folder describes it (`store::<name>::STORE`)
//! together with how the command line speaks of it and the module that
//! turns its flags and environment into its settings. Adding a store is an
//! entry here (see docs/design.md, "Adding a store").

use crate::store::kind::Store;
use crate::store::{consul, etcd, local, postgres, redis, zookeeper};

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
    /// Run options of other stores (in [`SOME_STORES_OPTIONS`]) that do
    /// not apply to it.
    pub refuses: &'static [&'static str],
    /// What its slot is, in the words of "the local store's slot is
    /// {slot_is}": why an option of others does not apply to it.
    pub slot_is: &'static str,
    /// Why a prefix with an empty, `.` or `..` segment is refused, in the
    /// words of "--prefix 'a//b' has an empty, '.' or '..' segment, {…}":
    /// every store refuses it, so that a prefix is a path of names
    /// wherever it is used.
    pub segments_refused: &'static str,
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
        slot_is: "a contender key held by a session, which the session's TTL keeps",
        segments_refused: "which Consul's HTTP API cannot address (it redirects such a path to a cleaned one)",
        limit_bound_by: "the Consul store holds in .lock",
        ttl_bound_by: "Consul accepts",
        configure: super::consul::configure,
    },
    Entry {
        store: &local::STORE,
        written: &["local", "local:DIR"],
        options: &[],
        refuses: &["--ttl", "--monitor-retry", "--name"],
        slot_is: "a kernel lock, which lasts as long as consem lives, with no lease to renew and no session to name",
        segments_refused: "which the local store does not take (a prefix is a path of names, the same on every store)",
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
        slot_is: "a permit with a lease, and no session to name",
        segments_refused: "which the Redis store does not take (a prefix is a path of names, the same on every store)",
        limit_bound_by: "the Redis store keeps",
        ttl_bound_by: "the Redis store takes",
        configure: super::redis::configure,
    },
    Entry {
        store: &etcd::STORE,
        written: &["etcd://host:port"],
        options: &["--user", "--password", "--cacert", "--cert", "--key"],
        refuses: &["--name"],
        slot_is: "a key on a lease, and no session to name",
        segments_refused: "which the etcd store does not take (a prefix is a path of names, the same on every store)",
        limit_bound_by: "the etcd store keeps",
        ttl_bound_by: "the etcd store takes",
        configure: super::etcd::configure,
    },
    Entry {
        store: &postgres::STORE,
        written: &["postgres://user@host:port/database"],
        options: &[],
        refuses: &["--name", "--monitor-retry"],
        slot_is: "an advisory lock of a database session, which ends with the connection: a renewal that fails cannot be tried again, and the session has no name",
        segments_refused: "which the PostgreSQL store does not take (a prefix is a path of names, the same on every store)",
        limit_bound_by: "the PostgreSQL store keeps",
        ttl_bound_by: "the PostgreSQL store takes",
        configure: super::postgres::configure,
    },
    Entry {
        store: &zookeeper::STORE,
        written: &["zk://host:port[/chroot]"],
        options: &["--user", "--password", "--cacert", "--cert", "--key"],
        refuses: &["--name", "--monitor-retry"],
        slot_is: "a lease node of a ZooKeeper session, which the session's pings keep",
        segments_refused: "which ZooKeeper's paths do not take",
        limit_bound_by: "the ZooKeeper store keeps",
        ttl_bound_by: "the ZooKeeper store takes (the server bounds it further)",
        configure: super::zookeeper::configure,
    },
];

/// Run options that not every store takes, and what they are for, in the
/// words of "--ttl applies to Consul, Redis and etcd, {what for}": the
/// stores that take one are those that do not refuse it.
pub static SOME_STORES_OPTIONS: &[(&str, &str)] = &[
    ("--ttl", "whose slots are leases"),
    ("--monitor-retry", "whose holders renew their slots' leases"),
    ("--name", "whose slots are held by named sessions"),
];

/// Options that mean the same on different stores, each group under the
/// names the stores' own tools give them (etcdctl's, Consul's).
static SAME_MEANING: &[&[&str]] = &[
    &["--cacert", "--ca-file"],
    &["--cert", "--client-cert"],
    &["--key", "--client-key"],
];

impl Entry {
    /// This store's name for what another store's `option` means.
    pub fn same_as(&self, option: &str) -> Option<&'static str> {
        SAME_MEANING
            .iter()
            .filter(|group| group.contains(&option))
            .flat_map(|group| group.iter())
            .find(|name| self.options.contains(name))
            .copied()
    }

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
    listed(&ways, "or")
}

/// The largest limit any store takes.
pub fn largest_limit() -> u32 {
    STORES
        .iter()
        .map(|entry| entry.store.largest_limit)
        .max()
        .unwrap_or(1)
}

/// The way to write a store nearest to `text`, which chooses none: by the
/// name before `:` (`lcoal`: `local`; `redis`: `redis://host:port`),
/// within two letters' edits.
pub fn nearest_way_to_write(text: &str) -> Option<&'static str> {
    let name = |way: &str| {
        way.split(':')
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase()
    };
    let given = name(text);
    STORES
        .iter()
        .flat_map(|entry| entry.written)
        .map(|way| (strsim::levenshtein(&given, &name(way)), *way))
        .filter(|(distance, _)| *distance <= 2)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, way)| way)
}

/// `items` as a sentence lists them: "a", "a and b", "a, b and c" (`last`
/// the word before the last).
pub fn listed(items: &[&str], last: &str) -> String {
    match items.split_last() {
        Some((only, [])) => only.to_string(),
        Some((final_one, rest)) => format!("{} {last} {final_one}", rest.join(", ")),
        None => String::new(),
    }
}
