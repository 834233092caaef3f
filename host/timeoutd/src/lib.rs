//! timeoutd, the order-timeout daemon.
//!
//! Orders are created PENDING with a payment deadline. When it lapses, timeoutd asks the
//! merchant's policy plugin (a WebAssembly component, see the `timeoutd-runtime` crate) what to
//! do and carries out the answer exactly once: one compare-and-set PENDING→CLOSED in one
//! transaction with the stock and coupon changes and an effect ledger.
//!
//! Parts, one module each (their layers, the path of a trigger and where each rule lives:
//! `ARCHITECTURE.md` at the repository root): [`config`] (the file and its validation), [`db`] (schema and
//! queries per table), [`clock`] (the only place time is read), [`policies`] (plugins per
//! merchant), [`dispatch`] (trigger → decision → transaction), [`effects`] (carrying out ledger
//! rows: notices, Redis, payments), [`http`] (payment callbacks), [`sources`] (outbox timer, sweep), [`shutdown`] (how loops wait), [`daemon`] (wiring), [`shards`] (one process over a sharded order database), [`rocketmq`] (the RocketMQ transport), [`demo`], [`cli`] and [`plugin_cli`] (`timeoutd plugin check|test|replay`).

#![warn(missing_docs)]
#![recursion_limit = "256"]

pub mod admin;
pub mod alerts;
pub mod bench;
pub mod build_info;
pub mod bulk;
pub mod cli;
pub mod clock;
pub mod config;
pub mod context;
pub mod daemon;
pub mod db;
pub mod demo;
pub mod dispatch;
pub mod doctor;
pub mod effects;
pub mod events;
pub mod gauges;
pub mod http;
pub mod kinds;
pub mod lateness;
pub mod lease;
pub mod outbound;
pub mod paid;
pub mod plugin_cli;
pub mod policies;
pub mod ratecap;
pub mod retention;
/// The backoff rule and the default retry settings (shared with the plugin harness).
pub use timeoutd_runtime::retry;
pub mod rocketmq;
pub mod shadow;
pub mod shards;
pub mod shutdown;
pub mod sources;
pub mod stock_fold;
pub mod telemetry;
