//! The layers of `src/`: each top-level module imports only the modules to its left in
//! [`ORDER`] (ARCHITECTURE.md states it as an invariant); inside `environment` the core
//! names no kind: only `environment/kinds/` does; and the batch and the suite loader name no
//! kind of agent: only `agent/kinds/` does. An offending import is named with its
//! file and line, so a change that adds one fails here, not in a later refactor.

use std::path::{Path, PathBuf};

/// From the wire formats at the bottom to the command line at the top.
const ORDER: [&str; 19] = [
    "allocator",
    "contract",
    "domain",
    "config",
    "sandbox",
    "log",
    "model",
    "budget",
    "gateway",
    "image",
    "agent",
    "environment",
    "scoring",
    "suite",
    "batch",
    "report",
    "serve",
    "view",
    "cli",
];

/// Every `crate::NAME` a line of code names (in `use` lines, `use crate::{a, b}` groups,
/// and paths in code), comments left out.
fn modules_named(line: &str) -> Vec<&str> {
    names_after(line, "crate::")
}

/// Every `NAME` that follows `prefix` (`crate::`, `kinds::`) in a line of code, alone or in
/// a `{a, b}` group, comments left out.
fn names_after<'a>(line: &'a str, prefix: &str) -> Vec<&'a str> {
    let code = line.split("//").next().unwrap_or("");
    let mut names = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        rest = &rest[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // The first segment of each item at the group's own depth.
            let mut depth = 0;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && !c.is_whitespace() => {
                        item_start = false;
                        let end = group[i..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(0);
                        names.push(&group[i..i + end]);
                    }
                    _ => {}
                }
            }
        } else {
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
            names.push(&rest[..end]);
        }
    }
    names
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())).flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// `file:line: from -> to` for each import of a module at or above the importer's layer.
fn upward_edges(src: &Path) -> Vec<String> {
    let rank = |m: &str| ORDER.iter().position(|o| *o == m);
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut edges = Vec::new();
    for file in files {
        let relative = file.strip_prefix(src).unwrap_or(&file);
        let Some(from) = relative.components().next().and_then(|c| c.as_os_str().to_str()) else { continue };
        let Some(from_rank) = rank(from) else { continue };
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        for (n, line) in text.lines().enumerate() {
            for to in modules_named(line) {
                if rank(to).is_some_and(|r| r > from_rank) {
                    edges.push(format!("src/{}:{}: {from} -> {to}: {}", relative.display(), n + 1, line.trim()));
                }
            }
        }
    }
    edges
}

#[test]
fn every_module_imports_only_the_layers_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut tops: Vec<String> = std::fs::read_dir(&src)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    tops.sort();
    let unplaced: Vec<&String> = tops.iter().filter(|t| !ORDER.contains(&t.as_str())).collect();
    assert!(unplaced.is_empty(), "top-level modules with no place in the layers: {unplaced:?}");
    let edges = upward_edges(&src);
    assert!(edges.is_empty(), "imports that go up the layers:\n{}", edges.join("\n"));
}

/// The kinds of environment: each file and folder of `src/environment/kinds/` but the list
/// itself (`mod.rs`) and its tests.
fn environment_kinds(kinds: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(kinds)
        .unwrap_or_else(|e| panic!("read {}: {e}", kinds.display()))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().trim_end_matches(".rs").to_owned())
        .filter(|name| name != "mod" && name != "tests")
        .collect();
    names.sort();
    names
}

/// `file:line: names kind` for each line of the environment's core (every file of
/// `src/environment/` outside `kinds/`) that names a kind's module; the list's own items
/// (`kinds::KINDS`, `kinds::find`, `KindSettings`, …) are the core's to use.
fn kinds_named_by_the_core(src: &Path) -> Vec<String> {
    let environment = src.join("environment");
    let kinds_dir = environment.join("kinds");
    let kinds = environment_kinds(&kinds_dir);
    let mut files = Vec::new();
    rust_files(&environment, &mut files);
    files.retain(|f| !f.starts_with(&kinds_dir));
    files.sort();
    let mut found = Vec::new();
    for file in files {
        let relative = file.strip_prefix(src).unwrap_or(&file);
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        for (n, line) in text.lines().enumerate() {
            for name in names_after(line, "kinds::") {
                if kinds.iter().any(|k| k == name) {
                    found.push(format!("src/{}:{}: names kind `{name}`: {}", relative.display(), n + 1, line.trim()));
                }
            }
        }
    }
    found
}

#[test]
fn the_environment_core_names_no_kind() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let kinds = environment_kinds(&src.join("environment/kinds"));
    for kind in ["shell", "kv", "python", "web", "writing", "mcp"] {
        assert!(kinds.iter().any(|k| k == kind), "no kind `{kind}` under src/environment/kinds/: {kinds:?}");
    }
    let found = kinds_named_by_the_core(&src);
    assert!(found.is_empty(), "the environment's core names a kind; only kinds/ may:\n{}", found.join("\n"));
}

/// The kinds of agent: each file and folder of `src/agent/kinds/` but the list itself.
fn agent_kinds(kinds: &Path) -> Vec<String> {
    environment_kinds(kinds)
}

/// `file:line: names kind` for each line of `src/batch/` and `src/suite/` that names a kind
/// of agent: by its module (`kinds::memory`) or its settings' variant
/// (`AgentSettings::Memory`). They ask the kind, through `AgentKind`, what they need.
fn agent_kinds_named_in(src: &Path, folders: &[&str]) -> Vec<String> {
    let kinds = agent_kinds(&src.join("agent/kinds"));
    let mut found = Vec::new();
    for folder in folders {
        let mut files = Vec::new();
        rust_files(&src.join(folder), &mut files);
        files.sort();
        for file in files {
            let relative = file.strip_prefix(src).unwrap_or(&file);
            let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
            for (n, line) in text.lines().enumerate() {
                let by_module =
                    names_after(line, "agent::kinds::").into_iter().filter(|name| kinds.iter().any(|k| k == name));
                let by_settings = names_after(line, "AgentSettings::").into_iter();
                for name in by_module.chain(by_settings) {
                    found.push(format!(
                        "src/{}:{}: names agent kind `{name}`: {}",
                        relative.display(),
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    found
}

#[test]
fn the_batch_and_the_suite_loader_name_no_agent_kind() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let kinds = agent_kinds(&src.join("agent/kinds"));
    for kind in ["tool_calling", "oracle", "external", "cli", "memory"] {
        assert!(kinds.iter().any(|k| k == kind), "no kind `{kind}` under src/agent/kinds/: {kinds:?}");
    }
    let found = agent_kinds_named_in(&src, &["batch", "suite"]);
    assert!(
        found.is_empty(),
        "the batch or the suite loader names an agent kind; only agent/kinds/ may:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_layer_check_sees_every_form_of_import() {
    assert_eq!(modules_named("use crate::report::table::Projection;"), ["report"]);
    assert_eq!(modules_named("use crate::{log::Event, model::Backend};"), ["log", "model"]);
    assert_eq!(modules_named("use crate::{log::{Event, Outcome}, report::Summary};"), ["log", "report"]);
    assert_eq!(modules_named("    let x = crate::batch::suite_info(s); // crate::cli"), ["batch"]);
    assert!(modules_named("// use crate::cli::main;").is_empty());
    assert_eq!(names_after("use super::kinds::{self, shell::Shell, KINDS};", "kinds::"), ["self", "shell", "KINDS"]);
    assert_eq!(names_after("let w = crate::environment::kinds::web::page::cut(s);", "kinds::"), ["web"]);
    assert_eq!(
        names_after("use crate::agent::kinds::{memory::Memory, AGENT_KINDS};", "agent::kinds::"),
        ["memory", "AGENT_KINDS"]
    );
    assert_eq!(names_after("if let AgentSettings::Memory(s) = x {", "AgentSettings::"), ["Memory"]);
}

/// Names a public type may share across top modules: idiomatic ones that mean the same
/// kind of thing wherever they are (a file format, a listing's entry).
const SHARED_NAMES: [&str; 2] = ["Entry", "Format"];

/// Each `pub` type (struct, enum, trait, alias) of `src/` and the workspace's crates,
/// outside test modules, as `(name, top module, file:line)`.
fn public_types() -> Vec<(String, String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    let trees = [
        (root.join("src"), None),
        (root.join("crates/contract/src"), Some("contract")),
        (root.join("crates/sandbox/src"), Some("sandbox")),
    ];
    for (tree, crate_name) in trees {
        let mut files = Vec::new();
        rust_files(&tree, &mut files);
        files.sort();
        for file in files {
            let relative = file.strip_prefix(&tree).unwrap_or(&file);
            let top = match crate_name {
                Some(name) => name.to_owned(),
                None => relative
                    .components()
                    .next()
                    .map(|c| c.as_os_str().to_string_lossy().trim_end_matches(".rs").to_owned())
                    .unwrap_or_default(),
            };
            let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
            for (n, line) in text.lines().enumerate() {
                if line.starts_with("#[cfg(test)]") {
                    break;
                }
                let Some(rest) = line.trim_start().strip_prefix("pub ") else { continue };
                let Some(rest) = ["struct ", "enum ", "trait ", "type "].iter().find_map(|k| rest.strip_prefix(k))
                else {
                    continue;
                };
                let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                found.push((
                    name,
                    top.clone(),
                    format!("{}:{}", file.strip_prefix(root).unwrap_or(&file).display(), n + 1),
                ));
            }
        }
    }
    found
}

/// One noun per idea: two public types of one name in two top modules are two ideas under
/// one word (a reader, or a `use`, takes one for the other).
#[test]
fn no_two_top_modules_declare_a_public_type_of_the_same_name() {
    let mut by_name: std::collections::BTreeMap<String, Vec<(String, String)>> = Default::default();
    for (name, top, at) in public_types() {
        by_name.entry(name).or_default().push((top, at));
    }
    let shared: Vec<String> = by_name
        .iter()
        .filter(|(name, places)| {
            let tops: std::collections::BTreeSet<&String> = places.iter().map(|(top, _)| top).collect();
            tops.len() > 1 && !SHARED_NAMES.contains(&name.as_str())
        })
        .map(|(name, places)| {
            format!("`{name}`: {}", places.iter().map(|(_, at)| at.as_str()).collect::<Vec<_>>().join(", "))
        })
        .collect();
    assert!(shared.is_empty(), "public types of one name in several top modules:\n{}", shared.join("\n"));
    assert!(by_name.contains_key("Event") && by_name.contains_key("Suite"), "the scan found the crate's types");
}
