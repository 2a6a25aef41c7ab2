//! `includes`, `equals`, `regex` and their `not_` forms: the answer (or a text of the world,
//! with `from:`) against a text, a template of the task. Each distinct regex is compiled
//! once per run ([`Patterns`]): a suite scores the same few patterns over and over.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use regex_automata::meta::{Config, Regex};
use regex_automata::util::syntax;

use super::{Answer, Scene, Verdict, verdict};
use crate::domain::scorer::TextOp;

/// The answer contains, equals or matches `expected` (or, negated, does not).
pub(crate) fn check(
    scene: &Scene<'_>,
    answer: &Answer<'_>,
    op: TextOp,
    expected: &str,
    negate: bool,
    ignore_case: bool,
) -> Verdict {
    let expected = match scene.render(expected) {
        Ok(e) => e,
        Err(failed) => return failed,
    };
    let Some(text) = answer.text() else { return answer.missing() };
    match matches(op, text, &expected, ignore_case) {
        Ok(found) => {
            let what = match (op, found) {
                (TextOp::Includes, true) => format!("contains {expected:?}"),
                (TextOp::Includes, false) => format!("does not contain {expected:?}"),
                (TextOp::Equals, true) => format!("equals {expected:?}"),
                (TextOp::Equals, false) => format!("does not equal {expected:?}"),
                (TextOp::Regex, true) => format!("matches /{expected}/"),
                (TextOp::Regex, false) => format!("does not match /{expected}/"),
            };
            verdict(found != negate, format!("{} {what}", answer.subject(text)))
        }
        Err(e) => verdict(false, e),
    }
}

/// Whether `haystack` contains, equals (trimmed) or matches `expected`; an invalid regex
/// says so.
pub(crate) fn matches(op: TextOp, haystack: &str, expected: &str, ignore_case: bool) -> Result<bool, String> {
    let fold = |s| if ignore_case { Cow::Owned(str::to_lowercase(s)) } else { Cow::Borrowed(s) };
    Ok(match op {
        TextOp::Includes => fold(haystack).contains(&*fold(expected)),
        TextOp::Equals => fold(haystack.trim()) == fold(expected.trim()),
        TextOp::Regex if is_plain_text(expected, ignore_case) => haystack.contains(expected),
        TextOp::Regex => PATTERNS.compiled(expected, ignore_case)?.is_match(haystack),
    })
}

/// Whether the regex `pattern` matches exactly its own text: none of its characters means
/// anything to a regex, and case counts. Looking for the text then finds what the regex
/// would, with no regex to build (a pattern rendered from `{{ target }}` is often a word or
/// a number, a new one for every task).
fn is_plain_text(pattern: &str, ignore_case: bool) -> bool {
    !ignore_case && !pattern.chars().any(regex_syntax::is_meta_character)
}

/// Compiles `pattern` into the run's regexes, so that scoring finds it compiled: a suite's
/// loader checks every rendered pattern of every task, the same few patterns thousands of
/// times. Whether it compiled.
pub fn keep_pattern(pattern: &str, ignore_case: bool) -> bool {
    is_plain_text(pattern, ignore_case) || PATTERNS.compiled(pattern, ignore_case).is_ok()
}

/// The run's compiled regexes.
pub(crate) static PATTERNS: LazyLock<Patterns> = LazyLock::new(|| Patterns::new(MAX_PATTERNS));

/// How many distinct patterns are kept compiled; past it (templates that render a new
/// pattern for every task, say) a pattern is compiled each time it is used.
const MAX_PATTERNS: usize = 4096;

/// A compiled pattern, shared: a clone of a `Regex` would make its own matching caches
/// again, which costs about as much as the match.
type Compiled = Result<Arc<Regex>, String>;

/// Regexes compiled once per distinct pattern, with their compile errors.
pub(crate) struct Patterns {
    /// By pattern: case-sensitive, then case-insensitive.
    compiled: Mutex<[HashMap<Box<str>, Compiled>; 2]>,
    capacity: usize,
    /// How many times a pattern was compiled.
    compilations: AtomicUsize,
}

impl Patterns {
    pub fn new(capacity: usize) -> Self {
        Patterns { compiled: Mutex::default(), capacity, compilations: AtomicUsize::new(0) }
    }

    /// `pattern` compiled, or why it is not a regex.
    pub fn compiled(&self, pattern: &str, ignore_case: bool) -> Compiled {
        let mut maps = self.compiled.lock().unwrap_or_else(PoisonError::into_inner);
        let map = &mut maps[usize::from(ignore_case)];
        if let Some(found) = map.get(pattern) {
            return found.clone();
        }
        self.compilations.fetch_add(1, Ordering::Relaxed);
        // The `regex` crate's engine without its fully compiled DFA: building one costs
        // three times the rest of compiling a short pattern, and a scorer's pattern is
        // matched against a few answers. Matches are the same; only the strategy differs.
        let compiled = Regex::builder()
            .configure(Config::new().dfa(false))
            .syntax(syntax::Config::new().case_insensitive(ignore_case))
            .build(pattern)
            .map(Arc::new)
            .map_err(|_| {
                // The `regex` crate words a syntax error for people, with the place marked.
                let error = regex::RegexBuilder::new(pattern).case_insensitive(ignore_case).build().err();
                match error {
                    Some(e) => format!("invalid regex /{pattern}/: {e}"),
                    None => format!("invalid regex /{pattern}/"),
                }
            });
        if map.len() < self.capacity {
            map.insert(pattern.into(), compiled.clone());
        }
        compiled
    }

    /// Whether `pattern` is kept compiled.
    #[cfg(test)]
    pub fn kept(&self, pattern: &str, ignore_case: bool) -> bool {
        self.compiled.lock().unwrap_or_else(PoisonError::into_inner)[usize::from(ignore_case)].contains_key(pattern)
    }

    /// How many times a pattern was compiled.
    #[cfg(test)]
    pub fn compilations(&self) -> usize {
        self.compilations.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: every scoring compiled its regex again, three quarters of the CPU of a
    /// suite of regex scorers.
    #[test]
    fn a_pattern_is_compiled_once_however_often_it_is_used() {
        let patterns = Patterns::new(16);
        for answer in ["42", "x", "17", "forty-two"] {
            for _ in 0..10 {
                let matched = patterns.compiled(r"^\d+$", false).unwrap().is_match(answer);
                assert_eq!(matched, answer.chars().all(|c| c.is_ascii_digit()));
                let upper = answer.to_uppercase();
                assert_eq!(patterns.compiled("forty", true).unwrap().is_match(&upper), answer == "forty-two");
            }
        }
        assert_eq!(patterns.compilations(), 2, "one compilation per distinct pattern");
        // The same text as another case setting is another pattern.
        assert!(patterns.compiled(r"^\d+$", true).is_ok());
        assert_eq!(patterns.compilations(), 3);
    }

    #[test]
    fn a_regex_check_keeps_its_pattern_for_the_run() {
        let pattern = "^kept for the run: [0-9]+$";
        assert_eq!(matches(TextOp::Regex, "kept for the run: 7", pattern, false), Ok(true));
        let kept = PATTERNS.compiled.lock().unwrap()[0].contains_key(pattern);
        assert!(kept, "the check compiled its pattern without keeping it");
    }

    /// The patterns kept are built without a full DFA: they match what the `regex` crate's
    /// `Regex` matches, case folding, Unicode classes and anchors included.
    #[test]
    fn a_kept_pattern_matches_as_the_regex_crate_matches() {
        let patterns = Patterns::new(64);
        let cases = [
            r"^The answer is \d+\.$",
            r"\b\d{1,3}\b",
            r"(?i)\b(sorry|cannot|unable|as an ai)\b",
            "answer",
            "The answer is 74.",
            r"\w+é",
            r"(?m)^b$",
            r"^$",
            "ß",
        ];
        let haystacks = [
            "The answer is 74.",
            "THE ANSWER IS 74.",
            "the answer is 1000.",
            "Sorry, I CANNOT.",
            "as an AI",
            "café",
            "a\nb\nc",
            "",
            "STRASSE ß ẞ",
            "١٢٣",
        ];
        for pattern in cases {
            for ignore_case in [false, true] {
                let kept = patterns.compiled(pattern, ignore_case).unwrap();
                let reference = regex::RegexBuilder::new(pattern).case_insensitive(ignore_case).build().unwrap();
                for haystack in haystacks {
                    assert_eq!(
                        kept.is_match(haystack),
                        reference.is_match(haystack),
                        "/{pattern}/ (ignore case: {ignore_case}) on {haystack:?}"
                    );
                }
            }
        }
    }

    /// A pattern with no regex syntax is looked for as text, never compiled, and finds
    /// what the regex finds.
    #[test]
    fn a_pattern_of_plain_text_is_looked_for_as_text_and_matches_as_the_regex_would() {
        let plain = ["74", "The answer is 74", "café au lait", "", "a, b; c! 'q' \"d\" @%/<>=_`"];
        let haystacks = ["The answer is 74.", "café au lait", "CAFÉ", "a, b; c! 'q' \"d\" @%/<>=_`", ""];
        for pattern in plain {
            assert!(is_plain_text(pattern, false), "{pattern:?}");
            assert!(!is_plain_text(pattern, true), "case folding is the regex's to do");
            let reference = regex::Regex::new(pattern).unwrap();
            for haystack in haystacks {
                let found = matches(TextOp::Regex, haystack, pattern, false);
                assert_eq!(found, Ok(reference.is_match(haystack)), "/{pattern}/ on {haystack:?}");
            }
            assert!(keep_pattern(pattern, false));
            assert!(!PATTERNS.compiled.lock().unwrap()[0].contains_key(pattern), "{pattern:?} was compiled");
        }
        for pattern in ["7.", "a+", "^x", "x$", "(a)", "a|b", "[ab]", "a{2}", r"\d", "a?", "a*", "#", "-", "&", "~"] {
            assert!(!is_plain_text(pattern, false), "{pattern:?} is regex syntax");
        }
    }

    #[test]
    fn an_invalid_pattern_says_why_each_time_and_is_compiled_once() {
        let patterns = Patterns::new(16);
        for _ in 0..3 {
            let e = patterns.compiled("(unclosed", false).unwrap_err();
            assert!(e.starts_with("invalid regex /(unclosed/:") && e.contains("unclosed group"), "{e}");
        }
        assert_eq!(patterns.compilations(), 1);
    }

    #[test]
    fn past_its_capacity_a_new_pattern_is_compiled_each_time_and_the_kept_ones_stay() {
        let patterns = Patterns::new(1);
        assert!(patterns.compiled("a", false).unwrap().is_match("a"));
        assert!(patterns.compiled("b", false).unwrap().is_match("b"));
        assert!(patterns.compiled("b", false).unwrap().is_match("b"));
        assert!(patterns.compiled("a", false).unwrap().is_match("a"));
        assert_eq!(patterns.compilations(), 3, "`a` kept, `b` compiled each time");
    }
}
