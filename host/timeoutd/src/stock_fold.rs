//! The stock journal's fold loop (`[dispatch.stock] mode = "journal"`): every `fold_interval`
//! it folds the journal into `sku_stock` ([`crate::db::stock_journal::fold`]) until a fold
//! takes fewer than `fold_batch` rows, and once more when the daemon stops, so a stopping
//! daemon leaves none of its closes' units behind. Every daemon on a database folds; their
//! folds take disjoint rows. With `mode = "direct"` a daemon folds once at start, so units a
//! journal-mode run left behind come back after the switch.

use tokio::sync::watch;

use crate::clock::Clock;
use crate::config::{StockConfig, StockMode};
use crate::db::{Db, stock_journal};
use crate::events::{Event, emit};

/// Folds until `shutdown` (with `mode = "direct"`: once, then returns).
pub async fn run(db: Db, clock: Clock, config: StockConfig, mut shutdown: watch::Receiver<bool>) {
    loop {
        drain(&db, &clock, config.fold_batch).await;
        if config.mode == StockMode::Direct
            || crate::shutdown::sleep_or_shutdown(config.fold_interval, &mut shutdown).await
        {
            break;
        }
    }
    if config.mode == StockMode::Journal {
        drain(&db, &clock, config.fold_batch).await;
    }
}

/// Folds batches of `batch` rows until one takes fewer (or fails: logged, the next round
/// retries); returns the rows folded.
pub async fn drain(db: &Db, clock: &Clock, batch: u32) -> u64 {
    let mut total = 0;
    loop {
        let folded = match clock.now_ms(db).await {
            Ok(now_ms) => stock_journal::fold(db, now_ms, batch)
                .await
                .map(|f| (now_ms, f)),
            Err(e) => Err(e),
        };
        match folded {
            Ok((now_ms, f)) => {
                if f.rows > 0 {
                    emit(Event::StockFolded {
                        rows: f.rows,
                        units: f.units,
                        lag_ms: f.oldest_ms.map_or(0, |o| now_ms - o),
                    });
                }
                for (sku, units) in &f.missing {
                    tracing::warn!(
                        sku,
                        units,
                        "stock journal: no sku_stock row for the SKU; its units were dead-lettered"
                    );
                }
                total += f.rows;
                if f.rows < u64::from(batch.max(1)) {
                    return total;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "stock journal fold failed; the next round retries");
                return total;
            }
        }
    }
}
