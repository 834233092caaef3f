//! The order every transaction of timeoutd's takes stock rows in, so that no two of them wait
//! on each other in a circle: the group close, the reference order service's create, a
//! payment on a schema profile, and the bench's set-based baseline.

use std::collections::BTreeMap;

/// Units per SKU summed from `lines` (SKU, units), iterated in the order every transaction of
/// timeoutd's takes stock rows: ascending SKU, compared as text (the group close and
/// [`super::orders::create`]; docs/adoption.md asks a shop's own order service to do the same). Two
/// transactions that take their stock rows this way never deadlock on them.
pub fn units_per_sku<'a>(
    lines: impl IntoIterator<Item = (&'a str, i64)>,
) -> BTreeMap<&'a str, i64> {
    let mut per_sku: BTreeMap<&str, i64> = BTreeMap::new();
    for (sku, units) in lines {
        *per_sku.entry(sku).or_default() += units;
    }
    per_sku
}
