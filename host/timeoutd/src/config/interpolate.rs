//! `${VAR}` and `${VAR:-default}` in the configuration text, resolved before parsing.

use super::ConfigProblems;

/// Replaces every `${NAME}` with the value `env` gives, or `${NAME:-fallback}` with the fallback
/// when `env` gives none. `$$` is a literal `$`.
///
/// # Errors
/// Every unset variable without a fallback, and every unterminated `${`, with its line.
pub fn interpolate(
    raw: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ConfigProblems> {
    let mut out = String::with_capacity(raw.len());
    let mut problems = ConfigProblems::default();
    for (n, line) in raw.split_inclusive('\n').enumerate() {
        let at = format!("line {}", n + 1);
        let mut rest = line;
        while let Some(i) = rest.find('$') {
            out.push_str(&rest[..i]);
            let after = &rest[i + 1..];
            if let Some(tail) = after.strip_prefix('$') {
                out.push('$');
                rest = tail;
            } else if let Some(body) = after.strip_prefix('{') {
                let Some(end) = body.find('}') else {
                    problems.push(&at, "unterminated `${` (write `$$` for a literal `$`)");
                    rest = "";
                    break;
                };
                let expr = &body[..end];
                let (name, fallback) = match expr.split_once(":-") {
                    Some((name, fallback)) => (name, Some(fallback)),
                    None => (expr, None),
                };
                match (env(name), fallback) {
                    (Some(v), _) => out.push_str(&v),
                    (None, Some(f)) => out.push_str(f),
                    (None, None) => problems.push(
                        &at,
                        format!("environment variable `{name}` is not set (use ${{{name}:-default}} for a fallback)"),
                    ),
                }
                rest = &body[end + 1..];
            } else {
                out.push('$');
                rest = after;
            }
        }
        out.push_str(rest);
    }
    problems.into_result(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(k: &str) -> Option<String> {
        (k == "HOME_DB").then(|| "db.sqlite".to_string())
    }

    #[test]
    fn set_unset_defaulted_and_escaped_variables() {
        assert_eq!(
            interpolate("url = \"sqlite://${HOME_DB}\"", &env).unwrap(),
            "url = \"sqlite://db.sqlite\""
        );
        assert_eq!(interpolate("a = \"${NOPE:-x}$$\"", &env).unwrap(), "a = \"x$\"");
        let err = interpolate("a = 1\nb = \"${NOPE}\"\nc = \"${ALSO_NOPE}\"", &env).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("line 2") && text.contains("`NOPE`"), "{text}");
        assert!(text.contains("line 3") && text.contains("`ALSO_NOPE`"), "{text}");
    }
}
