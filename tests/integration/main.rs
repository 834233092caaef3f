//! timeoutd's integration tests. See `tests/README.md` for what each module needs.

mod admin;
mod alipay;
mod chaos;
mod config;
mod e2e;
mod edges;
mod effects;
mod engines;
mod fakes;
mod group;
mod input;
mod leases;
mod payments;
mod pipeline;
mod plugin_cli;
mod policy_api;
mod polyglot;
mod prefetch;
mod redis_server;
mod retention;
mod rocketmq;
mod runtime;
mod shards;
mod skew;
mod stripe;
mod support;
