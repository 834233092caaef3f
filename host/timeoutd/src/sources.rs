//! Timeout triggers. Every source turns "look at order O, phase P" into a
//! [`crate::dispatch::Trigger`] for the one dispatcher.
//!
//! - [`outbox`]: the outbox timer over `order_timeout_msg`, sleeping until the next due row;
//! - [`prefetch`]: the outbox timer's rows due soon, claimed and loaded ahead, released when
//!   due;
//! - [`sweep`]: the backstop that re-arms overdue open orders whose triggers were lost.

pub mod outbox;
pub mod prefetch;
pub mod sweep;
