//! `includes`, `equals`, `regex` and their `not_` forms: the answer (or a text of the world,
//! with `from:`) against a text, a template of the task. Each distinct regex is compiled
//! once per run ([`Patterns`]): a suite scores the same few patterns over and over.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock, PoisonError};

use regex_automata::meta::{Config, Regex};
use regex_automata::util::syntax;

use super::{Answer, CheckResult, Scene, verdict};
use crate::domain::scorer::TextOp;

/// The answer contains, equals or matches `expected` (or, negated, does not).
pub(crate) fn check(
    scene: &Scene<'_>,
    answer: &Answer<'_>,
    op: TextOp,
    expected: &str,
    negate: bool,
    ignore_case: bool,
) -> CheckResult {
    let expected = match scene.render(expected) {
        Ok(e) => e,
        Err(failed) => return failed,
    };
    let Some(text) = answer.text() else { return answer.missing() };
    match matches(op, text, &expected, ignore_case) {
        Ok(found) => {
            let mut explanation = answer.subject(text);
            let _ = match (op, found) {
                (TextOp::Includes, true) => write!(explanation, " contains {expected:?}"),
                (TextOp::Includes, false) => write!(explanation, " does not contain {expected:?}"),
                (TextOp::Equals, true) => write!(explanation, " equals {expected:?}"),
                (TextOp::Equals, false) => write!(explanation, " does not equal {expected:?}"),
                (TextOp::Regex, true) => write!(explanation, " matches /{expected}/"),
                (TextOp::Regex, false) => write!(explanation, " does not match /{expected}/"),
            };
            verdict(found != negate, explanation)
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
        TextOp::Regex => PATTERNS.compiled(expected, ignore_case)?.is_match(haystack)?,
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

/// How many bytes of answers a pattern is matched against with the small engine before the
/// full one is built for it. The full engine takes about as long to build (~50 µs for a
/// short pattern) as the small one takes to read a kilobyte; past that the build pays for
/// itself, and a pattern matched that much is likely to be matched more.
const SMALL_ENGINE_BYTES: usize = 1024;

/// A compiled pattern, shared: a clone of a `Regex` would make its own matching caches
/// again, which costs about as much as the match.
type Compiled = Result<Arc<Pattern>, String>;

/// A regex, compiled for matching a few short answers first and many or long ones later.
///
/// A pattern rendered from a task's template (`{{ target }}`) is new for every task and
/// matched against one answer an epoch. For such a pattern the `regex` crate's engine spends
/// nearly all its time building itself (its Unicode tables, its caches); `regex-lite` builds
/// in a fifteenth of the time and reads ~50 ns a byte, so it takes the first kilobyte. Only
/// where the two mean the same ([`small_engine_means_the_same`]): `regex-lite`'s classes
/// and case folding are ASCII.
#[derive(Debug)]
pub(crate) struct Pattern {
    source: Box<str>,
    ignore_case: bool,
    small: Option<regex_lite::Regex>,
    /// Bytes matched with `small` so far.
    small_bytes: AtomicUsize,
    full: OnceLock<Result<Regex, String>>,
}

impl Pattern {
    fn new(source: &str, ignore_case: bool) -> Result<Self, String> {
        let small =
            small_engine_means_the_same(source, ignore_case).then(|| regex_lite::Regex::new(source).ok()).flatten();
        let pattern = Pattern {
            source: source.into(),
            ignore_case,
            small_bytes: AtomicUsize::new(0),
            full: OnceLock::new(),
            small,
        };
        if pattern.small.is_none() {
            pattern.full()?;
        }
        Ok(pattern)
    }

    /// Whether the pattern matches somewhere in `haystack`.
    pub fn is_match(&self, haystack: &str) -> Result<bool, String> {
        if let Some(small) = &self.small
            && self.full.get().is_none()
            && self.small_bytes.fetch_add(haystack.len(), Ordering::Relaxed) + haystack.len() <= SMALL_ENGINE_BYTES
        {
            return Ok(small.is_match(haystack));
        }
        Ok(self.full()?.is_match(haystack))
    }

    /// The `regex` crate's engine, built the first time it is needed.
    fn full(&self) -> Result<&Regex, String> {
        let built = self.full.get_or_init(|| {
            // Without its fully compiled DFA: building one costs three times the rest of
            // compiling a short pattern, and a scorer's pattern is matched against a few
            // answers. Matches are the same; only the strategy differs.
            Regex::builder()
                .configure(Config::new().dfa(false))
                .syntax(syntax::Config::new().case_insensitive(self.ignore_case))
                .build(&self.source)
                .map_err(|_| {
                    // The `regex` crate words a syntax error for people, with the place marked.
                    let error = regex::RegexBuilder::new(&self.source).case_insensitive(self.ignore_case).build().err();
                    match error {
                        Some(e) => format!("invalid regex /{}/: {e}", self.source),
                        None => format!("invalid regex /{}/", self.source),
                    }
                })
        });
        built.as_ref().map_err(Clone::clone)
    }

    /// Whether the `regex` crate's engine has been built.
    #[cfg(test)]
    fn built_in_full(&self) -> bool {
        self.full.get().is_some()
    }
}

/// Whether `regex-lite` reads `pattern` as the `regex` crate does. They differ only in
/// Unicode: `regex-lite`'s `\w`, `\d`, `\s`, `\b` (and their negations and `\<`, `\>`) are
/// ASCII, it has no `\p{..}`, and its case folding is ASCII (where the `regex` crate's `(?i)k`
/// also finds the Kelvin sign). A pattern with none of these escapes, no case folding and no
/// `u` flag means the same to both; anything else, or anything `regex-lite` refuses, goes to
/// the `regex` crate.
fn small_engine_means_the_same(pattern: &str, ignore_case: bool) -> bool {
    if ignore_case {
        return false;
    }
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            // Escapes of a character (`\.`, `\n`, `\x7F`, `\u{e9}`) and the text anchors.
            '\\' => match chars.next() {
                Some('<' | '>') => return false,
                Some(e) if e.is_ascii_alphanumeric() && !"ntrfvaxuUAz".contains(e) => return false,
                _ => {}
            },
            // Flags: `(?i)`, `(?iu:…)`, `(?-u)`; a group's name (`(?P<x>`) ends them.
            '(' if chars.peek() == Some(&'?') => {
                chars.next();
                while let Some(&f) = chars.peek() {
                    if f == 'i' || f == 'u' {
                        return false;
                    }
                    if !"msxUR-".contains(f) {
                        break;
                    }
                    chars.next();
                }
            }
            _ => {}
        }
    }
    true
}

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
        let compiled = Pattern::new(pattern, ignore_case).map(Arc::new);
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
                let matched = patterns.compiled(r"^\d+$", false).unwrap().is_match(answer).unwrap();
                assert_eq!(matched, answer.chars().all(|c| c.is_ascii_digit()));
                let upper = answer.to_uppercase();
                assert_eq!(patterns.compiled("forty", true).unwrap().is_match(&upper).unwrap(), answer == "forty-two");
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
                        kept.is_match(haystack).unwrap(),
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

    /// A random pattern of the syntax both engines read alike: literals (Unicode ones
    /// too), `.`, classes, escapes of characters, anchors, groups, alternation and
    /// repetition.
    fn random_pattern(rng: &mut fastrand::Rng, depth: u32, groups: &mut u32) -> String {
        const ATOMS: &[&str] = &[
            "a", "b", "é", "日", ".", "[a-c]", "[^a]", "[é-ü]", r"\.", r"\n", r"\x{e9}", "^", "$", r"\A", r"\z",
            "(?s:.)", "(?m:^)", "(?m:$)", " ",
        ];
        let mut pattern = String::new();
        for _ in 0..rng.usize(1..4) {
            let atom = if depth < 2 && rng.u8(..4) == 0 {
                let inner = random_pattern(rng, depth + 1, groups);
                let other = random_pattern(rng, depth + 1, groups);
                *groups += 1;
                match rng.u8(..3) {
                    0 => format!("({inner})"),
                    1 => format!("(?:{inner}|{other})"),
                    _ => format!("(?P<g{groups}>{inner})"),
                }
            } else {
                ATOMS[rng.usize(..ATOMS.len())].to_string()
            };
            pattern.push_str(&atom);
            let repeat = ["", "", "", "*", "+", "?", "{1,2}", "*?", "{2}"];
            pattern.push_str(repeat[rng.usize(..repeat.len())]);
        }
        pattern
    }

    /// The small engine answers as the `regex` crate does on what it is given: 1,500
    /// random patterns, each on 20 random answers of Unicode text.
    #[test]
    fn the_small_engine_matches_as_the_regex_crate_matches() {
        let mut rng = fastrand::Rng::with_seed(24);
        let alphabet = ['a', 'b', 'c', 'é', 'ü', '日', '\n', '.', ' '];
        for _ in 0..1500 {
            let source = random_pattern(&mut rng, 0, &mut 0);
            assert!(small_engine_means_the_same(&source, false), "/{source}/");
            let pattern = Pattern::new(&source, false).unwrap();
            assert!(pattern.small.is_some(), "/{source}/ went to the full engine");
            let reference = regex::Regex::new(&source).unwrap();
            for _ in 0..20 {
                let haystack: String = (0..rng.usize(..12)).map(|_| alphabet[rng.usize(..alphabet.len())]).collect();
                let found = pattern.is_match(&haystack).unwrap();
                assert_eq!(found, reference.is_match(&haystack), "/{source}/ on {haystack:?}");
            }
            assert!(!pattern.built_in_full(), "/{source}/: 20 short answers are within the small engine's share");
        }
    }

    /// What the small engine reads as ASCII goes to the `regex` crate: `\w` finds `é`,
    /// `\d` an Arabic-Indic digit, `(?i)k` the Kelvin sign.
    #[test]
    fn a_pattern_that_means_something_else_in_ascii_goes_to_the_full_engine() {
        let cases = [
            (r"^\w$", "é"),
            (r"^\d$", "١"),
            (r"^\s$", "\u{2003}"),
            (r"^\W$", "é"),
            (r"é\b", "éé"),
            (r"\Bé", "aé"),
            (r"\<é", "é"),
            (r"é\>", "é"),
            (r"^\p{Greek}$", "λ"),
            (r"^\pL$", "λ"),
            ("(?i)^k$", "\u{212a}"),
            ("(?i:s)$", "\u{17f}"),
            ("(?ui)^k$", "\u{212a}"),
        ];
        for (source, haystack) in cases {
            assert!(!small_engine_means_the_same(source, false), "/{source}/");
            let pattern = Pattern::new(source, false).unwrap();
            assert!(pattern.small.is_none() && pattern.built_in_full(), "/{source}/");
            let reference = regex::Regex::new(source).unwrap();
            assert_eq!(pattern.is_match(haystack), Ok(reference.is_match(haystack)), "/{source}/ on {haystack:?}");
            let small = regex_lite::Regex::new(source).map(|r| r.is_match(haystack));
            assert_ne!(small, Ok(reference.is_match(haystack)), "/{source}/ is no example of a difference");
        }
        assert!(!small_engine_means_the_same("answer", true), "case folding is the full engine's");
        assert!(!small_engine_means_the_same(r"(?-u:\xFF)", false), "the `u` flag is the full engine's");
        for alike in [r"\.", r"\n\t", r"\x41\u{e9}", r"\Aa\z", "(?m)^a$", "(?P<x>a)", "(?s:.)", r"[\-\]]"] {
            assert!(small_engine_means_the_same(alike, false), "/{alike}/");
        }
    }

    /// Past a kilobyte of answers the full engine is built, and answers the same.
    #[test]
    fn a_pattern_matched_against_much_text_is_built_in_full() {
        let pattern = Pattern::new("a.c", false).unwrap();
        let long = format!("{}abc", "x".repeat(700));
        assert_eq!(pattern.is_match(&long), Ok(true));
        assert!(!pattern.built_in_full());
        assert_eq!(pattern.is_match(&long), Ok(true));
        assert!(pattern.built_in_full(), "1,406 bytes were matched");
        assert_eq!(pattern.is_match("ab"), Ok(false));
        assert_eq!(pattern.is_match("a\nc"), Ok(false));
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
        assert!(patterns.compiled("a", false).unwrap().is_match("a").unwrap());
        assert!(patterns.compiled("b", false).unwrap().is_match("b").unwrap());
        assert!(patterns.compiled("b", false).unwrap().is_match("b").unwrap());
        assert!(patterns.compiled("a", false).unwrap().is_match("a").unwrap());
        assert_eq!(patterns.compilations(), 3, "`a` kept, `b` compiled each time");
    }
}
