//! Configuration goldens: the shipped files validate; a bad file lists every problem.

use timeoutd::config::Config;

use crate::support::repo_root;

/// Every `config/*.toml` (listed from the folder, so none is forgotten) parses and validates,
/// plugins included. (`config/rocketmq/` holds the broker's own files.)
#[test]
fn every_shipped_config_validates() {
    let dir = repo_root().join("config");
    for path in crate::support::shipped_configs() {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let raw = std::fs::read_to_string(&path).unwrap();
        let config = Config::from_toml(&raw, &dir, &|k| {
            (k == "TIMEOUTD_DATA_DIR").then(|| "/tmp".into())
        })
        .unwrap_or_else(|p| panic!("config/{name}: {p}"));
        assert!(!config.merchants.is_empty(), "{name}");
        timeoutd::policies::load(&config).unwrap_or_else(|e| panic!("config/{name}: {e}"));
    }
}

#[test]
fn a_bad_config_lists_every_problem_with_its_key_path() {
    let raw = r#"
[database]
url = "oracle://x"
max_connections = 0
[outbox]
batch = 0
[sweep]
interval = "0s"
[merchants.a]
plugin = "builtin:three-phase"
[merchants.b]
plugin = "missing/plugin.wasm"
"#;
    let problems =
        Config::from_toml(raw, std::path::Path::new("/nonexistent"), &|_| None).unwrap_err();
    let keys: Vec<&str> = problems.problems.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "database.url",
            "database.max_connections",
            "outbox.batch",
            "sweep.interval",
            "merchants.a.plugin",
            "merchants.b.plugin"
        ],
        "{problems}"
    );
    assert!(
        problems
            .to_string()
            .contains("unknown built-in plugin `three-phase`")
    );
}

/// A shard list is checked shard by shard (a duplicate name, a URL without a database, a bad
/// scheme), with the sections not yet available beside shards named, all in one report; a file
/// with neither a URL nor shards says what to give.
#[test]
fn a_bad_shard_list_names_every_problem_by_its_index() {
    let raw = r#"
[database]
routing = "mod"
shard_lease = "500ms"
[[database.shards]]
name = "ds_0"
url = "mysql://root@127.0.0.1:3306/shop_0"
[[database.shards]]
name = "ds_0"
url = "mysql://root@127.0.0.1:3306"
[[database.shards]]
name = "ds_2"
url = "oracle://x/y"
[admin]
listen = "127.0.0.1:0"
tokens = { ops = "0123456789abcdef" }
[merchants.a]
plugin = "builtin:single-phase"
"#;
    let problems =
        Config::from_toml(raw, std::path::Path::new("/nonexistent"), &|_| None).unwrap_err();
    let keys: Vec<&str> = problems.problems.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "database.shards[1].name",
            "database.shards[1].url",
            "database.shards[2].url",
            "database.shard_lease",
            "admin",
        ],
        "{problems}"
    );
    let said = problems.to_string();
    assert!(said.contains("`ds_0` names two shards"), "{said}");
    assert!(
        said.contains("[admin] is not available with database.shards"),
        "{said}"
    );
    let neither = Config::from_toml(
        "[database]
[merchants.a]
plugin = \"builtin:single-phase\"
",
        std::path::Path::new("."),
        &|_| None,
    )
    .unwrap_err()
    .to_string();
    assert!(neither.contains("database.url: missing"), "{neither}");
}

/// Fair shares: more slots for one merchant than the executor has, and a weight of 0, are each
/// named by their key; the default share is ¾ of the slots, rounded up.
#[test]
fn bad_fair_shares_are_named_by_their_keys() {
    let raw = r#"
[database]
url = "sqlite://x.db"
[effects]
concurrency = 8
merchant_slots = 9
[merchants.a]
plugin = "builtin:single-phase"
weight = 0
[merchants.b]
plugin = "builtin:single-phase"
weight = 1001
"#;
    let problems = Config::from_toml(raw, std::path::Path::new("."), &|_| None).unwrap_err();
    let keys: Vec<&str> = problems.problems.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "effects.merchant_slots",
            "merchants.a.weight",
            "merchants.b.weight"
        ],
        "{problems}"
    );
    assert!(
        problems
            .to_string()
            .contains("must be 1 to effects.concurrency (8)"),
        "{problems}"
    );
    let fine = raw
        .replace("merchant_slots = 9\n", "")
        .replace("weight = 0", "weight = 3")
        .replace("weight = 1001", "");
    let config = Config::from_toml(&fine, std::path::Path::new("."), &|_| None).unwrap();
    assert_eq!(config.effects.merchant_slots(), 6);
    assert_eq!(
        (config.merchants["a"].weight, config.merchants["b"].weight),
        (3, 1)
    );
}

/// Caps: a name that is no cap, a channel that does not exist, a rate of 0 and a shared store
/// without Redis are each named by their key.
#[test]
fn bad_caps_are_named_by_their_keys() {
    let raw = r#"
[database]
url = "sqlite://x.db"
[caps]
store = "redis"
[caps.per_second]
notify = 0
"notify.sms" = 5
sms = 3
[merchants.a]
plugin = "builtin:single-phase"
[merchants.a.caps]
"payment.stripe" = 2
"#;
    let problems = Config::from_toml(raw, std::path::Path::new("."), &|_| None).unwrap_err();
    let keys: Vec<&str> = problems.problems.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "caps.per_second.\"notify\"",
            "caps.per_second.\"notify.sms\"",
            "caps.per_second.\"sms\"",
            "merchants.a.caps.\"payment.stripe\"",
            "caps.store",
        ],
        "{problems}"
    );
    let said = problems.to_string();
    assert!(
        said.contains("`sms` is not a channel of [notify.channels]"),
        "{said}"
    );
    assert!(said.contains("`payment.stripe` is no cap"), "{said}");
}

#[test]
fn unknown_keys_and_unitless_durations_are_refused() {
    let unknown = Config::from_toml(
        "[database]\nurl = \"sqlite://x\"\nurll = 1\n[merchants]\n",
        std::path::Path::new("."),
        &|_| None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        unknown.contains("unknown field `urll`") && unknown.contains("line 3"),
        "{unknown}"
    );
    let unitless = Config::from_toml(
        "[database]\nurl = \"sqlite://x\"\n[sweep]\ninterval = \"30\"\n[merchants]\n",
        std::path::Path::new("."),
        &|_| None,
    )
    .unwrap_err()
    .to_string();
    assert!(unitless.contains("`30` is not a duration"), "{unitless}");
    assert!(
        unitless.contains("sweep.interval (line 4)"),
        "the key is named, not only the line: {unitless}"
    );
    let merchant = Config::from_toml(
        "[database]\nurl = \"sqlite://x\"\n[merchants.shop]\nplugin = \"builtin:single-phase\"\npayment_window = \"900\"\n",
        std::path::Path::new("."),
        &|_| None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        merchant.contains("merchants.shop.payment_window (line 5)")
            && merchant.contains("`900` is not a duration"),
        "{merchant}"
    );
}

#[test]
fn values_that_would_break_the_daemon_at_run_time_are_refused() {
    let raw = r#"
[database]
url = "mysql://root@127.0.0.1:3306/"
[admin]
listen = "127.0.0.1:0"
sample_interval = "0s"
[admin.tokens]
ops = "short"
[effects]
retry_initial = "10m"
retry_max = "1s"
lease = "0s"
[redis]
url = "redis://127.0.0.1:6379"
marker_ttl = "0s"
[runtime]
deadline = "1000h"
max_memory_mib = 4000000
[rocketmq]
namesrv = "127.0.0.1:19876"
rows_per_message = 100000
[merchants.a]
plugin = "builtin:single-phase"
"#;
    let problems = Config::from_toml(raw, std::path::Path::new("."), &|_| None).unwrap_err();
    let keys: Vec<&str> = problems.problems.iter().map(|(k, _)| k.as_str()).collect();
    for key in [
        "database.url",
        "admin.tokens.ops",
        "admin.sample_interval",
        "effects.retry_initial",
        "effects.lease",
        "redis.marker_ttl",
        "runtime.deadline",
        "runtime.max_memory_mib",
        "rocketmq.rows_per_message",
    ] {
        assert!(keys.contains(&key), "{key} not reported:\n{problems}");
    }
}

#[test]
fn merchant_plugin_error_rules_and_granted_effects_are_checked() {
    let raw = r#"
        [database]
        url = "sqlite://x.db"
        [merchants.a]
        plugin = "builtin:two-phase"
        on_plugin_error = "fallback"
        granted_effects = ["restore-stock", "refund-everything", "notify", "teleport"]
        [merchants.b]
        plugin = "builtin:single-phase"
        on_plugin_error = "dead_letter"
    "#;
    let problems = Config::from_toml(raw, std::path::Path::new("."), &|_| None).unwrap_err();
    let keys: Vec<&str> = problems.problems.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "merchants.a.granted_effects[1]",
            "merchants.a.granted_effects[3]"
        ],
        "{problems}"
    );
    assert!(
        problems
            .to_string()
            .contains("`teleport` is not an effect kind (one of restore-stock"),
        "{problems}"
    );

    let ok = raw
        .replace(", \"refund-everything\"", "")
        .replace(", \"teleport\"", "");
    let config = Config::from_toml(&ok, std::path::Path::new("."), &|_| None).unwrap();
    use timeoutd::config::OnPluginError;
    assert_eq!(
        config.merchants["a"].on_plugin_error,
        OnPluginError::Fallback
    );
    assert_eq!(
        config.merchants["b"].on_plugin_error,
        OnPluginError::DeadLetter
    );

    let bad_rule = raw.replace("\"fallback\"", "\"shrug\"");
    let err = Config::from_toml(&bad_rule, std::path::Path::new("."), &|_| None).unwrap_err();
    assert!(err.to_string().contains("shrug"), "{err}");
}

/// `redis.marker_ttl` must outlast the ledger's replay horizon (every retry at `retry_max`, and
/// a lease): a marker that expires before a replay lets the effect apply twice.
#[test]
fn a_marker_ttl_shorter_than_the_replay_horizon_is_refused_naming_both() {
    let raw = r#"
[database]
url = "sqlite://data/t.db"
[effects]
max_attempts = 48
retry_max = "1h"
[redis]
url = "redis://127.0.0.1:6379"
marker_ttl = "1d"
[merchants.a]
plugin = "builtin:single-phase"
"#;
    let problems = Config::from_toml(raw, std::path::Path::new("."), &|_| None).unwrap_err();
    let (_, what) = problems
        .problems
        .iter()
        .find(|(k, _)| k == "redis.marker_ttl")
        .unwrap_or_else(|| panic!("redis.marker_ttl not reported:\n{problems}"));
    assert!(
        what.starts_with("is 1day, shorter than the ledger's replay horizon"),
        "{what}"
    );
    assert!(
        what.contains("effects.max_attempts 48 × effects.retry_max 1h"),
        "{what}"
    );
    let fine = raw.replace("marker_ttl = \"1d\"", "marker_ttl = \"7d\"");
    assert!(Config::from_toml(&fine, std::path::Path::new("."), &|_| None).is_ok());
}

/// The pool size left out is 4 on SQLite (one writer at a time; each connection's own page
/// cache counts in the RSS) and 8 on a server; `max_connections` overrides both, shards
/// included.
#[test]
fn the_pool_size_left_out_depends_on_the_backend_and_max_connections_overrides_it() {
    let parse = |database: &str| {
        let raw = format!("{database}\n[merchants.acme]\nplugin = \"builtin:single-phase\"\n");
        Config::from_toml(&raw, std::path::Path::new("/nonexistent"), &|_| None)
            .unwrap_or_else(|p| panic!("{database}: {p}"))
    };
    let sqlite = parse("[database]\nurl = \"sqlite:///tmp/t.db\"");
    assert_eq!(sqlite.database.pool_size(&sqlite.database.url), 4);
    let mariadb = parse("[database]\nurl = \"mysql://root@127.0.0.1:3306/test\"");
    assert_eq!(mariadb.database.pool_size(&mariadb.database.url), 8);
    let postgres = parse("[database]\nurl = \"postgres://postgres@127.0.0.1/test\"");
    assert_eq!(postgres.database.pool_size(&postgres.database.url), 8);
    let set = parse("[database]\nurl = \"sqlite:///tmp/t.db\"\nmax_connections = 12");
    assert_eq!(set.database.pool_size(&set.database.url), 12);
    assert_eq!(
        set.database.pool_size("mysql://root@127.0.0.1:3306/shop_0"),
        12
    );
}

/// `[dispatch.stock]`: the journal needs a pace and a batch, and gives units back to timeoutd's
/// own `sku_stock` only, so it is refused beside a shop's schema profile, each named by its key.
#[test]
fn a_stock_journal_on_a_shops_schema_or_without_a_pace_is_refused() {
    let raw = r#"
[database]
url = "mysql://root@127.0.0.1:3306/test"
[database.shop]
profile = "profiles/mall.toml"
database = "mall"
[dispatch.stock]
mode = "journal"
fold_interval = "0s"
fold_batch = 0
[merchants.mall]
plugin = "builtin:single-phase"
"#;
    let problems = Config::from_toml(raw, &repo_root().join("config"), &|_| None).unwrap_err();
    let keys: Vec<&str> = problems.problems.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "dispatch.stock.fold_interval",
            "dispatch.stock.fold_batch",
            "dispatch.stock.mode"
        ],
        "{problems}"
    );
    assert!(
        problems
            .to_string()
            .contains("timeoutd's own sku_stock only"),
        "{problems}"
    );
    let direct = raw.replace("mode = \"journal\"", "mode = \"direct\"");
    Config::from_toml(&direct, &repo_root().join("config"), &|_| None)
        .expect("direct mode on a shop's schema (its fold keys unused)");
}
