//! Permission rules: which calls the environment runs, refuses, or asks the task's user
//! about. Rules are ordered, and the first that matches a call decides it; a suite's rules
//! come before its environment's, and a call that no rule matches runs.
//!
//! A rule is `TOOL[(ARGUMENT)]: allow | deny | ask`, both parts globs over the whole text
//! (`*` any run of characters, `?` one). The argument glob is matched against the call's
//! *subject*: the first argument of [`SUBJECT_ARGUMENTS`] it has as a string, or else the
//! arguments as JSON text. A `path` is matched as written with its `.` parts, empty parts
//! and `..` steps taken out ([`normalise_path`], lexically), so `./secret.txt` is
//! `secret.txt`; a `grep` over a folder shows no line of a file the rules keep it from
//! reading. Rules steer an agent that means well; they are no sandbox (a command can be
//! spelt many ways, a link can name a file twice).

use serde_json::Value;

use crate::contract::{ErrorType, FINAL_TOOL, ToolCall, ToolError};
use crate::log::{DecidedBy, PermissionDecision};

/// The arguments a call's subject is taken from, first found first: `run_command`'s
/// `command`, the file tools' `path`, `kv`'s `key`.
pub const SUBJECT_ARGUMENTS: &[&str] = &["command", "path", "key"];

/// What a rule says to do with a call it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Allow,
    Deny,
    /// The task's user decides; with no answer, the call is denied.
    Ask,
}

impl Action {
    fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Deny => "deny",
            Action::Ask => "ask",
        }
    }
}

/// One rule, as written in a `permissions:` list.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// A glob over tool names.
    pub tool: String,
    /// A glob over the call's subject; `None` matches any arguments.
    pub argument: Option<String>,
    pub action: Action,
    /// Where it was written, for messages: `suite permissions[0]`.
    pub origin: String,
}

impl Rule {
    /// Reads one rule from its key (`run_command(rm *)`) and its action (`deny`); `origin`
    /// says where it was written.
    pub fn parse(key: &str, action: &str, origin: &str) -> Result<Rule, String> {
        let action = match action.trim() {
            "allow" => Action::Allow,
            "deny" => Action::Deny,
            "ask" => Action::Ask,
            other => return Err(format!("`{key}`: expected allow, deny or ask, found `{other}`")),
        };
        let key = key.trim();
        let (tool, argument) = match key.split_once('(') {
            None => (key, None),
            Some((tool, rest)) => match rest.strip_suffix(')') {
                Some("") => {
                    return Err(format!(
                        "`{key}`: the argument glob is empty; leave out the parentheses to match any arguments"
                    ));
                }
                Some(argument) => (tool.trim(), Some(argument.to_owned())),
                None => return Err(format!("`{key}`: the argument glob must end with `)`")),
            },
        };
        if tool.is_empty() {
            return Err(format!("`{key}`: the rule names no tool; use `*` for every tool"));
        }
        if let Some(bad) = tool.chars().find(|c| !(c.is_ascii_alphanumeric() || "_-.*?".contains(*c))) {
            return Err(format!("`{key}`: `{bad}` cannot be part of a tool name or its glob"));
        }
        Ok(Rule { tool: tool.to_owned(), argument, action, origin: origin.to_owned() })
    }

    /// Whether the rule is about `call`. A path is compared normalised, on both sides.
    pub fn matches(&self, call: &ToolCall) -> bool {
        glob_matches(&self.tool, &call.name)
            && self.argument.as_deref().is_none_or(|glob| match path_subject(&call.arguments) {
                Some(path) => glob_matches(&normalise_path(glob), &normalise_path(path)),
                None => glob_matches(glob, &subject(&call.arguments)),
            })
    }

    /// The rule as written: `run_command(rm *): deny`.
    pub fn text(&self) -> String {
        match &self.argument {
            Some(argument) => format!("{}({argument}): {}", self.tool, self.action.as_str()),
            None => format!("{}: {}", self.tool, self.action.as_str()),
        }
    }
}

/// What a rule's argument glob is matched against.
pub fn subject(arguments: &Value) -> String {
    SUBJECT_ARGUMENTS
        .iter()
        .find_map(|name| arguments.get(name).and_then(Value::as_str))
        .map_or_else(|| arguments.to_string(), str::to_owned)
}

/// The call's subject when it is a path: its `path` argument, unless a `command` comes
/// first (see [`SUBJECT_ARGUMENTS`]).
fn path_subject(arguments: &Value) -> Option<&str> {
    if arguments.get("command").and_then(Value::as_str).is_some() {
        return None;
    }
    arguments.get("path").and_then(Value::as_str)
}

/// `path` without `.` parts, empty parts or a trailing `/`, each `..` taking back the part
/// before it; by the text alone, never the file system. `./secret.txt`, `secret.txt/.`,
/// `.//secret.txt` and `a/../secret.txt` are all `secret.txt`; an empty path is `.`.
pub fn normalise_path(path: &str) -> String {
    let absolute = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => match parts.last() {
                Some(&last) if last != ".." => {
                    parts.pop();
                }
                // Above the root is the root.
                _ if absolute => {}
                _ => parts.push(".."),
            },
            part => parts.push(part),
        }
    }
    let joined = parts.join("/");
    if absolute {
        format!("/{joined}")
    } else if joined.is_empty() {
        ".".to_owned()
    } else {
        joined
    }
}

/// Whether `text`, all of it, matches `glob`: `*` is any run of characters (`/` and spaces
/// included), `?` one character, anything else itself. Hand-written rather than `globset`,
/// whose globs are about paths (`*` stops at `/`, `{a,b}`, classes): a rule's subject is
/// as often a command line, and two wildcards are all a rule needs. Linear in practice: it
/// backtracks only to the last `*`.
pub fn glob_matches(glob: &str, text: &str) -> bool {
    let glob: Vec<char> = glob.chars().collect();
    let text: Vec<char> = text.chars().collect();
    let (mut g, mut t) = (0, 0);
    // The last `*` seen, and where in the text it was tried to end.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if g < glob.len() && (glob[g] == '?' || (glob[g] != '*' && glob[g] == text[t])) {
            g += 1;
            t += 1;
        } else if g < glob.len() && glob[g] == '*' {
            star = Some((g, t));
            g += 1;
        } else if let Some((star_g, star_t)) = star {
            // Let the `*` take one more character.
            g = star_g + 1;
            t = star_t + 1;
            star = Some((star_g, star_t + 1));
        } else {
            return false;
        }
    }
    glob[g..].iter().all(|c| *c == '*')
}

/// An ordered list of rules: a suite's first, then its environment's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Permissions {
    rules: Vec<Rule>,
}

/// A decision about one call.
#[derive(Debug, Clone, PartialEq)]
pub struct Ruling {
    pub decision: PermissionDecision,
    pub decided_by: DecidedBy,
    /// The rule that matched.
    pub rule: Option<Rule>,
    /// The user's answer to an `ask`.
    pub answer: Option<String>,
}

impl Ruling {
    /// The observation's error for a denied call: it names the rule.
    pub fn error(&self, call: &ToolCall) -> ToolError {
        let rule = match &self.rule {
            Some(rule) => format!("the permission rule `{}` ({})", rule.text(), rule.origin),
            None => "the permission rules".into(),
        };
        let message = match (self.decided_by, &self.answer) {
            (DecidedBy::User, Some(answer)) => {
                format!("`{}` was not run: {rule} asks the user, who answered {answer:?}", call.name)
            }
            (DecidedBy::Default, _) => {
                format!("`{}` was not run: {rule} asks the user, and there is no one to answer", call.name)
            }
            _ => format!("`{}` was not run: it is denied by {rule}", call.name),
        };
        ToolError::new(ErrorType::PermissionError, message).suggest("do it another way, or not at all")
    }
}

impl Permissions {
    pub fn new(rules: Vec<Rule>) -> Self {
        Permissions { rules }
    }

    /// These rules, then `later`'s.
    pub fn then(&self, later: &Permissions) -> Permissions {
        Permissions { rules: self.rules.iter().chain(&later.rules).cloned().collect() }
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Decides `call` by the first rule that matches it; an `ask` takes the answer `ask`
    /// gives (`None`: nobody answered). The final answer is always allowed.
    pub fn decide(&self, call: &ToolCall, ask: impl FnOnce() -> Option<String>) -> Ruling {
        let rule = self.rule_for(call);
        let answer = if rule.is_some_and(|r| r.action == Action::Ask) { ask() } else { None };
        self.verdict(rule, answer)
    }

    /// The first rule that matches `call`; none for the final answer, which is how an
    /// episode ends.
    pub fn rule_for(&self, call: &ToolCall) -> Option<&Rule> {
        if call.name == FINAL_TOOL { None } else { self.rules.iter().find(|r| r.matches(call)) }
    }

    /// The verdict of `rule` (the one `rule_for` found), with the user's answer to an `ask`.
    pub fn verdict(&self, rule: Option<&Rule>, answer: Option<String>) -> Ruling {
        let Some(rule) = rule else {
            return Ruling {
                decision: PermissionDecision::Allow,
                decided_by: DecidedBy::Default,
                rule: None,
                answer: None,
            };
        };
        let (decision, decided_by, answer) = match rule.action {
            Action::Allow => (PermissionDecision::Allow, DecidedBy::Rule, None),
            Action::Deny => (PermissionDecision::Deny, DecidedBy::Rule, None),
            Action::Ask => match answer {
                Some(answer) if approves(&answer) => (PermissionDecision::Allow, DecidedBy::User, Some(answer)),
                Some(answer) => (PermissionDecision::Deny, DecidedBy::User, Some(answer)),
                None => (PermissionDecision::Deny, DecidedBy::Default, None),
            },
        };
        Ruling { decision, decided_by, rule: Some(rule.clone()), answer }
    }
}

impl Permissions {
    /// Whether the rules keep the agent from reading the file at `path` (relative to the
    /// working directory): a rule about that path, the first to match a `read_file` or a
    /// `grep` of it, does not allow it. Rules about a tool as a whole (`*: deny` after
    /// `grep: allow`) are not about the file.
    pub fn withholds(&self, path: &str) -> bool {
        ["read_file", "grep"].into_iter().any(|tool| {
            let call = ToolCall::new("", tool, serde_json::json!({"path": path}));
            self.rule_for(&call).is_some_and(|rule| rule.argument.is_some() && rule.action != Action::Allow)
        })
    }

    /// Takes out of a `grep` result (`matches`: `path:line:text` lines) the lines of files
    /// the rules withhold, and says how many were taken out. A line is taken out when any
    /// way of reading its path (a name may hold `:12:`) is withheld.
    pub fn withhold_matches(&self, result: &mut Value) {
        if self.rules.iter().all(|rule| rule.argument.is_none()) {
            return;
        }
        let Some(text) = result.get("matches").and_then(Value::as_str) else { return };
        let mut kept = String::with_capacity(text.len());
        let mut withheld = 0u64;
        for line in text.split_inclusive('\n') {
            if match_paths(line).any(|path| self.withholds(path)) {
                withheld += 1;
            } else {
                kept.push_str(line);
            }
        }
        if withheld == 0 {
            return;
        }
        kept.push_str(&format!(
            "[... {withheld} matching lines in files the permission rules keep from you are not shown ...]\n"
        ));
        result["matches"] = Value::String(kept);
        if let Some(count) = result.get("count").and_then(Value::as_u64) {
            result["count"] = Value::from(count.saturating_sub(withheld));
        }
    }
}

/// Every prefix of a `path:line:text` line that ends before a `:LINE:`: the paths the line
/// may be about.
fn match_paths(line: &str) -> impl Iterator<Item = &str> {
    line.match_indices(':').filter_map(move |(at, _)| {
        let rest = &line[at + 1..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        (at > 0 && digits > 0 && rest.as_bytes().get(digits) == Some(&b':')).then(|| &line[..at])
    })
}

/// Whether a user's answer approves: it starts with `y`, `allow` or `approve`, in any case.
pub fn approves(answer: &str) -> bool {
    let answer = answer.trim().to_lowercase();
    answer.starts_with('y') || answer.starts_with("allow") || answer.starts_with("approve")
}

/// Reads a `permissions:` list (each item a one-key map, `- run_command(rm *): deny`),
/// checking that each rule's tool glob names a tool of `tools`. An error names the item
/// (`permissions[2]`) it is about. `origin` says whose rules these are.
pub fn parse_rules(value: &Value, origin: &str, tools: &[&str]) -> Result<Permissions, (String, String)> {
    const FIELD: &str = "permissions";
    let items = match value {
        Value::Null => return Ok(Permissions::default()),
        Value::Array(items) => items,
        _ => {
            let message = "expected a list of rules in order, each `- TOOL[(ARGUMENT)]: allow | deny | ask`";
            return Err((FIELD.into(), message.into()));
        }
    };
    let mut rules = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("{FIELD}[{i}]");
        let rule = match item {
            Value::Object(map) if map.len() == 1 => map.iter().next(),
            _ => None,
        };
        let Some((key, action)) = rule else {
            let message =
                format!("expected one rule `TOOL[(ARGUMENT)]: allow | deny | ask` (a map of one key), found {item}");
            return Err((at, message));
        };
        let Value::String(action) = action else {
            return Err((at, format!("`{key}`: expected allow, deny or ask, found {action}")));
        };
        let rule = Rule::parse(key, action, &format!("{origin} {at}")).map_err(|e| (at.clone(), e))?;
        let tool = &rule.tool;
        if tool == FINAL_TOOL {
            return Err((at, format!("`{FINAL_TOOL}` is always allowed: it is how an episode ends")));
        }
        if !tools.iter().any(|name| glob_matches(tool, name)) {
            return Err((at, format!("`{tool}` matches no tool here; the tools are: {}", tools.join(", "))));
        }
        rules.push(rule);
    }
    Ok(Permissions::new(rules))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const TOOLS: &[&str] = &["run_command", "read_file", "write_file", "list_dir", FINAL_TOOL];

    fn rules(value: Value) -> Permissions {
        parse_rules(&value, "suite", TOOLS).unwrap()
    }

    fn error(value: Value) -> (String, String) {
        parse_rules(&value, "suite", TOOLS).unwrap_err()
    }

    fn command(text: &str) -> ToolCall {
        ToolCall::new("c1", "run_command", json!({"command": text}))
    }

    fn decide(permissions: &Permissions, call: &ToolCall) -> (PermissionDecision, DecidedBy, Option<String>) {
        let verdict = permissions.decide(call, || None);
        (verdict.decision, verdict.decided_by, verdict.rule.map(|r| r.text()))
    }

    #[test]
    fn rules_are_read_in_order_with_their_globs() {
        let p = rules(json!([{"run_command(rm *)": "deny"}, {"write_file": "ask"}, {"*": "allow"}]));
        let texts: Vec<String> = p.rules().iter().map(Rule::text).collect();
        assert_eq!(texts, ["run_command(rm *): deny", "write_file: ask", "*: allow"]);
        assert_eq!(p.rules()[0].argument.as_deref(), Some("rm *"));
        assert_eq!(p.rules()[2].origin, "suite permissions[2]");
        assert!(rules(Value::Null).is_empty(), "no `permissions:` is no rules");
    }

    #[test]
    fn a_bad_rule_names_its_item() {
        let cases = [
            (json!([{"*": "allow"}, {"run_command": "maybe"}]), "permissions[1]", "expected allow, deny or ask"),
            (json!([{"run_command": true}]), "permissions[0]", "expected allow, deny or ask, found true"),
            (json!(["run_command: deny"]), "permissions[0]", "a map of one key"),
            (json!([{"run_command": "deny", "read_file": "allow"}]), "permissions[0]", "a map of one key"),
            (json!([{"run_command(rm *": "deny"}]), "permissions[0]", "must end with `)`"),
            (json!([{"run_command()": "deny"}]), "permissions[0]", "the argument glob is empty"),
            (json!([{"(rm *)": "deny"}]), "permissions[0]", "names no tool"),
            (json!([{"run command": "deny"}]), "permissions[0]", "` ` cannot be part of a tool name"),
            (
                json!([{"*": "allow"}, {"*": "allow"}, {"run_comand": "deny"}]),
                "permissions[2]",
                "`run_comand` matches no tool here; the tools are: run_command",
            ),
            (json!([{"kv_*": "deny"}]), "permissions[0]", "matches no tool"),
            (json!([{"final_answer": "deny"}]), "permissions[0]", "always allowed"),
            (json!({"run_command": "deny"}), "permissions", "expected a list of rules in order"),
        ];
        for (value, field, message) in cases {
            let (at, text) = error(value.clone());
            assert_eq!(at, field, "{value}: {text}");
            assert!(text.contains(message), "{value}: {text}");
        }
    }

    #[test]
    fn the_first_rule_that_matches_decides() {
        let p = rules(json!([{"run_command(rm *)": "deny"}, {"run_command": "allow"}, {"*": "deny"}]));
        let deny = Some("run_command(rm *): deny".to_string());
        assert_eq!(decide(&p, &command("rm -rf x")), (PermissionDecision::Deny, DecidedBy::Rule, deny));
        let allow = Some("run_command: allow".to_string());
        assert_eq!(decide(&p, &command("ls")), (PermissionDecision::Allow, DecidedBy::Rule, allow));
        // The glob is over the whole command: `rm` elsewhere in it is not `rm *`.
        assert_eq!(decide(&p, &command("ls; rm x")).0, PermissionDecision::Allow);
        let read = ToolCall::new("c2", "read_file", json!({"path": "a.txt"}));
        assert_eq!(decide(&p, &read), (PermissionDecision::Deny, DecidedBy::Rule, Some("*: deny".into())));
        // Reversed, the catch-all wins before the narrower rule is reached.
        let p = rules(json!([{"*": "allow"}, {"run_command(rm *)": "deny"}]));
        assert_eq!(decide(&p, &command("rm -rf x")).0, PermissionDecision::Allow);
    }

    #[test]
    fn a_call_no_rule_matches_is_allowed_by_default() {
        let p = rules(json!([{"run_command(rm *)": "deny"}]));
        let write = ToolCall::new("c1", "write_file", json!({"path": "a", "content": ""}));
        assert_eq!(decide(&p, &write), (PermissionDecision::Allow, DecidedBy::Default, None));
        let p = rules(json!([{"*": "deny"}]));
        let fin = ToolCall::new("c1", FINAL_TOOL, json!({"answer": "3"}));
        assert_eq!(decide(&p, &fin), (PermissionDecision::Allow, DecidedBy::Default, None), "the episode can end");
    }

    #[test]
    fn file_tools_match_on_their_path_and_others_on_their_json() {
        let p = rules(json!([{"write_*(secrets/*)": "deny"}, {"list_dir(*\"path\":\"private\"*)": "deny"}]));
        let write = |path: &str| ToolCall::new("c", "write_file", json!({"path": path, "content": "x"}));
        assert_eq!(decide(&p, &write("secrets/key")).0, PermissionDecision::Deny);
        assert_eq!(decide(&p, &write("notes/secrets/key")).0, PermissionDecision::Allow);
        assert_eq!(subject(&json!({"by": 2})), r#"{"by":2}"#);
        assert_eq!(subject(&json!({"path": "a/b", "command": "ls"})), "ls", "command comes first");
    }

    #[test]
    fn paths_are_normalised_before_they_are_matched() {
        for (given, normal) in [
            ("./secret.txt", "secret.txt"),
            ("secret.txt/.", "secret.txt"),
            (".//secret.txt", "secret.txt"),
            ("secret.txt/", "secret.txt"),
            ("a/../secret.txt", "secret.txt"),
            ("a/./b//c/", "a/b/c"),
            ("../x", "../x"),
            ("a/../../x", "../x"),
            ("", "."),
            ("./", "."),
            ("/a/./b/../c", "/a/c"),
            ("/..", "/"),
        ] {
            assert_eq!(normalise_path(given), normal, "{given:?}");
        }
        let p = rules(json!([{"write_file(secret.txt)": "deny"}, {"read_file(./private/*)": "deny"}]));
        let call = |tool: &str, path: &str| ToolCall::new("c", tool, json!({"path": path, "content": "x"}));
        for path in ["secret.txt", "./secret.txt", "secret.txt/.", ".//secret.txt", "x/../secret.txt"] {
            assert_eq!(decide(&p, &call("write_file", path)).0, PermissionDecision::Deny, "{path}");
        }
        assert_eq!(decide(&p, &call("write_file", "secret.txt.bak")).0, PermissionDecision::Allow);
        assert_eq!(decide(&p, &call("read_file", "private/key")).0, PermissionDecision::Deny);
        assert_eq!(decide(&p, &call("read_file", "./private//key")).0, PermissionDecision::Deny);
        // A command is matched as written: it is no path.
        let p = rules(json!([{"run_command(./x)": "deny"}]));
        assert_eq!(decide(&p, &command("x")).0, PermissionDecision::Allow);
    }

    #[test]
    fn grep_shows_no_line_of_a_file_the_rules_keep_from_reading() {
        let tools = ["read_file", "grep", FINAL_TOOL];
        let p = parse_rules(
            &json!([{"read_file(secret.txt)": "deny"}, {"grep(private/*)": "ask"}, {"*": "allow"}]),
            "suite",
            &tools,
        )
        .unwrap();
        let text = "a.txt:1:key\nsecret.txt:3:key=1\nprivate/k:9:key\nb:7:c.txt:2:key\nsecret.txt:2:x:1:y\n";
        let mut result = json!({"pattern": "key", "matches": text, "count": 5});
        p.withhold_matches(&mut result);
        let shown = result["matches"].as_str().unwrap();
        assert!(shown.starts_with("a.txt:1:key\nb:7:c.txt:2:key\n[... 3 matching lines"), "{shown}");
        assert_eq!(result["count"], 2);
        // Rules about tools as a whole say nothing about one file.
        let p = parse_rules(&json!([{"grep": "allow"}, {"*": "deny"}]), "suite", &tools).unwrap();
        let mut result = json!({"matches": text, "count": 5});
        p.withhold_matches(&mut result);
        assert_eq!(result["matches"], text);
    }

    #[test]
    fn globs_match_the_whole_text() {
        for (glob, text) in [("rm *", "rm -rf x"), ("*", ""), ("a?c", "abc"), ("*.txt", "a/b.txt"), ("*a*b", "xaab")] {
            assert!(glob_matches(glob, text), "{glob} should match {text}");
        }
        for (glob, text) in [("rm *", "ls"), ("rm *", "xrm a"), ("a?c", "ac"), ("*.txt", "a.txt.bak"), ("?", "")] {
            assert!(!glob_matches(glob, text), "{glob} should not match {text}");
        }
    }

    #[test]
    fn ask_takes_the_users_answers_in_order_and_denies_when_they_run_out() {
        let p = rules(json!([{"write_file": "ask"}]));
        let write = ToolCall::new("c", "write_file", json!({"path": "a", "content": ""}));
        let mut user: std::collections::VecDeque<String> = ["yes", "no", "Allow it"].map(String::from).into();
        let answers: Vec<(PermissionDecision, DecidedBy, Option<String>)> = (0..4)
            .map(|_| {
                let v = p.decide(&write, || user.pop_front());
                (v.decision, v.decided_by, v.answer)
            })
            .collect();
        use PermissionDecision::{Allow, Deny};
        assert_eq!(
            answers,
            [
                (Allow, DecidedBy::User, Some("yes".into())),
                (Deny, DecidedBy::User, Some("no".into())),
                (Allow, DecidedBy::User, Some("Allow it".into())),
                (Deny, DecidedBy::Default, None),
            ]
        );
        let verdict = p.decide(&write, || None);
        let error = verdict.error(&write);
        assert_eq!(error.kind, ErrorType::PermissionError);
        assert!(error.message.contains("`write_file: ask` (suite permissions[0])"), "{}", error.message);
        assert!(error.message.contains("no one to answer"), "{}", error.message);
    }
}
