//! Plugin calls, batched: a group's staged triggers are decided on a few blocking calls, not
//! one each.
//!
//! A decision is about 10 µs of CPU ([`timeoutd_runtime::Plugin::decide`] blocks its thread for
//! at most the plugin's deadline). Handing each call to tokio's blocking pool and back costs
//! two thread wake-ups — about as much again in the kernel's task switch as the call itself
//! (`perf` of the broker path: 47 % of the daemon's samples in the kernel, `finish_task_switch`
//! 19 %). So a group's asks are split into at most one chunk per core, each decided in turn on
//! one blocking call, the chunks side by side under the deciders' semaphore (one per core).

use futures_util::future::join_all;
use std::sync::Arc;
use timeoutd_runtime::DecideError;
use timeoutd_runtime::model::{Context, Decision, Order};

use super::{Dispatcher, Step, Trigger};
use crate::clock::Stopwatch;
use crate::db::DbError;
use crate::policies::MerchantPolicy;

/// Asks fewer than this many to a chunk are not split further: below it, a second blocking
/// call costs more than it saves.
const MIN_PER_CALL: usize = 16;

/// A trigger taken as far as its plugin call ([`Dispatcher::stage`]): what the call needs.
pub(super) struct Asking {
    /// The merchant's plugin, breaker and settings.
    pub policy: Arc<MerchantPolicy>,
    /// The order as loaded.
    pub order: Order,
    /// The call's context (its `now_ms` is the group's one clock read).
    pub ctx: Context,
    /// Asked before the deadline (API 0.2.0 on): only a `wait` goes ahead.
    pub early: bool,
    /// The call's input, JSON, as `decision_log.input`.
    pub input: String,
}

/// How far [`Dispatcher::stage`] took a trigger.
pub(super) enum Staged {
    /// It ended before its plugin was asked.
    Ended(super::Step),
    /// Its plugin is to be asked.
    Ask(Box<Asking>),
}

/// A plugin's answer and the call's own time, µs (not the wait for a thread).
pub(super) type Answered = (Result<Decision, DecideError>, i64);

impl Dispatcher {
    /// Decides each of `asks`: answers in the same order, each beside its ask. One blocking call
    /// per chunk, at most one chunk per core and none smaller than [`MIN_PER_CALL`] unless the
    /// asks are fewer; a single ask is a single call, as it always was.
    pub(super) async fn ask_all(&self, asks: Vec<Asking>) -> Vec<(Asking, Answered)> {
        if asks.is_empty() {
            return Vec::new();
        }
        let chunks = self
            .decider_count
            .min(asks.len().div_ceil(MIN_PER_CALL))
            .max(1);
        let per_chunk = asks.len().div_ceil(chunks);
        let mut split: Vec<Vec<Asking>> = Vec::with_capacity(chunks);
        for ask in asks {
            match split.last_mut() {
                Some(chunk) if chunk.len() < per_chunk => chunk.push(ask),
                _ => split.push(vec![ask]),
            }
        }
        let calls = split.into_iter().map(|chunk| async move {
            let _slot = self
                .deciders
                .acquire()
                .await
                .expect("the deciders' semaphore is never closed");
            tokio::task::spawn_blocking(move || {
                chunk
                    .into_iter()
                    .map(|ask| {
                        let watch = Stopwatch::start();
                        let answer = ask.policy.plugin.decide(&ask.order, &ask.ctx);
                        let latency_us = watch.elapsed_us();
                        (ask, (answer, latency_us))
                    })
                    .collect::<Vec<_>>()
            })
            .await
            .expect("plugin call thread panicked")
        });
        let answered: Vec<(Asking, Answered)> =
            join_all(calls).await.into_iter().flatten().collect();
        // Each merchant's shadow sees exactly what its live plugin saw, after the live answer
        // is in hand, off this path (`crate::shadow`): every live ask of every path (a group,
        // a single trigger, a manual close) comes through here once.
        for (ask, (answer, _)) in &answered {
            if let Some(shadow) = self.policies.shadow(&ask.order.merchant) {
                self.shadows.offer(
                    &shadow,
                    crate::shadow::Offer {
                        order: &ask.order,
                        ctx: &ask.ctx,
                        trigger_kind: ask.ctx.trigger.as_str(),
                        live: answer,
                    },
                );
            }
        }
        answered
    }

    /// The rest of [`Dispatcher::prepare`] for a group already staged (`None`: a trigger whose
    /// order was not loaded): the asks decided together ([`Dispatcher::ask_all`]), each then
    /// concluded. Steps in the order of `triggers`; `None` stays `None`.
    pub(super) async fn conclude_staged(
        &self,
        triggers: &[Trigger],
        staged: Vec<Option<Result<Staged, DbError>>>,
    ) -> Vec<Option<Result<Step, DbError>>> {
        let mut steps: Vec<Option<Result<Step, DbError>>> = Vec::with_capacity(staged.len());
        let (mut asks, mut positions) = (Vec::new(), Vec::new());
        for (i, stage) in staged.into_iter().enumerate() {
            steps.push(match stage {
                Some(Ok(Staged::Ask(ask))) => {
                    asks.push(*ask);
                    positions.push(i);
                    None
                }
                Some(Ok(Staged::Ended(step))) => Some(Ok(step)),
                Some(Err(e)) => Some(Err(e)),
                None => None,
            });
        }
        let answered = self.ask_all(asks).await;
        let concluded = join_all(
            positions
                .iter()
                .zip(answered)
                .map(|(&i, (ask, answer))| self.conclude(&triggers[i], ask, answer)),
        )
        .await;
        for (i, step) in positions.into_iter().zip(concluded) {
            steps[i] = Some(step);
        }
        steps
    }
}
