//! The files of code scorers (`python: file.py:function`, `js: file.js:function`), found
//! when the suite loads: a path is relative to the suite's folder and becomes absolute, a
//! missing file or function is refused naming the scorer's line.

use std::path::Path;

use crate::config::decode::{ConfigError, Source};
use crate::config::yaml;
use crate::domain::scorer::{CodeSource, Language, ScorerSpec};
use crate::scoring::Check;

/// The largest scorer file read to look for its function.
const FILE_CAP: u64 = 8 << 20;

/// Makes each code scorer's file absolute (relative to `folder`, the suite's) and checks
/// that it exists and defines the function; `at` is where the scorers are in the suite.
pub(super) fn resolve(
    source: &Source,
    at: &str,
    scorers: &mut [ScorerSpec],
    folder: Option<&Path>,
) -> Result<(), ConfigError> {
    for (i, scorer) in scorers.iter_mut().enumerate() {
        let Check::Code(code) = &mut scorer.check else { continue };
        let CodeSource::File { path, function } = &mut code.source else { continue };
        let here = yaml::child(&yaml::item(at, i), &scorer.name);
        let written = Path::new(path.as_str());
        let joined = match folder {
            Some(folder) if written.is_relative() => folder.join(written),
            _ => written.to_path_buf(),
        };
        let found = joined.canonicalize().map_err(|e| {
            source.error(&here, format!("the scorer file `{path}` ({}) cannot be opened: {e}", joined.display()))
        })?;
        let text = read_text(&found).map_err(|e| source.error(&here, format!("the scorer file `{path}`: {e}")))?;
        if !defines(code.language, &text, function) {
            let how = match code.language {
                Language::Python => format!("no `def {function}(`"),
                Language::Js => format!("`{function}` does not appear in it"),
            };
            return Err(source.error(&here, format!("the scorer file `{path}` has no function `{function}` ({how})")));
        }
        *path = found.to_string_lossy().into_owned();
    }
    Ok(())
}

fn read_text(path: &Path) -> Result<String, String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    if !file.metadata().map_err(|e| e.to_string())?.is_file() {
        return Err("is not a file".into());
    }
    let mut bytes = Vec::new();
    file.take(FILE_CAP).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    String::from_utf8(bytes).map_err(|_| "is not UTF-8 text".into())
}

/// Whether a file's text defines `function`, as far as reading it can tell: Python's
/// `def`, an assignment or an import of the name; in JavaScript, whose functions take many
/// forms (exports, methods, arrows), the name appearing as a word.
fn defines(language: Language, text: &str, function: &str) -> bool {
    let name = regex::escape(function);
    let pattern = match language {
        Language::Python => {
            format!(r"(?m)^\s*(async\s+)?def\s+{name}\s*\(|^{name}\s*=|^\s*(from\s+\S+\s+)?import\b.*\b{name}\b")
        }
        Language::Js => format!(r"(^|[^\w$]){name}($|[^\w$])"),
    };
    regex::Regex::new(&pattern).is_ok_and(|r| r.is_match(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_function_is_found_by_its_definition() {
        let py = "import json\n\ndef helper(x):\n    pass\n\nasync def grade(output, context):\n    return True\n";
        assert!(defines(Language::Python, py, "grade"));
        assert!(!defines(Language::Python, py, "grad"), "a prefix is not the name");
        assert!(!defines(Language::Python, "# def grade(\n", "grade"), "a comment defines nothing");
        assert!(defines(Language::Python, "from checks import grade\n", "grade"));
        assert!(defines(Language::Js, "module.exports = { grade(output) { return true } };", "grade"));
        assert!(!defines(Language::Js, "module.exports = { grader: 1 };", "grade"));
    }
}
