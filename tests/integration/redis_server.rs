//! A private, restartable `redis-server` for the tests that take Redis down (the machine's own
//! Redis on 6379 is shared by every test and stays up).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::support::free_port;

/// A `redis-server` of the test's own on a free loopback port, its append-only file on (fsync
/// on every write), so a restart keeps everything it acknowledged.
pub struct PrivateRedis {
    /// Its port.
    pub port: u16,
    dir: PathBuf,
    child: Child,
}

impl PrivateRedis {
    /// Starts one with its files in `dir`, and waits until it answers.
    pub async fn start(dir: &Path) -> PrivateRedis {
        let port = free_port();
        let child = Self::spawn(port, dir);
        let r = PrivateRedis {
            port,
            dir: dir.to_path_buf(),
            child,
        };
        r.ready().await;
        r
    }

    fn spawn(port: u16, dir: &Path) -> Child {
        Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(dir)
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-server (Debian's redis-server package)")
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    async fn ready(&self) {
        let client = redis::Client::open(self.url()).unwrap();
        for _ in 0..100 {
            if let Ok(mut c) = client.get_multiplexed_async_connection().await
                && redis::cmd("PING")
                    .query_async::<String>(&mut c)
                    .await
                    .is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the private redis-server on {} did not start", self.port);
    }

    /// A connection to it.
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// SIGKILL, then the same server again on the same port and files.
    pub async fn restart(&mut self) {
        let _ = self.child.kill().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.child = Self::spawn(self.port, &self.dir);
        self.ready().await;
    }
}
