//! The architecture's rules as tests, read off the source as `db::tests::only_db_speaks_sql`
//! does: the layers `ARCHITECTURE.md` declares (its table is the one source of truth), no
//! import circle anywhere in `host/timeoutd/src`, the table naming exactly the crate's modules,
//! and every ledger kind carried out somewhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use timeoutd::kinds::{Home, LedgerKind, Section};

/// The repository's root (this crate is `tests/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The daemon crate's sources.
fn src() -> PathBuf {
    root().join("host/timeoutd/src")
}

/// A module path inside the crate: `["sources", "prefetch"]`; the crate root is empty.
type Module = Vec<String>;

fn show(module: &[String]) -> String {
    if module.is_empty() {
        "crate".to_string()
    } else {
        module.join("::")
    }
}

/// Every file module of the library (`lib.rs` and what it declares, as `foo.rs` + `foo/`),
/// with its file. `main.rs` is the binary, not the library.
fn file_modules() -> BTreeMap<Module, PathBuf> {
    fn walk(dir: &Path, prefix: &[String], out: &mut BTreeMap<Module, PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                let name = path.file_name().unwrap().to_string_lossy().to_string();
                let mut inner = prefix.to_vec();
                inner.push(name);
                walk(&path, &inner, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let stem = path.file_stem().unwrap().to_string_lossy().to_string();
                let module = match (prefix.is_empty(), stem.as_str()) {
                    (true, "main") => continue,
                    (true, "lib") | (_, "mod") => prefix.to_vec(),
                    _ => {
                        let mut module = prefix.to_vec();
                        module.push(stem);
                        module
                    }
                };
                out.insert(module, path);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(&src(), &[], &mut out);
    // A folder of templates (`plugin_cli/new/`) holds no `.rs` module of its own: only paths
    // with a file are modules, which `walk` already ensures.
    out
}

/// `text` with comments, string and char literals blanked and `#[cfg(test)]` items removed:
/// what is left is code, so a path in a doc comment or a message is not an import.
fn code_of(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r'
            && (i == 0 || !ident(chars[i - 1]) || chars[i - 1] == 'b')
            && matches!(next, Some('"') | Some('#'))
            && {
                let mut j = i + 1;
                while chars.get(j) == Some(&'#') {
                    j += 1;
                }
                chars.get(j) == Some(&'"')
            }
        {
            // A raw string: r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars[j] == '#' {
                hashes += 1;
                j += 1;
            }
            j += 1;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (0..hashes).all(|h| chars.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
            out.push_str("\"\"");
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && next == Some('\\') {
            // An escaped char literal: '\n', '\u{1F600}'.
            i += 2;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            i += 3;
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    strip_test_items(&out)
}

/// Removes every item marked `#[cfg(test)]` (a `mod tests { … }`, a helper): test code may
/// reach anywhere.
fn strip_test_items(code: &str) -> String {
    let mut out = code.to_string();
    while let Some(at) = out.find("#[cfg(test)]") {
        let rest = &out[at..];
        let brace = rest.find('{');
        let semi = rest.find(';');
        let end = match (brace, semi) {
            (Some(b), Some(s)) if s < b => at + s + 1,
            (None, Some(s)) => at + s + 1,
            (Some(b), _) => {
                let mut depth = 0;
                let mut end = out.len();
                for (k, ch) in out[at + b..].char_indices() {
                    match ch {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = at + b + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (None, None) => out.len(),
        };
        out.replace_range(at..end, " ");
    }
    out
}

/// The tokens of `code`: identifiers, `::`, and single punctuation characters.
fn tokens(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push("::".to_string());
            i += 2;
        } else if c.is_whitespace() {
            i += 1;
        } else {
            out.push(c.to_string());
            i += 1;
        }
    }
    out
}

/// The paths a use tree starting at `tokens[*at]` names, each as its segments (`{a, b::c}`
/// gives two). Leaves `*at` after the tree.
fn use_tree(tokens: &[String], at: &mut usize, prefix: Vec<String>) -> Vec<Vec<String>> {
    let mut path = prefix;
    loop {
        match tokens.get(*at).map(String::as_str) {
            Some("{") => {
                *at += 1;
                let mut all = Vec::new();
                loop {
                    match tokens.get(*at).map(String::as_str) {
                        Some("}") => {
                            *at += 1;
                            break;
                        }
                        Some(",") => *at += 1,
                        None => break,
                        Some(_) => all.extend(use_tree(tokens, at, path.clone())),
                    }
                }
                return all;
            }
            Some("*") => {
                *at += 1;
                return vec![path];
            }
            Some(word) if word.chars().all(|c| c.is_alphanumeric() || c == '_') => {
                if word != "self" || path.is_empty() {
                    path.push(word.to_string());
                }
                *at += 1;
                if tokens.get(*at).map(String::as_str) == Some("::") {
                    *at += 1;
                } else {
                    return vec![path];
                }
            }
            _ => return vec![path],
        }
    }
}

/// One reference from a module's code to another module of the crate.
#[derive(Debug, Clone)]
struct Reference {
    /// The module whose file holds the path.
    from: Module,
    /// The deepest module of the crate the path names.
    to: Module,
    /// The path as written (`crate::db::outbox::claim_due`, `super::prefetch::Prefetch`).
    written: String,
}

/// Every path into the crate that `module`'s code writes (`crate::…`, `super::…`,
/// `self::…`, `$crate::…`), resolved to the deepest module of `modules` it names.
fn references(module: &Module, code: &str, modules: &BTreeSet<Module>) -> Vec<Reference> {
    let tokens = tokens(code);
    let mut out = Vec::new();
    for start in 0..tokens.len() {
        let head = tokens[start].as_str();
        if !matches!(head, "crate" | "super" | "self")
            || tokens.get(start + 1).map(String::as_str) != Some("::")
            || (start > 0 && tokens[start - 1] == "::")
        {
            continue;
        }
        let mut at = start;
        let mut base: Module = match head {
            "crate" => Vec::new(),
            "self" => module.clone(),
            _ => module[..module.len().saturating_sub(1)].to_vec(),
        };
        at += 2;
        while tokens.get(at).map(String::as_str) == Some("super")
            && tokens.get(at + 1).map(String::as_str) == Some("::")
        {
            base.pop();
            at += 2;
        }
        for path in use_tree(&tokens, &mut at, Vec::new()) {
            let mut to = base.clone();
            for segment in &path {
                let mut deeper = to.clone();
                deeper.push(segment.clone());
                if modules.contains(&deeper) {
                    to = deeper;
                } else {
                    break;
                }
            }
            let written = std::iter::once(head.to_string())
                .chain(path.iter().cloned())
                .collect::<Vec<_>>()
                .join("::");
            out.push(Reference {
                from: module.clone(),
                to,
                written,
            });
        }
    }
    out
}

/// The import graph between siblings: for each parent module, which of its children reach
/// which (a child's whole subtree counts as the child; a path to an ancestor or into one's own
/// subtree is no edge). Each edge keeps the references that make it.
type Siblings = BTreeMap<Module, BTreeMap<(String, String), Vec<Reference>>>;

fn sibling_graph() -> Siblings {
    let files = file_modules();
    let modules: BTreeSet<Module> = files.keys().cloned().collect();
    let mut graph = Siblings::new();
    for (module, path) in &files {
        let code = code_of(&std::fs::read_to_string(path).unwrap());
        for r in references(module, &code, &modules) {
            let common = r.from.iter().zip(&r.to).take_while(|(a, b)| a == b).count();
            if common == r.from.len() || common == r.to.len() {
                continue;
            }
            graph
                .entry(r.from[..common].to_vec())
                .or_default()
                .entry((r.from[common].clone(), r.to[common].clone()))
                .or_default()
                .push(r);
        }
    }
    graph
}

/// A circle among `edges` (the nodes in order, the first repeated at the end), if any.
fn find_circle(edges: &BTreeMap<(String, String), Vec<Reference>>) -> Option<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        next.entry(a.as_str()).or_default().push(b.as_str());
    }
    // Depth-first search; `state`: 1 on the stack, 2 finished.
    fn visit<'a>(
        node: &'a str,
        next: &BTreeMap<&'a str, Vec<&'a str>>,
        state: &mut BTreeMap<&'a str, u8>,
        stack: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        state.insert(node, 1);
        stack.push(node);
        for &to in next.get(node).map(Vec::as_slice).unwrap_or_default() {
            match state.get(to) {
                Some(1) => {
                    let from = stack.iter().position(|&n| n == to).unwrap();
                    let mut circle: Vec<String> =
                        stack[from..].iter().map(|s| s.to_string()).collect();
                    circle.push(to.to_string());
                    return Some(circle);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(to, next, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node, 2);
        None
    }
    let mut state = BTreeMap::new();
    let nodes: Vec<&str> = next.keys().copied().collect();
    for node in nodes {
        if !state.contains_key(node) {
            let mut stack = Vec::new();
            if let Some(c) = visit(node, &next, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

/// The layers `ARCHITECTURE.md` declares, top first: the table under "Layers of
/// `host/timeoutd/src`", one row per layer, its modules in backticks in the second column.
fn declared_layers() -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let section = text
        .split("\n## ")
        .find(|s| s.starts_with("Layers of `host/timeoutd/src`"))
        .expect("ARCHITECTURE.md has a section \"## Layers of `host/timeoutd/src`\"");
    let mut layers = Vec::new();
    for line in section.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | layer | modules | what they own |
        let Some(modules) = cells.get(2) else {
            continue;
        };
        if cells[1] == "layer" || cells[1].starts_with("---") {
            continue;
        }
        let names: Vec<String> = modules
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        assert!(
            !names.is_empty(),
            "ARCHITECTURE.md's layer row `{line}` names no module in backticks"
        );
        layers.push(names);
    }
    assert!(
        !layers.is_empty(),
        "ARCHITECTURE.md's layer section has no table"
    );
    layers
}

/// The top-level modules `lib.rs` declares (`pub mod x;`, `mod x;`).
fn declared_modules() -> BTreeSet<String> {
    let code = code_of(&std::fs::read_to_string(src().join("lib.rs")).unwrap());
    let tokens = tokens(&code);
    tokens
        .windows(3)
        .filter(|w| w[0] == "mod" && w[2] == ";")
        .map(|w| w[1].clone())
        .collect()
}

#[test]
fn no_import_circle_anywhere_in_the_daemon_crate() {
    let graph = sibling_graph();
    let mut circles = Vec::new();
    for (parent, edges) in &graph {
        if let Some(circle) = find_circle(edges) {
            let because: Vec<String> = circle
                .windows(2)
                .map(|pair| {
                    let refs = &edges[&(pair[0].clone(), pair[1].clone())];
                    format!(
                        "{} → {} ({} in {})",
                        pair[0],
                        pair[1],
                        refs[0].written,
                        show(&refs[0].from)
                    )
                })
                .collect();
            circles.push(format!(
                "under {}: {}: {}",
                show(parent),
                circle.join(" → "),
                because.join("; ")
            ));
        }
    }
    assert!(circles.is_empty(), "import circles: {circles:#?}");
    // The reader finds the edges it must: a known import, a known absence.
    let top = &graph[&Module::new()];
    assert!(top.contains_key(&("dispatch".to_string(), "db".to_string())));
    assert!(!top.contains_key(&("db".to_string(), "dispatch".to_string())));
}

#[test]
fn imports_point_down_the_layers_architecture_md_declares() {
    let layers = declared_layers();
    let layer_of: BTreeMap<&str, usize> = layers
        .iter()
        .enumerate()
        .flat_map(|(i, names)| names.iter().map(move |n| (n.as_str(), i)))
        .collect();
    let graph = sibling_graph();
    let mut upward = Vec::new();
    for ((from, to), refs) in &graph[&Module::new()] {
        let (Some(&a), Some(&b)) = (layer_of.get(from.as_str()), layer_of.get(to.as_str())) else {
            // A module missing from the table is the next test's finding.
            continue;
        };
        if b < a {
            upward.push(format!(
                "{from} (layer {}) imports {to} (layer {}): {} in {}",
                a + 1,
                b + 1,
                refs[0].written,
                show(&refs[0].from)
            ));
        }
    }
    assert!(
        upward.is_empty(),
        "imports pointing up ARCHITECTURE.md's layers (a design question: move the item down, \
         or hand it in through a port): {upward:#?}"
    );
}

#[test]
fn architecture_md_names_every_module_of_the_crate_once() {
    let layers = declared_layers();
    let mut seen = BTreeMap::new();
    for name in layers.iter().flatten() {
        *seen.entry(name.clone()).or_insert(0) += 1;
    }
    let twice: Vec<&String> = seen
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(m, _)| m)
        .collect();
    assert!(
        twice.is_empty(),
        "in two layers of ARCHITECTURE.md: {twice:?}"
    );
    let documented: BTreeSet<String> = seen.into_keys().collect();
    let crate_modules = declared_modules();
    assert!(crate_modules.contains("dispatch") && crate_modules.contains("db"));
    let undocumented: Vec<&String> = crate_modules.difference(&documented).collect();
    let gone: Vec<&String> = documented.difference(&crate_modules).collect();
    assert!(
        undocumented.is_empty() && gone.is_empty(),
        "ARCHITECTURE.md's layer table and lib.rs disagree: modules missing from the table \
         {undocumented:?}; named in the table but not in lib.rs {gone:?}"
    );
    // Every top-level file is a declared module (none left out of lib.rs and the table).
    let files: BTreeSet<String> = file_modules()
        .into_keys()
        .filter(|m| m.len() == 1)
        .map(|m| m[0].clone())
        .collect();
    assert_eq!(
        files, crate_modules,
        "files under src/ against lib.rs's `mod`s"
    );
}

/// The Rust name of an effect kind's variant (`RestoreStock`): `EffectKind` and `Effect`
/// share them.
fn variant(kind: LedgerKind) -> String {
    match kind {
        LedgerKind::Effect(k) => format!("{k:?}"),
        other => format!("{other:?}"),
    }
}

/// Whether `code` names `variant` as a path's last segment after `qualifier` (`Effect::Notify`,
/// `LedgerKind::Remind`, `E::RestoreStock`).
fn names_variant(code: &str, qualifiers: &[&str], variant: &str) -> bool {
    let tokens = tokens(code);
    tokens
        .windows(3)
        .any(|w| qualifiers.contains(&w[0].as_str()) && w[1] == "::" && w[2] == variant)
}

#[test]
fn every_ledger_kind_has_an_executor_or_is_applied_in_the_close_transaction() {
    let files = file_modules();
    let code = |module: &[&str]| {
        let key: Module = module.iter().map(|s| s.to_string()).collect();
        let path = files
            .get(&key)
            .unwrap_or_else(|| panic!("no module {}", key.join("::")));
        code_of(&std::fs::read_to_string(path).unwrap())
    };
    // Each executor: the file that implements `effects::Executor`, by the section it returns.
    let mut executors: BTreeMap<String, (Module, String)> = BTreeMap::new();
    for (module, path) in &files {
        if module.first().map(String::as_str) != Some("effects") {
            continue;
        }
        let text = code_of(&std::fs::read_to_string(path).unwrap());
        let tokens = tokens(&text);
        if !tokens
            .windows(3)
            .any(|w| w[0] == "impl" && w[1] == "Executor" && w[2] == "for")
        {
            continue;
        }
        // `fn section(&self) -> Section { Section::Redis }`
        let at = tokens
            .windows(2)
            .position(|w| w[0] == "fn" && w[1] == "section")
            .unwrap_or_else(|| panic!("{} implements Executor without `section`", show(module)));
        let section = tokens[at..]
            .windows(3)
            .find(|w| w[0] == "Section" && w[1] == "::" && w[2] != "ALL")
            .map(|w| w[2].clone())
            .unwrap_or_else(|| panic!("{}: `section` returns no Section", show(module)));
        let before = executors.insert(section.clone(), (module.clone(), text));
        assert!(before.is_none(), "two executors for Section::{section}");
    }
    let mut homeless = Vec::new();
    for kind in LedgerKind::all() {
        let name = variant(kind);
        match kind.home() {
            Home::Executor(section) => {
                let section_name = format!("{section:?}");
                assert!(Section::ALL.contains(&section));
                match executors.get(&section_name) {
                    None => homeless.push(format!(
                        "{}: its section {section_name} has no `impl Executor` in effects/",
                        kind.as_str()
                    )),
                    Some((module, text)) => {
                        // `effects/work.rs` reads each row once into its section's work enum
                        // (an exhaustive match over the effects, unit-tested against `home`),
                        // and the executor matches that enum exhaustively: the kind must be
                        // read there, and the executor must take its section's work.
                        let work = format!("{section_name}Work");
                        if !names_variant(
                            &code(&["effects", "work"]),
                            &["Effect", "LedgerKind"],
                            &name,
                        ) {
                            homeless.push(format!(
                                "{}: effects/work.rs does not read {name} into any section's work",
                                kind.as_str()
                            ));
                        }
                        if !tokens(text).contains(&work) {
                            homeless.push(format!(
                                "{}: the {section_name} executor ({}) does not take {work}",
                                kind.as_str(),
                                show(module)
                            ));
                        }
                    }
                }
            }
            Home::CloseTransaction => {
                // The close's writes: `dispatch/` (the close) hands the effect to `db::orders`,
                // which applies it beside the compare-and-set; a host kind applied there (the
                // points a shop's order spent) is named by its `LedgerKind`.
                let in_close = files.iter().any(|(module, path)| {
                    module.first().map(String::as_str) == Some("dispatch")
                        && names_variant(
                            &code_of(&std::fs::read_to_string(path).unwrap()),
                            &["Effect", "E", "EffectKind", "LedgerKind"],
                            &name,
                        )
                });
                if !in_close {
                    homeless.push(format!(
                        "{}: home is the close transaction, but no file of dispatch/ applies \
                         Effect::{name}",
                        kind.as_str()
                    ));
                }
            }
        }
    }
    assert!(
        homeless.is_empty(),
        "ledger kinds nobody carries out: {homeless:#?}"
    );
    // Every section has its executor, and the database's part of the close exists.
    assert_eq!(
        executors.len(),
        Section::ALL.len(),
        "{:?}",
        executors.keys()
    );
    assert!(code(&["db", "orders"]).contains("fn compare_and_close"));
}

#[test]
fn the_reader_sees_through_comments_strings_and_test_code() {
    let code = code_of(
        "use crate::a::{b, c::d};\n// crate::x::y\nlet s = \"crate::z\"; let r = r#\"crate::w\"#;\n\
         let c = '\"'; let l: &'static str = \"\";\n#[cfg(test)]\nmod tests { use crate::t; }\n\
         fn f() { super::super::q::r(); }",
    );
    let modules: BTreeSet<Module> = [
        vec!["a"],
        vec!["a", "b"],
        vec!["a", "c"],
        vec!["x"],
        vec!["z"],
        vec!["w"],
        vec!["t"],
        vec!["q"],
        vec!["m"],
        vec!["m", "n"],
    ]
    .into_iter()
    .map(|m| m.into_iter().map(str::to_string).collect())
    .collect();
    let here: Module = vec!["m".into(), "n".into()];
    let found: Vec<String> = references(&here, &code, &modules)
        .into_iter()
        .map(|r| show(&r.to))
        .collect();
    assert_eq!(found, ["a::b", "a::c", "q"]);
}
