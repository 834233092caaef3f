//! Timeout message formats.
//!
//! Bodies as the seeds' order services produce them, told apart by their first byte:
//! - text: the order id alone, e.g. `O-1001`;
//! - JSON: `{"orderId": 1790000000000000123, "activityId": 77, "userId": 9001, "createTime":
//!   1767225600000, "phase": 0}` as Jackson, fastjson, fastjson2 and Gson write seed 001's bean
//!   (ids as numbers or strings, exact over i64; see [`java_json`]). `orderId` is required;
//!   `phase` defaults to 0; the others are checked but informational, since the database is the
//!   truth.
//!
//! The message key (`KEYS`) carries the order id; a key that names another order than the body
//! makes the message malformed. Messages timeoutd publishes itself are JSON and carry, as user
//! properties, the absolute due time ([`PROP_DUE_MS`], epoch ms) that chains of delay hops steer
//! by, and the outbox row they stand for ([`PROP_ROW`]).
//!
//! A message timeoutd's relay publishes may also wake several rows due within a second of each
//! other (a flash sale's): it carries [`PROP_ROWS`], the number of rows, and a body listing
//! them ([`rows`]); its [`PROP_DUE_MS`] is the earliest row's due time. [`decode_wakeup`] reads
//! either kind.

mod java_json;
pub mod rows;

use serde::Serialize;

/// User property: when the timeout is due, epoch ms.
pub const PROP_DUE_MS: &str = "TIMEOUTD_DUE_MS";
/// User property: the `order_timeout_msg` row id the message stands for.
pub const PROP_ROW: &str = "TIMEOUTD_ROW";
/// User property: hops taken so far (diagnostics).
pub const PROP_HOP: &str = "TIMEOUTD_HOP";
/// User property of a message that wakes several rows: how many its body lists ([`rows`]).
pub const PROP_ROWS: &str = "TIMEOUTD_ROWS";
/// Longest order id accepted (the `orders.id` column holds 64 characters).
pub const MAX_ORDER_ID: usize = 64;

/// A decoded timeout message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeoutMessage {
    /// Order id.
    pub order_id: String,
    /// Phase to decide.
    pub phase: u32,
    /// When it is due, epoch ms, if the message says (timeoutd's own messages do).
    pub due_ms: Option<i64>,
    /// The outbox row it stands for, if any.
    pub row_id: Option<i64>,
    /// Hops taken so far.
    pub hop: u32,
}

/// What a timeout message wakes: one order's row, or several rows ([`rows`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wakeup {
    /// One order (the seeds' messages, and timeoutd's own for a row due alone).
    Order(TimeoutMessage),
    /// Several outbox rows, each with its order, phase, row id and due time (epoch ms), in the
    /// order listed; the message's own due time ([`Wakeup::due_ms`]) is the earliest of theirs.
    Rows {
        /// The rows, each with `row_id` and `due_ms` set and the message's `hop`.
        rows: Vec<TimeoutMessage>,
        /// Hops taken so far.
        hop: u32,
    },
}

impl Wakeup {
    /// When the message is due, epoch ms: its order's, or its earliest row's.
    pub fn due_ms(&self) -> Option<i64> {
        match self {
            Wakeup::Order(m) => m.due_ms,
            Wakeup::Rows { rows, .. } => rows.iter().filter_map(|r| r.due_ms).min(),
        }
    }

    /// Hops taken so far.
    pub fn hop(&self) -> u32 {
        match self {
            Wakeup::Order(m) => m.hop,
            Wakeup::Rows { hop, .. } => *hop,
        }
    }

    /// The rows it wakes, one for an order's message.
    pub fn messages(&self) -> &[TimeoutMessage] {
        match self {
            Wakeup::Order(m) => std::slice::from_ref(m),
            Wakeup::Rows { rows, .. } => rows,
        }
    }

    /// The rows it wakes, owned.
    pub fn into_messages(self) -> Vec<TimeoutMessage> {
        match self {
            Wakeup::Order(m) => vec![m],
            Wakeup::Rows { rows, .. } => rows,
        }
    }
}

/// The body timeoutd writes: the seeds' JSON with the order id as a string.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct OwnBody<'a> {
    order_id: &'a str,
    phase: u32,
}

/// Decodes a message from its body, its `KEYS` and a property lookup.
///
/// # Errors
/// A sentence naming what is wrong (unparseable JSON, an empty or oversized order id, a phase
/// out of range, a key naming another order, a malformed property); such a message can never
/// succeed and is dead-lettered.
pub fn decode(
    body: &[u8],
    keys: Option<&str>,
    property: impl Fn(&str) -> Option<String>,
) -> Result<TimeoutMessage, String> {
    let text = std::str::from_utf8(body).map_err(|e| format!("body is not UTF-8: {e}"))?;
    let trimmed = text.trim();
    let (order_id, phase) = if trimmed.starts_with('{') {
        let body = java_json::parse(trimmed)?;
        (body.order_id, body.phase)
    } else {
        (trimmed.to_string(), 0)
    };
    check_order_id(&order_id)?;
    if let Some(keys) = keys.filter(|k| !k.trim().is_empty())
        && !keys.split(' ').any(|k| k == order_id)
    {
        return Err(format!(
            "message key `{}` names another order than the body's `{order_id}`",
            preview(keys)
        ));
    }
    let number = |name: &str| number_property(name, property(name).as_deref());
    Ok(TimeoutMessage {
        order_id,
        phase,
        due_ms: number(PROP_DUE_MS)?,
        row_id: number(PROP_ROW)?,
        hop: hop_of(number(PROP_HOP)?),
    })
}

/// The integer in property `name` (`value`, `None` when the message lacks it).
///
/// # Errors
/// `property NAME = `VALUE` is not an integer`.
pub(crate) fn number_property(name: &str, value: Option<&str>) -> Result<Option<i64>, String> {
    value
        .map(|v| {
            v.parse::<i64>()
                .map_err(|_| format!("property {name} = `{}` is not an integer", preview(v)))
        })
        .transpose()
}

/// A message's hop count from its [`PROP_HOP`]: 0 when absent, clamped into `u32`.
pub(crate) fn hop_of(hop: Option<i64>) -> u32 {
    hop.unwrap_or(0).clamp(0, i64::from(u32::MAX)) as u32
}

/// Decodes a message that may wake one order ([`decode`]) or several rows (it carries
/// [`PROP_ROWS`]; [`rows::decode`]).
///
/// # Errors
/// As [`decode`] and [`rows::decode`]: a sentence naming what is wrong; such a message is
/// dead-lettered.
pub fn decode_wakeup(
    body: &[u8],
    keys: Option<&str>,
    property: impl Fn(&str) -> Option<String>,
) -> Result<Wakeup, String> {
    match property(PROP_ROWS) {
        Some(count) => rows::decode(body, &count, property(PROP_HOP).as_deref()),
        None => decode(body, keys, property).map(Wakeup::Order),
    }
}

/// Whether `order_id` can be an order id: not empty, at most [`MAX_ORDER_ID`] bytes, no spaces
/// or control characters.
///
/// # Errors
/// A sentence naming the id and the rule.
pub(crate) fn check_order_id(order_id: &str) -> Result<(), String> {
    if order_id.is_empty() {
        return Err("order id is empty".into());
    }
    if order_id.len() > MAX_ORDER_ID
        || order_id
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "`{}` is not an order id (≤ {MAX_ORDER_ID} characters, no spaces)",
            preview(order_id)
        ));
    }
    Ok(())
}

/// The JSON body timeoutd publishes for `message`.
pub fn encode_body(message: &TimeoutMessage) -> Vec<u8> {
    serde_json::to_vec(&OwnBody {
        order_id: &message.order_id,
        phase: message.phase,
    })
    .expect("plain struct serialises")
}

/// The first 80 characters of `s`, for error messages.
pub fn preview(s: &str) -> String {
    let mut out: String = s.chars().take(80).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn an_order_id_of_the_longest_length_is_taken_and_one_longer_is_refused() {
        let longest = "x".repeat(MAX_ORDER_ID);
        assert_eq!(
            decode(longest.as_bytes(), None, none).unwrap().order_id,
            longest
        );
        let longer = "x".repeat(MAX_ORDER_ID + 1);
        let refused = decode(longer.as_bytes(), None, none).unwrap_err();
        assert!(refused.contains("is not an order id"), "{refused}");
    }

    #[test]
    fn previews_cut_at_80_characters_and_say_so() {
        assert_eq!(preview("short"), "short");
        assert_eq!(preview(&"y".repeat(100)), format!("{}…", "y".repeat(80)));
        let cjk = "超".repeat(80);
        assert_eq!(preview(&cjk), cjk, "80 characters (240 bytes) are not cut");
    }

    #[test]
    fn text_body_is_the_order_id() {
        let m = decode(b"O-1001\n", Some("O-1001"), none).unwrap();
        assert_eq!(
            (m.order_id.as_str(), m.phase, m.due_ms),
            ("O-1001", 0, None)
        );
    }

    #[test]
    fn json_body_of_the_seeds() {
        let body = br#"{"orderId":"O-7","activityId":"A-1","userId":"u","createTime":1700000000000,"phase":1}"#;
        let m = decode(body, None, none).unwrap();
        assert_eq!((m.order_id.as_str(), m.phase), ("O-7", 1));
    }

    #[test]
    fn own_messages_carry_due_and_row() {
        let m = TimeoutMessage {
            order_id: "O-9".into(),
            phase: 2,
            due_ms: Some(5),
            row_id: Some(77),
            hop: 3,
        };
        let body = encode_body(&m);
        let props = |k: &str| match k {
            PROP_DUE_MS => Some("5".to_string()),
            PROP_ROW => Some("77".to_string()),
            PROP_HOP => Some("3".to_string()),
            _ => None,
        };
        assert_eq!(decode(&body, Some("O-9"), props).unwrap(), m);
    }

    #[test]
    fn malformed_messages_name_the_problem() {
        for (body, keys, expect) in [
            (&b"{not json"[..], None, "not a timeout JSON"),
            (b"", None, "empty"),
            (b"two words", None, "not an order id"),
            (br#"{"orderId":"O-1","phase":-1}"#, None, "outside"),
            (b"O-1", Some("O-2"), "another order"),
            (b"\xff\xfe", None, "not UTF-8"),
        ] {
            let err = decode(body, keys, none).unwrap_err();
            assert!(err.contains(expect), "{err}");
        }
        let err = decode(b"O-1", None, |_| Some("soon".into())).unwrap_err();
        assert!(err.contains("TIMEOUTD_"), "{err}");
    }
}
