//! What the payment-provider tests share: the interpreter of a fake's venv (installed by
//! scripts/test), a fake started on loopback that prints its port, RSA key pairs made by
//! `openssl` per run, the daemon's `[http]` listener, and the refused-notice counter.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tokio::io::AsyncBufReadExt;

use crate::support::Env;

/// The Python interpreter of the venv scripts/test builds for `name` from
/// `tests/data/{data}/requirements.txt`: `$var` when set, else where scripts/test puts it.
pub fn python(var: &str, name: &str, data: &str) -> String {
    let python = std::env::var(var).unwrap_or_else(|_| {
        let req = std::fs::read(
            crate::support::repo_root().join(format!("tests/data/{data}/requirements.txt")),
        )
        .unwrap();
        let sum = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&req));
        format!(
            "{}/.cache/timeoutd/{name}-{}/bin/python",
            std::env::var("HOME").unwrap(),
            &sum[..16]
        )
    });
    assert!(
        PathBuf::from(&python).exists(),
        "no {name} interpreter at {python}: run scripts/test (it installs tests/data/{data}/requirements.txt into a venv) or set {var}"
    );
    python
}

/// Starts `python script args…` (killed when the child is dropped) and reads the port it
/// prints first: its base URL and the child.
pub async fn spawn(
    python: &str,
    script: &Path,
    args: &[&std::ffi::OsStr],
) -> (String, tokio::process::Child) {
    let mut child = tokio::process::Command::new(python)
        .arg(script)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", script.display()));
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let port = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the fake printed its port")
        .unwrap()
        .expect("a port line");
    (format!("http://127.0.0.1:{}", port.trim()), child)
}

/// Generates an RSA key of 2048 bits into `dir/name.key` (`traditional`: PKCS#1, as Alipay's
/// Python SDK reads it; else PKCS#8) and its public key into `dir/name.pub`.
pub fn key_pair(dir: &Path, name: &str, traditional: bool) {
    let key = dir.join(format!("{name}.key"));
    let mut genrsa = Command::new("openssl");
    genrsa.arg("genrsa");
    if traditional {
        genrsa.arg("-traditional");
    }
    let made = genrsa.arg("-out").arg(&key).arg("2048").output().unwrap();
    assert!(made.status.success(), "openssl genrsa: {made:?}");
    let public = Command::new("openssl")
        .args(["rsa", "-pubout", "-in"])
        .arg(&key)
        .arg("-out")
        .arg(dir.join(format!("{name}.pub")))
        .output()
        .unwrap();
    assert!(public.status.success(), "openssl rsa -pubout: {public:?}");
}

/// The `[http]` listener of `config` serving on a port of its own for the rest of the test:
/// its base URL (`http://127.0.0.1:PORT`).
pub async fn listen(env: &Env, config: &timeoutd::config::Config) -> String {
    let runner = env.runner(config, timeoutd::clock::Clock::Database).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    // Never stopped: the server lives as long as the test.
    std::mem::forget(stop);
    let state = timeoutd::http::HttpState::new(env.db.clone(), runner, config);
    tokio::spawn(timeoutd::http::serve(listener, state, stopped));
    format!("http://{addr}")
}

/// How many of `provider`'s notices were refused for `reason` so far (the metric).
pub fn refused(provider: &str, reason: &str) -> u64 {
    let series = format!(
        "timeoutd_payment_notices_refused_total{{provider=\"{provider}\",reason=\"{reason}\"}}"
    );
    crate::support::sample(&timeoutd::events::metrics_handle().render(), &series)
        .map_or(0, |n| n as u64)
}

/// `timeoutd doctor`'s findings on `provider` (`payment.{provider}…`) for `config`, once no
/// line of the whole report shows any of `secrets` (the files' contents, line by line).
pub async fn doctor_findings(
    config: &timeoutd::config::Config,
    provider: &str,
    secrets: &[&Path],
) -> Vec<timeoutd::doctor::Finding> {
    let all = timeoutd::doctor::examine(config).await;
    for secret in secrets {
        let secret = std::fs::read_to_string(secret).unwrap();
        let parts = secret.lines().map(str::trim).filter(|l| l.len() >= 16);
        for part in parts.filter(|l| !l.starts_with("-----")) {
            for finding in &all {
                assert!(
                    !finding.to_string().contains(part),
                    "a secret in the report: {finding}"
                );
            }
        }
    }
    let at = format!("payment.{provider}");
    all.into_iter()
        .filter(|f| f.what.starts_with(&at))
        .collect()
}
