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
    run_commands_in(sb, "kind: shell\nlimits: {command_timeout_s: 20}\n", files, commands)
}

/// [`run_commands`] in a world of the `environment` given (the YAML of its file).
fn run_commands_in(sb: &Sandbox, environment: &str, files: &str, commands: &[String]) -> Vec<Value> {
    sb.write("environments/box.yaml", environment);
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

/// The user and capabilities in a `/proc/PID/status`: the `Uid:` line's four ids, and the
/// permitted and effective sets.
fn ids_and_capabilities(status: &str) -> (Vec<u32>, u64, u64) {
    let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).unwrap_or_default().trim().to_owned();
    let uids = field("Uid:").split_whitespace().filter_map(|id| id.parse().ok()).collect();
    let set = |name: &str| u64::from_str_radix(&field(name), 16).unwrap_or(u64::MAX);
    (uids, set("CapPrm:"), set("CapEff:"))
}

/// `CAP_DAC_READ_SEARCH`, the one capability a root runner's commands keep.
const DAC_READ_SEARCH: u64 = 1 << 2;

/// A command cannot get a capability back, nor root's uid, by running a program that has
/// file capabilities or is set-user-ID root: `no_new_privs` keeps `exec` from adding any
/// (the sandbox no longer empties the bounding set, which would also stop them). The same
/// programs run by that user without `no_new_privs` get both, so that the test can tell.
#[test]
fn as_root_a_command_gains_no_capability_or_uid_from_a_set_user_id_or_file_capability_program() {
    use std::os::unix::process::CommandExt;
    if !is_root() {
        eprintln!("skipped: runner is not root here, and root's power is what this test is about");
        return;
    }
    let sb = Sandbox::new();
    // A folder of its own, which the user the programs run as may search.
    let folder = tempfile::tempdir().unwrap();
    let programs = folder.path();
    std::fs::set_permissions(programs, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cat = std::fs::canonicalize("/bin/cat").unwrap();
    let (setuid, capable) = (programs.join("setuid-cat"), programs.join("capable-cat"));
    std::fs::copy(&cat, &setuid).unwrap();
    std::fs::set_permissions(&setuid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    std::fs::copy(&cat, &capable).unwrap();
    // `struct vfs_cap_data`, revision 2, effective at once: owning and changing any file,
    // killing, any uid and gid, and CAP_SYS_ADMIN. (An `exec` that cannot grant all of a
    // file's permitted set fails: these are in any bounding set root usually has.)
    let wanted: u32 = (1 << 0) | (1 << 3) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 21);
    let mut caps = Vec::new();
    for word in [0x0200_0001u32, wanted, 0, 0, 0] {
        caps.extend_from_slice(&word.to_le_bytes());
    }
    let path = std::ffi::CString::new(capable.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path and attribute name, and a value of the length given.
    let set =
        unsafe { libc::setxattr(path.as_ptr(), c"security.capability".as_ptr(), caps.as_ptr().cast(), caps.len(), 0) };
    assert_eq!(set, 0, "file capabilities: {}", std::io::Error::last_os_error());

    // Without no_new_privs, a user who has no capability gets them, or root's uid.
    let unconfined = |program: &Path| {
        // std drops the supplementary groups too, as root changing user.
        let output = std::process::Command::new(program).arg("/proc/self/status").uid(65_123).gid(65_123).output();
        let output = output.unwrap();
        assert!(output.status.success(), "{output:?}");
        ids_and_capabilities(&String::from_utf8_lossy(&output.stdout))
    };
    let (uids, _, _) = unconfined(&setuid);
    assert!(uids.contains(&0), "the set-user-ID copy gave no root uid unconfined: {uids:?}");
    let (_, permitted, effective) = unconfined(&capable);
    assert_eq!((permitted, effective), (wanted.into(), wanted.into()), "the file's capabilities unconfined");

    let environment =
        format!("kind: shell\nlimits: {{command_timeout_s: 20}}\nsandbox: {{read_paths: [{}]}}\n", programs.display());
    let commands = [&setuid, &capable].map(|p| format!("{} /proc/self/status", p.display()));
    let obs = run_commands_in(&sb, &environment, "{}", &commands);
    for (i, o) in obs[..commands.len()].iter().enumerate() {
        assert_eq!(exit_code(o), 0, "`{}`: {o}", commands[i]);
        let (uids, permitted, effective) = ids_and_capabilities(o["tool_result"]["stdout"].as_str().unwrap_or(""));
        assert!(uids.len() == 4 && !uids.contains(&0), "`{}` ran with root's uid: {uids:?}", commands[i]);
        assert_eq!(permitted & !DAC_READ_SEARCH, 0, "`{}` gained capabilities {permitted:x}", commands[i]);
        assert_eq!(effective & !DAC_READ_SEARCH, 0, "`{}` gained capabilities {effective:x}", commands[i]);
    }
}
