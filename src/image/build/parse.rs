//! A Dockerfile's text as instructions: parser directives read off the top, comments
//! dropped, continued lines joined, each instruction with the line it starts on. What the
//! arguments mean is read later, when the variables they may name are known.

/// One instruction as written: its keyword (upper case), its arguments (continuations
/// joined), and the line it starts on (1-based).
#[derive(Debug, Clone, PartialEq)]
pub struct Instruction {
    pub line: usize,
    pub keyword: String,
    pub args: String,
}

impl Instruction {
    /// The instruction as one line, for messages and cache keys.
    pub fn text(&self) -> String {
        format!("{} {}", self.keyword, self.args)
    }
}

/// A parsed Dockerfile: its escape character and its instructions.
#[derive(Debug, Clone, PartialEq)]
pub struct Dockerfile {
    pub escape: char,
    pub instructions: Vec<Instruction>,
}

/// A mistake in the file's text: the line it is on and what is wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

/// Parses `text`: `# escape=` (a backslash or a backtick) and `# syntax=` directives at the
/// top, `#` comment lines anywhere (inside a continued instruction too), lines continued by
/// the escape character at their end. Heredocs (`<<EOF`) are refused.
pub fn parse(text: &str) -> Result<Dockerfile, ParseError> {
    let lines: Vec<&str> = text.lines().collect();
    let (escape, first) = directives(&lines)?;
    let mut instructions = Vec::new();
    let mut i = first;
    while i < lines.len() {
        let trimmed = lines[i].trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            i += 1;
            continue;
        }
        let start = i;
        let mut joined = String::new();
        loop {
            let line = lines[i].trim_end();
            match line.strip_suffix(escape) {
                Some(head) => {
                    joined.push_str(head);
                    i += 1;
                    // Comment and empty lines inside a continued instruction are skipped.
                    while i < lines.len() && (lines[i].trim().is_empty() || lines[i].trim_start().starts_with('#')) {
                        i += 1;
                    }
                    if i == lines.len() {
                        break;
                    }
                }
                None => {
                    joined.push_str(line);
                    i += 1;
                    break;
                }
            }
        }
        instructions.push(instruction(start + 1, joined.trim())?);
    }
    Ok(Dockerfile { escape, instructions })
}

/// The directives at the top of the file: the escape character, and the index of the first
/// line after them.
fn directives(lines: &[&str]) -> Result<(char, usize), ParseError> {
    let mut escape = '\\';
    for (i, line) in lines.iter().enumerate() {
        let Some(body) = line.trim().strip_prefix('#') else { return Ok((escape, i)) };
        let Some((key, value)) = body.split_once('=') else { return Ok((escape, i)) };
        let (key, value) = (key.trim().to_ascii_lowercase(), value.trim());
        if key.contains(char::is_whitespace) || key.is_empty() {
            return Ok((escape, i));
        }
        match key.as_str() {
            "escape" => {
                escape = match value {
                    "\\" => '\\',
                    "`" => '`',
                    other => {
                        return Err(ParseError {
                            line: i + 1,
                            message: format!("the escape directive takes `\\` or a backtick, not `{other}`"),
                        });
                    }
                }
            }
            // A front end to use instead of Docker's own: this builder is its own.
            "syntax" | "check" => {}
            _ => return Ok((escape, i)),
        }
    }
    Ok((escape, lines.len()))
}

fn instruction(line: usize, text: &str) -> Result<Instruction, ParseError> {
    let (keyword, args) = match text.split_once(char::is_whitespace) {
        Some((k, rest)) => (k, rest.trim()),
        None => (text, ""),
    };
    let keyword = keyword.to_ascii_uppercase();
    if matches!(keyword.as_str(), "RUN" | "COPY" | "ADD") && has_heredoc(args) {
        return Err(ParseError {
            line,
            message: format!("{keyword} with a heredoc (`<<`) is not supported; put the lines in a file and COPY it"),
        });
    }
    Ok(Instruction { line, keyword, args: args.to_owned() })
}

/// Whether `args` holds a heredoc's start: `<<WORD`, `<<-WORD`, `<<"WORD"` or `<<'WORD'`.
fn has_heredoc(args: &str) -> bool {
    args.match_indices("<<").any(|(at, _)| {
        let rest = args[at + 2..].trim_start_matches('-');
        let rest = rest.trim_start_matches(['"', '\'']);
        rest.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
    })
}

/// The JSON (exec) form of an instruction's arguments, when they are one: a JSON array of
/// strings.
pub fn exec_form(args: &str) -> Option<Vec<String>> {
    if !args.trim_start().starts_with('[') {
        return None;
    }
    serde_json::from_str::<Vec<String>>(args.trim()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keywords(text: &str) -> Vec<(usize, String, String)> {
        parse(text).unwrap().instructions.into_iter().map(|i| (i.line, i.keyword, i.args)).collect()
    }

    #[test]
    fn continued_lines_are_joined_and_comments_dropped_with_each_instruction_on_its_first_line() {
        let text = "# syntax=docker/dockerfile:1\nFROM base\n\n# a comment\nrun apt-get update && \\\n  # inside\n  apt-get install -y jq\nENV A=1\n";
        let got = keywords(text);
        assert_eq!(
            got,
            vec![
                (2, "FROM".into(), "base".into()),
                (5, "RUN".into(), "apt-get update &&   apt-get install -y jq".into()),
                (8, "ENV".into(), "A=1".into()),
            ]
        );
    }

    #[test]
    fn the_escape_directive_makes_a_backtick_continue_lines() {
        let got = parse("# escape=`\nFROM base\nRUN echo a `\n  b\\c\n").unwrap();
        assert_eq!(got.escape, '`');
        assert_eq!(got.instructions[1].args, "echo a   b\\c");
        let bad = parse("# escape=x\nFROM base\n").unwrap_err();
        assert_eq!(bad.line, 1, "{bad:?}");
    }

    #[test]
    fn a_directive_after_a_comment_is_a_comment() {
        let got = parse("# hello\n# escape=`\nFROM base\nRUN a \\\n b\n").unwrap();
        assert_eq!(got.escape, '\\');
        assert_eq!(got.instructions[1].args, "a  b");
    }

    #[test]
    fn a_heredoc_is_refused_on_its_line() {
        let err = parse("FROM base\nRUN <<EOF\necho hi\nEOF\n").unwrap_err();
        assert_eq!(err.line, 2);
        assert!(err.message.contains("heredoc"), "{err:?}");
        assert!(parse("FROM base\nRUN echo $((1 << 2))\n").is_ok(), "a shift is not a heredoc");
    }

    #[test]
    fn the_exec_form_is_a_json_array_of_strings() {
        assert_eq!(exec_form(r#"["sh", "-c", "x"]"#), Some(vec!["sh".into(), "-c".into(), "x".into()]));
        assert_eq!(exec_form("[ -f x ] && echo y"), None);
        assert_eq!(exec_form("echo [x]"), None);
    }
}
