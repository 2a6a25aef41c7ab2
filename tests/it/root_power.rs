//! A runner that runs as root lends none of root's power over files to the processes it
//! starts: a command cannot change the mode, group, times or extended attributes of a file
//! outside its episode's folder, even one root owns; inside the folder it can, as before,
//! also on the files the runner wrote there. Skipped, saying so, when not run as root.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use serde_json::{Value, json};

use crate::{Sandbox, tool_observations};

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Runs one shell episode whose agent runs `commands`, one per turn, with the task's
/// `files`; returns the commands' observations.
fn run_commands(sb: &Sandbox, files: &str, commands: &[String]) -> Vec<Value> {
    sb.write("environments/box.yaml", "kind: shell\nlimits: {command_timeout_s: 20}\n");
    let mut mock = String::new();
    for command in commands {
        mock.push_str(&format!(
            "      - tool_calls: [{{name: run_command, arguments: {}}}]\n",
            json!({ "command": command })
        ));
    }
    mock.push_str("      - text: ok\n");
    sb.write(
        "s.yaml",
        &format!(
            "suite: probe\nenvironment: box\nscorers: [{{includes: ok}}]\ntasks:\n  - id: t\n    input: go\n    files: {files}\n    mock:\n{mock}"
        ),
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let observations: Vec<Value> = tool_observations(&sb.events()).into_iter().cloned().collect();
    assert_eq!(observations.len(), commands.len() + 1, "{observations:?}");
    observations
}

fn exit_code(observation: &Value) -> i64 {
    observation["tool_result"]["exit_code"].as_i64().unwrap_or(-1)
}

/// Whether the file system under `path` keeps `user.` extended attributes.
fn has_user_xattrs(path: &Path) -> bool {
    let Ok(name) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else { return false };
    // SAFETY: a NUL-terminated path and attribute name, and a value of the length given.
    unsafe { libc::setxattr(name.as_ptr(), c"user.probe".as_ptr(), b"1".as_ptr().cast(), 1, 0) == 0 }
}

fn xattr(path: &Path, attr: &std::ffi::CStr) -> Option<Vec<u8>> {
    let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    let mut value = [0u8; 64];
    // SAFETY: a NUL-terminated path and name, and a buffer of the length given.
    let n = unsafe { libc::getxattr(name.as_ptr(), attr.as_ptr(), value.as_mut_ptr().cast(), value.len()) };
    (n >= 0).then(|| value[..n as usize].to_vec())
}

#[test]
fn as_root_a_command_cannot_change_the_mode_group_times_or_attributes_of_a_file_outside() {
    if !is_root() {
        eprintln!("skipped: runner is not root here, and root's power is what this test is about");
        return;
    }
    let sb = Sandbox::new();
    // A file the command cannot even read, in a folder it cannot list, of root's and of
    // another group: root owns it, so as its owner a root command needed no capability.
    let locked = sb.write("outside/locked", "secret");
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&locked, Some(0), Some(4242)).unwrap();
    std::fs::set_permissions(sb.path().join("outside"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let xattrs = has_user_xattrs(&sb.write("probe", "x"));
    if !xattrs {
        eprintln!("note: this file system keeps no user. attributes; the setxattr attempts are not checked");
    }
    let before = std::fs::metadata(&locked).unwrap();
    let l = locked.display();
    let setxattr = |path: &str| format!("python3 -c \"import os; os.setxattr('{path}', 'user.mark', b'1')\"");
    let commands = vec![
        format!("chmod 4777 {l}"),
        format!("chgrp 0 {l}"),
        format!("touch -d 2001-01-01 {l}"),
        setxattr(&l.to_string()),
        format!("chmod 4777 {}", sb.path().join("outside").display()),
    ];
    let obs = run_commands(&sb, "{}", &commands);
    for (i, o) in obs[..commands.len()].iter().enumerate() {
        assert_ne!(exit_code(o), 0, "`{}` succeeded: {o}", commands[i]);
    }
    let after = std::fs::metadata(&locked).unwrap();
    assert_eq!(after.mode() & 0o7777, 0o600, "the mode changed");
    assert_eq!((after.uid(), after.gid()), (0, 4242), "the owner or group changed");
    assert_eq!(after.mtime(), before.mtime(), "the times changed");
    if xattrs {
        assert_eq!(xattr(&locked, c"user.mark"), None, "an attribute was set");
    }
    let folder = std::fs::metadata(sb.path().join("outside")).unwrap();
    assert_eq!(folder.mode() & 0o7777, 0o700, "the folder's mode changed");
}

#[test]
fn as_root_a_command_still_changes_the_metadata_of_its_own_files_and_of_those_the_runner_wrote() {
    if !is_root() {
        eprintln!("skipped: runner is not root here, and root's power is what this test is about");
        return;
    }
    let sb = Sandbox::new();
    let xattrs = has_user_xattrs(&sb.write("probe", "x"));
    let setxattr = if xattrs {
        "python3 -c \"import os; os.setxattr('mine', 'user.mark', b'1'); print(os.getxattr('mine', 'user.mark'))\""
    } else {
        "echo \"b'1'\""
    };
    let commands = vec![
        // Files the command makes.
        "touch mine && chmod 4755 mine && stat -c %a mine".to_owned(),
        "touch -d 2001-01-01 mine && date -r mine +%Y".to_owned(),
        setxattr.to_owned(),
        "chgrp $(id -g) mine && echo grouped".to_owned(),
        // Files and folders the runner wrote from the task's files.
        "chmod +x run.sh && ./run.sh && echo more >> run.sh && tail -n 1 run.sh".to_owned(),
        "echo b > src/b.txt && cat src/a.txt src/b.txt".to_owned(),
    ];
    let files = "{run.sh: \"echo ran\\n\", src/a.txt: a}";
    let obs = run_commands(&sb, files, &commands);
    let stdout = |i: usize| obs[i]["tool_result"]["stdout"].as_str().unwrap_or_default().to_owned();
    assert_eq!(stdout(0), "4755\n", "{}", obs[0]);
    assert_eq!(stdout(1), "2001\n", "{}", obs[1]);
    assert_eq!(stdout(2), "b'1'\n", "{}", obs[2]);
    assert_eq!(stdout(3), "grouped\n", "{}", obs[3]);
    assert_eq!(stdout(4), "ran\nmore\n", "{}", obs[4]);
    assert_eq!(stdout(5), "ab\n", "{}", obs[5]);
}

#[test]
fn as_root_the_python_world_cannot_change_the_mode_of_a_file_outside_either() {
    if !is_root() || !crate::have_python() {
        eprintln!("skipped: runner is not root here, or there is no python");
        return;
    }
    let sb = Sandbox::new();
    let locked = sb.write("outside/locked", "secret");
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o600)).unwrap();
    let code = format!("__import__('os').chmod('{}', 0o4777)", locked.display());
    sb.write(
        "s.yaml",
        &format!(
            "suite: py\nenvironment: python\nscorers: [{{includes: ok}}]\ntasks:\n  - id: t\n    input: go\n    mock:\n      - tool_calls: [{{name: eval, arguments: {}}}]\n      - text: ok\n",
            json!({ "code": code })
        ),
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let obs = tool_observations(&sb.events())[0].clone();
    assert!(obs["error"].to_string().contains("PermissionError"), "{obs}");
    let mode = std::fs::metadata(&locked).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o600, "the python world changed the mode: {obs}");
}
