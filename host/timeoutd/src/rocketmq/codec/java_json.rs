//! The seeds' JSON timeout body as Java libraries write it.
//!
//! Seed 001's bean is `OrderTimeoutMessage { Long orderId, activityId, userId; Long createTime;
//! Integer phase }` (`createTime` is a `Date` in some order services). The same bean arrives in
//! several spellings, all accepted here:
//!
//! | writer | ids and phase | `createTime` |
//! |---|---|---|
//! | Jackson (rocketmq-spring's default converter) | JSON numbers | epoch ms; ISO-8601 with `WRITE_DATES_AS_TIMESTAMPS` off |
//! | Jackson with `WRITE_NUMBERS_AS_STRINGS` | strings of digits | the same, as a string |
//! | fastjson / fastjson2 `JSON.toJSONString` | numbers, keys sorted | epoch ms, or `yyyy-MM-dd HH:mm:ss` |
//! | Gson | numbers, nulls left out | epoch ms, or `Jan 1, 2026, 12:00:00 AM` (`DateFormat.DEFAULT`, en-US) |
//!
//! Ids are exact over the whole signed 64-bit range: numbers are read from their JSON text,
//! never through `f64`, so `1790000000000000123` stays `1790000000000000123`. A fractional or
//! exponent form (`1.79e18`, `17.0`) is refused, naming the field, since it cannot be an exact
//! id. Zone-less times (`yyyy-MM-dd HH:mm:ss`, Gson's) are read as UTC: `createTime` is
//! informational (the database is the truth), so a zone guess never decides anything.

use std::collections::HashMap;

use serde_json::value::RawValue;

use super::preview;

/// The fields of one JSON timeout body, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct JavaBody {
    /// `orderId`, as text (a number's decimal digits, or the string).
    pub order_id: String,
    /// `activityId`, when present and not null.
    pub activity_id: Option<String>,
    /// `userId`, when present and not null.
    pub user_id: Option<String>,
    /// `createTime`, epoch ms, when present and not null.
    pub create_time_ms: Option<i64>,
    /// `phase` (0 when absent or null).
    pub phase: u32,
}

/// Reads a JSON object body.
///
/// # Errors
/// A sentence naming the field and what is wrong with it (`orderId: 1.79e18 is not a whole
/// number …`), or why the body is not a JSON object.
pub(super) fn parse(text: &str) -> Result<JavaBody, String> {
    let fields: HashMap<String, &RawValue> =
        serde_json::from_str(text).map_err(|e| format!("body is not a timeout JSON: {e}"))?;
    let field = |name: &str| fields.get(name).copied().filter(|v| v.get() != "null");
    let order_id = match field("orderId") {
        Some(raw) => id("orderId", raw)?,
        None => return Err("orderId is missing".into()),
    };
    let activity_id = field("activityId")
        .map(|raw| id("activityId", raw))
        .transpose()?;
    let user_id = field("userId").map(|raw| id("userId", raw)).transpose()?;
    let create_time_ms = field("createTime").map(create_time).transpose()?;
    let phase = match field("phase") {
        None => 0,
        Some(raw) => {
            let n = integer("phase", raw)?;
            u32::try_from(n).map_err(|_| format!("phase {n} is outside 0..={}", u32::MAX))?
        }
    };
    Ok(JavaBody {
        order_id,
        activity_id,
        user_id,
        create_time_ms,
        phase,
    })
}

/// An id: a JSON integer (exact, signed 64-bit) becomes its decimal text; a string is taken
/// as written.
fn id(name: &str, raw: &RawValue) -> Result<String, String> {
    match raw.get().as_bytes().first() {
        Some(b'"') => string(name, raw),
        _ => integer(name, raw).map(|n| n.to_string()),
    }
}

/// A whole number, from a JSON number or a string of digits (`WRITE_NUMBERS_AS_STRINGS`).
fn integer(name: &str, raw: &RawValue) -> Result<i64, String> {
    let text = match raw.get().as_bytes().first() {
        Some(b'"') => string(name, raw)?,
        Some(b'-' | b'0'..=b'9') => raw.get().to_string(),
        _ => {
            return Err(format!(
                "{name}: expected a number or a string, found `{}`",
                preview(raw.get())
            ));
        }
    };
    whole(name, text.trim())
}

/// Parses `-?[0-9]+` into an i64, naming the field and the reason otherwise.
fn whole(name: &str, text: &str) -> Result<i64, String> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        let why = if text.contains(['.', 'e', 'E']) {
            "fractional and exponent forms cannot be exact ids"
        } else {
            "expected digits"
        };
        return Err(format!(
            "{name}: `{}` is not a whole number ({why})",
            preview(text)
        ));
    }
    text.parse::<i64>().map_err(|_| {
        format!(
            "{name}: {} is outside the signed 64-bit range",
            preview(text)
        )
    })
}

fn string(name: &str, raw: &RawValue) -> Result<String, String> {
    serde_json::from_str::<String>(raw.get()).map_err(|e| format!("{name}: {e}"))
}

/// `createTime`: epoch ms (a number or a string of digits), ISO-8601 (with or without an
/// offset), `yyyy-MM-dd HH:mm:ss`, or Gson's en-US `MMM d, yyyy[,] h:mm:ss a`.
fn create_time(raw: &RawValue) -> Result<i64, String> {
    const NAME: &str = "createTime";
    if !raw.get().starts_with('"') {
        return integer(NAME, raw);
    }
    let text = string(NAME, raw)?;
    // Gson on JDK 20+ writes a narrow no-break space before AM/PM.
    let text = text.trim().replace(['\u{202f}', '\u{a0}'], " ");
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return whole(NAME, &text);
    }
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(&text) {
        return Ok(t.timestamp_millis());
    }
    for zoned in ["%Y-%m-%dT%H:%M:%S%.f%z", "%Y-%m-%dT%H:%M:%S%z"] {
        if let Ok(t) = chrono::DateTime::parse_from_str(&text, zoned) {
            return Ok(t.timestamp_millis());
        }
    }
    for local in [
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M:%S%.f",
        "%b %d, %Y, %I:%M:%S %p",
        "%b %d, %Y %I:%M:%S %p",
    ] {
        if let Ok(t) = chrono::NaiveDateTime::parse_from_str(&text, local) {
            return Ok(t.and_utc().timestamp_millis());
        }
    }
    Err(format!(
        "{NAME}: `{}` is not epoch ms, ISO-8601, `yyyy-MM-dd HH:mm:ss` or Gson's date",
        preview(&text)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS_2026: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

    #[test]
    fn jackson_numbers_are_exact_over_i64() {
        let b = parse(r#"{"orderId":1790000000000000123,"activityId":77,"userId":9001,"createTime":1767225600000,"phase":0}"#).unwrap();
        assert_eq!(b.order_id, "1790000000000000123");
        assert_eq!(b.activity_id.as_deref(), Some("77"));
        assert_eq!(b.user_id.as_deref(), Some("9001"));
        assert_eq!((b.create_time_ms, b.phase), (Some(MS_2026), 0));
        for edge in [i64::MAX, i64::MIN] {
            let b = parse(&format!(r#"{{"orderId":{edge}}}"#)).unwrap();
            assert_eq!(b.order_id, edge.to_string());
        }
    }

    #[test]
    fn numbers_as_strings_and_every_date_form() {
        let b =
            parse(r#"{"orderId":"1790000000000000123","phase":"1","createTime":"1767225600000"}"#)
                .unwrap();
        assert_eq!((b.order_id.as_str(), b.phase), ("1790000000000000123", 1));
        assert_eq!(b.create_time_ms, Some(MS_2026));
        for date in [
            "2026-01-01T00:00:00.000+00:00",
            "2026-01-01T00:00:00.000+0000",
            "2026-01-01T08:00:00+08:00",
            "2026-01-01T00:00:00Z",
            "2026-01-01T00:00:00",
            "2026-01-01 00:00:00",
            "Jan 1, 2026, 12:00:00\u{202f}AM",
            "Jan 1, 2026 12:00:00 AM",
        ] {
            let b = parse(&format!(r#"{{"orderId":1,"createTime":"{date}"}}"#)).unwrap();
            assert_eq!(b.create_time_ms, Some(MS_2026), "{date}");
        }
    }

    #[test]
    fn nulls_and_absent_fields_are_none() {
        let b = parse(r#"{"orderId":"O-1","activityId":null,"phase":null}"#).unwrap();
        assert_eq!((b.activity_id, b.user_id, b.phase), (None, None, 0));
    }

    #[test]
    fn inexact_and_wrong_values_name_the_field() {
        for (body, expect) in [
            (
                r#"{"orderId":1.79e18}"#,
                "orderId: `1.79e18` is not a whole number (fractional",
            ),
            (
                r#"{"orderId":17.0}"#,
                "orderId: `17.0` is not a whole number",
            ),
            (
                r#"{"orderId":9223372036854775808}"#,
                "orderId: 9223372036854775808 is outside",
            ),
            (
                r#"{"orderId":"1","userId":true}"#,
                "userId: expected a number or a string",
            ),
            (r#"{"orderId":"1","activityId":1E3}"#, "activityId: `1E3`"),
            (
                r#"{"orderId":"1","phase":"x"}"#,
                "phase: `x` is not a whole number",
            ),
            (
                r#"{"orderId":"1","phase":4294967296}"#,
                "phase 4294967296 is outside",
            ),
            (
                r#"{"orderId":"1","createTime":"yesterday"}"#,
                "createTime: `yesterday`",
            ),
            (r#"{"orderId":"1","createTime":1.5}"#, "createTime: `1.5`"),
            (r#"{"activityId":1}"#, "orderId is missing"),
            (r#"[1]"#, "not a timeout JSON"),
        ] {
            let err = parse(body).unwrap_err();
            assert!(err.contains(expect), "{body}: {err}");
        }
    }
}
