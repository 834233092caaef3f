//! The docs hold: every relative link in the README, `ARCHITECTURE.md` and `docs/*.md` reaches
//! a file (and a heading, for a `#fragment`), and every command block in them is run here or
//! says why not. The conventions are in `docs/README.md`, "Writing these docs".

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::timeoutd_bin;

/// The repository's root (this crate is `tests/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The pages checked: the README, ARCHITECTURE.md, and every page of `docs/`.
fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    assert!(docs.len() >= 5, "docs/ holds the guides: {docs:?}");
    pages.extend(docs);
    pages
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// A fenced code block of a page.
#[derive(Debug)]
struct Block {
    /// Its first line's number (1-based), for messages.
    line: usize,
    /// The info string's first word (`sh`, `toml`, `text`); empty when none.
    info: String,
    /// The `<!-- not run: REASON -->` line right before the fence, if any: REASON.
    not_run: Option<String>,
    /// Its lines.
    body: Vec<String>,
}

/// What a page holds: its code blocks, and its prose lines (outside blocks) with numbers.
struct Page {
    blocks: Vec<Block>,
    prose: Vec<(usize, String)>,
}

fn read_page(path: &Path) -> Page {
    let text = std::fs::read_to_string(path).unwrap();
    let mut blocks = Vec::new();
    let mut prose = Vec::new();
    let mut open: Option<(String, Block)> = None;
    let mut last_prose = String::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let fence: String = trimmed
            .chars()
            .take_while(|&c| c == '`' || c == '~')
            .collect();
        match &mut open {
            Some((opened, block)) => {
                if fence.len() >= opened.len()
                    && fence.starts_with(&opened[..1])
                    && trimmed[fence.len()..].trim().is_empty()
                {
                    blocks.push(open.take().unwrap().1);
                    last_prose.clear();
                } else {
                    block.body.push(line.to_string());
                }
            }
            None if fence.len() >= 3 => {
                let info = trimmed[fence.len()..]
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .to_string();
                let not_run = last_prose
                    .trim()
                    .strip_prefix("<!-- not run:")
                    .and_then(|r| r.strip_suffix("-->"))
                    .map(|r| r.trim().to_string());
                open = Some((
                    fence,
                    Block {
                        line: i + 1,
                        info,
                        not_run,
                        body: Vec::new(),
                    },
                ));
            }
            None => {
                if !line.trim().is_empty() {
                    last_prose = line.to_string();
                }
                prose.push((i + 1, line.to_string()));
            }
        }
    }
    assert!(
        open.is_none(),
        "{}: a code block is never closed",
        relative(path)
    );
    Page { blocks, prose }
}

/// Info strings of blocks that are commands to run.
const COMMANDS: [&str; 4] = ["sh", "bash", "shell", "console"];

/// Words of commands never run by a test, marked or not: a build, the project's scripts (the
/// suite, installs, services), root.
const EXPENSIVE: [&str; 3] = ["cargo ", "scripts/", "sudo "];

#[test]
fn every_command_block_in_the_docs_runs_or_says_why_not() {
    let root = root();
    let bin = timeoutd_bin();
    let bin_dir = bin.parent().unwrap().to_path_buf();
    let path = std::env::join_paths(
        std::iter::once(bin_dir.clone()).chain(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        )),
    )
    .unwrap();
    let mut problems = Vec::new();
    let mut ran = 0;
    for page in pages() {
        let name = relative(&page);
        for block in read_page(&page).blocks {
            let at = format!("{name}:{}", block.line);
            if block.info.is_empty() {
                problems.push(format!(
                    "{at}: a code block without an info string (`sh` for commands, `text` for \
                     output, `toml`, `rust`, …)"
                ));
                continue;
            }
            if !COMMANDS.contains(&block.info.as_str()) {
                if block.not_run.is_some() {
                    problems.push(format!("{at}: `not run` marks a block that is no command"));
                }
                continue;
            }
            match &block.not_run {
                Some(reason) if reason.is_empty() => {
                    problems.push(format!("{at}: `<!-- not run: -->` gives no reason"));
                }
                Some(_) => {}
                None if EXPENSIVE
                    .iter()
                    .any(|w| block.body.iter().any(|l| l.contains(w))) =>
                {
                    problems.push(format!(
                        "{at}: unmarked, but it builds, installs or starts something (cargo, \
                         scripts/, sudo): mark it `<!-- not run: REASON -->`"
                    ));
                }
                None => {
                    // The docs write the release build's path; the tests run the build at hand.
                    let script = block
                        .body
                        .join("\n")
                        .replace("target/release/timeoutd", &bin.display().to_string());
                    let out = Command::new("bash")
                        .args(["-euo", "pipefail", "-c", &script])
                        .current_dir(&root)
                        .env("PATH", &path)
                        .output()
                        .expect("bash runs");
                    ran += 1;
                    if !out.status.success() {
                        problems.push(format!(
                            "{at}: `{}` failed ({}): {}{}",
                            block.body.join("; "),
                            out.status,
                            String::from_utf8_lossy(&out.stdout),
                            String::from_utf8_lossy(&out.stderr)
                        ));
                    }
                }
            }
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(
        ran >= 3,
        "only {ran} command blocks ran: the docs' cheap commands should"
    );
}

/// GitHub's anchor of a heading: lower case, punctuation dropped (`-` and `_` kept), spaces
/// to `-`; a link's text stands for the link.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // `[text](target)` → `text`.
    while let Some(open) = rest.find('[') {
        let Some(mid) = rest[open..].find("](") else {
            break;
        };
        let Some(close) = rest[open + mid..].find(')') else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..open + mid]);
        rest = &rest[open + mid + close + 1..];
    }
    text.push_str(rest);
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors a page's headings make, with GitHub's `-1`, `-2` for repeats.
fn anchors(page: &Page) -> Vec<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for (_, line) in &page.prose {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim().trim_end_matches('#'));
        let n = seen.entry(base.clone()).or_insert(0);
        out.push(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The link targets of a prose line (`[text](target)`, `![alt](target)`, `[ref]: target`),
/// inline code left out.
fn link_targets(line: &str) -> Vec<String> {
    let mut prose = String::new();
    for (i, part) in line.split('`').enumerate() {
        if i % 2 == 0 {
            prose.push_str(part);
        }
    }
    let mut out = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let end = after.find(')').unwrap_or(after.len());
        let target = after[..end].split_whitespace().next().unwrap_or("");
        out.push(target.trim_matches(['<', '>']).to_string());
        rest = &after[end..];
    }
    let trimmed = prose.trim_start();
    if trimmed.starts_with('[')
        && let Some(def) = trimmed.find("]: ")
        && !trimmed[..def].contains(']')
    {
        out.push(
            trimmed[def + 3..]
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_string(),
        );
    }
    out
}

#[test]
fn every_relative_link_in_the_docs_reaches_a_file_and_heading() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for page_path in pages() {
        let page = read_page(&page_path);
        let name = relative(&page_path);
        for (line_no, line) in &page.prose {
            for target in link_targets(line) {
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (file, fragment) = match target.split_once('#') {
                    Some((f, frag)) => (f, Some(frag)),
                    None => (target.as_str(), None),
                };
                let resolved = if file.is_empty() {
                    page_path.clone()
                } else {
                    page_path.parent().unwrap().join(file)
                };
                if !resolved.exists() {
                    problems.push(format!("{name}:{line_no}: `{target}`: no such file"));
                    continue;
                }
                let Some(fragment) = fragment else { continue };
                if resolved.extension().is_none_or(|e| e != "md") {
                    problems.push(format!(
                        "{name}:{line_no}: `{target}`: a fragment into a file that is not markdown"
                    ));
                    continue;
                }
                let there = anchors(&read_page(&resolved));
                if !there.iter().any(|a| a == fragment) {
                    problems.push(format!(
                        "{name}:{line_no}: `{target}`: {} has no heading `#{fragment}`",
                        relative(&resolved)
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "broken links: {problems:#?}");
    assert!(
        checked >= 20,
        "only {checked} relative links found: is the reader broken?"
    );
}

#[test]
fn anchors_follow_githubs_rules() {
    assert_eq!(
        slug("Behind a connection pooler"),
        "behind-a-connection-pooler"
    );
    assert_eq!(
        slug("Upgrades, rollbacks and the schema's compatibility window"),
        "upgrades-rollbacks-and-the-schemas-compatibility-window"
    );
    assert_eq!(
        slug("Application-level sharding: `[[database.shards]]`"),
        "application-level-sharding-databaseshards"
    );
    assert_eq!(slug("A [linked](x.md) heading"), "a-linked-heading");
    assert_eq!(
        link_targets("see [a](docs/a.md#b) and `[c](d)` and ![i](img.svg \"t\")"),
        ["docs/a.md#b", "img.svg"]
    );
}
