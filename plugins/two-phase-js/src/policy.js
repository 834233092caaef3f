// `two-phase` in JavaScript: when the payment window lapses, keep the order open a little longer
// and remind the buyer ("closes in 5 minutes"); when that grace lapses too, close it — restore
// stock, release the coupon, close the payment, and for a flash-sale order also give the units
// back to the activity and free the buyer's slot. Decides exactly like the Rust
// `plugins/two-phase` (same settings, decisions, effects, reminders and check verdicts).
//
// Settings (strings from [merchants.<id>.settings]):
// - `grace` (required) — how long to keep waiting after the payment window, e.g. `5m`;
// - `channel` — notification sink, default `log`;
// - `reminder_template` — default `order-closing-soon`;
// - `closed_template` — default `order-closed`;
// - `max_checks` — check-backs answered `unknown` before committing, default 3.
//
// Shapes (componentize-js bindings of wit/v0.1.0): records are objects with camelCase fields,
// enums are their WIT names as strings ('pending'), variants are `{ tag, val }`, options are a
// value or `undefined`, tuples are arrays, s64/u64 are BigInt, u32 is a number. Returning from
// `decide` is `ok`; throwing `{ tag: 'bad-setting', val: [key, problem] }` is `err`.

import { log } from 'timeout:policy/host@0.1.0';

const U64_MAX = (1n << 64n) - 1n;
const I64_MIN = -(1n << 63n);
const I64_MAX = (1n << 63n) - 1n;

const UNITS = { ms: 1n, s: 1_000n, m: 60_000n, min: 60_000n, h: 3_600_000n, d: 86_400_000n };

/** The value of `key` in the settings list (`[[key, value], ...]`), or `undefined`. */
function setting(settings, key) {
  const found = settings.find(([k]) => k === key);
  return found === undefined ? undefined : found[1];
}

/** Parses "1500ms", "90s", "10m", "2h" or "1d" into milliseconds (BigInt); throws the problem. */
export function parseDurationMs(raw) {
  const s = raw.trim();
  let split = 0;
  while (split < s.length && s[split] >= '0' && s[split] <= '9') split++;
  const digits = s.slice(0, split);
  const unit = s.slice(split).trim();
  const n = digits === '' ? undefined : BigInt(digits);
  if (n === undefined || n > U64_MAX) throw `\`${raw}\` does not start with a whole number`;
  if (unit === '') throw `\`${raw}\` has no unit (ms, s, m, h, d)`;
  const scale = Object.hasOwn(UNITS, unit) ? UNITS[unit] : undefined;
  if (scale === undefined) throw `\`${raw}\` has an unknown unit \`${unit}\` (ms, s, m, h, d)`;
  const ms = n * scale;
  if (ms > U64_MAX) throw `\`${raw}\` is too long`;
  return ms;
}

/** A required duration setting in ms (BigInt); throws the `bad-setting` policy error. */
function durationSetting(settings, key) {
  const raw = setting(settings, key);
  if (raw === undefined) throw { tag: 'bad-setting', val: [key, 'missing (e.g. "5m")'] };
  try {
    return parseDurationMs(raw);
  } catch (problem) {
    throw { tag: 'bad-setting', val: [key, String(problem)] };
  }
}

/** A whole-number (u32) setting, or `fallback` when absent or malformed. */
function numberSetting(settings, key, fallback) {
  const raw = setting(settings, key);
  if (raw === undefined) return fallback;
  const t = raw.trim();
  if (!/^\+?[0-9]+$/.test(t)) return fallback;
  const n = BigInt(t);
  return n > 0xffff_ffffn ? fallback : Number(n);
}

/** "5 minutes", "30 seconds", "1500 ms" for a BigInt of ms. */
function human(ms) {
  if (ms >= 60_000n && ms % 60_000n === 0n) return `${ms / 60_000n} minutes`;
  if (ms >= 1_000n) return `${(ms + 999n) / 1_000n} seconds`;
  return `${ms} ms`;
}

/** The standard effects of closing `order` (the SDK's `release_everything`). */
function releaseEverything(order, flashSale, notice) {
  const effects = order.items.map((i) => ({ tag: 'restore-stock', val: [i.sku, i.quantity] }));
  if (order.coupon !== undefined) effects.push({ tag: 'release-coupon', val: order.coupon });
  if (flashSale && order.flashActivity !== undefined) {
    const units = order.items.reduce((sum, i) => (sum + i.quantity) >>> 0, 0);
    effects.push({ tag: 'restore-flash-stock', val: [order.flashActivity, units] });
    effects.push({ tag: 'release-flash-slot', val: [order.flashActivity, order.user] });
  }
  if (order.paymentRef !== undefined) effects.push({ tag: 'close-payment', val: order.paymentRef });
  if (notice !== undefined) effects.push({ tag: 'notify', val: notice });
  return effects;
}

// The Rust plugin's `format!("order is {:?}", status)` of its generated enum.
const STATUS_NAMES = { pending: 'OrderStatus::Pending', paid: 'OrderStatus::Paid', closed: 'OrderStatus::Closed' };

export function decide(order, context) {
  if (order.status !== 'pending') {
    return { tag: 'ignore', val: `order is ${STATUS_NAMES[order.status]}` };
  }
  const settings = context.settings;
  const graceMs = durationSetting(settings, 'grace');
  const channel = setting(settings, 'channel') ?? 'log';
  // i64 arithmetic as the Rust plugin does it: the grace is reinterpreted as i64, the add
  // saturates, the differences wrap into u64.
  let closeAt = order.deadlineMs + BigInt.asIntN(64, graceMs);
  closeAt = closeAt > I64_MAX ? I64_MAX : closeAt < I64_MIN ? I64_MIN : closeAt;
  const now = context.nowMs;
  if (now >= closeAt) {
    const notice = {
      channel,
      template: setting(settings, 'closed_template') ?? 'order-closed',
      params: [['total_cents', order.totalCents.toString()]],
    };
    return {
      tag: 'cancel',
      val: { reason: 'payment window and grace lapsed', effects: releaseEverything(order, true, notice) },
    };
  }
  const from = now > order.deadlineMs ? now : order.deadlineMs;
  const remaining = BigInt.asUintN(64, closeAt - from);
  // Remind once: on the first phase that finds the window lapsed.
  let reminder;
  if (context.phase === 0 && now >= order.deadlineMs) {
    reminder = {
      channel,
      template: setting(settings, 'reminder_template') ?? 'order-closing-soon',
      params: [
        ['closes_in', human(remaining)],
        ['closes_at_ms', closeAt.toString()],
      ],
    };
    log('debug', `reminding; closing in ${human(remaining)}`);
  }
  return {
    tag: 'wait',
    val: { afterMs: BigInt.asUintN(64, closeAt - now), nextPhase: (context.phase + 1) >>> 0, reminder },
  };
}

export function check(order, context) {
  const maxChecks = numberSetting(context.settings, 'max_checks', 3);
  if (order.status !== 'pending') return 'rollback';
  if (context.nowMs >= order.deadlineMs || context.attempt >= maxChecks) return 'commit';
  return 'unknown';
}
