//! Typed access to the merchant settings a plugin receives in its context.

use crate::PolicyError;
use crate::prelude::*;

/// The merchant's settings (`context.settings`), looked up by key.
pub struct Settings<'a>(pub &'a [(String, String)]);

impl<'a> Settings<'a> {
    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The value of `key`, or `default`.
    pub fn text(&self, key: &str, default: &'a str) -> &'a str {
        self.get(key).unwrap_or(default)
    }

    /// A required duration setting, in milliseconds.
    ///
    /// # Errors
    /// `policy-error::bad-setting` naming the key when it is missing or malformed.
    pub fn duration_ms(&self, key: &str) -> Result<u64, PolicyError> {
        let raw = self.get(key).ok_or_else(|| {
            PolicyError::BadSetting((key.to_string(), "missing (e.g. \"5m\")".to_string()))
        })?;
        parse_duration_ms(raw)
            .map_err(|problem| PolicyError::BadSetting((key.to_string(), problem)))
    }

    /// A whole-number setting, or `default` when absent.
    ///
    /// # Errors
    /// `policy-error::bad-setting` naming the key when it is not a non-negative integer.
    pub fn number(&self, key: &str, default: u32) -> Result<u32, PolicyError> {
        match self.get(key) {
            None => Ok(default),
            Some(raw) => raw.trim().parse().map_err(|_| {
                PolicyError::BadSetting((key.to_string(), format!("`{raw}` is not a whole number")))
            }),
        }
    }
}

/// Parses `"1500ms"`, `"90s"`, `"10m"`, `"2h"` or `"1d"` into milliseconds.
///
/// # Errors
/// A message saying what was wrong with the text.
pub fn parse_duration_ms(raw: &str) -> Result<u64, String> {
    let s = raw.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("`{raw}` does not start with a whole number"))?;
    let scale = match unit.trim() {
        "ms" => 1,
        "s" => 1_000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "" => return Err(format!("`{raw}` has no unit (ms, s, m, h, d)")),
        other => {
            return Err(format!(
                "`{raw}` has an unknown unit `{other}` (ms, s, m, h, d)"
            ));
        }
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("`{raw}` is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_refuse_without() {
        assert_eq!(parse_duration_ms("1500ms"), Ok(1500));
        assert_eq!(parse_duration_ms("10m"), Ok(600_000));
        assert_eq!(parse_duration_ms(" 2h "), Ok(7_200_000));
        assert!(parse_duration_ms("10").unwrap_err().contains("no unit"));
        assert!(parse_duration_ms("ten").is_err());
        assert!(
            parse_duration_ms("3w")
                .unwrap_err()
                .contains("unknown unit")
        );
    }
}
