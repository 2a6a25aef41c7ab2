//! Words of an instruction's arguments, as Docker reads them in the instructions it expands
//! variables in (`FROM`, `COPY`, `ADD`, `ENV`, `ARG`, `LABEL`, `WORKDIR`, `USER`, `EXPOSE`,
//! `VOLUME`, `STOPSIGNAL`): quotes removed, the escape character taken, `$VAR`, `${VAR}`,
//! `${VAR:-default}`, `${VAR-default}`, `${VAR:+alt}` and `${VAR+alt}` replaced. Single
//! quotes keep their text as written.

use std::collections::BTreeMap;

/// The variables an instruction sees, by name.
pub type Vars = BTreeMap<String, String>;

/// `text` split at unquoted white space into words, each expanded.
pub fn split(text: &str, vars: &Vars, escape: char) -> Result<Vec<String>, String> {
    Lexer { chars: text.chars().collect(), at: 0, vars, escape }.words(true)
}

/// `text` as one word, expanded (white space kept).
pub fn expand(text: &str, vars: &Vars, escape: char) -> Result<String, String> {
    Ok(Lexer { chars: text.chars().collect(), at: 0, vars, escape }.words(false)?.concat())
}

struct Lexer<'a> {
    chars: Vec<char>,
    at: usize,
    vars: &'a Vars,
    escape: char,
}

impl Lexer<'_> {
    fn words(mut self, split: bool) -> Result<Vec<String>, String> {
        let mut words = Vec::new();
        let mut word = String::new();
        // Whether a word was begun (`""` is an empty word, not none).
        let mut begun = false;
        while let Some(c) = self.next() {
            match c {
                c if split && c.is_whitespace() => {
                    if begun {
                        words.push(std::mem::take(&mut word));
                        begun = false;
                    }
                }
                '\'' => {
                    begun = true;
                    loop {
                        match self.next() {
                            Some('\'') => break,
                            Some(c) => word.push(c),
                            None => return Err("a single quote is not closed".into()),
                        }
                    }
                }
                '"' => {
                    begun = true;
                    self.double_quoted(&mut word)?;
                }
                '$' => {
                    begun = true;
                    word.push_str(&self.variable()?);
                }
                c if c == self.escape => {
                    begun = true;
                    match self.next() {
                        Some(c) => word.push(c),
                        None => word.push(self.escape),
                    }
                }
                c => {
                    begun = true;
                    word.push(c);
                }
            }
        }
        if begun {
            words.push(word);
        }
        Ok(words)
    }

    fn next(&mut self) -> Option<char> {
        let c = self.chars.get(self.at).copied();
        self.at += usize::from(c.is_some());
        c
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn double_quoted(&mut self, word: &mut String) -> Result<(), String> {
        loop {
            match self.next() {
                Some('"') => return Ok(()),
                Some('$') => word.push_str(&self.variable()?),
                Some(c) if c == self.escape => match self.next() {
                    Some(c @ ('"' | '$')) => word.push(c),
                    Some(c) if c == self.escape => word.push(c),
                    Some(c) => {
                        word.push(self.escape);
                        word.push(c);
                    }
                    None => return Err("a double quote is not closed".into()),
                },
                Some(c) => word.push(c),
                None => return Err("a double quote is not closed".into()),
            }
        }
    }

    /// The value of the variable after a `$` just read.
    fn variable(&mut self) -> Result<String, String> {
        if self.peek() == Some('{') {
            self.at += 1;
            return self.braced();
        }
        let name = self.name();
        if name.is_empty() {
            return Ok("$".into());
        }
        Ok(self.vars.get(&name).cloned().unwrap_or_default())
    }

    fn name(&mut self) -> String {
        let mut name = String::new();
        while let Some(c) = self.peek().filter(|c| c.is_ascii_alphanumeric() || *c == '_') {
            name.push(c);
            self.at += 1;
        }
        name
    }

    /// `${NAME}` and its forms with a default or an alternative, after the `{`.
    fn braced(&mut self) -> Result<String, String> {
        let name = self.name();
        if name.is_empty() {
            return Err("`${` is not followed by a variable's name".into());
        }
        let value = self.vars.get(&name);
        let colon = self.peek() == Some(':');
        if colon {
            self.at += 1;
        }
        let op = self.next();
        if op == Some('}') && !colon {
            return Ok(value.cloned().unwrap_or_default());
        }
        let Some(op @ ('-' | '+')) = op else {
            return Err(format!("`${{{name}` takes `}}`, `:-`, `-`, `:+` or `+` here"));
        };
        let mut word = String::new();
        loop {
            match self.next() {
                Some('}') => break,
                Some('$') => word.push_str(&self.variable()?),
                Some(c) if c == self.escape => word.extend(self.next()),
                Some(c) => word.push(c),
                None => return Err(format!("`${{{name}` is not closed with `}}`")),
            }
        }
        let set = match value {
            Some(v) => !(colon && v.is_empty()),
            None => false,
        };
        Ok(match (op, set) {
            ('-', true) => value.cloned().unwrap_or_default(),
            ('-', false) => word,
            ('+', true) => word,
            _ => String::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> Vars {
        [("A", "one"), ("E", ""), ("P", "/opt/app")].into_iter().map(|(k, v)| (k.into(), v.into())).collect()
    }

    #[test]
    fn variables_expand_in_every_form() {
        let x = |s: &str| expand(s, &vars(), '\\').unwrap();
        assert_eq!(x("$A-${A}"), "one-one");
        assert_eq!(x("${MISSING:-dflt} ${E:-empty} ${E-set} ${A:-no}"), "dflt empty  one");
        assert_eq!(x("${A:+alt}|${E:+alt}|${E+alt}|${MISSING+alt}"), "alt||alt|");
        assert_eq!(x("${P}/bin:$MISSING."), "/opt/app/bin:.");
        assert_eq!(x(r"\$A '$A' $"), "$A $A $", "escaped, single-quoted and a lone dollar stay");
        assert_eq!(x("\"$A b\""), "one b");
        assert_eq!(x("${MISSING:-${A}x}"), "onex", "a default may name a variable");
    }

    #[test]
    fn words_split_at_unquoted_spaces() {
        let w = |s: &str| split(s, &vars(), '\\').unwrap();
        assert_eq!(w(r#"A="a b" B='c $A' C=d\ e "" x"#), vec!["A=a b", "B=c $A", "C=d e", "", "x"]);
        assert_eq!(w("  --chown=$A:$A  src/  /dst "), vec!["--chown=one:one", "src/", "/dst"]);
    }

    #[test]
    fn unclosed_quotes_and_braces_are_errors() {
        assert!(split("'x", &vars(), '\\').is_err());
        assert!(split("\"x", &vars(), '\\').is_err());
        assert!(split("${A", &vars(), '\\').is_err());
        assert!(split("${A?x}", &vars(), '\\').is_err());
    }
}
