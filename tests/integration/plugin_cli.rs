//! `timeoutd plugin check | test | replay`, run as the built binary like a merchant runs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use timeoutd::clock::Clock;
use timeoutd::db::Backend;
use timeoutd::dispatch::Outcome;
use timeoutd::policies::builtin;

use crate::support::{Env, FUTURE_API_WASM, HOSTILE_WASM, T0, order, repo_root, timeoutd_bin};

fn plugin_cmd(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(timeoutd_bin())
        .arg("plugin")
        .args(args)
        .output()
        .expect("run timeoutd")
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Writes `bytes` as `dir/name`.
fn file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn check_reports_version_world_and_size_and_refuses_what_would_not_load() {
    let dir = tempfile::tempdir().unwrap();
    let good = file(dir.path(), "two_phase.wasm", builtin("two-phase").unwrap());
    let out = plugin_cmd(&["check".as_ref(), good.as_os_str()]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    for want in [
        "component:   yes",
        "api stamp:   timeout:policy@0.1.0",
        "exported",
        "compile:",
        &format!("{} bytes", builtin("two-phase").unwrap().len()),
        "imports:     timeout:policy/",
    ] {
        assert!(all.contains(want), "missing `{want}` in\n{all}");
    }
    // Built without `std`: no WASI imports, so no hint; a plugin built with `std` gets one.
    assert!(!all.contains("WASI interfaces"), "{all}");
    let with_std = file(dir.path(), "hostile.wasm", HOSTILE_WASM);
    let all = text(&plugin_cmd(&["check".as_ref(), with_std.as_os_str()]));
    assert!(
        all.contains("wasi:cli/") && all.contains("WASI interfaces, set up for every"),
        "{all}"
    );

    let future = file(dir.path(), "future.wasm", FUTURE_API_WASM);
    let out = plugin_cmd(&["check".as_ref(), future.as_os_str()]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("timeout:policy@9.0.0")
            && all.contains(&format!(
                "supports {}",
                timeoutd_runtime::SUPPORTED_API_VERSIONS.join(", ")
            )),
        "{all}"
    );
    assert!(all.contains("refused before compiling"), "{all}");

    let bytes = builtin("two-phase").unwrap();
    let cut = file(dir.path(), "cut.wasm", &bytes[..bytes.len() / 3]);
    let out = plugin_cmd(&["check".as_ref(), cut.as_os_str()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("malformed WebAssembly at byte"),
        "{}",
        text(&out)
    );
}

#[test]
fn test_runs_the_cases_file_and_fails_on_a_policy_that_differs() {
    let dir = tempfile::tempdir().unwrap();
    let cases = repo_root().join("plugins/cases/two-phase.toml");
    let two = file(dir.path(), "two_phase.wasm", builtin("two-phase").unwrap());
    let out = plugin_cmd(&["test".as_ref(), two.as_os_str(), cases.as_os_str()]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(
        all.contains("ok    at the deadline it waits the grace and reminds the buyer"),
        "{all}"
    );
    assert!(all.contains(" 0 failed"), "{all}");

    // The single-phase policy closes at the deadline: the two-phase cases must catch it.
    let one = file(
        dir.path(),
        "single_phase.wasm",
        builtin("single-phase").unwrap(),
    );
    let out = plugin_cmd(&["test".as_ref(), one.as_os_str(), cases.as_os_str()]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("FAIL  at the deadline it waits the grace and reminds the buyer"),
        "{all}"
    );
    assert!(all.contains("expected decision wait, got cancel"), "{all}");

    let bad = file(
        dir.path(),
        "bad.toml",
        b"[[case]]\nname = \"a\"\nexpect = { decision = \"wait\", effect_kinds = [\"restore-stok\"] }\n",
    );
    let out = plugin_cmd(&["test".as_ref(), two.as_os_str(), bad.as_os_str()]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(64), "{all}");
    assert!(
        all.contains("`effect_kinds` needs decision = cancel"),
        "{all}"
    );
    assert!(all.contains("unknown kind `restore-stok`"), "{all}");
}

/// `plugin test` plays what the daemon does: a case the daemon never produces fails, naming
/// why (a 0.1.0 plugin asked before its deadline; state at phase 0), while the same early call
/// to a 0.2.0 plugin runs; a 0.2.0 wait's state and poll request are compared.
#[test]
fn test_flags_a_case_the_daemon_never_produces_and_compares_state() {
    let dir = tempfile::tempdir().unwrap();
    let two = file(dir.path(), "two_phase.wasm", builtin("two-phase").unwrap());
    let tea = file(dir.path(), "tea_house.wasm", crate::support::TEA_HOUSE_WASM);
    let cases = file(
        dir.path(),
        "cases.toml",
        "[defaults.context]\nsettings = { grace = \"5m\" }\n\
         [[case]]\nname = \"ten minutes in\"\ncontext = { phase = 1, now = \"10m\" }\n\
         expect = { decision = \"wait\" }\n\
         [[case]]\nname = \"state at the first call\"\ncontext = { now = \"16m\", state = \"01\" }\n\
         expect = { decision = \"wait\" }\n"
            .as_bytes(),
    );
    let out = plugin_cmd(&["test".as_ref(), two.as_os_str(), cases.as_os_str()]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("FAIL  ten minutes in\n        - the daemon never asks this: a 0.1.0 plugin is asked from the deadline on, and `now` is 5m before it"), "{all}");
    assert!(all.contains("FAIL  state at the first call\n        - the daemon never asks this: phase 0 is the order's first call, which has no state"), "{all}");

    let out = plugin_cmd(&["test".as_ref(), tea.as_os_str(), cases.as_os_str()]);
    let all = text(&out);
    assert!(all.contains("ok    ten minutes in"), "{all}");
    assert!(all.contains("FAIL  state at the first call"), "{all}");

    let cases = file(
        dir.path(),
        "state.toml",
        "[[case]]\nname = \"reminded\"\ncontext = { phase = 1, now = \"13m\" }\n\
         expect = { decision = \"wait\", state = \"02\", poll_payment = true }\n\
         [[case]]\nname = \"bad hex\"\ncontext = { phase = 1, state = \"0g\" }\n\
         expect = { decision = \"wait\", state = \"xyz\" }\n"
            .as_bytes(),
    );
    let out = plugin_cmd(&["test".as_ref(), tea.as_os_str(), cases.as_os_str()]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(64), "{all}");
    assert!(all.contains("context.state: `0g` is not hex"), "{all}");
    assert!(all.contains("state: not hex"), "{all}");
    std::fs::write(
        &cases,
        "[[case]]\nname = \"reminded\"\ncontext = { phase = 1, now = \"13m\" }\n\
         expect = { decision = \"wait\", state = \"02\", poll_payment = true }\n",
    )
    .unwrap();
    let out = plugin_cmd(&["test".as_ref(), tea.as_os_str(), cases.as_os_str()]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("expected state \"02\", got \"01\""), "{all}");
    assert!(
        all.contains("expected poll_payment = true, got false"),
        "{all}"
    );
}

/// A decision recorded by a dispatcher is replayed: the same plugin agrees; a different one is
/// reported with both answers; rows older than migration 0005 are reconstructed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_prints_where_a_new_version_decides_differently() {
    let env = Env::new(Backend::Sqlite).await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    env.create(&order("r1", "flashy", T0)).await;
    let settings: &[(&str, &str)] = &[("grace", "5m")];
    let config = env.config(&[("flashy", "builtin:two-phase", settings)], "");
    let (clock, _now) = Clock::manual(T0 + 200);
    let d = env.dispatcher(&config, clock).await;
    assert!(matches!(
        env.process(&d, T0 + 200).await[..],
        [Outcome::Waiting { .. }]
    ));
    let input = env
        .text("SELECT input FROM decision_log WHERE order_id = ?", "r1")
        .await;
    assert!(
        input.contains("\"grace\"") && input.contains("\"now_ms\""),
        "{input}"
    );

    let dir = tempfile::tempdir().unwrap();
    let config_file = file(
        dir.path(),
        "timeoutd.toml",
        format!(
            "[database]\nurl = \"{}\"\nmigrate = false\n[merchants.flashy]\nplugin = \"builtin:two-phase\"\n\
             [merchants.flashy.settings]\ngrace = \"5m\"\n",
            env.url
        )
        .as_bytes(),
    );
    let replay = |wasm: &Path| {
        plugin_cmd(&[
            "replay".as_ref(),
            wasm.as_os_str(),
            "--config".as_ref(),
            config_file.as_os_str(),
            "--merchant".as_ref(),
            "flashy".as_ref(),
        ])
    };
    let two = file(dir.path(), "two_phase.wasm", builtin("two-phase").unwrap());
    let out = replay(&two);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("1 same, 0 different"), "{}", text(&out));
    // The same plugin with a new setting: what the recorded order would have got.
    let out = plugin_cmd(&[
        "replay".as_ref(),
        two.as_os_str(),
        "--config".as_ref(),
        config_file.as_os_str(),
        "--setting".as_ref(),
        "grace=1m".as_ref(),
    ]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("was: wait 299800 ms") && all.contains("now: wait 59800 ms"),
        "{all}"
    );
    assert!(all.contains("settings changed: grace=1m"), "{all}");

    let one = file(
        dir.path(),
        "single_phase.wasm",
        builtin("single-phase").unwrap(),
    );
    let out = replay(&one);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("DIFF") && all.contains("order r1 phase 0"),
        "{all}"
    );
    assert!(all.contains("was: wait 299800 ms"), "{all}");
    assert!(all.contains("now: cancel (payment window lapsed)"), "{all}");

    // A row written before migration 0005 has no input: it is rebuilt from the order.
    sqlx::query("UPDATE decision_log SET input = NULL, answer = NULL")
        .execute(env.db.pool())
        .await
        .unwrap();
    let out = replay(&two);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(all.contains("1 with reconstructed input"), "{all}");
    env.cleanup().await;
}

/// `plugin check` lists a 0.2.0 plugin's manifest; `plugin run` calls it once with an order from
/// a file and prints the decision and the guard's verdict (a reminder before the deadline is a
/// wait the daemon carries out), warning about a setting the manifest says is malformed.
#[test]
fn run_calls_a_plugin_once_with_an_order_from_a_file_and_check_lists_its_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let tea = file(dir.path(), "tea_house.wasm", crate::support::TEA_HOUSE_WASM);
    let out = plugin_cmd(&["check".as_ref(), tea.as_os_str()]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    for want in [
        "api stamp:   timeout:policy@0.2.0",
        "effects:     restore-stock, release-coupon, restore-flash-stock, release-flash-slot, close-payment, notify",
        "setting:     vip_grace (duration, default 10m): how much longer a VIP order stays open after its deadline",
    ] {
        assert!(all.contains(want), "missing `{want}` in\n{all}");
    }
    let o = order("o-run", "tea", T0);
    let order_file = file(
        dir.path(),
        "order.json",
        serde_json::to_string(&o).unwrap().as_bytes(),
    );
    let now = (T0 - 2 * 60_000).to_string();
    let out = plugin_cmd(&[
        "run".as_ref(),
        tea.as_os_str(),
        "--order".as_ref(),
        order_file.as_os_str(),
        "--now".as_ref(),
        now.as_ref(),
        "--phase".as_ref(),
        "1".as_ref(),
        "--setting".as_ref(),
        "vip_grace=10".as_ref(),
    ]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    for want in [
        "plugin:   tea_house (timeout:policy@0.2.0",
        "asked:    phase 1 at",
        "\"decision\":\"wait\"",
        "order-closing-soon",
        "guard:    permitted",
        "warning: settings.vip_grace: `10` has no unit",
    ] {
        assert!(all.contains(want), "missing `{want}` in\n{all}");
    }
    let bad = file(dir.path(), "bad.json", b"{\"id\": 1}");
    let out = plugin_cmd(&[
        "run".as_ref(),
        tea.as_os_str(),
        "--order".as_ref(),
        bad.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
    assert!(text(&out).contains("not an order"), "{}", text(&out));
}

/// `timeoutd plugin new` makes a project that builds with nothing but the binary and a Rust
/// toolchain (the SDK and its WIT vendored into it) and passes its own cases on first run;
/// it refuses to write over an existing folder or to take a name that is not a crate name.
/// The JavaScript and Python scaffolds, built with the tools their README names (npm and
/// componentize-js; a venv and componentize-py), pass their cases and load as 0.2.0 plugins.
#[test]
fn plugin_new_in_javascript_and_python_builds_with_its_own_tools_and_passes_its_cases() {
    let dir = tempfile::tempdir().unwrap();
    let steps: [(&str, &[&[&str]]); 2] = [
        (
            "js",
            &[
                &[
                    "npm",
                    "install",
                    "--no-audit",
                    "--no-fund",
                    "--loglevel=error",
                ],
                &["npm", "run", "build"],
            ],
        ),
        ("python", &[&["./build.sh"]]),
    ];
    for (lang, build) in steps {
        let name = format!("shop-{lang}");
        let project = dir.path().join(&name);
        let out = plugin_cmd(&[
            "new".as_ref(),
            name.as_ref(),
            "--lang".as_ref(),
            lang.as_ref(),
            "--dir".as_ref(),
            project.as_os_str(),
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert!(text(&out).contains("--deadline 250ms"), "{}", text(&out));
        assert_eq!(
            std::fs::read_to_string(project.join("wit/policy.wit")).unwrap(),
            std::fs::read_to_string(repo_root().join("wit/v0.2.0/policy.wit")).unwrap(),
            "the released WIT, unchanged"
        );
        for step in build {
            let done = Command::new(step[0])
                .args(&step[1..])
                .current_dir(&project)
                .output()
                .expect(step[0]);
            assert!(done.status.success(), "{lang}: {step:?}\n{}", text(&done));
        }
        let wasm = project.join(format!("{name}.wasm"));
        let out = plugin_cmd(&["check".as_ref(), wasm.as_os_str()]);
        assert!(
            text(&out).contains("timeout:policy@0.2.0"),
            "{}",
            text(&out)
        );
        assert!(text(&out).contains("remind_before"), "{}", text(&out));
        let out = plugin_cmd(&[
            "test".as_ref(),
            "--deadline".as_ref(),
            "2s".as_ref(),
            wasm.as_os_str(),
            project.join("CASES.toml").as_os_str(),
        ]);
        assert_eq!(out.status.code(), Some(0), "{lang}: {}", text(&out));
        assert!(text(&out).contains("4 passed, 0 failed"), "{}", text(&out));
    }
    let out = plugin_cmd(&[
        "new".as_ref(),
        "x".as_ref(),
        "--lang".as_ref(),
        "go".as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("possible values: rust, js, python"),
        "{}",
        text(&out)
    );
}

#[test]
fn plugin_new_makes_a_project_that_builds_and_passes_its_cases_on_first_run() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("my-shop");
    let out = plugin_cmd(&[
        "new".as_ref(),
        "my-shop".as_ref(),
        "--dir".as_ref(),
        project.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for path in [
        "Cargo.toml",
        "src/lib.rs",
        "CASES.toml",
        "README.md",
        "timeoutd-policy-sdk/wit/policy.wit",
    ] {
        assert!(project.join(path).is_file(), "{path} missing");
    }
    // Built as a merchant would, outside this workspace and its target directory (offline
    // first: the SDK's one dependency is in the local registry cache after this repo's build).
    let build = |offline: bool| {
        let mut cmd = Command::new("cargo");
        cmd.args(["build", "--release", "--target", "wasm32-wasip2"])
            .current_dir(&project)
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("RUSTFLAGS");
        if offline {
            cmd.arg("--offline");
        }
        cmd.output().expect("cargo")
    };
    let mut built = build(true);
    if !built.status.success() {
        built = build(false);
    }
    assert!(built.status.success(), "{}", text(&built));
    let wasm = project.join("target/wasm32-wasip2/release/my_shop.wasm");
    let out = plugin_cmd(&["check".as_ref(), wasm.as_os_str()]);
    assert!(
        text(&out).contains("timeout:policy@0.2.0"),
        "{}",
        text(&out)
    );
    let out = plugin_cmd(&[
        "test".as_ref(),
        wasm.as_os_str(),
        project.join("CASES.toml").as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("4 passed, 0 failed"), "{}", text(&out));
    // Without `std`, as its README says (`#![no_std]`, the SDK's default features off): the
    // vendored SDK brings the allocator and panic handler, the component imports no WASI, and
    // the same cases pass.
    let lib = project.join("src/lib.rs");
    let source = std::fs::read_to_string(&lib).unwrap();
    std::fs::write(&lib, format!("#![no_std]\n{source}")).unwrap();
    let manifest = project.join("Cargo.toml");
    let cargo_toml = std::fs::read_to_string(&manifest).unwrap();
    let sdk = r#"timeoutd-policy-sdk = { path = "timeoutd-policy-sdk" }"#;
    assert!(cargo_toml.contains(sdk), "{cargo_toml}");
    std::fs::write(
        &manifest,
        cargo_toml.replace(
            sdk,
            r#"timeoutd-policy-sdk = { path = "timeoutd-policy-sdk", default-features = false }"#,
        ),
    )
    .unwrap();
    let built = build(true);
    assert!(built.status.success(), "{}", text(&built));
    let out = plugin_cmd(&["check".as_ref(), wasm.as_os_str()]);
    let all = text(&out);
    assert!(
        all.contains("imports:     timeout:policy/") && !all.contains("wasi:"),
        "{all}"
    );
    let out = plugin_cmd(&[
        "test".as_ref(),
        wasm.as_os_str(),
        project.join("CASES.toml").as_os_str(),
    ]);
    assert!(text(&out).contains("4 passed, 0 failed"), "{}", text(&out));
    // Never over an existing folder; only crate names.
    let again = plugin_cmd(&[
        "new".as_ref(),
        "my-shop".as_ref(),
        "--dir".as_ref(),
        project.as_os_str(),
    ]);
    assert_eq!(again.status.code(), Some(64), "{}", text(&again));
    let bad = plugin_cmd(&[
        "new".as_ref(),
        "My Shop".as_ref(),
        "--dir".as_ref(),
        dir.path().join("x").as_os_str(),
    ]);
    assert_eq!(bad.status.code(), Some(64), "{}", text(&bad));
}

/// `plugin whatif` over a merchant's recorded decisions (#44 part 2): six closes the
/// single-phase plugin made, decided again by the two-phase candidate, are six closes that
/// become waits with a reminder, every unit and coupon released later by 1–5 minutes; the
/// totals printed, written as JSON, and drawn by the report (in headless Chromium when the
/// console test's browser is installed); the same plugin agrees on all six.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whatif_totals_what_a_candidate_would_have_changed() {
    let env = Env::new(Backend::Sqlite).await;
    env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
    let ids: Vec<String> = (0..6).map(|k| format!("w{k}")).collect();
    for id in &ids {
        env.create(&order(id, "acme", T0)).await;
    }
    let config = env.config(&[("acme", "builtin:single-phase", &[])], "");
    let (clock, _) = Clock::manual(T0 + 200);
    let d = env.dispatcher(&config, clock).await;
    let outcomes = env.process(&d, T0 + 200).await;
    assert_eq!(outcomes.len(), 6, "{outcomes:?}");
    for id in &ids {
        assert_eq!(env.status(id).await, "CLOSED");
    }
    let dir = tempfile::tempdir().unwrap();
    let config_file = file(
        dir.path(),
        "timeoutd.toml",
        format!(
            "[database]\nurl = \"{}\"\nmigrate = false\ntable_prefix = \"{}\"\n[merchants.acme]\nplugin = \"builtin:single-phase\"\n",
            env.url,
            crate::support::table_prefix()
        )
        .as_bytes(),
    );
    let whatif = |wasm: &Path, out: &Path, extra: &[&str]| {
        let mut args: Vec<&std::ffi::OsStr> = vec![
            "whatif".as_ref(),
            wasm.as_os_str(),
            "--config".as_ref(),
            config_file.as_os_str(),
            "--merchant".as_ref(),
            "acme".as_ref(),
            "--since".as_ref(),
            "60d".as_ref(),
            "--out".as_ref(),
            out.as_os_str(),
        ];
        args.extend(extra.iter().map(|a| std::ffi::OsStr::new(*a)));
        plugin_cmd(&args)
    };
    let two = file(dir.path(), "two_phase.wasm", builtin("two-phase").unwrap());
    let report = dir.path().join("report");
    let out = whatif(&two, &report, &["--setting", "grace=5m"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(all.contains("cancel→wait: 6"), "{all}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(report.join("whatif.json")).unwrap())
            .unwrap();
    assert_eq!(
        (
            json["decisions"].as_u64(),
            json["same"].as_u64(),
            json["different"].as_u64()
        ),
        (Some(6), Some(0), Some(6)),
        "{json}"
    );
    assert_eq!(json["transitions"]["cancel→wait"], 6, "{json}");
    assert_eq!(json["reminders_added"], 6, "{json}");
    // Each order: two units of sku-a, one of sku-b, its coupon — all released later.
    assert_eq!(
        (
            json["stock_units"]["later"].as_u64(),
            json["coupons"]["later"].as_u64(),
            json["stock_units"]["earlier"].as_u64()
        ),
        (Some(18), Some(6), Some(0)),
        "{json}"
    );
    assert_eq!(
        json["shift"][1],
        serde_json::json!(["1–5 min", 0, 6]),
        "{json}"
    );
    assert_eq!(json["refused"], 0, "{json}");
    let html = std::fs::read_to_string(report.join("whatif.html")).unwrap();
    assert!(
        html.contains("function stackedBars") && html.contains("\"cancel→wait\": 6"),
        "the report carries the chart code and its data"
    );
    let console = repo_root().join("tests/console");
    if console.join("node_modules/playwright-core").is_dir() {
        let run = Command::new("node")
            .arg("whatif.test.mjs")
            .arg(report.join("whatif.html"))
            .current_dir(&console)
            .output()
            .unwrap();
        assert!(run.status.success(), "{}", text(&run));
    }
    // The live plugin itself agrees with every recorded decision.
    let one = file(
        dir.path(),
        "single_phase.wasm",
        builtin("single-phase").unwrap(),
    );
    let out = whatif(&one, &dir.path().join("same"), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("same 6 · different 0"),
        "{}",
        text(&out)
    );
    env.cleanup().await;
}

/// By hand (`--ignored`): `plugin whatif`'s speed and memory over many recorded decisions.
/// Real decisions of the single-phase plugin for 8 orders, the rows copied (doubling, SQL)
/// up to `TIMEOUTD_WHATIF_DECISIONS` (default 1,000,000), then the two-phase candidate over
/// all of them through the built binary: prints decisions a second, a second per core, and
/// the binary's peak RSS (`/proc`'s `VmHWM` is not readable after exit: GNU time's `%M`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a bench, run by hand"]
async fn bench_whatif_over_many_recorded_decisions() {
    let n: i64 = std::env::var("TIMEOUTD_WHATIF_DECISIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let env = Env::new(Backend::Sqlite).await;
    env.stock_up(&[("sku-a", 1_000), ("sku-b", 1_000)]).await;
    for k in 0..8 {
        env.create(&order(&format!("b{k}"), "acme", T0)).await;
    }
    let config = env.config(&[("acme", "builtin:single-phase", &[])], "");
    let (clock, _) = Clock::manual(T0 + 200);
    let d = env.dispatcher(&config, clock).await;
    assert_eq!(env.process(&d, T0 + 200).await.len(), 8);
    let columns = "order_id, merchant_id, plugin, plugin_digest, trigger_kind, phase, attempt, \
                   decision, outcome, detail, decided_at_ms, latency_us, input, answer";
    loop {
        let have = env
            .int(
                "SELECT COUNT(*) FROM decision_log WHERE merchant_id = ?",
                "acme",
            )
            .await;
        if have >= n {
            break;
        }
        let sql = format!(
            "INSERT INTO decision_log ({columns}) SELECT {columns} FROM decision_log LIMIT {}",
            (n - have).min(have)
        );
        env.db
            .backend()
            .query_owned(sql)
            .execute(env.db.pool())
            .await
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let config_file = file(
        dir.path(),
        "timeoutd.toml",
        format!(
            "[database]\nurl = \"{}\"\nmigrate = false\n[merchants.acme]\nplugin = \"builtin:single-phase\"\n",
            env.url
        )
        .as_bytes(),
    );
    let two = file(dir.path(), "two_phase.wasm", builtin("two-phase").unwrap());
    let out = Command::new("/usr/bin/time")
        .args(["-f", "peak RSS %M KiB, %e s wall, %U s user"])
        .arg(timeoutd_bin())
        .args(["plugin", "whatif"])
        .arg(&two)
        .arg("--config")
        .arg(&config_file)
        .args([
            "--merchant",
            "acme",
            "--since",
            "60d",
            "--setting",
            "grace=5m",
            "--out",
        ])
        .arg(dir.path().join("report"))
        .output()
        .unwrap();
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    let per_second: f64 = all
        .lines()
        .find_map(|l| l.trim().strip_suffix(" a second"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    eprintln!("{all}");
    eprintln!(
        "whatif over {n} decisions: {per_second:.0}/s on {cores} cores = {:.0}/s per core",
        per_second / cores as f64
    );
    assert!(all.contains(&format!("cancel→wait: {n}")), "{all}");
    env.cleanup().await;
}
