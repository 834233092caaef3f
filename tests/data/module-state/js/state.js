// A policy that keeps module-level state, as a merchant's plugin that caches its parsed settings
// would: the `tag` setting of the first call this instance served is kept in a module variable
// and given as the close reason (`tag=<T>`) of every later call. The daemon must never let one
// merchant's cached value answer another merchant's orders (tests/integration/polyglot.rs).
let firstTag;

export function decide(order, context) {
  if (firstTag === undefined) {
    const found = context.settings.find(([k]) => k === 'tag');
    firstTag = found === undefined ? '' : found[1];
  }
  const effects = order.items.map((i) => ({ tag: 'restore-stock', val: [i.sku, i.quantity] }));
  return { tag: 'cancel', val: { reason: `tag=${firstTag}`, effects } };
}

export function check(order, context) {
  return 'unknown';
}
