//! The body of a message that wakes several outbox rows: timeoutd's relay publishes one for
//! rows due within a second of each other (a flash sale's), instead of a message per row
//! (`rocketmq.rows_per_message`).
//!
//! ```json
//! {"rows":[{"row":101,"orderId":"O-1","phase":0,"dueMs":1767225600000},
//!          {"row":102,"orderId":"O-2","phase":0,"dueMs":1767225600250}]}
//! ```
//!
//! `row` is the `order_timeout_msg` id, `dueMs` the row's due time (epoch ms). The message
//! carries [`super::PROP_ROWS`] (how many rows the body lists, checked), [`super::PROP_DUE_MS`]
//! (the earliest row's due time, which its hops steer by) and [`super::PROP_HOP`]; it has no
//! `KEYS` (each row's message id is recorded on its row when it is sent).

use serde::{Deserialize, Serialize};

/// The rows of one message are due within this long of the earliest of them, ms (the relay
/// shares a message only so; a wider message is refused as malformed). The message comes back
/// `rocketmq.timer_lead` before its earliest row, so each of its rows is then due within the
/// lead plus this span: held for its own due time, never sent on as a hop of its own.
pub const SPAN_MS: i64 = 1000;

use super::{TimeoutMessage, Wakeup, check_order_id, preview};

#[derive(Serialize)]
struct Body<'a> {
    rows: Vec<Row<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Row<'a> {
    row: i64,
    order_id: &'a str,
    phase: u32,
    due_ms: i64,
}

#[derive(Deserialize)]
struct OwnedBody {
    rows: Vec<OwnedRow>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OwnedRow {
    row: i64,
    order_id: String,
    phase: u32,
    due_ms: i64,
}

/// The body listing `rows`.
///
/// # Panics
/// When a row has no `row_id` or `due_ms` (the relay builds these from claimed rows, which have
/// both).
pub fn encode(rows: &[TimeoutMessage]) -> Vec<u8> {
    let body = Body {
        rows: rows
            .iter()
            .map(|m| Row {
                row: m.row_id.expect("a relayed row has its id"),
                order_id: &m.order_id,
                phase: m.phase,
                due_ms: m.due_ms.expect("a relayed row has its due time"),
            })
            .collect(),
    };
    serde_json::to_vec(&body).expect("plain struct serialises")
}

/// Decodes a body listing rows; `count` is the message's [`super::PROP_ROWS`], `hop` its
/// [`super::PROP_HOP`] (clamped into `u32` as a per-order message's is: [`super::hop_of`]).
///
/// # Errors
/// A sentence naming what is wrong: a body that is not this JSON, no rows, a count that does
/// not match the body, an order id that cannot be one (which row), a hop that is not an integer.
pub fn decode(body: &[u8], count: &str, hop: Option<&str>) -> Result<Wakeup, String> {
    let count: usize = count.parse().map_err(|_| {
        format!(
            "property {} = `{}` is not a row count",
            super::PROP_ROWS,
            preview(count)
        )
    })?;
    let hop = super::hop_of(super::number_property(super::PROP_HOP, hop)?);
    let parsed: OwnedBody = serde_json::from_slice(body).map_err(|e| {
        format!(
            "body is not a rows message (`{{\"rows\":[{{\"row\",\"orderId\",\"phase\",\"dueMs\"}}]}}`): {e}"
        )
    })?;
    if parsed.rows.is_empty() {
        return Err("a rows message lists no rows".into());
    }
    if parsed.rows.len() != count {
        return Err(format!(
            "property {} says {count} rows, the body lists {}",
            super::PROP_ROWS,
            parsed.rows.len()
        ));
    }
    let earliest = parsed.rows.iter().map(|r| r.due_ms).min().unwrap_or(0);
    if let Some(late) = parsed
        .rows
        .iter()
        .find(|r| r.due_ms.saturating_sub(earliest) >= SPAN_MS)
    {
        return Err(format!(
            "row id {} is due {} ms after the message's earliest row; a rows message spans less \
             than {SPAN_MS} ms",
            late.row,
            late.due_ms.saturating_sub(earliest)
        ));
    }
    let mut rows = Vec::with_capacity(parsed.rows.len());
    for (k, r) in parsed.rows.into_iter().enumerate() {
        check_order_id(&r.order_id).map_err(|e| format!("row {k} (id {}): {e}", r.row))?;
        rows.push(TimeoutMessage {
            order_id: r.order_id,
            phase: r.phase,
            due_ms: Some(r.due_ms),
            row_id: Some(r.row),
            hop,
        });
    }
    Ok(Wakeup::Rows { rows, hop })
}

#[cfg(test)]
mod tests {
    use super::super::{PROP_DUE_MS, PROP_HOP, PROP_ROWS, decode_wakeup};
    use super::*;

    fn row(id: i64, order: &str, due_ms: i64) -> TimeoutMessage {
        TimeoutMessage {
            order_id: order.into(),
            phase: 0,
            due_ms: Some(due_ms),
            row_id: Some(id),
            hop: 2,
        }
    }

    #[test]
    fn a_rows_message_round_trips_and_is_due_at_its_earliest_row() {
        let rows = vec![
            row(7, "O-7", 1_500),
            row(8, "O-8", 1_200),
            row(9, "O-9", 1_900),
        ];
        let body = encode(&rows);
        let props = |k: &str| match k {
            PROP_ROWS => Some("3".to_string()),
            PROP_HOP => Some("2".to_string()),
            PROP_DUE_MS => Some("1200".to_string()),
            _ => None,
        };
        let decoded = decode_wakeup(&body, None, props).unwrap();
        assert_eq!(decoded.due_ms(), Some(1_200));
        assert_eq!(decoded.hop(), 2);
        assert_eq!(decoded.into_messages(), rows);
    }

    #[test]
    fn malformed_rows_messages_name_the_problem() {
        let body = encode(&[row(1, "O-1", 5)]);
        for (body, count, expect) in [
            (&body[..], "2", "says 2 rows, the body lists 1"),
            (&body[..], "many", "not a row count"),
            (&br#"{"rows":[]}"#[..], "0", "lists no rows"),
            (&b"O-1"[..], "1", "not a rows message"),
            (
                &br#"{"rows":[{"row":1,"orderId":"a","phase":0,"dueMs":0},{"row":2,"orderId":"b","phase":0,"dueMs":1000}]}"#[..],
                "2",
                "row id 2 is due 1000 ms after",
            ),
            (
                &br#"{"rows":[{"row":4,"orderId":"two words","phase":0,"dueMs":1}]}"#[..],
                "1",
                "row 0 (id 4)",
            ),
        ] {
            let err = decode(body, count, None).unwrap_err();
            assert!(err.contains(expect), "{expect}: {err}");
        }
        let err = decode(&body, "1", Some("x")).unwrap_err();
        assert!(err.contains(PROP_HOP), "{err}");
    }
}
