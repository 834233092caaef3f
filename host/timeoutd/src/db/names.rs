//! The names of timeoutd's own tables and indexes, and the table prefix that lets them share a
//! database with a shop's tables (`database.table_prefix`, as WordPress's `$table_prefix` and
//! Django's `db_table` let two applications share one schema).
//!
//! timeoutd's SQL names its own tables bare (`order_timeout_msg`, `effect_ledger`, …); a schema
//! profile's statements name the shop's tables quoted (`` `oms_order` ``, `"oms_order"`). With a
//! prefix, every statement is rewritten on its way to the database ([`own`]): each bare word
//! that is one of [`OWN`] gains the prefix; quoted names, string literals, comments and
//! qualified names (`x.orders`) are left as they are. Without one (the default) nothing is
//! rewritten and no statement is copied.
//!
//! The prefix is one per process ([`serve`]): a process serves one deployment, and every shard
//! it works holds the same tables. The migrations are rewritten the same way ([`migration`]),
//! so a prefixed database holds `timeoutd_order_timeout_msg`, `timeoutd__sqlx_migrations` and
//! so on, and never one of the unprefixed names.

use std::borrow::Cow;
use std::sync::OnceLock;

use super::{Backend, DbError};

/// Every table timeoutd's migrations create, and the migrator's own bookkeeping table.
pub const TABLES: &[&str] = &[
    "_sqlx_migrations",
    "admin_audit",
    "coupons",
    "dead_letter",
    "decision_log",
    "effect_ledger",
    "maintenance_lease",
    "order_items",
    "order_timeout_msg",
    "orders",
    "paid_after_close",
    "pauses",
    "payment_leases",
    "shadow_decisions",
    "sku_stock",
    "stock_journal",
    "timeoutd_schema",
    "write_fence",
];

/// Every index timeoutd's migrations create by name (PostgreSQL keeps index names per schema,
/// so they are prefixed with the tables).
const INDEXES: &[&str] = &[
    "coupons_order",
    "dead_letter_message",
    "dead_letter_order",
    "decision_log_decided",
    "decision_log_order",
    "effect_ledger_claim",
    "effect_ledger_status",
    "effect_ledger_status_created",
    "effect_ledger_status_updated",
    "order_timeout_msg_claim",
    "order_timeout_msg_status_due",
    "order_timeout_msg_status_processed",
    "order_timeout_msg_unseen",
    "orders_status_deadline",
    "payment_leases_order",
    "payment_leases_until",
    "shadow_decisions_decided",
    "shadow_decisions_merchant",
];

/// The longest prefix: the longest own name (34 characters) plus it stays within PostgreSQL's
/// 63-character identifiers (MySQL's are 64).
pub const MAX_PREFIX: usize = 24;

static PREFIX: OnceLock<String> = OnceLock::new();

/// Whether `name` is one of timeoutd's own tables or indexes (unprefixed).
pub fn is_own(name: &str) -> bool {
    TABLES.contains(&name) || INDEXES.contains(&name)
}

/// What is wrong with `prefix` as `database.table_prefix`, if anything: it must be lowercase
/// ASCII letters, digits and `_`, start with a letter, and be at most [`MAX_PREFIX`] long
/// (PostgreSQL folds unquoted names to lowercase and MySQL on Linux compares them by case, so
/// only lowercase names mean the same on both). The empty prefix is the default.
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix.is_empty() {
        return Ok(());
    }
    if prefix.len() > MAX_PREFIX {
        return Err(format!(
            "`{prefix}` is {} characters; at most {MAX_PREFIX}",
            prefix.len()
        ));
    }
    let first = prefix.as_bytes()[0];
    if !first.is_ascii_lowercase()
        || !prefix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(format!(
            "`{prefix}`: use lowercase letters, digits and `_`, \
             starting with a letter (for example `timeoutd_`)"
        ));
    }
    Ok(())
}

/// Makes `prefix` this process's table prefix. The first call decides; a later call with the
/// same prefix is a no-op.
///
/// # Errors
/// [`DbError::Config`] when `prefix` is malformed ([`check_prefix`]) or differs from the one
/// this process already serves (one process, one set of tables).
pub fn serve(prefix: &str) -> Result<(), DbError> {
    check_prefix(prefix).map_err(|e| DbError::Config(format!("database.table_prefix: {e}")))?;
    let served = PREFIX.get_or_init(|| prefix.to_string());
    if served != prefix {
        return Err(DbError::Config(format!(
            "this process serves timeoutd's tables with the prefix `{served}`; a config with \
             `database.table_prefix` = `{prefix}` needs a process of its own"
        )));
    }
    Ok(())
}

/// This process's table prefix (`""` unless [`serve`] set one).
pub fn prefix() -> &'static str {
    PREFIX.get().map_or("", String::as_str)
}

/// `name` (one of [`TABLES`]) as this process's database holds it.
pub fn table(name: &str) -> String {
    debug_assert!(is_own(name), "{name} is not one of timeoutd's tables");
    format!("{}{name}", prefix())
}

/// `sql` with each of timeoutd's own names prefixed ([`rewrite`] with this process's prefix):
/// borrowed, unchanged, when there is no prefix.
pub fn own(sql: &str) -> Cow<'_, str> {
    rewrite(sql, prefix())
}

/// `sql` with each bare word that is one of timeoutd's own tables or indexes given `prefix`.
/// Left alone: text inside `'…'` literals, `"…"` and `` `…` `` quoted names, `--` and `/* */`
/// comments, a word right after a `.` (a column or another schema's table), and a word right
/// after `AS` (an alias: `COUNT(*) AS dead_letter` stays the name a reader asks for).
pub fn rewrite<'a>(sql: &'a str, prefix: &str) -> Cow<'a, str> {
    if prefix.is_empty() {
        return Cow::Borrowed(sql);
    }
    let bytes = sql.as_bytes();
    let mut out = String::with_capacity(sql.len() + 64);
    let mut i = 0;
    let mut copied = 0;
    // The word before, when it was `AS`: the next word is an alias or a type, never a table.
    let mut after_as = false;
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    while i < bytes.len() {
        match bytes[i] {
            q @ (b'\'' | b'"' | b'`') => {
                i += 1;
                while i < bytes.len() && bytes[i] != q {
                    i += 1;
                }
                i += 1;
                after_as = false;
            }
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < bytes.len() && !(bytes[i] == b'*' && bytes[i + 1] == b'/') {
                    i += 1;
                }
                i += 2;
            }
            b if word(b) => {
                let start = i;
                while i < bytes.len() && word(bytes[i]) {
                    i += 1;
                }
                let qualified = start > 0 && bytes[start - 1] == b'.';
                let word = &sql[start..i];
                if !qualified && !after_as && is_own(word) {
                    out.push_str(&sql[copied..start]);
                    out.push_str(prefix);
                    out.push_str(word);
                    copied = i;
                }
                after_as = word.eq_ignore_ascii_case("as");
            }
            _ => i += 1,
        }
    }
    if copied == 0 {
        return Cow::Borrowed(sql);
    }
    out.push_str(&sql[copied.min(sql.len())..]);
    Cow::Owned(out)
}

/// A migration's SQL for this process's prefix: unchanged (borrowed, so an unprefixed
/// database's recorded checksums still match) without one. With one, the names are prefixed
/// and, on MySQL/MariaDB, the migration keeps its hands off the database it shares with the
/// shop: `ALTER DATABASE` (the utf8mb4 default of migration 9) is left out, and each
/// `CREATE TABLE` names its own character set instead (`utf8mb4_bin`, what the database
/// default would have given it).
pub fn migration(backend: Backend, sql: &'static str) -> Cow<'static, str> {
    let prefix = prefix();
    if prefix.is_empty() {
        return Cow::Borrowed(sql);
    }
    match backend {
        Backend::MySql => Cow::Owned(
            super::statements::split(sql)
                .into_iter()
                .filter(|s| !starts_with_words(s, &["ALTER", "DATABASE"]))
                .map(|s| {
                    let s = rewrite(&s, prefix).into_owned();
                    if starts_with_words(&s, &["CREATE", "TABLE"])
                        && !s.to_ascii_uppercase().contains("CHARSET")
                        && !s.to_ascii_uppercase().contains("CHARACTER SET")
                    {
                        format!("{s} DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;\n")
                    } else {
                        format!("{s};\n")
                    }
                })
                .collect(),
        ),
        Backend::Sqlite | Backend::Postgres => Cow::Owned(rewrite(sql, prefix).into_owned()),
    }
}

/// Whether `statement` begins with `words`, in any case, separated by whitespace.
fn starts_with_words(statement: &str, words: &[&str]) -> bool {
    let mut got = statement.split_whitespace();
    words
        .iter()
        .all(|w| got.next().is_some_and(|g| g.eq_ignore_ascii_case(w)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bare_own_names_are_prefixed() {
        assert_eq!(
            rewrite(
                "UPDATE orders o JOIN order_items i ON i.order_id = o.id SET o.status = 'orders' \
                 WHERE o.id IN (SELECT order_id FROM order_timeout_msg) -- orders\n\
                 AND `orders`.x = \"orders\" /* effect_ledger */ AND shop.orders.id = 1 \
                 AND ordersx = 1 AND (SELECT 1 FROM dead_letter) AS dead_letter",
                "t_"
            ),
            "UPDATE t_orders o JOIN t_order_items i ON i.order_id = o.id SET o.status = 'orders' \
             WHERE o.id IN (SELECT order_id FROM t_order_timeout_msg) -- orders\n\
             AND `orders`.x = \"orders\" /* effect_ledger */ AND shop.orders.id = 1 \
             AND ordersx = 1 AND (SELECT 1 FROM t_dead_letter) AS dead_letter"
        );
    }

    #[test]
    fn no_prefix_borrows_the_statement() {
        assert!(matches!(
            rewrite("SELECT 1 FROM orders", ""),
            Cow::Borrowed(_)
        ));
        assert!(matches!(
            rewrite("SELECT 1 FROM oms_order", "t_"),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn prefixes_are_checked() {
        for good in ["", "timeoutd_", "t", "x9_"] {
            assert_eq!(check_prefix(good), Ok(()), "{good}");
        }
        for bad in ["Timeoutd_", "9x", "_x", "t-x", "t x", "t`", &"t".repeat(25)] {
            let e = check_prefix(bad).unwrap_err();
            assert!(e.contains(&format!("`{bad}`")), "{e}");
        }
    }

    /// The one list cannot drift from the migrations: every table and index they create is
    /// in [`TABLES`] or [`INDEXES`], and no column has one of those names (it would be
    /// prefixed as if it were a table).
    #[test]
    fn every_name_the_migrations_create_is_listed() {
        let (mut created, mut columns) = (
            std::collections::BTreeSet::new(),
            std::collections::BTreeSet::new(),
        );
        for backend in [Backend::Sqlite, Backend::MySql, Backend::Postgres] {
            for sql in super::super::migrate::sources(backend) {
                for s in super::super::statements::split(sql) {
                    let words: Vec<String> = s
                        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .filter(|w| !w.is_empty())
                        .map(str::to_ascii_lowercase)
                        .collect();
                    for (k, w) in words.iter().enumerate() {
                        let next = |n: usize| words.get(k + n).map(String::as_str);
                        let after = k.checked_sub(1).map(|p| words[p].as_str());
                        if matches!(w.as_str(), "table" | "index" | "key")
                            && matches!(after, Some("create" | "unique" | "alter" | "drop"))
                        {
                            let mut n = 1;
                            while matches!(next(n), Some("if" | "not" | "exists")) {
                                n += 1;
                            }
                            if let Some(name) = next(n) {
                                created.insert(name.to_string());
                            }
                        }
                        if w == "column" && after == Some("add") {
                            columns.insert(next(1).unwrap_or_default().to_string());
                        }
                    }
                    if starts_with_words(&s, &["CREATE", "TABLE"]) {
                        for line in s.lines().skip(1) {
                            if let Some(first) = line.split_whitespace().next() {
                                columns.insert(first.to_ascii_lowercase());
                            }
                        }
                    }
                    // MySQL's inline `KEY name (…)` in a CREATE TABLE.
                    for line in s.lines() {
                        let t = line.trim().to_ascii_lowercase();
                        for head in ["key ", "unique key ", "index "] {
                            if let Some(rest) = t.strip_prefix(head)
                                && let Some(name) = rest.split_whitespace().next()
                                && !name.starts_with('(')
                            {
                                created.insert(name.to_string());
                            }
                        }
                    }
                }
            }
        }
        created.remove("_sqlx_migrations");
        let missing: Vec<_> = created.iter().filter(|n| !is_own(n)).collect();
        assert!(
            missing.is_empty(),
            "not in names::TABLES/INDEXES: {missing:?}"
        );
        // `stock_journal.orders` (migration 16) is bare in its migration and in its one
        // statement (the close's append), so both are rewritten alike: a prefixed database's
        // journal calls it `<prefix>orders`. Any other column named like a table must be
        // looked at the same way before it is added here.
        let clashing: Vec<_> = columns
            .iter()
            .filter(|c| is_own(c) && c.as_str() != "orders")
            .collect();
        assert!(
            clashing.is_empty(),
            "columns named like a table: {clashing:?}"
        );
        for t in TABLES.iter().filter(|t| **t != "_sqlx_migrations") {
            assert!(created.contains(*t), "{t} is listed but never created");
        }
    }
}
