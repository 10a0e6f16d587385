//! The integration tests: one crate, so that the helpers in `common` are
//! compiled once, with a module per subject (Cargo.toml sets `autotests =
//! false`: a new file in tests/ is a module declared here, not a crate of
//! its own). Most modules run the real `consem` binary against a store;
//! `properties`, `simulation`, `double_order` and `generated_docs` also
//! call the library.

mod common;

mod admin;
mod chaos;
mod conformance;
mod docs;
mod double_behaviour;
mod double_order;
mod double_replay;
mod double_tls_acl;
mod etcd_store;
mod generated_docs;
mod hostile_server;
mod lifecycle;
mod local_store;
mod manifest;
mod package;
mod postgres_store;
mod progress;
mod properties;
mod redis_cluster;
mod redis_sentinel;
mod redis_store;
mod run;
mod security;
mod simulation;
mod unix_citizen;
mod zookeeper_store;
