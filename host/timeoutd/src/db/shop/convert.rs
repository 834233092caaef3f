//! The forms a shop stores times and money in, and their conversion to and from what timeoutd
//! and the plugin see (epoch ms, integer cents). Exact: money never passes through a float.

use chrono::{NaiveDateTime, TimeZone};
use chrono_tz::Tz;

/// How a shop stores a point in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeForm {
    /// `DATETIME` / `TIMESTAMP WITHOUT TIME ZONE` holding the wall time of `zone`.
    Local(Tz),
    /// Integer seconds since the Unix epoch.
    EpochSeconds,
    /// Integer milliseconds since the Unix epoch.
    EpochMillis,
}

/// A time as a statement binds it: text for a wall time, an integer for an epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// `YYYY-MM-DD HH:MM:SS` (wall time; compared by the server as a datetime).
    Text(String),
    /// Epoch seconds or milliseconds.
    Int(i64),
}

impl TimeForm {
    /// `ms` (epoch ms) in this form. A wall time is rounded down to the second (mall's
    /// `DATETIME` has no fraction), so a deadline compared against it is never early.
    pub fn store(self, ms: i64) -> Stored {
        match self {
            TimeForm::Local(zone) => {
                let utc = chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default();
                Stored::Text(
                    utc.with_timezone(&zone)
                        .format("%Y-%m-%d %H:%M:%S")
                        .to_string(),
                )
            }
            TimeForm::EpochSeconds => Stored::Int(ms.div_euclid(1000)),
            TimeForm::EpochMillis => Stored::Int(ms),
        }
    }

    /// Epoch ms of a wall time read as text (`YYYY-MM-DD HH:MM:SS[.ffffff]`). A wall time that
    /// a daylight-saving change skips or repeats takes the earlier instant.
    ///
    /// # Errors
    /// A message quoting `text` when it is not such a time, or this form is an epoch.
    pub fn read_text(self, text: &str) -> Result<i64, String> {
        let TimeForm::Local(zone) = self else {
            return Err(format!(
                "`{text}` is text, but the profile says epoch numbers"
            ));
        };
        let naive = NaiveDateTime::parse_from_str(text.trim(), "%Y-%m-%d %H:%M:%S%.f")
            .map_err(|e| format!("`{text}` is not a time of the form 2026-12-06 14:30:00 ({e})"))?;
        zone.from_local_datetime(&naive)
            .earliest()
            .map(|t| t.timestamp_millis())
            .ok_or_else(|| format!("`{text}` does not exist in {zone}"))
    }

    /// Epoch ms of an epoch number in this form.
    pub fn read_int(self, n: i64) -> i64 {
        match self {
            TimeForm::EpochSeconds => n.saturating_mul(1000),
            TimeForm::EpochMillis | TimeForm::Local(_) => n,
        }
    }

    /// Whether the column is read as text (a wall time) rather than a number.
    pub fn is_text(self) -> bool {
        matches!(self, TimeForm::Local(_))
    }
}

/// How a shop stores an amount of money.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoneyForm {
    /// `DECIMAL(p, 2)` in the currency's main unit (yuan), read as its decimal text.
    DecimalYuan,
    /// Integer cents (fen).
    Cents,
}

/// Integer cents of a decimal amount written in main units (`"12.3"`, `"-0.05"`, `"7"`).
///
/// # Errors
/// A message quoting `text` when it is not a decimal number or has more than two places that
/// are not zeros (a fraction of a cent would be lost).
pub fn cents_of_decimal(text: &str) -> Result<i64, String> {
    let t = text.trim();
    let bad = || format!("`{text}` is not an amount in yuan with at most two decimal places");
    let (negative, digits) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let (whole, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if whole.is_empty() && frac.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
        || frac.len() > 2 && frac[2..].bytes().any(|b| b != b'0')
    {
        return Err(bad());
    }
    let whole: i64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| bad())?
    };
    let mut cents_part = frac
        .bytes()
        .take(2)
        .fold(0i64, |acc, b| acc * 10 + i64::from(b - b'0'));
    if frac.len() == 1 {
        cents_part *= 10;
    }
    let cents = whole
        .checked_mul(100)
        .and_then(|w| w.checked_add(cents_part))
        .ok_or_else(bad)?;
    Ok(if negative { -cents } else { cents })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_yuan_reads_exactly_into_cents() {
        for (text, cents) in [
            ("12.30", 1230),
            ("12.3", 1230),
            ("0.05", 5),
            ("7", 700),
            ("-1.50", -150),
            (".5", 50),
            ("99999999.99", 9_999_999_999),
            ("1.2300", 123),
        ] {
            assert_eq!(cents_of_decimal(text), Ok(cents), "{text}");
        }
        for bad in ["", "-", "1.234", "1,5", "abc", "1e3", "1.2.3"] {
            assert!(cents_of_decimal(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_shanghai_wall_time_round_trips_through_epoch_ms() {
        let form = TimeForm::Local(chrono_tz::Asia::Shanghai);
        // 2026-12-06 14:30:00 in Shanghai (UTC+8) is 06:30:00 UTC.
        let ms = form.read_text("2026-12-06 14:30:00").unwrap();
        assert_eq!(ms, 1_796_538_600_000);
        assert_eq!(form.store(ms), Stored::Text("2026-12-06 14:30:00".into()));
        // Fractions are read, and stored rounded down to the second.
        assert_eq!(form.read_text("2026-12-06 14:30:00.250").unwrap(), ms + 250);
        assert_eq!(
            form.store(ms + 999),
            Stored::Text("2026-12-06 14:30:00".into())
        );
        assert!(form.read_text("yesterday").is_err());
    }

    #[test]
    fn a_wall_time_a_clock_change_skips_is_refused_and_a_repeated_one_takes_the_earlier() {
        let form = TimeForm::Local(chrono_tz::Europe::Berlin);
        assert!(form.read_text("2026-03-29 02:30:00").is_err());
        let twice = form.read_text("2026-10-25 02:30:00").unwrap();
        // The earlier of the two is still summer time (UTC+2).
        assert_eq!(twice, 1_792_888_200_000);
    }

    #[test]
    fn epochs_convert_by_their_unit() {
        assert_eq!(TimeForm::EpochSeconds.store(1_500), Stored::Int(1));
        assert_eq!(TimeForm::EpochSeconds.read_int(2), 2_000);
        assert_eq!(TimeForm::EpochMillis.store(1_500), Stored::Int(1_500));
    }
}
