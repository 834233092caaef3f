//! Typed access to the merchant settings a plugin receives, with the defaults its manifest
//! declares.

use crate::prelude::*;
use crate::{PolicyError, Setting};

/// The merchant's settings (`context.settings`), falling back to the declared defaults.
pub struct Settings<'a> {
    set: &'a [(String, String)],
    declared: Vec<Setting>,
}

impl<'a> Settings<'a> {
    /// The settings `set` by the merchant, with `declared` (the manifest's) supplying defaults.
    pub fn new(set: &'a [(String, String)], declared: Vec<Setting>) -> Self {
        Settings { set, declared }
    }

    /// The value of `key`: the merchant's, else the declared default.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.set
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .or_else(|| {
                self.declared
                    .iter()
                    .find(|s| s.name == key)
                    .and_then(|s| s.default.as_deref())
            })
    }

    fn required(&self, key: &str) -> Result<&str, PolicyError> {
        self.get(key).ok_or_else(|| {
            PolicyError::BadSetting((key.to_string(), "missing and has no default".to_string()))
        })
    }

    /// A text setting.
    ///
    /// # Errors
    /// `bad-setting` when it is missing and has no default.
    pub fn text(&self, key: &str) -> Result<&str, PolicyError> {
        self.required(key)
    }

    /// A duration setting, in milliseconds (`"90s"`, `"10m"`; see [`parse_duration_ms`]).
    ///
    /// # Errors
    /// `bad-setting` naming the key when it is missing or malformed.
    pub fn duration_ms(&self, key: &str) -> Result<u64, PolicyError> {
        parse_duration_ms(self.required(key)?)
            .map_err(|problem| PolicyError::BadSetting((key.to_string(), problem)))
    }

    /// A whole-number (or cents) setting.
    ///
    /// # Errors
    /// `bad-setting` naming the key when it is missing or not a whole number.
    pub fn integer(&self, key: &str) -> Result<i64, PolicyError> {
        let raw = self.required(key)?;
        raw.trim().parse().map_err(|_| {
            PolicyError::BadSetting((key.to_string(), format!("`{raw}` is not a whole number")))
        })
    }
}

/// Parses `"1500ms"`, `"90s"`, `"10m"` (or `"10min"`), `"2h"` or `"1d"` into milliseconds.
/// The host's `timeoutd validate` applies the same grammar to settings declared as durations.
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
