//! The book under `docs/` cannot drift from the code: every page is in its summary and every
//! page the summary names exists, every tool of every environment kind is named on its kind's
//! page, every command and flag is in the commands chapter, and links between pages resolve.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use runner::cli::flags::CommandLine;
use runner::environment::KINDS;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn book() -> PathBuf {
    root().join("docs/src")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Whether `text` names `name` in backquotes: `` `name` ``, `` `name(…` `` or `` `name X` ``,
/// but not a longer name that starts with it (`--cache` is not named by `--cache-dir`).
fn names(text: &str, name: &str) -> bool {
    let quoted = format!("`{name}");
    text.match_indices(&quoted).any(|(at, _)| {
        let next = text[at + quoted.len()..].chars().next();
        !matches!(next, Some(c) if c.is_alphanumeric() || c == '_' || c == '-')
    })
}

/// Of `wanted`, those `text` does not name.
fn unnamed<'a>(text: &str, wanted: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    wanted.into_iter().filter(|name| !names(text, name)).collect()
}

/// The Markdown links in `text` that point into the book (no scheme, no mail), each as its
/// file (empty for the page itself) and its anchor (empty for none).
fn local_links(text: &str) -> Vec<(String, String)> {
    text.match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &text[at + 2..];
            let target = &rest[..rest.find(')')?];
            let external = target.contains("://") || target.starts_with("mailto:");
            let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
            (!external && !target.is_empty()).then(|| (file.to_string(), anchor.to_string()))
        })
        .collect()
}

/// The anchors of a page's headings, as mdBook makes them: lower case, spaces to `-`, only
/// letters, digits, `-` and `_` kept (`` ## `runner.yaml` `` is `#runneryaml`).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut in_code = false;
    let mut anchors = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            let heading = line.trim_start_matches('#').trim();
            let anchor = heading
                .chars()
                .filter_map(|c| match c {
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
                    c if c.is_whitespace() => Some('-'),
                    _ => None,
                })
                .collect();
            anchors.insert(anchor);
        }
    }
    anchors
}

/// Every `.md` file under `dir`, as a path relative to it with `/` separators.
fn pages_under(dir: &Path) -> BTreeSet<String> {
    let mut pages = BTreeSet::new();
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let entries = std::fs::read_dir(&folder).unwrap_or_else(|e| panic!("read {}: {e}", folder.display()));
        for entry in entries {
            let path = entry.expect("a folder entry").path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                let relative = path.strip_prefix(dir).expect("under the book");
                let parts: Vec<_> = relative.components().map(|c| c.as_os_str().to_string_lossy()).collect();
                pages.insert(parts.join("/"));
            }
        }
    }
    pages
}

#[test]
fn every_page_is_in_the_summary_and_every_summary_link_exists() {
    let summary = read(&book().join("SUMMARY.md"));
    let linked: BTreeSet<String> = local_links(&summary).into_iter().map(|(file, _)| file).collect();
    let mut pages = pages_under(&book());
    pages.remove("SUMMARY.md");

    let missing: Vec<_> = linked.difference(&pages).collect();
    assert!(missing.is_empty(), "docs/src/SUMMARY.md links to pages that do not exist: {missing:?}");
    let unlisted: Vec<_> = pages.difference(&linked).collect();
    assert!(unlisted.is_empty(), "pages under docs/src/ that docs/src/SUMMARY.md does not list: {unlisted:?}");
}

/// Every kind of agent has its page in the book, as every kind of environment has, and the
/// page names each of the kind's own keys.
#[test]
fn every_agent_kind_has_its_page_naming_its_keys() {
    for kind in runner::agent::kinds::AGENT_KINDS {
        let page = book().join(format!("agents/{}.md", kind.name()));
        assert!(page.is_file(), "agent kind `{}` has no page {}", kind.name(), page.display());
        let text = read(&page);
        let missing: Vec<&str> =
            kind.keys().iter().copied().filter(|k| !names(&text, k) && !names(&text, &format!("agent.{k}"))).collect();
        assert!(
            missing.is_empty(),
            "keys of kind `{}` that {} does not name: {missing:?}",
            kind.name(),
            page.display()
        );
    }
}

#[test]
fn every_tool_of_every_kind_is_on_its_kinds_page() {
    for kind in KINDS {
        let page = book().join(format!("environments/{}.md", kind.name()));
        assert!(page.is_file(), "environment kind `{}` has no page {}", kind.name(), page.display());
        let tools: Vec<String> = kind.tools().into_iter().map(|t| t.spec.name).collect();
        let missing = unnamed(&read(&page), tools.iter().map(String::as_str));
        assert!(
            missing.is_empty(),
            "tools of kind `{}` that {} does not name in backquotes: {missing:?}",
            kind.name(),
            page.display()
        );
    }
}

#[test]
fn every_command_and_flag_is_in_the_commands_chapter() {
    let page = book().join("commands.md");
    let text = read(&page);
    let mut cli = CommandLine::command();
    cli.build();

    let top: Vec<String> = flags(&cli);
    let missing = unnamed(&text, top.iter().map(String::as_str));
    assert!(missing.is_empty(), "flags of `runner` that {} does not name: {missing:?}", page.display());

    for command in cli.get_subcommands() {
        let name = command.get_name();
        if name == "help" {
            continue;
        }
        assert!(
            text.contains(&format!("## `runner {name}`")),
            "{} has no section `## \\`runner {name}\\``",
            page.display()
        );
        let wanted = flags(command);
        let missing = unnamed(&text, wanted.iter().map(String::as_str));
        assert!(missing.is_empty(), "flags of `runner {name}` that {} does not name: {missing:?}", page.display());
    }
}

/// A command's flags as typed: `--long` and `-s`.
fn flags(command: &clap::Command) -> Vec<String> {
    let mut flags = Vec::new();
    for arg in command.get_arguments().filter(|a| !a.is_positional()) {
        flags.extend(arg.get_long().map(|long| format!("--{long}")));
        flags.extend(arg.get_short().map(|short| format!("-{short}")));
    }
    flags
}

#[test]
fn links_between_pages_resolve() {
    let mut pages: Vec<PathBuf> = pages_under(&book()).into_iter().map(|p| book().join(p)).collect();
    pages.push(root().join("README.md"));
    for page in pages {
        let folder = page.parent().expect("a page in a folder");
        for (file, anchor) in local_links(&read(&page)) {
            let target = if file.is_empty() { page.clone() } else { folder.join(&file) };
            assert!(target.exists(), "{} links to `{file}`, which does not exist", page.display());
            let is_page = target.extension().is_some_and(|e| e == "md");
            if !anchor.is_empty() && is_page {
                assert!(
                    anchors(&read(&target)).contains(&anchor),
                    "{} links to `{file}#{anchor}`, a heading {} does not have",
                    page.display(),
                    target.display()
                );
            }
        }
    }
}

#[test]
fn a_name_counts_only_whole_and_in_backquotes() {
    let text = "Use `--cache-dir DIR`, `-j N`, `read_file(path)` and grep.";
    assert_eq!(unnamed(text, ["--cache-dir", "-j", "read_file"]), Vec::<&str>::new());
    assert_eq!(unnamed(text, ["--cache", "-q", "read", "grep"]), ["--cache", "-q", "read", "grep"]);
}

#[test]
fn links_to_other_sites_are_not_the_books() {
    let text = "[a](a.md) [b](sub/b.md#part) [c](#here) [d](https://example.org/d.md) [e](mailto:x@y)";
    let links = local_links(text);
    let links: Vec<(&str, &str)> = links.iter().map(|(f, a)| (f.as_str(), a.as_str())).collect();
    assert_eq!(links, [("a.md", ""), ("sub/b.md", "part"), ("", "here")]);
}

#[test]
fn anchors_are_made_from_headings_as_mdbook_makes_them() {
    let text = "# Models\n\n```sh\n# a comment\n```\n\n## `runner.yaml`\n### Gates and reports: `eval`, `merge`\n";
    let expected = ["gates-and-reports-eval-merge", "models", "runneryaml"];
    assert_eq!(anchors(text), expected.into_iter().map(String::from).collect::<BTreeSet<_>>());
}

/// The first `sh` block after `heading` in `text`: its commands, comments dropped.
fn setup_commands(text: &str, heading: &str) -> Vec<String> {
    let after = &text[text.find(heading).unwrap_or_else(|| panic!("no `{heading}`"))..];
    let block = &after[after.find("```sh\n").expect("a sh block") + 6..];
    let block = &block[..block.find("```").expect("the block ends")];
    block.lines().map(|l| l.split('#').next().unwrap_or_default().trim().to_owned()).filter(|l| !l.is_empty()).collect()
}

/// Regression: the README's second command was `cargo test`, which fails on a fresh machine
/// without the MCP test servers, the model SDKs and Chromium; only `.ci/run` installs them.
#[test]
fn the_readmes_test_command_is_what_ci_runs_and_it_says_what_it_installs() {
    let readme = read(&root().join("README.md"));
    let commands = setup_commands(&readme, "## Set up");
    assert_eq!(commands.get(1).map(String::as_str), Some("bash .ci/run"), "{commands:?}");
    let guide = read(&book().join("getting-started.md"));
    assert_eq!(setup_commands(&guide, "## Set up"), commands, "the getting-started page runs the README's commands");
    // `.ci/run` installs what the tests need, then runs the tests: `cargo test`, as its last command.
    let ci = read(&root().join(".ci/run"));
    assert!(ci.contains("bash scripts/install-test-servers.sh"), "{ci}");
    let last = ci.lines().map(str::trim).rfind(|l| !l.is_empty() && !l.starts_with('#'));
    assert_eq!(last, Some("cargo test"), "{ci}");
    // The README says what that is: each package `.ci/run` installs, and the test servers.
    let packages: Vec<&str> = ci.lines().filter_map(|l| l.split("missing+=(").nth(1)?.split(')').next()).collect();
    assert!(packages.len() >= 5, "{packages:?}");
    let setup = &readme[readme.find("## Set up").unwrap()..readme.find("## Commands").unwrap()];
    assert!(
        unnamed(setup, packages.iter().copied()).is_empty(),
        "the README does not name {:?}",
        unnamed(setup, packages)
    );
    assert!(names(setup, "scripts/install-test-servers.sh"), "{setup}");
}
