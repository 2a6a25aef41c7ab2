//! `.dockerignore`: which files of the build context a build leaves out. Patterns are
//! relative to the context (a leading `/` is dropped), `*` and `?` stop at `/`, `**` spans
//! folders, a pattern that names a folder leaves out all beneath it, and `!` takes a
//! pattern's matches back in. The last pattern that matches a path decides.

use globset::{GlobBuilder, GlobMatcher};

/// The patterns of a context's `.dockerignore`.
#[derive(Debug, Default)]
pub struct Ignore {
    patterns: Vec<(GlobMatcher, bool)>,
}

impl Ignore {
    /// Reads the patterns in `text`; an error names the line.
    pub fn parse(text: &str) -> Result<Ignore, String> {
        let mut patterns = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (pattern, keep) = match line.strip_prefix('!') {
                Some(rest) => (rest.trim(), true),
                None => (line, false),
            };
            let pattern = clean(pattern);
            if pattern.is_empty() {
                continue;
            }
            let glob = GlobBuilder::new(&pattern)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .map_err(|e| format!(".dockerignore line {}: `{line}`: {e}", i + 1))?;
            patterns.push((glob.compile_matcher(), keep));
        }
        Ok(Ignore { patterns })
    }

    /// Whether `path` (relative to the context, `/`-separated) is left out.
    pub fn excludes(&self, path: &str) -> bool {
        let mut excluded = false;
        for (glob, keep) in &self.patterns {
            if ancestors(path).any(|p| glob.is_match(p)) {
                excluded = !keep;
            }
        }
        excluded
    }

    /// Whether some pattern takes files back in: a left-out folder must then still be
    /// looked into.
    pub fn has_exceptions(&self) -> bool {
        self.patterns.iter().any(|(_, keep)| *keep)
    }
}

/// `path` and each folder above it, the longest first.
fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    std::iter::successors(Some(path), |p| p.rsplit_once('/').map(|(head, _)| head))
}

/// A pattern as Docker cleans it: no leading `/` or `./`, no empty or `.` parts.
fn clean(pattern: &str) -> String {
    pattern.split('/').filter(|part| !part.is_empty() && *part != ".").collect::<Vec<_>>().join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_leave_out_files_folders_and_take_exceptions_back() {
        let ignore = Ignore::parse("# comment\n*.log\n/build\n**/secret*\ndocs/**\n!docs/keep.md\n").unwrap();
        let out = |p: &str| ignore.excludes(p);
        assert!(out("a.log"));
        assert!(!out("sub/a.log"), "`*` stops at `/`");
        assert!(out("build") && out("build/x/y.o"), "a folder leaves out what is beneath it");
        assert!(out("secret.txt") && out("a/b/secret.key"), "`**` spans folders");
        assert!(out("docs/a.md"));
        assert!(!out("docs/keep.md"), "an exception takes a file back");
        assert!(!out("src/main.rs"));
        assert!(ignore.has_exceptions());
    }

    #[test]
    fn the_last_matching_pattern_decides() {
        let ignore = Ignore::parse("!a.txt\n*.txt\n").unwrap();
        assert!(ignore.excludes("a.txt"));
        assert!(!Ignore::parse("").unwrap().excludes("x"));
    }
}
