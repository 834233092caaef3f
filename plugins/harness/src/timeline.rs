//! A plugin played along an order's life the way the daemon plays it.
//!
//! The daemon asks phase 0 of a 0.1.0 plugin at the order's deadline; a 0.2.0 plugin is asked
//! as soon as the daemon sees the order (here: at its creation), and any trigger before the
//! deadline that it answers with a `cancel` or an `ignore` is held until the deadline and asked
//! again then (a 0.1.0 plugin is never asked before the deadline). A `wait` schedules its
//! `next-phase` `after-ms` later (attempt 0), handing its state to it; an `ignore` or a failure
//! at or after the deadline asks the same phase again with the attempt counted up, after the
//! default `[dispatch]` backoff (1 s doubling to 5 min, at most 8 attempts, then the trigger is
//! dead-lettered); a `cancel` within the order closes it; a decision the guard refuses
//! (effects exceeding the order, kinds the plugin did not declare, a wait that does not move
//! on, an oversized state) is dead-lettered. After a close, refusal or dead letter nothing more
//! is asked.

use std::time::Duration;

use timeoutd_runtime::guard;
use timeoutd_runtime::model::{Decision, Order, OrderStatus, TriggerKind};

use crate::decided::human_offset;
use crate::{Decided, Harness, context, ms};

// Attempts of one trigger before the daemon dead-letters it, and its backoff: the daemon's own
// defaults (`dispatch.max_attempts`, `retry_initial`, `retry_max`), from the one place both read.
use timeoutd_runtime::retry::{DISPATCH_BACKOFF, DISPATCH_MAX_ATTEMPTS as MAX_ATTEMPTS};

/// One trigger the timeline fired.
#[derive(Debug)]
pub struct Step {
    /// When it fired, ms after the order's creation.
    pub at_ms: i64,
    /// The call and its answer (its context has the phase, attempt and trigger).
    pub decided: Decided,
}

/// Where the order stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// A trigger for `phase` is due at `due_ms` (epoch ms), with the state its wait handed on.
    Due {
        phase: u32,
        attempt: u32,
        due_ms: i64,
        state: Vec<u8>,
    },
    /// Closed by a cancel.
    Closed,
    /// Refused or dead-lettered: left for an operator.
    Stuck(String),
}

/// An order's timeline under a plugin; see the module documentation for the rules.
#[derive(Debug)]
pub struct Timeline<'h> {
    harness: &'h Harness,
    order: Order,
    trigger: TriggerKind,
    state: State,
    now_ms: i64,
}

impl<'h> Timeline<'h> {
    pub(crate) fn new(harness: &'h Harness, order: Order) -> Self {
        let now_ms = order.created_at_ms;
        let due_ms = if harness.plugin().asks_before_deadline() {
            now_ms
        } else {
            order.deadline_ms
        };
        Timeline {
            harness,
            order,
            trigger: TriggerKind::Outbox,
            state: State::Due {
                phase: 0,
                attempt: 0,
                due_ms,
                state: Vec::new(),
            },
            now_ms,
        }
    }

    /// The trigger kind every call is made with (default `outbox`).
    pub fn trigger(mut self, trigger: TriggerKind) -> Self {
        self.trigger = trigger;
        self
    }

    /// Moves the clock to `after_creation` past the order's creation and fires every trigger
    /// due by then, each at its due time, in order. Returns the steps fired (none when nothing
    /// was due: a 0.1.0 plugin is not asked before the deadline).
    ///
    /// # Panics
    /// When `after_creation` is earlier than the timeline's clock.
    #[track_caller]
    pub fn advance_to(&mut self, after_creation: Duration) -> Vec<Step> {
        let target = self.order.created_at_ms + ms(after_creation);
        assert!(
            target >= self.now_ms,
            "timeline for order `{}` is at created + {}; it cannot go back to created + {}",
            self.order.id,
            human_offset(self.now_ms - self.order.created_at_ms),
            human_offset(target - self.order.created_at_ms)
        );
        let mut steps = Vec::new();
        while let State::Due { due_ms, .. } = self.state {
            if due_ms > target {
                break;
            }
            steps.push(self.fire());
        }
        self.now_ms = target;
        steps
    }

    /// Fires triggers until the order is closed or left for an operator, at most `max_steps`.
    /// Returns every step.
    ///
    /// # Panics
    /// When the order is still open after `max_steps` triggers (the plugin never closes it).
    #[track_caller]
    pub fn run_to_end(&mut self, max_steps: usize) -> Vec<Step> {
        let mut steps = Vec::new();
        while matches!(self.state, State::Due { .. }) {
            assert!(
                steps.len() < max_steps,
                "order `{}` still open after {max_steps} triggers; last: {}",
                self.order.id,
                steps
                    .last()
                    .map_or("none".into(), |s: &Step| s.decided.describe())
            );
            steps.push(self.fire());
        }
        steps
    }

    /// Whether a cancel closed the order.
    pub fn closed(&self) -> bool {
        self.state == State::Closed
    }

    /// Why the order was left for an operator (a refused decision or exhausted retries).
    pub fn stuck(&self) -> Option<&str> {
        match &self.state {
            State::Stuck(reason) => Some(reason),
            _ => None,
        }
    }

    /// When the next trigger is due, ms after creation, and for which phase.
    pub fn next_due(&self) -> Option<(i64, u32)> {
        match self.state {
            State::Due { phase, due_ms, .. } => Some((due_ms - self.order.created_at_ms, phase)),
            _ => None,
        }
    }

    fn fire(&mut self) -> Step {
        let State::Due {
            phase,
            attempt,
            due_ms,
            state,
        } = std::mem::replace(&mut self.state, State::Closed)
        else {
            unreachable!("fire is only called with a trigger due")
        };
        self.now_ms = due_ms;
        let mut ctx = context()
            .now_ms(due_ms)
            .trigger(self.trigger)
            .phase(phase)
            .attempt(attempt)
            .settings(self.harness.settings())
            .build();
        ctx.state = state.clone();
        let decided = self.harness.decide_with(&self.order, &ctx);
        let early = due_ms < self.order.deadline_ms;
        let plugin = self.harness.plugin();
        let review = guard::Review {
            order: &self.order,
            phase,
            now_ms: due_ms,
            granted: None,
            manifest: plugin.manifest(),
        };
        let retry = |why: String| {
            let attempts = attempt + 1;
            if attempts >= MAX_ATTEMPTS {
                State::Stuck(format!("gave up after {attempts} attempt(s): {why}"))
            } else {
                let delay = DISPATCH_BACKOFF.delay_ms(attempts);
                State::Due {
                    phase,
                    attempt: attempts,
                    due_ms: due_ms + delay,
                    state: state.clone(),
                }
            }
        };
        let held = State::Due {
            phase,
            attempt,
            due_ms: self.order.deadline_ms,
            state: state.clone(),
        };
        self.state = match &decided.result {
            Err(e) => retry(e.to_string()),
            // Before the deadline only a wait goes ahead; the rest is asked again at it.
            Ok(Decision::Ignore { .. } | Decision::Cancel { .. }) if early => held,
            Ok(Decision::Ignore { reason }) => retry(format!("ignored: {reason}")),
            Ok(d) => match guard::review(d, review) {
                Err(problems) => State::Stuck(format!("refused: {}", problems.join("; "))),
                Ok(()) => match d {
                    Decision::Wait {
                        after_ms,
                        next_phase,
                        state,
                        ..
                    } => State::Due {
                        phase: *next_phase,
                        attempt: 0,
                        due_ms: due_ms.saturating_add(i64::try_from(*after_ms).unwrap_or(i64::MAX)),
                        state: state.clone(),
                    },
                    _ => {
                        self.order.status = OrderStatus::Closed;
                        State::Closed
                    }
                },
            },
        };
        Step {
            at_ms: due_ms - self.order.created_at_ms,
            decided,
        }
    }
}
