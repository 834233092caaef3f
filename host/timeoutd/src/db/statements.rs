//! SQL text split into its statements: the migrator runs a MariaDB/MySQL migration one
//! statement at a time, and the table prefix rewrites a migration statement by statement.

/// A migration's statements: split at `;` outside quotes and `--` comments, each trimmed,
/// empty ones dropped.
pub fn split(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut chars = sql.chars().peekable();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        match quote {
            Some(q) => {
                current.push(c);
                if c == q {
                    quote = None;
                }
            }
            None => match c {
                '\'' | '"' | '`' => {
                    quote = Some(c);
                    current.push(c);
                }
                '-' if chars.peek() == Some(&'-') => {
                    for c in chars.by_ref() {
                        if c == '\n' {
                            current.push('\n');
                            break;
                        }
                    }
                }
                ';' => out.push(std::mem::take(&mut current)),
                _ => current.push(c),
            },
        }
    }
    out.push(current);
    out.into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn splits_outside_quotes_and_comments() {
        assert_eq!(
            super::split("-- a; comment\nINSERT INTO t VALUES ('a;b'); SELECT 1;\n"),
            ["INSERT INTO t VALUES ('a;b')", "SELECT 1"]
        );
    }
}
