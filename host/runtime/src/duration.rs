//! Durations in plugin settings, as the SDK reads them: a whole number and a unit, `ms`, `s`,
//! `m` (or `min`), `h` or `d` (`"1500ms"`, `"90s"`, `"10m"`). The SDK's
//! `settings::parse_duration_ms` is the guest's side of the same grammar; a test in `tests/`
//! holds the two together, so `timeoutd validate` refuses exactly what the plugin would.

/// Parses a setting's duration into milliseconds.
///
/// # Errors
/// What is wrong with the text, e.g. ``"15" has no unit (ms, s, m, h, d)``.
pub fn parse_ms(raw: &str) -> Result<u64, String> {
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
