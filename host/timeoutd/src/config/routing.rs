//! `database.routing`: which shard an order id belongs to — the rule the order service shards
//! by, so timeoutd looks for an order where the order service wrote it. Used by the HTTP
//! endpoint (`http.rs`) and the tests' shops; the shards themselves are worked by `shards.rs`.

use super::Routing;

/// Why an order id names no shard.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// `routing = "mod"` and the id is not a decimal integer.
    #[error(
        "order id `{0}` is not an integer; database.routing = \"mod\" shards by the id's value"
    )]
    NotAnInteger(String),
}

/// The index (`0..shards`) of the shard holding `order_id` under `routing`.
///
/// # Errors
/// [`RouteError::NotAnInteger`] for `mod` and an id that is not a decimal integer.
///
/// # Panics
/// When `shards` is 0 (validation refuses an empty shard list).
pub fn shard_of(routing: Routing, order_id: &str, shards: usize) -> Result<usize, RouteError> {
    assert!(shards > 0, "no shards to route to");
    let n = shards as u64;
    match routing {
        Routing::HashMod => Ok((java_string_hash(order_id).unsigned_abs() % n) as usize),
        Routing::Mod => {
            let id: i128 = order_id
                .trim()
                .parse()
                .map_err(|_| RouteError::NotAnInteger(order_id.to_string()))?;
            // Java's `%` keeps the dividend's sign; ShardingSphere's MOD takes the value as is,
            // and ids are positive: a negative one is refused rather than routed by a guess.
            u64::try_from(id)
                .map(|id| (id % n) as usize)
                .map_err(|_| RouteError::NotAnInteger(order_id.to_string()))
        }
    }
}

/// `(long) s.hashCode()` of a Java `String`: `h = 31·h + c` over its UTF-16 code units in
/// wrapping 32-bit arithmetic, widened to 64 bits (ShardingSphere's `HashModShardingAlgorithm`
/// widens before `Math.abs`, so `Integer.MIN_VALUE` stays positive).
pub fn java_string_hash(s: &str) -> i64 {
    let h = s
        .encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)));
    i64::from(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_string_hash_matches_the_jdk() {
        // Values from Java: "".hashCode() = 0, "a" = 97, "hello" = 99162322,
        // "polygenelubricants" = Integer.MIN_VALUE, "订单" (two UTF-16 units) = 1129459,
        // "c-000123" = -852469076.
        assert_eq!(java_string_hash(""), 0);
        assert_eq!(java_string_hash("a"), 97);
        assert_eq!(java_string_hash("hello"), 99_162_322);
        assert_eq!(java_string_hash("polygenelubricants"), i64::from(i32::MIN));
        assert_eq!(java_string_hash("订单"), 1_129_459);
        assert_eq!(java_string_hash("c-000123"), -852_469_076);
        // An astral character counts as its two surrogates.
        assert_eq!(java_string_hash("😀"), 0xD83D * 31 + 0xDE00);
    }

    #[test]
    fn hash_mod_is_abs_of_the_hash_modulo_the_shard_count() {
        assert_eq!(shard_of(Routing::HashMod, "hello", 2), Ok(0));
        assert_eq!(shard_of(Routing::HashMod, "a", 2), Ok(1));
        // Integer.MIN_VALUE widened: |-2147483648| % 3 = 2.
        assert_eq!(shard_of(Routing::HashMod, "polygenelubricants", 3), Ok(2));
        // A negative hash is taken by its absolute value: |-852469076| % 3 = 2.
        assert_eq!(shard_of(Routing::HashMod, "c-000123", 3), Ok(2));
    }

    #[test]
    fn mod_routes_integer_ids_and_refuses_others() {
        assert_eq!(shard_of(Routing::Mod, "1001", 2), Ok(1));
        assert_eq!(shard_of(Routing::Mod, "1794329671293485056", 4), Ok(0));
        assert_eq!(
            shard_of(Routing::Mod, "c-000123", 2),
            Err(RouteError::NotAnInteger("c-000123".into()))
        );
        assert!(shard_of(Routing::Mod, "-4", 2).is_err());
    }
}
