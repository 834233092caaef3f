//! Application-level sharding (`[[database.shards]]`): two MariaDB (and, for the lease and the
//! take-over, two PostgreSQL) databases as the shards of one order database, shared by
//! `timeoutd run` daemons through each shard's lease.

use std::time::Duration;

use timeoutd::config::Routing;
use timeoutd::config::routing::shard_of;
use timeoutd::db::Backend;

use crate::support::{Env, eventually, free_port, order, started_daemon};

/// Which daemon (by pid) holds `env`'s shard lease now, if any.
async fn holder(env: &Env) -> Option<u32> {
    let now = env.db.now_ms().await.ok()?;
    let row = env
        .db
        .backend()
        .query("SELECT holder FROM maintenance_lease WHERE name = 'shard' AND until_ms >= ?")
        .bind(now)
        .fetch_optional(env.db.pool())
        .await
        .ok()??;
    let holder: String = sqlx::Row::get(&row, 0);
    holder.split("-pid").nth(1)?.split('-').next()?.parse().ok()
}

async fn count(env: &Env, sql: &'static str) -> i64 {
    sqlx::Row::get(
        &env.db
            .backend()
            .query(sql)
            .fetch_one(env.db.pool())
            .await
            .unwrap(),
        0,
    )
}

/// Two fresh databases of `backend`, each stocked with `units` of `sku-a` and `sku-b`.
async fn two_shards_of(backend: Backend, units: i64) -> [Env; 2] {
    let shards = [Env::new(backend).await, Env::new(backend).await];
    for env in &shards {
        env.stock_up(&[("sku-a", units), ("sku-b", units)]).await;
    }
    shards
}

async fn drop_shards([s0, s1]: [Env; 2]) {
    s0.cleanup().await;
    s1.cleanup().await;
}

/// Order ids of `n` orders, `per` routed to each of the two shards by `hash_mod`.
fn ids(prefix: &str, per: usize) -> [Vec<String>; 2] {
    let mut out = [Vec::new(), Vec::new()];
    let mut i = 0;
    while out[0].len() < per || out[1].len() < per {
        let id = format!("{prefix}-{i:05}");
        let at = shard_of(Routing::HashMod, &id, 2).unwrap();
        if out[at].len() < per {
            out[at].push(id);
        }
        i += 1;
    }
    out
}

/// Two fresh MariaDB databases, each stocked with `units` of `sku-a` and `sku-b`.
async fn two_shards(units: i64) -> [Env; 2] {
    two_shards_of(Backend::MySql, units).await
}

/// Two daemons over two MariaDB shard databases: the first takes both shards, hands one to the
/// second when it appears (⌈2 ÷ 2⌉ each), and when the holder of a shard is SIGKILLed the other
/// takes it over within the lease; every order — routed to its shard by `hash_mod` as the order
/// service writes it — is closed exactly once by its own shard (stock and coupons back once,
/// one decision each), and a paid callback sent to either daemon lands in the order's shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemons_share_shards_by_lease_and_take_over_a_killed_holders_shard() {
    shards_shared_and_taken_over(Backend::MySql).await;
}

/// The same on two PostgreSQL shard databases: the shard lease (`maintenance_lease`), the
/// hand-over, the take-over after a SIGKILL and each order closed once in its own shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemons_share_postgresql_shards_by_lease_and_take_over_a_killed_holders_shard() {
    shards_shared_and_taken_over(Backend::Postgres).await;
}

async fn shards_shared_and_taken_over(backend: Backend) {
    let shards = two_shards_of(backend, 1_000).await;
    let dir = tempfile::tempdir().unwrap();
    let ports = [free_port(), free_port()];
    let config = |port: u16| {
        format!(
            "[database]\nrouting = \"hash_mod\"\nshard_lease = \"2s\"\nmax_connections = 4\n\
             [[database.shards]]\nname = \"ds_0\"\nurl = \"{}\"\n\
             [[database.shards]]\nname = \"ds_1\"\nurl = \"{}\"\n\
             [outbox]\nidle_recheck = \"200ms\"\nlease = \"3s\"\n\
             [sweep]\ninterval = \"1s\"\ngrace = \"2s\"\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\n\
             [runtime]\ndeadline = \"2s\"\n\
             [merchants.acme]\nplugin = \"builtin:single-phase\"\n",
            shards[0].url, shards[1].url
        )
    };
    let files: Vec<_> = (0..2)
        .map(|i| {
            let f = dir.path().join(format!("d{i}.toml"));
            std::fs::write(&f, config(ports[i])).unwrap();
            f
        })
        .collect();
    let logs: Vec<_> = (0..2)
        .map(|i| dir.path().join(format!("d{i}.log")))
        .collect();

    // Daemon A alone takes both shards.
    let mut a = started_daemon(&files[0], &[("RUST_LOG", "info")], &logs[0]).await;
    let a_pid = a.id().unwrap();
    eventually(Duration::from_secs(20), "A holds both shards", || async {
        holder(&shards[0]).await == Some(a_pid) && holder(&shards[1]).await == Some(a_pid)
    })
    .await;
    // B appears: A hands one shard over, each holds one.
    let mut b = started_daemon(&files[1], &[("RUST_LOG", "info")], &logs[1]).await;
    let b_pid = b.id().unwrap();
    eventually(
        Duration::from_secs(30),
        "A and B hold a shard each",
        || async {
            let (h0, h1) = (holder(&shards[0]).await, holder(&shards[1]).await);
            h0.is_some() && h1.is_some() && h0 != h1
        },
    )
    .await;

    // Orders in both shards, written where the routing rule puts them, lapsing in 2 s.
    let now = shards[0].db.now_ms().await.unwrap();
    let first = ids("so", 10);
    for (at, ids) in first.iter().enumerate() {
        for id in ids {
            shards[at].create(&order(id, "acme", now + 2_000)).await;
        }
    }
    // One order per shard is paid through the *other* shard's holder's endpoint.
    let http = reqwest::Client::new();
    for (at, port) in [(0, ports[1]), (1, ports[0])] {
        let answer = http
            .post(format!(
                "http://127.0.0.1:{port}/v1/payments/{}/paid",
                first[at][0]
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "{}", answer.text().await.unwrap());
    }
    for env in &shards {
        eventually(
            Duration::from_secs(30),
            "the first orders settle",
            || async {
                count(env, "SELECT COUNT(*) FROM orders WHERE status = 'PENDING'").await == 0
            },
        )
        .await;
    }

    // SIGKILL whoever holds ds_1; the other takes it over within the lease.
    let victim = holder(&shards[1]).await.unwrap();
    let survivor = if victim == a_pid { b_pid } else { a_pid };
    if victim == a_pid {
        a.kill().await.unwrap();
    } else {
        b.kill().await.unwrap();
    }
    let now = shards[0].db.now_ms().await.unwrap();
    let second = ids("sk", 10);
    for (at, ids) in second.iter().enumerate() {
        for id in ids {
            shards[at].create(&order(id, "acme", now + 1_000)).await;
        }
    }
    eventually(
        Duration::from_secs(30),
        "the survivor holds both shards",
        || async {
            holder(&shards[0]).await == Some(survivor) && holder(&shards[1]).await == Some(survivor)
        },
    )
    .await;
    for env in &shards {
        eventually(
            Duration::from_secs(30),
            "the second orders close",
            || async {
                count(env, "SELECT COUNT(*) FROM orders WHERE status = 'PENDING'").await == 0
            },
        )
        .await;
    }

    // Each shard has exactly its own orders, each closed once, stock and coupons back once.
    for (at, env) in shards.iter().enumerate() {
        assert_eq!(count(env, "SELECT COUNT(*) FROM orders").await, 20);
        assert_eq!(
            count(env, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'").await,
            1,
            "shard {at}: the order paid through the other daemon's endpoint"
        );
        assert_eq!(
            count(env, "SELECT COUNT(*) FROM orders WHERE status = 'CLOSED'").await,
            19
        );
        assert_eq!(
            count(
                env,
                "SELECT COUNT(*) FROM (SELECT order_id FROM decision_log WHERE outcome = 'closed' \
                 GROUP BY order_id HAVING COUNT(*) > 1) twice"
            )
            .await,
            0,
            "shard {at}: an order closed twice"
        );
        assert_eq!(
            count(
                env,
                "SELECT COUNT(DISTINCT order_id) FROM decision_log WHERE outcome = 'closed'"
            )
            .await,
            19
        );
        // 20 orders took 2 × sku-a and 1 × sku-b each; the 19 closes gave theirs back once.
        assert_eq!(
            count(env, "SELECT available FROM sku_stock WHERE sku = 'sku-a'").await,
            1_000 - 2
        );
        assert_eq!(
            count(env, "SELECT available FROM sku_stock WHERE sku = 'sku-b'").await,
            1_000 - 1
        );
        assert_eq!(
            count(
                env,
                "SELECT COUNT(*) FROM coupons WHERE status = 'AVAILABLE'"
            )
            .await,
            19
        );
    }
    let _ = if victim == a_pid {
        crate::support::sigterm(&mut b, Duration::from_secs(10)).await
    } else {
        crate::support::sigterm(&mut a, Duration::from_secs(10)).await
    };
    drop_shards(shards).await;
}

/// A sharded config's routing refuses an id the rule cannot place (`mod` and a non-integer id)
/// with 400 naming it, and an order of the other shard is found there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_routes_by_mod_and_refuses_an_id_it_cannot_place() {
    let shards = two_shards(10).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let file = dir.path().join("d.toml");
    std::fs::write(
        &file,
        format!(
            "[database]\nrouting = \"mod\"\n\
             [[database.shards]]\nname = \"ds_0\"\nurl = \"{}\"\n\
             [[database.shards]]\nname = \"ds_1\"\nurl = \"{}\"\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\n\
             [merchants.acme]\nplugin = \"builtin:single-phase\"\n",
            shards[0].url, shards[1].url
        ),
    )
    .unwrap();
    let log = dir.path().join("d.log");
    let mut daemon = started_daemon(&file, &[], &log).await;
    let now = shards[0].db.now_ms().await.unwrap();
    // 1001 % 2 = 1, 1002 % 2 = 0: each written to its shard, far from its deadline.
    shards[1]
        .create(&order("1001", "acme", now + 600_000))
        .await;
    shards[0]
        .create(&order("1002", "acme", now + 600_000))
        .await;
    let http = reqwest::Client::new();
    let pay = |id: &'static str| {
        let http = http.clone();
        async move {
            http.post(format!("http://127.0.0.1:{port}/v1/payments/{id}/paid"))
                .send()
                .await
                .unwrap()
        }
    };
    assert_eq!(pay("1001").await.status(), 200);
    assert_eq!(pay("1002").await.status(), 200);
    let refused = pay("c-1").await;
    assert_eq!(refused.status(), 400);
    assert!(
        refused
            .text()
            .await
            .unwrap()
            .contains("order id `c-1` is not an integer")
    );
    for env in &shards {
        assert_eq!(
            count(env, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'").await,
            1
        );
    }
    crate::support::sigterm(&mut daemon, Duration::from_secs(10)).await;
    drop_shards(shards).await;
}

/// A shard that goes dark (its database a black hole: connections taken and never answered)
/// costs only its own work: its holder stops working it before its lease can lapse (and says
/// so), while the other shard keeps its holder — never taken over, its orders closed on
/// time — through three leases of the outage; when the shard comes back it is taken again and
/// its orders, written during the outage, are closed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dark_shard_stops_only_its_own_work() {
    let shards = two_shards(1_000).await;
    let proxy = crate::fakes::Proxy::start("127.0.0.1:3306").await;
    let dark_url =
        shards[1]
            .url
            .replacen("127.0.0.1:3306", &format!("127.0.0.1:{}", proxy.port), 1);
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<_> = (0..2)
        .map(|i| {
            let f = dir.path().join(format!("d{i}.toml"));
            std::fs::write(
                &f,
                format!(
                    "[database]\nshard_lease = \"2s\"\nmax_connections = 4\n\
                     [[database.shards]]\nname = \"ds_0\"\nurl = \"{}\"\n\
                     [[database.shards]]\nname = \"ds_1\"\nurl = \"{dark_url}\"\n\
                     [outbox]\nidle_recheck = \"200ms\"\nlease = \"3s\"\n\
                     [sweep]\ninterval = \"1s\"\ngrace = \"2s\"\n\
                     [runtime]\ndeadline = \"2s\"\n\
                     [merchants.acme]\nplugin = \"builtin:single-phase\"\n",
                    shards[0].url
                ),
            )
            .unwrap();
            f
        })
        .collect();
    let logs: Vec<_> = (0..2)
        .map(|i| dir.path().join(format!("d{i}.log")))
        .collect();
    let mut daemons = Vec::new();
    for i in 0..2 {
        daemons.push(started_daemon(&files[i], &[("RUST_LOG", "info")], &logs[i]).await);
    }
    eventually(
        Duration::from_secs(30),
        "each daemon holds a shard",
        || async {
            let (h0, h1) = (holder(&shards[0]).await, holder(&shards[1]).await);
            h0.is_some() && h1.is_some() && h0 != h1
        },
    )
    .await;
    // Holding the lease is not yet working the shard: wait until both have started their
    // shard's work.
    eventually(
        Duration::from_secs(30),
        "each daemon works its shard",
        || async {
            logs.iter().all(|log| {
                std::fs::read_to_string(log)
                    .unwrap_or_default()
                    .contains("shard taken")
            })
        },
    )
    .await;
    let keeper = holder(&shards[0]).await.unwrap();
    let dark_holder = holder(&shards[1]).await.unwrap();
    let dark_log = &logs[daemons
        .iter()
        .position(|d| d.id() == Some(dark_holder))
        .unwrap()];

    proxy.set_hang(true);
    let now = shards[0].db.now_ms().await.unwrap();
    let [lit, dark] = ids("dk", 5);
    for id in &lit {
        shards[0].create(&order(id, "acme", now + 1_000)).await;
    }
    for id in &dark {
        shards[1].create(&order(id, "acme", now + 1_000)).await;
    }
    // Three leases of darkness: ds_0 keeps its holder throughout.
    for _ in 0..30 {
        assert_eq!(
            holder(&shards[0]).await,
            Some(keeper),
            "ds_0 changed hands while only ds_1 was dark"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        count(
            &shards[0],
            "SELECT COUNT(*) FROM orders WHERE status = 'CLOSED'"
        )
        .await,
        5,
        "ds_0's orders closed on time while ds_1 was dark"
    );
    assert_eq!(
        count(
            &shards[1],
            "SELECT COUNT(*) FROM orders WHERE status = 'PENDING'"
        )
        .await,
        5,
        "nothing closes ds_1's orders while it is dark"
    );
    let said = std::fs::read_to_string(dark_log).unwrap();
    assert!(
        said.contains("shard lease not renewed; stopping its work before it lapses"),
        "the dark shard's holder fences itself:\n{said}"
    );

    proxy.set_hang(false);
    eventually(
        Duration::from_secs(30),
        "ds_1's orders close after it is back",
        || async {
            count(
                &shards[1],
                "SELECT COUNT(*) FROM orders WHERE status = 'CLOSED'",
            )
            .await
                == 5
        },
    )
    .await;
    for env in &shards {
        assert_eq!(
            count(
                env,
                "SELECT COUNT(*) FROM (SELECT order_id FROM decision_log WHERE outcome = 'closed' \
                 GROUP BY order_id HAVING COUNT(*) > 1) twice"
            )
            .await,
            0
        );
        assert_eq!(
            count(env, "SELECT available FROM sku_stock WHERE sku = 'sku-a'").await,
            1_000,
            "every unit back once"
        );
    }
    for d in &mut daemons {
        crate::support::sigterm(d, Duration::from_secs(15)).await;
    }
    drop_shards(shards).await;
}
