// `tea-house` in JavaScript (API 0.2.0): remind the buyer `remind_before` ahead of the deadline
// and close at the deadline; an order of `vip_cents` or more gets a second reminder when the
// window lapses and `vip_grace` more before it closes. Decides exactly like the Rust
// `plugins/tea-house` (the same `plugins/cases/tea-house.toml` passes on all three).
//
// Phases, each a `wait` to an instant (the state byte counts reminders sent):
// - first look (as soon as the daemon sees the order): wait until `deadline - remind_before`
//   (with `poll_every` set, in steps of it, asking the host to poll the payment provider);
// - then: remind ("closes in 2 minutes"), wait until the deadline (VIP) or the close;
// - VIP at the deadline: second reminder ("held 10 more minutes"), wait until the close;
// - at the close: cancel, releasing everything the order holds, and tell the buyer.
//
// Shapes (componentize-js bindings of wit/v0.2.0): records are objects with camelCase fields,
// enums are their WIT names as strings ('pending'), variants are `{ tag, val }` (an effect's
// `val` is its record: `{ tag: 'restore-stock', val: { sku, quantity } }`), options are a value
// or `undefined`, `list<u8>` is a Uint8Array, s64/u64 are BigInt, u32 is a number. Returning
// from `decide` is `ok`; throwing `{ tag: 'bad-setting', val: [key, problem] }` is `err`.

import { log } from 'timeout:policy/host@0.2.0';

const U64_MAX = (1n << 64n) - 1n;
const I64_MIN = -(1n << 63n);
const I64_MAX = (1n << 63n) - 1n;
const UNITS = { ms: 1n, s: 1_000n, m: 60_000n, min: 60_000n, h: 3_600_000n, d: 86_400_000n };

/** What this plugin does; `timeoutd validate` checks a merchant's config against it. */
const MANIFEST = {
  effects: ['restore-stock', 'release-coupon', 'restore-flash-stock', 'release-flash-slot', 'close-payment', 'notify'],
  settings: [
    { name: 'remind_before', valueType: 'duration', default: '2m', doc: 'how long before the deadline the buyer is reminded' },
    { name: 'vip_cents', valueType: 'cents', default: '100000', doc: 'order total, in cents, from which an order gets the VIP grace' },
    { name: 'vip_grace', valueType: 'duration', default: '10m', doc: 'how much longer a VIP order stays open after its deadline' },
    { name: 'channel', valueType: 'text', default: 'log', doc: 'notification channel' },
    { name: 'poll_every', valueType: 'duration', default: '0s', doc: 'how often the payment provider is asked until the reminder; 0s: not at all' },
  ],
};

export function describe() {
  return MANIFEST;
}

/** The merchant's value of `key`, else the manifest's default; throws `bad-setting` if neither. */
function setting(settings, key) {
  const found = settings.find(([k]) => k === key);
  if (found !== undefined) return found[1];
  const declared = MANIFEST.settings.find((s) => s.name === key)?.default;
  if (declared === undefined) throw { tag: 'bad-setting', val: [key, 'missing and has no default'] };
  return declared;
}

/** Parses "1500ms", "90s", "10m", "2h" or "1d" into milliseconds (BigInt); throws the problem. */
function parseDurationMs(raw) {
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

/** A duration setting in ms (BigInt), reinterpreted as i64 like the Rust SDK's `as i64`. */
function durationMs(settings, key) {
  const raw = setting(settings, key);
  try {
    return BigInt.asIntN(64, parseDurationMs(raw));
  } catch (problem) {
    throw { tag: 'bad-setting', val: [key, String(problem)] };
  }
}

/** A whole-number (i64) setting. */
function integer(settings, key) {
  const raw = setting(settings, key);
  const t = raw.trim();
  const n = /^[+-]?[0-9]+$/.test(t) ? BigInt(t) : undefined;
  if (n === undefined || n < I64_MIN || n > I64_MAX) {
    throw { tag: 'bad-setting', val: [key, `\`${raw}\` is not a whole number`] };
  }
  return n;
}

const clamp = (n) => (n > I64_MAX ? I64_MAX : n < I64_MIN ? I64_MIN : n);

/** "2 minutes": whole minutes, rounded up. */
function minutes(ms) {
  const m = ms > 0n ? ms : 0n;
  return `${(m + 59_999n) / 60_000n} minutes`;
}

function notice(channel, template, params) {
  return { channel, template, params };
}

/** The SDK's `wait_until`: to `atMs` (at least 1 ms), the next phase, the state kept. */
function waitUntil(context, atMs, extra = {}) {
  const d = clamp(atMs - context.nowMs);
  return {
    tag: 'wait',
    val: {
      afterMs: d > 0n ? d : 1n,
      nextPhase: (context.phase + 1) >>> 0,
      reminder: undefined,
      state: context.state,
      pollPayment: false,
      ...extra,
    },
  };
}

/** The SDK's `release_everything`: the standard effects of closing `order`. */
function releaseEverything(order, closed) {
  const effects = order.items.map((i) => ({ tag: 'restore-stock', val: { sku: i.sku, quantity: i.quantity } }));
  if (order.coupon !== undefined) effects.push({ tag: 'release-coupon', val: order.coupon });
  if (order.flashActivity !== undefined) {
    const units = order.items.reduce((sum, i) => (sum + i.quantity) >>> 0, 0);
    effects.push({ tag: 'restore-flash-stock', val: { activity: order.flashActivity, quantity: units } });
    effects.push({ tag: 'release-flash-slot', val: { activity: order.flashActivity, user: order.user } });
  }
  if (order.paymentRef !== undefined) effects.push({ tag: 'close-payment', val: order.paymentRef });
  effects.push({ tag: 'notify', val: closed });
  return effects;
}

// The Rust plugin's `format!("order is {:?}", status)` of its generated enum.
const STATUS_NAMES = { pending: 'OrderStatus::Pending', paid: 'OrderStatus::Paid', closed: 'OrderStatus::Closed' };

export function decide(order, context) {
  if (order.status !== 'pending') {
    return { tag: 'ignore', val: `order is ${STATUS_NAMES[order.status]}` };
  }
  const s = context.settings;
  const now = context.nowMs;
  const deadline = order.deadlineMs;
  const remindAt = clamp(deadline - durationMs(s, 'remind_before'));
  const vip = order.totalCents >= integer(s, 'vip_cents');
  const closeAt = clamp(deadline + (vip ? durationMs(s, 'vip_grace') : 0n));
  const channel = setting(s, 'channel');
  const sent = context.state.length > 0 ? context.state[0] : 0;
  if (now >= closeAt) {
    const closed = notice(channel, 'order-closed', [['total_cents', order.totalCents.toString()]]);
    return { tag: 'cancel', val: { reason: 'payment window lapsed', effects: releaseEverything(order, closed) } };
  }
  const pollEvery = durationMs(s, 'poll_every');
  if (sent === 0 && now < remindAt && pollEvery > 0n) {
    // Polling the provider until the reminder (seed 002): a payment it knows of is aligned at
    // once, before the deadline.
    const next = clamp(now + pollEvery);
    return waitUntil(context, next < remindAt ? next : remindAt, { pollPayment: true });
  }
  if (sent === 0 && now < remindAt) return waitUntil(context, remindAt);
  if (sent === 0) {
    log('info', `reminding ${minutes(deadline - now)} before the deadline`);
    const reminder = notice(channel, 'order-closing-soon', [['closes_in', minutes(deadline - now)]]);
    return waitUntil(context, vip ? deadline : closeAt, { reminder, state: new Uint8Array([1]) });
  }
  if (sent === 1 && vip && now >= deadline) {
    const reminder = notice(channel, 'order-held', [['closes_in', minutes(closeAt - now)]]);
    return waitUntil(context, closeAt, { reminder, state: new Uint8Array([2]) });
  }
  if (sent === 1 && vip) return waitUntil(context, deadline);
  return waitUntil(context, closeAt);
}

/** The SDK's `standard_check` with 3 checks. */
export function check(order, context) {
  if (order.status !== 'pending') return 'rollback';
  if (context.payment?.status === 'paid') return 'rollback';
  if (context.nowMs >= order.deadlineMs || context.attempt >= 3) return 'commit';
  return 'unknown';
}
