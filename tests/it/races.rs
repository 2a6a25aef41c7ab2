//! The runner's own file work cannot be raced out of the episode's folder: in each turn a
//! command swaps the folder `d` with a link to a folder outside (`renameat2` with
//! `RENAME_EXCHANGE`, in a loop) while the same turn calls a file tool on a path inside `d`
//! hundreds of times. No observation may show what is outside, and nothing outside may be
//! created, changed, removed or chmodded.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_json::{Value, json};

use crate::{Sandbox, have_python, tool_observations};

/// In every observation's text, this marks an escape: it is only outside.
const SECRET: &str = "OUTSIDE-SECRET-7731";
/// Race turns of each test, and calls of the tool in each.
const TURNS: usize = 4;
const CALLS: usize = 500;

/// A command that swaps `d` and `l` (a link to `outside`, made again when a restore took
/// it away) for `seconds`, and leaves `d` the folder at the end.
fn racer(outside: &Path, seconds: f64) -> Value {
    let script = format!(
        "import ctypes, os, time\n\
         lib = ctypes.CDLL(None, use_errno=True)\n\
         os.path.lexists('l') or os.symlink({outside:?}, 'l')\n\
         open('{RACING}', 'w').close()\n\
         end = time.time() + {seconds}\n\
         while time.time() < end:\n    \
             if lib.renameat2(-100, b'd', -100, b'l', 2) != 0 and not os.path.lexists('l'):\n        \
                 os.symlink({outside:?}, 'l')\n\
         os.remove('{RACING}')\n\
         if os.path.islink('d'):\n    lib.renameat2(-100, b'd', -100, b'l', 2)\n",
        outside = outside.display().to_string()
    );
    json!({"name": "run_command", "arguments": {"command": format!("python3 -S -c {}", shell_quote(&script))}})
}

/// The file the racer makes once it swaps, and removes when it stops.
const RACING: &str = ".racing";

/// A command that waits (up to 30 s) until the racer swaps: the calls after it, run one at a
/// time beside the racer, meet the swaps even when a loaded machine starts Python slowly.
fn await_racer() -> Value {
    let command = format!("i=0; while [ ! -e {RACING} ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done");
    json!({"name": "run_command", "arguments": {"command": command}})
}

fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

/// Every entry of `dir`: its name, its mode and its content (or link target).
fn snapshot(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mode = std::fs::symlink_metadata(dir).map(|m| m.permissions().mode()).unwrap_or(0);
    out.insert(".".into(), format!("{mode:o}"));
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let what = if meta.is_file() { std::fs::read_to_string(&path).unwrap_or_default() } else { "other".into() };
        out.insert(
            path.file_name().unwrap().to_string_lossy().into_owned(),
            format!("{:o} {what}", meta.permissions().mode()),
        );
    }
    out
}

struct Raced {
    /// Every tool observation's text.
    observations: Vec<String>,
    outside_before: BTreeMap<String, String>,
    outside_after: BTreeMap<String, String>,
}

impl Raced {
    /// The observations that show the outside secret.
    fn leaks(&self) -> Vec<&String> {
        self.observations.iter().filter(|o| o.contains(SECRET)).collect()
    }

    /// The observations of calls that met `d` swapped for the link, and were refused.
    fn met_the_link(&self) -> usize {
        let refusals = ["is outside the working directory", "symbolic link", "Too many levels of symbolic links"];
        self.observations.iter().filter(|o| refusals.iter().any(|r| o.contains(r))).count()
    }

    fn assert_no_escape(&self, tool: &str) {
        let leaks = self.leaks();
        assert!(
            leaks.is_empty(),
            "{tool}: {} of {} observations show the outside secret; the first: {}",
            leaks.len(),
            self.observations.len(),
            leaks[0]
        );
        assert_eq!(self.outside_before, self.outside_after, "{tool}: the folder outside was changed");
        let met = self.met_the_link();
        eprintln!("{tool}: {met} calls met the swapped folder and were refused");
        assert!(met > 0, "{tool}: no call met the swapped folder: the race did not run");
    }
}

/// Runs one episode of a `shell` environment (with `env_extra`): a quiet turn `before`,
/// then `TURNS` turns of the racer and `CALLS` calls made by `call(turn, i)`, each race
/// turn followed by the quiet turn `after(turn)`.
fn race(
    env_extra: &str,
    before: Vec<Value>,
    call: impl Fn(usize, usize) -> Vec<Value>,
    after: impl Fn(usize) -> Vec<Value>,
) -> Raced {
    let sb = Sandbox::new();
    let outside = sb.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("f.txt"), "hello\n").unwrap();
    std::fs::write(outside.join("OUTSIDE-SECRET.txt"), format!("{SECRET}\n")).unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o751)).unwrap();
    let outside_before = snapshot(&outside);
    sb.write("environments/box.yaml", &format!("kind: shell\nlimits: {{max_concurrency: 2}}\n{env_extra}"));
    let mut turns = Vec::new();
    if !before.is_empty() {
        turns.push(json!({"tool_calls": before}));
    }
    for turn in 0..TURNS {
        let mut calls = vec![racer(&outside, 1.0), await_racer()];
        for i in 0..CALLS {
            calls.extend(call(turn, i));
        }
        turns.push(json!({"tool_calls": calls}));
        let quiet = after(turn);
        if !quiet.is_empty() {
            turns.push(json!({"tool_calls": quiet}));
        }
    }
    turns.push(json!({"text": "done"}));
    let suite = json!({
        "suite": "races", "environment": "box", "scorers": [{"includes": "done"}],
        "limits": {"max_steps": 100, "time_s": 600},
        "tasks": [{"id": "t", "input": "go", "files": {"d/f.txt": "hello\n"}, "mock": turns}],
    });
    sb.write("s.yaml", &suite.to_string());
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let observations: Vec<String> = tool_observations(&events).into_iter().map(|o| o.to_string()).collect();
    let outside_after = snapshot(&outside);
    Raced { observations, outside_before, outside_after }
}

fn one(name: &str, arguments: Value) -> Vec<Value> {
    vec![json!({"name": name, "arguments": arguments})]
}

fn none(_: usize) -> Vec<Value> {
    Vec::new()
}

#[test]
fn read_file_never_reads_through_a_swapped_folder() {
    if !have_python() {
        return;
    }
    let raced = race("", vec![], |_, _| one("read_file", json!({"path": "d/OUTSIDE-SECRET.txt"})), none);
    raced.assert_no_escape("read_file");
}

#[test]
fn grep_never_searches_a_swapped_folder() {
    if !have_python() {
        return;
    }
    let raced = race("", vec![], |_, _| one("grep", json!({"pattern": "SECRET", "path": "d"})), none);
    raced.assert_no_escape("grep");
}

#[test]
fn list_dir_and_glob_never_list_a_swapped_folder() {
    if !have_python() {
        return;
    }
    let raced = race(
        "",
        vec![],
        |_, i| {
            if i % 2 == 0 { one("list_dir", json!({"path": "d"})) } else { one("glob", json!({"pattern": "d/*"})) }
        },
        none,
    );
    raced.assert_no_escape("list_dir and glob");
}

#[test]
fn write_file_and_edit_file_never_write_through_a_swapped_folder() {
    if !have_python() {
        return;
    }
    let raced = race(
        "",
        vec![],
        |turn, i| match i % 3 {
            0 => one("write_file", json!({"path": format!("d/new-{turn}-{i}.txt"), "content": "x"})),
            1 => one("read_file", json!({"path": "d/f.txt"})),
            _ => one(
                "edit_file",
                json!({"path": "d/f.txt", "old_string": "hello", "new_string": "hello", "replace_all": true}),
            )
            .into_iter()
            .map(|mut c| {
                c["arguments"]["new_string"] = json!("HELLO");
                c
            })
            .chain(one("edit_file", json!({"path": "d/f.txt", "old_string": "HELLO", "new_string": "hello"})))
            .collect(),
        },
        none,
    );
    raced.assert_no_escape("write_file and edit_file");
}

#[test]
fn checkpoints_never_copy_a_swapped_folder() {
    if !have_python() {
        return;
    }
    // Each checkpoint taken in a race is restored in a quiet turn: one that copied the
    // folder outside would bring its secret in, and name it.
    let raced = race(
        "",
        vec![],
        |turn, i| one("checkpoint", json!({"name": format!("c{turn}-{}", i % 20)})),
        |turn| {
            let mut calls: Vec<Value> =
                (0..20).flat_map(|i| one("restore", json!({"name": format!("c{turn}-{i}")}))).collect();
            calls.extend(one("run_command", json!({"command": "cat d/* 2>&1; ls -R"})));
            calls
        },
    );
    raced.assert_no_escape("checkpoint");
}

#[test]
fn restore_never_changes_a_swapped_folder() {
    if !have_python() {
        return;
    }
    let raced = race(
        "",
        one("checkpoint", json!({"name": "base"})),
        |_, i| {
            if i % 2 == 0 {
                one("restore", json!({"name": "base"}))
            } else {
                one("write_file", json!({"path": "d/made.txt", "content": "x"}))
            }
        },
        none,
    );
    raced.assert_no_escape("restore");
}

#[test]
fn one_script_cannot_make_the_runner_write_another_scripts_code_outside() {
    if !have_python() {
        return;
    }
    let sb = Sandbox::new();
    let outside = sb.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o777)).unwrap();
    let before = snapshot(&outside);
    // The attacker swaps every other script's folder for a link to `outside` as soon as it
    // appears, while the runner sets up the next scripts.
    let attacker = format!(
        "import os, time\n\
         parent = os.path.dirname(os.getcwd())\n\
         me = os.path.basename(os.getcwd())\n\
         end = time.time() + 1.5\n\
         moved = 0\n\
         while time.time() < end:\n    \
             try:\n        names = os.listdir(parent)\n    except OSError:\n        break\n    \
             for name in names:\n        \
                 if name == me or name.startswith('x'):\n            continue\n        \
                 try:\n            \
                     os.rename(os.path.join(parent, name), os.path.join(parent, 'x%d' % moved))\n            \
                     moved += 1\n            \
                     os.symlink({outside:?}, os.path.join(parent, name))\n        \
                 except OSError:\n            pass\n\
         print('moved', moved)\n",
        outside = outside.display().to_string()
    );
    sb.write("environments/box.yaml", "kind: shell\nexecute_code: {timeout_s: 10}\nlimits: {max_concurrency: 2}\n");
    let mut turns = Vec::new();
    for _ in 0..4 {
        let mut calls = vec![json!({"name": "execute_code", "arguments": {"code": attacker}})];
        for _ in 0..60 {
            calls.push(json!({"name": "execute_code", "arguments": {"code": "print('benign')"}}));
        }
        turns.push(json!({"tool_calls": calls}));
    }
    turns.push(json!({"text": "done"}));
    let suite = json!({
        "suite": "races", "environment": "box", "scorers": [{"includes": "done"}],
        "limits": {"max_steps": 100, "time_s": 600},
        "tasks": [{"id": "t", "input": "go", "mock": turns}],
    });
    sb.write("s.yaml", &suite.to_string());
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let after = snapshot(&outside);
    assert_eq!(before, after, "a script made the runner write into a folder of its choosing");
    // The benign scripts ran: each in a folder no other script could touch.
    let events = sb.events();
    let benign = tool_observations(&events).into_iter().filter(|o| o["tool_result"]["output"] == "benign\n").count();
    assert_eq!(benign, 4 * 60, "every benign script ran");
}
