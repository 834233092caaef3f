//! Durations written with units (`"250ms"`, `"30s"`, `"15m"`, `"2h"`), parsed by `humantime`.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// Deserialises a required duration.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let raw = String::deserialize(d)?;
    parse(&raw).map_err(serde::de::Error::custom)
}

/// Parses one duration, with a message that says what a valid one looks like.
pub fn parse(raw: &str) -> Result<Duration, String> {
    humantime::parse_duration(raw.trim()).map_err(|e| {
        format!("`{raw}` is not a duration ({e}); write a number with a unit: 500ms, 30s, 15m, 2h")
    })
}

/// Optional durations.
pub mod option {
    use super::*;

    /// Deserialises an optional duration.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|raw| parse(&raw).map_err(serde::de::Error::custom))
            .transpose()
    }
}
