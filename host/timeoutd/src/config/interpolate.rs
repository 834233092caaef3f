//! `${VAR}` and `${VAR:-default}` in the configuration text, resolved before parsing.

use super::ConfigProblems;

/// Replaces every `${NAME}` with the value `env` gives, or `${NAME:-fallback}` with the fallback
/// when `env` gives none. `$$` is a literal `$`. Comments (from a `#` outside a string to the end
/// of the line) are left as they are.
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
        let (code, comment) = line.split_at(comment_start(line));
        let mut rest = code;
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
        out.push_str(comment);
    }
    problems.into_result(out)
}

/// Byte offset of the line's comment (`#` outside a basic or literal string), or its length.
fn comment_start(line: &str) -> usize {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (Some('"'), '\\') if !escaped => {
                escaped = true;
                continue;
            }
            (Some(q), c) if c == q && !escaped => quote = None,
            (None, '"' | '\'') => quote = Some(c),
            (None, '#') => return i,
            _ => {}
        }
        escaped = false;
    }
    line.len()
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
        assert_eq!(
            interpolate("a = \"${NOPE:-x}$$\"", &env).unwrap(),
            "a = \"x$\""
        );
        let err = interpolate("a = 1\nb = \"${NOPE}\"\nc = \"${ALSO_NOPE}\"", &env).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("line 2") && text.contains("`NOPE`"), "{text}");
        assert!(
            text.contains("line 3") && text.contains("`ALSO_NOPE`"),
            "{text}"
        );
    }

    #[test]
    fn comments_are_not_interpolated() {
        assert_eq!(
            interpolate("a = \"#${HOME_DB}\" # see ${UNSET}\n", &env).unwrap(),
            "a = \"#db.sqlite\" # see ${UNSET}\n"
        );
    }
}
