//! One call's answer and assertions on it that fail with what the plugin actually did: the
//! decision, the trap kind and the guest's message, or which effect exceeded the order.

use std::fmt::Write as _;
use std::time::Duration;

use timeoutd_runtime::guard;
use timeoutd_runtime::model::{Context, Decision, Effect, Notice, Order, PolicyError};
use timeoutd_runtime::{DecideError, TrapKind};

/// What a `decide` call came to, with the order and context it was made with.
#[derive(Debug)]
pub struct Decided {
    /// Plugin name.
    pub plugin: String,
    /// The order it was asked about.
    pub order: Order,
    /// The context it was asked with.
    pub context: Context,
    /// Its answer, or why there was none.
    pub result: Result<Decision, DecideError>,
}

impl Decided {
    /// The decision, if the call produced one.
    pub fn decision(&self) -> Option<&Decision> {
        self.result.as_ref().ok()
    }

    /// What happened, in one line: the decision as JSON-ish debug text, or the error.
    pub fn describe(&self) -> String {
        match &self.result {
            Ok(d) => format!("{d:?}"),
            Err(DecideError::Trap { kind, message, .. }) => {
                format!("a trap ({}): {}", kind.as_str(), first_lines(message, 6))
            }
            Err(e) => e.to_string(),
        }
    }

    #[track_caller]
    fn fail(&self, expected: &str) -> ! {
        panic!(
            "plugin `{}` on order `{}` (phase {}, now {} ms = created + {}): expected {expected}, got {}",
            self.plugin,
            self.order.id,
            self.context.phase,
            self.context.now_ms,
            human_offset(self.context.now_ms - self.order.created_at_ms),
            self.describe()
        )
    }

    /// Asserts a `wait`.
    ///
    /// # Panics
    /// Naming what the plugin did instead.
    #[track_caller]
    pub fn expect_wait(&self) -> WaitView<'_> {
        match &self.result {
            Ok(Decision::Wait {
                after_ms,
                next_phase,
                reminder,
                ..
            }) => WaitView {
                decided: self,
                after_ms: *after_ms,
                next_phase: *next_phase,
                reminder: reminder.as_ref(),
            },
            _ => self.fail("a wait"),
        }
    }

    /// Asserts a `cancel` whose effects stay within the order (the daemon's own guard).
    ///
    /// # Panics
    /// Naming what the plugin did instead, or every effect that exceeds the order.
    #[track_caller]
    pub fn expect_cancel(&self) -> CancelView<'_> {
        match &self.result {
            Ok(Decision::Cancel { reason, effects }) => {
                if let Err(problems) = guard::check(&self.order, effects) {
                    panic!(
                        "plugin `{}` cancelled order `{}` with effects the daemon would refuse:\n  {}",
                        self.plugin,
                        self.order.id,
                        problems.join("\n  ")
                    );
                }
                CancelView {
                    decided: self,
                    reason,
                    effects,
                }
            }
            _ => self.fail("a cancel"),
        }
    }

    /// Asserts a `cancel` the daemon would refuse, and returns the guard's problems (each
    /// `effects[i] kind(args): what`).
    ///
    /// # Panics
    /// When the answer is not a cancel, or its effects are all within the order.
    #[track_caller]
    pub fn expect_refused_cancel(&self) -> Vec<String> {
        match &self.result {
            Ok(Decision::Cancel { effects, .. }) => match guard::check(&self.order, effects) {
                Err(problems) => problems,
                Ok(()) => self.fail("a cancel exceeding the order"),
            },
            _ => self.fail("a cancel exceeding the order"),
        }
    }

    /// Asserts an `ignore` and returns its reason.
    ///
    /// # Panics
    /// Naming what the plugin did instead.
    #[track_caller]
    pub fn expect_ignore(&self) -> &str {
        match &self.result {
            Ok(Decision::Ignore { reason }) => reason,
            _ => self.fail("an ignore"),
        }
    }

    /// Asserts the plugin's own `policy-error` and returns it.
    ///
    /// # Panics
    /// Naming what the plugin did instead.
    #[track_caller]
    pub fn expect_policy_error(&self) -> &PolicyError {
        match &self.result {
            Err(DecideError::Policy { error, .. }) => error,
            _ => self.fail("a policy-error"),
        }
    }

    /// Asserts a trap of `kind` and returns the engine's message (with the guest's).
    ///
    /// # Panics
    /// Naming what the plugin did instead.
    #[track_caller]
    pub fn expect_trap(&self, kind: TrapKind) -> &str {
        match &self.result {
            Err(DecideError::Trap {
                kind: k, message, ..
            }) if *k == kind => message,
            _ => self.fail(&format!("a trap ({})", kind.as_str())),
        }
    }
}

/// A `wait` under assertion.
#[derive(Debug)]
pub struct WaitView<'a> {
    decided: &'a Decided,
    /// Delay before the next call, ms.
    pub after_ms: u64,
    /// Next phase.
    pub next_phase: u32,
    /// The reminder, if any.
    pub reminder: Option<&'a Notice>,
}

impl WaitView<'_> {
    /// Asserts the delay.
    #[track_caller]
    pub fn after(self, after: Duration) -> Self {
        let want = after.as_millis() as u64;
        if self.after_ms != want {
            self.decided.fail(&format!(
                "a wait of {want} ms ({})",
                human_offset(want as i64)
            ));
        }
        self
    }

    /// Asserts the next phase.
    #[track_caller]
    pub fn next_phase(self, phase: u32) -> Self {
        if self.next_phase != phase {
            self.decided.fail(&format!("a wait for next phase {phase}"));
        }
        self
    }

    /// Asserts a reminder (of any template).
    #[track_caller]
    pub fn reminds(self) -> Self {
        if self.reminder.is_none() {
            self.decided.fail("a wait with a reminder");
        }
        self
    }

    /// Asserts a reminder with `template`.
    #[track_caller]
    pub fn reminds_with(self, template: &str) -> Self {
        match self.reminder {
            Some(n) if n.template == template => self,
            _ => self
                .decided
                .fail(&format!("a wait with a reminder `{template}`")),
        }
    }

    /// Asserts no reminder.
    #[track_caller]
    pub fn silent(self) -> Self {
        if self.reminder.is_some() {
            self.decided.fail("a wait without a reminder");
        }
        self
    }
}

/// A `cancel` within the order, under assertion.
#[derive(Debug)]
pub struct CancelView<'a> {
    decided: &'a Decided,
    /// Why.
    pub reason: &'a str,
    /// The effects, in order.
    pub effects: &'a [Effect],
}

impl CancelView<'_> {
    /// Asserts the exact set of effect kinds (`restore-stock`, `notify`, …), in any order.
    #[track_caller]
    pub fn kinds(self, kinds: &[&str]) -> Self {
        let mut want: Vec<&str> = kinds.to_vec();
        want.sort_unstable();
        want.dedup();
        let got = effect_kinds(self.effects);
        if got != want {
            self.decided.fail(&format!(
                "a cancel with effect kinds {want:?} (got kinds {got:?})"
            ));
        }
        self
    }

    /// Asserts that `effect` is among the effects.
    #[track_caller]
    pub fn includes(self, effect: &Effect) -> Self {
        if !self.effects.contains(effect) {
            self.decided
                .fail(&format!("a cancel including {}", guard::describe(effect)));
        }
        self
    }

    /// Asserts that the reason contains `text`.
    #[track_caller]
    pub fn reason_contains(self, text: &str) -> Self {
        if !self.reason.contains(text) {
            self.decided
                .fail(&format!("a cancel whose reason contains `{text}`"));
        }
        self
    }
}

/// The sorted, de-duplicated kinds of `effects`.
pub(crate) fn effect_kinds(effects: &[Effect]) -> Vec<&'static str> {
    let mut kinds: Vec<&str> = effects.iter().map(|e| e.kind().as_str()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    kinds
}

/// `90000` → `1m 30s`; negative offsets get a minus sign.
pub(crate) fn human_offset(ms: i64) -> String {
    let d = Duration::from_millis(ms.unsigned_abs());
    let sign = if ms < 0 { "-" } else { "" };
    format!("{sign}{}", humantime::format_duration(d))
}

/// The first `n` lines of `text`, with a count of the rest.
fn first_lines(text: &str, n: usize) -> String {
    let mut out = String::new();
    let mut lines = text.lines();
    for line in lines.by_ref().take(n) {
        let _ = write!(out, "{line} | ");
    }
    let rest = lines.count();
    if rest > 0 {
        let _ = write!(out, "… {rest} more lines");
    }
    out.trim_end_matches(" | ").to_string()
}
