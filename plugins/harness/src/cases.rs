//! Declarative behaviour cases: the `CASES.toml` format and its runner.
//!
//! A cases file states what a policy must decide, as data, so one file checks every
//! implementation of a policy (Rust, JavaScript, Python…) through the production runtime.
//! `timeoutd plugin test FILE.wasm CASES.toml` runs one; `plugins/README.md` documents the
//! format with an example, and `plugins/cases/two-phase.toml` is a complete one.
//!
//! Shape (every table optional except `[[case]]`'s `name` and `expect`):
//! - `[defaults.order]`: `id`, `merchant`, `user`, `status` (`pending`|`paid`|`closed`),
//!   `created_at_ms` (absolute, epoch ms), `deadline` (offset from `created_at_ms`: integer ms
//!   or a duration such as `"15m"`), `total_cents` (default: the lines' sum), `items`
//!   (`[{ sku, quantity, unit_price_cents }]`), `coupon`, `flash_activity`, `payment_ref`;
//! - `[defaults.context]`: `trigger` (`delay-message`|`outbox`|`sweep`|`check-back`|`manual`),
//!   `phase`, `attempt`, `now` (offset from `created_at_ms`), `settings` (string → string);
//! - `[[case]]`: `name`, `order` and `context` overriding the defaults field by field (the
//!   order's `remove = [...]` drops `coupon`, `flash_activity` or `payment_ref`; the context's
//!   `settings` merge key by key and `remove_settings = [...]` drops keys), and `expect` with
//!   exactly one of `decision` (`wait`|`cancel`|`ignore`), `error` (a `policy-error` kind) or
//!   `check` (`commit`|`rollback`|`unknown`), plus the details listed on [`Expect`].
//!
//! Every cancel is also checked with the daemon's guard ([`timeoutd_runtime::guard`]) and every
//! wait with its phase rule: what the daemon would refuse fails the case.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::Path;

use serde::Deserialize;
use timeoutd_runtime::guard;
use timeoutd_runtime::model::{
    CheckVerdict, Context, Decision, Effect, EffectKind, Order, OrderItem, OrderStatus, Payment,
    PaymentStatus, PolicyError, TriggerKind,
};
use timeoutd_runtime::{DecideError, Plugin};

use crate::builders::DEFAULT_CREATED_AT_MS;
use crate::decided::{effect_kinds, human_offset};

/// Why a cases file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CasesError {
    /// The file could not be read.
    #[error("cannot read cases file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML of this format (unknown key, wrong type); the message names
    /// the line and column.
    #[error("{path}: {message}")]
    Syntax {
        /// The file.
        path: String,
        /// The parser's message.
        message: String,
    },
    /// The file parses but some cases are inconsistent; every problem is listed, each naming
    /// its case.
    #[error("{path}: {} problem(s):\n  {}", problems.len(), problems.join("\n  "))]
    Invalid {
        /// The file.
        path: String,
        /// Every problem, `case[i] "name": what`.
        problems: Vec<String>,
    },
}

/// A time offset from the order's creation: integer milliseconds or a duration (`"15m"`,
/// `"1h 30m"`, `"250ms"`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Offset {
    Ms(i64),
    Text(String),
}

impl Offset {
    fn ms(&self) -> Result<i64, String> {
        match self {
            Offset::Ms(ms) => Ok(*ms),
            Offset::Text(text) => humantime::parse_duration(text.trim())
                .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
                .map_err(|e| {
                    format!("`{text}` is not a duration ({e}); write e.g. \"15m\" or 900000")
                }),
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Status {
    Pending,
    Paid,
    Closed,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum OptionalField {
    Coupon,
    FlashActivity,
    PaymentRef,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ItemDoc {
    sku: String,
    quantity: u32,
    unit_price_cents: i64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct OrderDoc {
    id: Option<String>,
    merchant: Option<String>,
    user: Option<String>,
    status: Option<Status>,
    created_at_ms: Option<i64>,
    deadline: Option<Offset>,
    total_cents: Option<i64>,
    items: Option<Vec<ItemDoc>>,
    coupon: Option<String>,
    flash_activity: Option<String>,
    payment_ref: Option<String>,
    #[serde(default)]
    remove: Vec<OptionalField>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ContextDoc {
    trigger: Option<TriggerKind>,
    phase: Option<u32>,
    attempt: Option<u32>,
    now: Option<Offset>,
    #[serde(default)]
    settings: BTreeMap<String, String>,
    #[serde(default)]
    remove_settings: Vec<String>,
    /// `context.state`, hex (as the daemon stores it): what the previous wait handed on.
    state: Option<String>,
    /// `context.payment`: the payment as the host last knew it.
    payment: Option<PaymentDoc>,
}

/// `context.payment` of a case: `{ status = "paid", queried_at = "12m", paid_at = "11m",
/// paid_cents = 3490 }`, times as offsets from the order's creation.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct PaymentDoc {
    status: PaymentStatus,
    queried_at: Option<Offset>,
    paid_at: Option<Offset>,
    paid_cents: Option<i64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Defaults {
    #[serde(default)]
    order: OrderDoc,
    #[serde(default)]
    context: ContextDoc,
}

/// The decision kinds a case can expect.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DecisionKind {
    /// `wait`.
    Wait,
    /// `cancel`.
    Cancel,
    /// `ignore`.
    Ignore,
}

impl DecisionKind {
    fn as_str(self) -> &'static str {
        match self {
            DecisionKind::Wait => "wait",
            DecisionKind::Cancel => "cancel",
            DecisionKind::Ignore => "ignore",
        }
    }
}

/// The `policy-error` kinds a case can expect.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorKind {
    /// `bad-setting(key, problem)`.
    BadSetting,
    /// `unsupported-order(text)`.
    UnsupportedOrder,
    /// `internal(text)`.
    Internal,
}

impl ErrorKind {
    fn as_str(self) -> &'static str {
        match self {
            ErrorKind::BadSetting => "bad-setting",
            ErrorKind::UnsupportedOrder => "unsupported-order",
            ErrorKind::Internal => "internal",
        }
    }
}

/// What a case expects (`[case.expect]`). Exactly one of `decision`, `error` or `check`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// `decide` returns this kind of decision.
    pub decision: Option<DecisionKind>,
    /// wait: exactly this delay (ms or a duration).
    after_ms: Option<Offset>,
    /// wait: exactly this next phase.
    pub next_phase: Option<u32>,
    /// wait: a reminder is (true) or is not (false) sent.
    pub reminder: Option<bool>,
    /// wait: the reminder's channel.
    pub reminder_channel: Option<String>,
    /// wait: the reminder's template.
    pub reminder_template: Option<String>,
    /// cancel: exactly this set of effect kinds (`restore-stock`, `notify`, …).
    pub effect_kinds: Option<Vec<String>>,
    /// cancel: exactly these effects, in any order.
    pub effects: Option<Vec<Effect>>,
    /// cancel: at least these effects.
    pub effects_include: Option<Vec<Effect>>,
    /// cancel or ignore: the reason contains this text.
    pub reason_contains: Option<String>,
    /// `decide` returns this `policy-error`.
    pub error: Option<ErrorKind>,
    /// `bad-setting`: the setting named.
    pub error_key: Option<String>,
    /// `check` (not `decide`) is called and answers this.
    pub check: Option<CheckVerdict>,
    /// wait: exactly this state handed to the next phase, hex (`""` for none).
    pub state: Option<String>,
    /// wait: whether it asks the host to poll the payment provider.
    pub poll_payment: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseDoc {
    name: String,
    #[serde(default)]
    order: OrderDoc,
    #[serde(default)]
    context: ContextDoc,
    expect: Expect,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDoc {
    #[serde(default)]
    defaults: Defaults,
    #[serde(default, rename = "case")]
    cases: Vec<CaseDoc>,
}

/// The parser's first error (with its line and column) and, after it, every other
/// `[[case]]` that does not parse on its own, each named by index and name — so a broken file
/// is fixed in one pass, not one error at a time.
fn syntax_problems(text: &str, first: &toml::de::Error) -> String {
    let mut problems = vec![first.to_string().trim_end().to_string()];
    let Ok(table) = text.parse::<toml::Table>() else {
        return problems.join("\n");
    };
    if let Some(toml::Value::Array(cases)) = table.get("case") {
        for (i, case) in cases.iter().enumerate() {
            if let Err(e) = CaseDoc::deserialize(case.clone()) {
                let name = case.get("name").and_then(|n| n.as_str()).unwrap_or("?");
                problems.push(format!("case[{i}] \"{name}\": {}", e.message()));
            }
        }
    }
    problems.join("\n  ")
}

/// One resolved case: the order, the context and what is expected.
#[derive(Debug, Clone)]
pub struct Case {
    /// The case's name.
    pub name: String,
    /// The order the plugin is asked about.
    pub order: Order,
    /// The context it is asked with.
    pub context: Context,
    /// What is expected.
    pub expect: Expect,
    after_ms: Option<u64>,
    state: Option<Vec<u8>>,
}

/// A parsed, checked cases file.
#[derive(Debug, Clone)]
pub struct CasesFile {
    /// Where it came from (for messages).
    pub path: String,
    /// The cases, in file order.
    pub cases: Vec<Case>,
}

impl CasesFile {
    /// Reads and checks the cases file at `path`.
    ///
    /// # Errors
    /// [`CasesError`] naming the file and, for each problem, the case and key.
    pub fn load(path: &Path) -> Result<Self, CasesError> {
        let text = std::fs::read_to_string(path).map_err(|source| CasesError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses and checks cases from `text`; `path` names it in messages.
    ///
    /// # Errors
    /// [`CasesError::Syntax`] or [`CasesError::Invalid`] (every problem, each naming its case).
    pub fn parse(text: &str, path: &str) -> Result<Self, CasesError> {
        let doc: FileDoc = toml::from_str(text).map_err(|e| CasesError::Syntax {
            path: path.to_string(),
            message: syntax_problems(text, &e),
        })?;
        let mut problems = Vec::new();
        let mut names = HashSet::new();
        let mut cases = Vec::new();
        if doc.cases.is_empty() {
            problems.push("no [[case]] tables".to_string());
        }
        for (i, c) in doc.cases.into_iter().enumerate() {
            let mut fail =
                |what: String| problems.push(format!("case[{i}] \"{}\": {what}", c.name));
            if !names.insert(c.name.clone()) {
                fail("the name is used by an earlier case".into());
            }
            let order = resolve_order(&doc.defaults.order, &c.order)
                .map_err(&mut fail)
                .ok();
            let context = order.as_ref().and_then(|o| {
                resolve_context(&doc.defaults.context, &c.context, o.created_at_ms)
                    .map_err(&mut fail)
                    .ok()
            });
            for problem in check_expect(&c.expect) {
                fail(format!("expect: {problem}"));
            }
            let after_ms = match c.expect.after_ms.as_ref().map(Offset::ms) {
                Some(Ok(ms)) if ms > 0 => Some(ms as u64),
                Some(Ok(ms)) => {
                    fail(format!("expect.after_ms: {ms} is not positive"));
                    None
                }
                Some(Err(e)) => {
                    fail(format!("expect.after_ms: {e}"));
                    None
                }
                None => None,
            };
            let state = match c.expect.state.as_deref().map(|t| hex::decode(t.trim())) {
                Some(Ok(bytes)) => Some(bytes),
                Some(Err(problem)) => {
                    fail(format!(
                        "expect: state: not hex ({problem}); write e.g. \"01\""
                    ));
                    None
                }
                None => None,
            };
            if let (Some(order), Some(context)) = (order, context) {
                cases.push(Case {
                    name: c.name,
                    order,
                    context,
                    expect: c.expect,
                    after_ms,
                    state,
                });
            }
        }
        if problems.is_empty() {
            Ok(CasesFile {
                path: path.to_string(),
                cases,
            })
        } else {
            Err(CasesError::Invalid {
                path: path.to_string(),
                problems,
            })
        }
    }

    /// Runs every case against `plugin`.
    pub fn run(&self, plugin: &Plugin) -> Report {
        Report {
            plugin: plugin.name().to_string(),
            path: self.path.clone(),
            results: self.cases.iter().map(|c| c.run(plugin)).collect(),
        }
    }
}

fn resolve_order(defaults: &OrderDoc, case: &OrderDoc) -> Result<Order, String> {
    fn pick<T: Clone>(case: &Option<T>, defaults: &Option<T>) -> Option<T> {
        case.clone().or_else(|| defaults.clone())
    }
    let created_at_ms =
        pick(&case.created_at_ms, &defaults.created_at_ms).unwrap_or(DEFAULT_CREATED_AT_MS);
    let deadline = match pick(&case.deadline, &defaults.deadline) {
        Some(offset) => offset.ms().map_err(|e| format!("order.deadline: {e}"))?,
        None => 15 * 60_000,
    };
    let items: Vec<OrderItem> = pick(&case.items, &defaults.items)
        .unwrap_or_else(|| {
            vec![ItemDoc {
                sku: "sku-a".into(),
                quantity: 2,
                unit_price_cents: 1_250,
            }]
        })
        .into_iter()
        .map(|i| OrderItem {
            sku: i.sku,
            quantity: i.quantity,
            unit_price_cents: i.unit_price_cents,
        })
        .collect();
    let removed = |f: OptionalField| case.remove.contains(&f) || defaults.remove.contains(&f);
    let optional = |f: OptionalField, c: &Option<String>, d: &Option<String>| {
        if removed(f) { None } else { pick(c, d) }
    };
    let total_cents = pick(&case.total_cents, &defaults.total_cents).unwrap_or_else(|| {
        items
            .iter()
            .map(|i| i64::from(i.quantity) * i.unit_price_cents)
            .sum()
    });
    Ok(Order {
        id: pick(&case.id, &defaults.id).unwrap_or_else(|| "o-1".into()),
        merchant: pick(&case.merchant, &defaults.merchant).unwrap_or_else(|| "acme".into()),
        user: pick(&case.user, &defaults.user).unwrap_or_else(|| "u-1".into()),
        status: match pick(&case.status, &defaults.status).unwrap_or(Status::Pending) {
            Status::Pending => OrderStatus::Pending,
            Status::Paid => OrderStatus::Paid,
            Status::Closed => OrderStatus::Closed,
        },
        created_at_ms,
        deadline_ms: created_at_ms.saturating_add(deadline),
        total_cents,
        items,
        coupon: optional(OptionalField::Coupon, &case.coupon, &defaults.coupon),
        flash_activity: optional(
            OptionalField::FlashActivity,
            &case.flash_activity,
            &defaults.flash_activity,
        ),
        payment_ref: optional(
            OptionalField::PaymentRef,
            &case.payment_ref,
            &defaults.payment_ref,
        ),
    })
}

fn resolve_context(
    defaults: &ContextDoc,
    case: &ContextDoc,
    created_at_ms: i64,
) -> Result<Context, String> {
    let now = match case.now.as_ref().or(defaults.now.as_ref()) {
        Some(offset) => offset.ms().map_err(|e| format!("context.now: {e}"))?,
        None => 15 * 60_000,
    };
    let mut settings = defaults.settings.clone();
    settings.extend(case.settings.clone());
    for key in defaults.remove_settings.iter().chain(&case.remove_settings) {
        settings.remove(key);
    }
    let state = match case.state.as_ref().or(defaults.state.as_ref()) {
        Some(text) => hex::decode(text.trim())
            .map_err(|e| format!("context.state: `{text}` is not hex ({e}); write e.g. \"01\""))?,
        None => Vec::new(),
    };
    let at = |key: &str, offset: &Option<Offset>| -> Result<Option<i64>, String> {
        offset
            .as_ref()
            .map(|o| {
                o.ms()
                    .map(|ms| created_at_ms.saturating_add(ms))
                    .map_err(|e| format!("context.payment.{key}: {e}"))
            })
            .transpose()
    };
    let payment = match case.payment.as_ref().or(defaults.payment.as_ref()) {
        Some(p) => Some(Payment {
            status: p.status,
            queried_at_ms: at("queried_at", &p.queried_at)?,
            paid_at_ms: at("paid_at", &p.paid_at)?,
            paid_cents: p.paid_cents,
        }),
        None => None,
    };
    Ok(Context {
        now_ms: created_at_ms.saturating_add(now),
        trigger: case
            .trigger
            .or(defaults.trigger)
            .unwrap_or(TriggerKind::Outbox),
        phase: case.phase.or(defaults.phase).unwrap_or(0),
        attempt: case.attempt.or(defaults.attempt).unwrap_or(0),
        settings: settings.into_iter().collect(),
        state,
        payment,
    })
}

/// Every inconsistency in an `expect` table.
fn check_expect(e: &Expect) -> Vec<String> {
    let mut problems = Vec::new();
    let chosen = [e.decision.is_some(), e.error.is_some(), e.check.is_some()]
        .iter()
        .filter(|b| **b)
        .count();
    if chosen != 1 {
        problems.push("needs exactly one of `decision`, `error` or `check`".into());
    }
    let kind = e.decision;
    let only = |set: bool, key: &str, allowed: &[DecisionKind]| {
        (set && !kind.is_some_and(|k| allowed.contains(&k))).then(|| {
            let names: Vec<&str> = allowed.iter().map(|k| k.as_str()).collect();
            format!("`{key}` needs decision = {}", names.join(" or "))
        })
    };
    use DecisionKind::{Cancel, Ignore, Wait};
    problems.extend(
        [
            only(e.after_ms.is_some(), "after_ms", &[Wait]),
            only(e.next_phase.is_some(), "next_phase", &[Wait]),
            only(e.reminder.is_some(), "reminder", &[Wait]),
            only(e.reminder_channel.is_some(), "reminder_channel", &[Wait]),
            only(e.reminder_template.is_some(), "reminder_template", &[Wait]),
            only(e.state.is_some(), "state", &[Wait]),
            only(e.poll_payment.is_some(), "poll_payment", &[Wait]),
            only(e.effect_kinds.is_some(), "effect_kinds", &[Cancel]),
            only(e.effects.is_some(), "effects", &[Cancel]),
            only(e.effects_include.is_some(), "effects_include", &[Cancel]),
            only(
                e.reason_contains.is_some(),
                "reason_contains",
                &[Cancel, Ignore],
            ),
        ]
        .into_iter()
        .flatten(),
    );
    if e.error_key.is_some() && e.error != Some(ErrorKind::BadSetting) {
        problems.push("`error_key` needs error = \"bad-setting\"".into());
    }
    if e.reminder == Some(false) && (e.reminder_channel.is_some() || e.reminder_template.is_some())
    {
        problems
            .push("`reminder = false` contradicts `reminder_channel`/`reminder_template`".into());
    }
    for k in e.effect_kinds.iter().flatten() {
        if EffectKind::parse(k).is_none() {
            problems.push(format!(
                "effect_kinds: unknown kind `{k}` (one of {})",
                EffectKind::names()
            ));
        }
    }
    problems
}

impl Case {
    /// Runs this case against `plugin`.
    pub fn run(&self, plugin: &Plugin) -> CaseResult {
        if let Some(why) = self.never_produced(plugin) {
            return CaseResult {
                name: self.name.clone(),
                got: "not asked".into(),
                failures: vec![format!("the daemon never asks this: {why}")],
            };
        }
        let (got, failures) = match self.expect.check {
            Some(want) => match plugin.check(&self.order, &self.context) {
                Ok(v) if v == want => (format!("check {}", verdict(v)), vec![]),
                Ok(v) => (
                    format!("check {}", verdict(v)),
                    vec![format!(
                        "expected check {}, got {}",
                        verdict(want),
                        verdict(v)
                    )],
                ),
                Err(e) => (
                    error_text(&e),
                    vec![format!(
                        "expected check {}, got {}",
                        verdict(want),
                        error_text(&e)
                    )],
                ),
            },
            None => {
                let answer = plugin.decide(&self.order, &self.context);
                let got = match &answer {
                    Ok(d) => summary(d),
                    Err(e) => error_text(e),
                };
                (got, self.compare(answer, plugin))
            }
        };
        CaseResult {
            name: self.name.clone(),
            got,
            failures,
        }
    }

    /// Why the daemon would never call `plugin` with this case's input, if it would not: a
    /// 0.1.0 plugin is asked only from the deadline on (its check-backs excepted), and phase 0
    /// — the order's first call — never carries state.
    fn never_produced(&self, plugin: &Plugin) -> Option<String> {
        let ctx = &self.context;
        let before = self.order.deadline_ms.saturating_sub(ctx.now_ms);
        if self.expect.check.is_none() && !plugin.asks_before_deadline() && before > 0 {
            return Some(format!(
                "a {} plugin is asked from the deadline on, and `now` is {} before it",
                plugin.api_version(),
                human_offset(before)
            ));
        }
        if ctx.phase == 0 && !ctx.state.is_empty() {
            return Some("phase 0 is the order's first call, which has no state".into());
        }
        None
    }

    fn compare(&self, answer: Result<Decision, DecideError>, plugin: &Plugin) -> Vec<String> {
        let e = &self.expect;
        let mut failures = Vec::new();
        let mut fail = |s: String| failures.push(s);
        if let Some(want) = e.error {
            match &answer {
                Err(DecideError::Policy { error, .. }) => {
                    let (kind, key) = match error {
                        PolicyError::BadSetting { key, .. } => (ErrorKind::BadSetting, Some(key)),
                        PolicyError::UnsupportedOrder(_) => (ErrorKind::UnsupportedOrder, None),
                        PolicyError::Internal(_) => (ErrorKind::Internal, None),
                    };
                    if kind != want {
                        fail(format!(
                            "expected policy-error {}, got {error}",
                            want.as_str()
                        ));
                    } else if let (Some(want_key), Some(key)) = (&e.error_key, key)
                        && want_key != key
                    {
                        fail(format!("expected bad-setting of `{want_key}`, got {error}"));
                    }
                }
                _ => fail(format!(
                    "expected policy-error {}, got {}",
                    want.as_str(),
                    outcome(&answer)
                )),
            }
            return failures;
        }
        let Some(want) = e.decision else {
            return failures;
        };
        let decision = match &answer {
            Ok(d) if d.kind() == want.as_str() => d,
            _ => {
                fail(format!(
                    "expected decision {}, got {}",
                    want.as_str(),
                    outcome(&answer)
                ));
                return failures;
            }
        };
        // The daemon's own review (the merchant's grant aside, which is the config's).
        let review = guard::Review {
            order: &self.order,
            phase: self.context.phase,
            now_ms: self.context.now_ms,
            granted: None,
            manifest: plugin.manifest(),
        };
        for p in guard::review(decision, review).err().into_iter().flatten() {
            fail(format!(
                "the daemon would refuse this {}: {p}",
                decision.kind()
            ));
        }
        match decision {
            Decision::Wait {
                after_ms,
                next_phase,
                reminder,
                state,
                poll_payment,
            } => {
                if let Some(want) = &self.state
                    && want != state
                {
                    fail(format!(
                        "expected state \"{}\", got \"{}\"",
                        hex::encode(want),
                        hex::encode(state)
                    ));
                }
                if let Some(want) = e.poll_payment
                    && want != *poll_payment
                {
                    fail(format!(
                        "expected poll_payment = {want}, got {poll_payment}"
                    ));
                }
                if let Some(want) = self.after_ms
                    && want != *after_ms
                {
                    fail(format!(
                        "expected after_ms {want} ({}), got {after_ms} ({})",
                        human_offset(want as i64),
                        human_offset(*after_ms as i64)
                    ));
                }
                if let Some(want) = e.next_phase
                    && want != *next_phase
                {
                    fail(format!("expected next_phase {want}, got {next_phase}"));
                }
                let want_reminder = e.reminder.or((e.reminder_channel.is_some()
                    || e.reminder_template.is_some())
                .then_some(true));
                match (want_reminder, reminder) {
                    (Some(true), None) => fail("expected a reminder, got none".into()),
                    (Some(false), Some(n)) => fail(format!(
                        "expected no reminder, got one ({}/{})",
                        n.channel, n.template
                    )),
                    _ => {}
                }
                if let Some(n) = reminder {
                    if let Some(want) = &e.reminder_channel
                        && *want != n.channel
                    {
                        fail(format!(
                            "expected reminder channel `{want}`, got `{}`",
                            n.channel
                        ));
                    }
                    if let Some(want) = &e.reminder_template
                        && *want != n.template
                    {
                        fail(format!(
                            "expected reminder template `{want}`, got `{}`",
                            n.template
                        ));
                    }
                }
            }
            Decision::Cancel { reason, effects } => {
                if let Some(want) = &e.effect_kinds {
                    let mut want: Vec<&str> = want.iter().map(String::as_str).collect();
                    want.sort_unstable();
                    want.dedup();
                    let got = effect_kinds(effects);
                    if got != want {
                        fail(format!("expected effect kinds {want:?}, got {got:?}"));
                    }
                }
                if let Some(want) = &e.effects {
                    let mut left: Vec<&Effect> = effects.iter().collect();
                    let mut missing = Vec::new();
                    for w in want {
                        match left.iter().position(|g| *g == w) {
                            Some(i) => {
                                left.remove(i);
                            }
                            None => missing.push(guard::describe(w)),
                        }
                    }
                    if !missing.is_empty() {
                        fail(format!("missing effects: {}", missing.join(", ")));
                    }
                    if !left.is_empty() {
                        let extra: Vec<String> = left.into_iter().map(guard::describe).collect();
                        fail(format!("unexpected effects: {}", extra.join(", ")));
                    }
                }
                for w in e.effects_include.iter().flatten() {
                    if !effects.contains(w) {
                        fail(format!("missing effect {}", describe_full(w)));
                    }
                }
                if let Some(text) = &e.reason_contains
                    && !reason.contains(text.as_str())
                {
                    fail(format!(
                        "expected the reason to contain `{text}`, got `{reason}`"
                    ));
                }
            }
            Decision::Ignore { reason } => {
                if let Some(text) = &e.reason_contains
                    && !reason.contains(text.as_str())
                {
                    fail(format!(
                        "expected the reason to contain `{text}`, got `{reason}`"
                    ));
                }
            }
        }
        failures
    }
}

/// One case's result.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// The case's name.
    pub name: String,
    /// What the plugin answered, in one line.
    pub got: String,
    /// Every expectation it missed (empty when it passed).
    pub failures: Vec<String>,
}

impl CaseResult {
    /// Whether every expectation held.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// The results of a cases file against a plugin. `Display` prints one line per case
/// (`ok` / `FAIL`, with each missed expectation and what the plugin answered) and a summary.
#[derive(Debug, Clone)]
pub struct Report {
    /// Plugin name.
    pub plugin: String,
    /// Cases file.
    pub path: String,
    /// Per case, in file order.
    pub results: Vec<CaseResult>,
}

impl Report {
    /// Cases that failed.
    pub fn failed(&self) -> usize {
        self.results.iter().filter(|r| !r.passed()).count()
    }

    /// Whether every case passed.
    pub fn passed(&self) -> bool {
        self.failed() == 0
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.results {
            if r.passed() {
                writeln!(f, "ok    {}", r.name)?;
            } else {
                writeln!(f, "FAIL  {}", r.name)?;
                for failure in &r.failures {
                    writeln!(f, "        - {failure}")?;
                }
                writeln!(f, "        plugin answered: {}", r.got)?;
            }
        }
        let failed = self.failed();
        write!(
            f,
            "{}: {} passed, {failed} failed ({} against {})",
            if failed == 0 { "ok" } else { "FAILED" },
            self.results.len() - failed,
            self.path,
            self.plugin
        )
    }
}

fn verdict(v: CheckVerdict) -> &'static str {
    match v {
        CheckVerdict::Commit => "commit",
        CheckVerdict::Rollback => "rollback",
        CheckVerdict::Unknown => "unknown",
    }
}

fn error_text(e: &DecideError) -> String {
    match e {
        DecideError::Policy { error, .. } => format!("policy-error {error}"),
        DecideError::Trap { kind, message, .. } => format!(
            "a trap ({}): {}",
            kind.as_str(),
            message.lines().next().unwrap_or_default()
        ),
        other => other.to_string(),
    }
}

fn outcome(answer: &Result<Decision, DecideError>) -> String {
    match answer {
        Ok(d) => summary(d),
        Err(e) => error_text(e),
    }
}

/// A decision in one line: `wait 300000 ms (5m) → phase 1, reminder log/order-closing-soon`.
pub fn summary(d: &Decision) -> String {
    match d {
        Decision::Wait {
            after_ms,
            next_phase,
            reminder,
            ..
        } => format!(
            "wait {after_ms} ms ({}) → phase {next_phase}, {}",
            human_offset(*after_ms as i64),
            reminder
                .as_ref()
                .map_or("no reminder".to_string(), |n| format!(
                    "reminder {}/{}",
                    n.channel, n.template
                ))
        ),
        Decision::Cancel { reason, effects } => format!(
            "cancel ({reason}) [{}]",
            effects
                .iter()
                .map(guard::describe)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Decision::Ignore { reason } => format!("ignore ({reason})"),
    }
}

/// An effect with every field (notices with their params).
fn describe_full(e: &Effect) -> String {
    match e {
        Effect::Notify(n) => format!("notify({}, {}, {:?})", n.channel, n.template, n.params),
        other => guard::describe(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides_resolve_field_by_field() {
        let file = CasesFile::parse(
            r#"
            [defaults.order]
            created_at_ms = 1000
            deadline = "1m"
            coupon = "c"
            [defaults.context]
            now = 60000
            settings = { grace = "5m", channel = "sms" }
            [[case]]
            name = "a"
            order = { remove = ["coupon"], payment_ref = "p" }
            context = { phase = 2, now = "2m", settings = { channel = "push" }, remove_settings = ["grace"] }
            expect = { decision = "ignore" }
            "#,
            "t.toml",
        )
        .unwrap();
        let c = &file.cases[0];
        assert_eq!((c.order.deadline_ms, c.context.now_ms), (61_000, 121_000));
        assert_eq!(
            (c.order.coupon.as_deref(), c.order.payment_ref.as_deref()),
            (None, Some("p"))
        );
        assert_eq!(c.order.total_cents, 2_500);
        assert_eq!(c.context.settings, vec![("channel".into(), "push".into())]);
        assert_eq!(c.context.phase, 2);
    }

    #[test]
    fn every_inconsistent_case_is_named() {
        let err = CasesFile::parse(
            r#"
            [[case]]
            name = "x"
            expect = { decision = "cancel", after_ms = "5m" }
            [[case]]
            name = "x"
            context = { now = "soon" }
            expect = { check = "commit", error = "internal" }
            "#,
            "t.toml",
        )
        .unwrap_err();
        let CasesError::Invalid { problems, .. } = err else {
            panic!("{err}")
        };
        assert_eq!(problems.len(), 4, "{problems:#?}");
        assert!(problems[0].contains("`after_ms` needs decision = wait"));
        assert!(problems[1].starts_with("case[1] \"x\": the name is used"));
        assert!(problems[2].contains("context.now: `soon` is not a duration"));
        assert!(problems[3].contains("exactly one of"));
    }

    #[test]
    fn unknown_keys_are_refused_with_their_place() {
        let err = CasesFile::parse(
            "[[case]]\nname = \"x\"\nexpect = { decison = \"wait\" }\n",
            "t.toml",
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("decison") && text.contains("line 3"),
            "{text}"
        );
    }

    #[test]
    fn every_case_that_does_not_parse_is_named_at_once() {
        let err = CasesFile::parse(
            "[[case]]\nname = \"a\"\nexpect = { decison = \"wait\" }\n\
             [[case]]\nname = \"b\"\nexpect = { decision = \"wait\" }\n\
             [[case]]\nname = \"c\"\norder = { total_cents = \"lots\" }\nexpect = { decision = \"ignore\" }\n",
            "t.toml",
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("line 3"),
            "the first error keeps its place: {text}"
        );
        assert!(
            text.contains("case[0] \"a\"") && text.contains("decison"),
            "{text}"
        );
        assert!(
            text.contains("case[2] \"c\""),
            "the second broken case too: {text}"
        );
        assert!(
            !text.contains("case[1]"),
            "the good case is not blamed: {text}"
        );
    }

    #[test]
    fn the_shipped_two_phase_cases_parse() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cases/two-phase.toml");
        let file = CasesFile::load(&path).unwrap();
        assert!(file.cases.len() >= 15, "{}", file.cases.len());
    }
}
