//! What one daemon's sources and workers share, built once by [`crate::daemon`] and handed to
//! each of them (Vector's `SourceContext` and Spin's factors are the models): the database, the
//! clock, the merchants' policies, the dispatcher, the outbox timer's waker and the shutdown
//! signal. A part that takes a [`Context`] cannot be started on another database, clock or
//! plugin set than its neighbours.

use std::sync::Arc;

use tokio::sync::{Notify, watch};

use crate::clock::Clock;
use crate::db::Db;
use crate::dispatch::Dispatcher;
use crate::policies::Policies;

/// The parts of one daemon every source and worker reads. Cloning is cheap (handles only).
#[derive(Clone)]
pub struct Context {
    /// The order database (one shard's, in a sharded process).
    pub db: Db,
    /// Where time is read: the database clock in the daemon, a manual one in tests.
    pub clock: Clock,
    /// The merchants' plugins and their breakers.
    pub policies: Arc<Policies>,
    /// From a trigger to its committed outcome.
    pub dispatcher: Arc<Dispatcher>,
    /// Wakes the outbox timer when this process wrote a row that may be due soon.
    pub waker: Arc<Notify>,
    /// Turns true when the daemon stops ([`crate::shutdown`]).
    pub shutdown: watch::Receiver<bool>,
}
