//! The file tools of `shell` and its world model, on a real temporary directory.

use serde_json::{Value, json};

use super::*;
use crate::environment::Definition;
use crate::image::ReadyImage;

/// A world over a fresh directory holding `files`, with output capped at `cap` bytes.
fn world_with(files: &[(&str, &str)], cap: usize) -> (tempfile::TempDir, ShellWorld) {
    let dir = tempfile::tempdir().unwrap();
    let mut definition = Definition::builtin(&Shell);
    definition.limits.output_cap_bytes = cap;
    let task =
        Task { files: files.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(), ..Task::new("t", "go") };
    let world = ShellWorld::create(&definition, &task, &SetupContext::new(dir.path(), "ep_test")).unwrap();
    (dir, world)
}

fn world(files: &[(&str, &str)]) -> (tempfile::TempDir, ShellWorld) {
    world_with(files, 32 * 1024)
}

async fn call(world: &ShellWorld, tool: &str, arguments: Value) -> Result<Value, ToolFailure> {
    call_as(world, &Actor::Main, tool, arguments).await
}

async fn call_as(world: &ShellWorld, actor: &Actor, tool: &str, arguments: Value) -> Result<Value, ToolFailure> {
    world.call(actor, tool, arguments).await
}

/// The failure of a call that must fail.
async fn failure(world: &ShellWorld, tool: &str, arguments: Value) -> ToolFailure {
    match call(world, tool, arguments.clone()).await {
        Ok(result) => panic!("{tool}({arguments}) succeeded: {result}"),
        Err(f) => f,
    }
}

fn content(world: &ShellWorld, name: &str) -> String {
    std::fs::read_to_string(world.root.join(name)).unwrap()
}

#[tokio::test]
async fn read_file_shows_numbered_lines_of_a_window_of_a_100k_line_file() {
    let text: String = (1..=100_000).map(|n| format!("line {n}\n")).collect();
    let (_dir, w) = world(&[("big.txt", &text)]);
    let read = call(&w, "read_file", json!({"path": "big.txt", "offset": 50_000, "limit": 3})).await.unwrap();
    assert_eq!(
        read["content"],
        " 50000\tline 50000\n 50001\tline 50001\n 50002\tline 50002\n[... 49998 more lines: read on with offset=50003 ...]\n"
    );
    assert_eq!((read["total_lines"].clone(), read["next_offset"].clone()), (json!(100_000), json!(50_003)));
    let last = call(&w, "read_file", json!({"path": "big.txt", "offset": 99_999})).await.unwrap();
    assert_eq!(last["content"], " 99999\tline 99999\n100000\tline 100000\n");
    assert_eq!(last["next_offset"], Value::Null);
    let past = failure(&w, "read_file", json!({"path": "big.txt", "offset": 100_001})).await;
    assert!(past.message.contains("has 100000 lines: offset 100001 is past its end"), "{}", past.message);
}

#[tokio::test]
async fn read_file_stops_at_the_byte_cap_and_says_where_to_go_on() {
    let text: String = (1..=1000).map(|n| format!("line {n}\n")).collect();
    let (_dir, w) = world_with(&[("f.txt", &text)], 200);
    let read = call(&w, "read_file", json!({"path": "f.txt"})).await.unwrap();
    let shown = read["lines_shown"].as_u64().unwrap();
    assert!(shown > 0 && shown < 20, "{read}");
    let content = read["content"].as_str().unwrap();
    assert!(content.ends_with(&format!("[... output cut at 200 bytes: read on with offset={} ...]\n", shown + 1)));
    assert!(content.len() < 200 + 80, "{content}");
}

#[tokio::test]
async fn read_file_cuts_a_long_line_and_numbers_a_file_without_a_final_newline() {
    let long = "x".repeat(10_000);
    let (_dir, w) = world(&[("f.txt", &format!("{long}\r\nlast"))]);
    let read = call(&w, "read_file", json!({"path": "f.txt"})).await.unwrap();
    let content = read["content"].as_str().unwrap();
    assert!(content.starts_with(&format!("     1\t{}", &long[..2000])), "{}", &content[..50]);
    assert!(content.contains(" [... line cut: 10001 bytes ...]\n     2\tlast\n"), "{}", &content[2000..]);
    assert_eq!(read["total_lines"], 2);
    let empty = world(&[("e.txt", "")]);
    assert_eq!(call(&empty.1, "read_file", json!({"path": "e.txt"})).await.unwrap()["total_lines"], 0);
}

#[tokio::test]
async fn read_file_refuses_a_binary_file() {
    let (_dir, w) = world(&[]);
    std::fs::write(w.root.join("b.bin"), b"\x7fELF\x00\x01\x02text").unwrap();
    let refused = failure(&w, "read_file", json!({"path": "b.bin"})).await;
    assert_eq!(refused.kind, ErrorType::ExecutionError);
    assert!(refused.message.contains("is a binary file"), "{}", refused.message);
    // A NUL past the first 8 KB does not make a text file binary.
    let mut late = vec![b'a'; 9000];
    late.push(0);
    std::fs::write(w.root.join("late.txt"), &late).unwrap();
    assert!(call(&w, "read_file", json!({"path": "late.txt"})).await.is_ok());
}

#[tokio::test]
async fn edit_file_replaces_one_exact_match_and_refuses_several_unless_replace_all() {
    let (_dir, w) = world(&[("f.txt", "a = 1\nb = 1\nc = 2\n")]);
    let unread = failure(&w, "edit_file", json!({"path": "f.txt", "old_string": "c = 2", "new_string": "c = 3"})).await;
    assert!(unread.message.contains("read it first"), "{}", unread.message);
    call(&w, "read_file", json!({"path": "f.txt"})).await.unwrap();

    let several = failure(&w, "edit_file", json!({"path": "f.txt", "old_string": "= 1", "new_string": "= 9"})).await;
    assert!(several.message.contains("occurs 2 times"), "{}", several.message);
    assert!(several.suggested_action.unwrap().contains("replace_all"));
    let missing = failure(&w, "edit_file", json!({"path": "f.txt", "old_string": "d = 4", "new_string": "x"})).await;
    assert!(missing.message.contains("old_string was not found in `f.txt`"), "{}", missing.message);
    let same = failure(&w, "edit_file", json!({"path": "f.txt", "old_string": "c", "new_string": "c"})).await;
    assert_eq!(same.kind, ErrorType::ValidationError);
    assert_eq!(content(&w, "f.txt"), "a = 1\nb = 1\nc = 2\n", "a refused edit changed the file");

    let one =
        call(&w, "edit_file", json!({"path": "f.txt", "old_string": "c = 2", "new_string": "c = 3"})).await.unwrap();
    assert_eq!(one["replacements"], 1);
    assert!(one["snippet"].as_str().unwrap().contains("     3\tc = 3\n"), "{one}");
    // Its own edit does not make the file stale to the agent.
    let all = json!({"path": "f.txt", "old_string": "= 1", "new_string": "= 9", "replace_all": true});
    assert_eq!(call(&w, "edit_file", all).await.unwrap()["replacements"], 2);
    assert_eq!(content(&w, "f.txt"), "a = 9\nb = 9\nc = 3\n");
    assert!(w.changed_files(&Actor::Main).await.is_empty());
}

#[tokio::test]
async fn a_write_or_edit_of_a_file_changed_since_it_was_read_is_refused_until_it_is_read_again() {
    let (_dir, w) = world(&[("f.txt", "one\n"), ("g.txt", "g\n")]);
    call(&w, "read_file", json!({"path": "f.txt"})).await.unwrap();
    assert!(w.changed_files(&Actor::Main).await.is_empty());
    call(&w, "run_command", json!({"command": "echo x >> f.txt"})).await.unwrap();

    assert_eq!(w.changed_files(&Actor::Main).await, ["f.txt"]);
    assert!(w.changed_files(&Actor::Main).await.is_empty(), "the same change was named twice");
    let write = failure(&w, "write_file", json!({"path": "./f.txt", "content": "mine"})).await;
    assert_eq!(write.message, "`./f.txt` changed since you last read it; read it again before writing it");
    let edit = failure(&w, "edit_file", json!({"path": "f.txt", "old_string": "one", "new_string": "two"})).await;
    assert!(edit.message.contains("changed since you last read it"), "{}", edit.message);
    assert_eq!(content(&w, "f.txt"), "one\nx\n");
    // A file never read may be written.
    call(&w, "write_file", json!({"path": "g.txt", "content": "new"})).await.unwrap();

    call(&w, "read_file", json!({"path": "f.txt"})).await.unwrap();
    call(&w, "edit_file", json!({"path": "f.txt", "old_string": "one", "new_string": "two"})).await.unwrap();
    call(&w, "write_file", json!({"path": "f.txt", "content": "mine\n"})).await.unwrap();
    assert!(w.changed_files(&Actor::Main).await.is_empty(), "its own writes are no change to it");
    call(&w, "run_command", json!({"command": "rm f.txt"})).await.unwrap();
    assert_eq!(w.changed_files(&Actor::Main).await, ["f.txt"], "a file removed is a change");
}

#[tokio::test]
async fn actors_share_the_world_and_each_keeps_its_own_model() {
    let (_dir, w) = world(&[("f.txt", "one\n")]);
    let sub = Actor::Subagent(vec![1]);
    call(&w, "read_file", json!({"path": "f.txt"})).await.unwrap();
    call_as(&w, &sub, "read_file", json!({"path": "f.txt"})).await.unwrap();
    call_as(&w, &sub, "write_file", json!({"path": "f.txt", "content": "sub\n"})).await.unwrap();
    assert!(w.changed_files(&sub).await.is_empty());
    assert_eq!(w.changed_files(&Actor::Main).await, ["f.txt"]);
    assert!(w.changed_files(&Actor::User).await.is_empty(), "an actor that touched nothing knows nothing");
}

#[tokio::test]
async fn glob_lists_matching_files_sorted_and_caps_the_list() {
    let (_dir, w) = world(&[("b.txt", ""), ("a.txt", ""), ("sub/c.txt", ""), ("sub/d.rs", "")]);
    let top = call(&w, "glob", json!({"pattern": "*.txt"})).await.unwrap();
    assert_eq!(top["files"], json!(["a.txt", "b.txt"]));
    let all = call(&w, "glob", json!({"pattern": "**/*.txt"})).await.unwrap();
    assert_eq!(all["files"], json!(["a.txt", "b.txt", "sub/c.txt"]));
    assert!(all.get("truncated").is_none());
    let bad = failure(&w, "glob", json!({"pattern": "a[.txt"})).await;
    assert_eq!(bad.kind, ErrorType::ValidationError);

    for n in 0..600 {
        std::fs::write(w.root.join(format!("many{n:03}.log")), "").unwrap();
    }
    let many = call(&w, "glob", json!({"pattern": "*.log"})).await.unwrap();
    assert_eq!(many["count"], 600);
    assert_eq!(many["files"].as_array().unwrap().len(), 500);
    assert!(many["truncated"].as_str().unwrap().contains("100 more files not shown"), "{}", many["truncated"]);
}

#[tokio::test]
async fn grep_gives_path_line_text_skips_binary_files_and_caps_matches() {
    let (_dir, w) = world(&[("a.txt", "alpha\nNeedle one\nbeta\n"), ("sub/b.md", "needle two\n"), ("c.txt", "none\n")]);
    std::fs::write(w.root.join("bin.dat"), b"needle\x00needle\n").unwrap();
    let found = call(&w, "grep", json!({"pattern": "needle"})).await.unwrap();
    assert_eq!(found["matches"], "sub/b.md:1:needle two\n");
    let found = call(&w, "grep", json!({"pattern": "needle", "ignore_case": true})).await.unwrap();
    assert_eq!(found["matches"], "a.txt:2:Needle one\nsub/b.md:1:needle two\n");
    let filtered = call(&w, "grep", json!({"pattern": "(?i)needle", "glob": "*.md"})).await.unwrap();
    assert_eq!(filtered["matches"], "sub/b.md:1:needle two\n");
    let one_file = call(&w, "grep", json!({"pattern": "a$", "path": "a.txt"})).await.unwrap();
    assert_eq!(one_file["matches"], "a.txt:1:alpha\na.txt:3:beta\n");
    let bad = failure(&w, "grep", json!({"pattern": "(unclosed"})).await;
    assert_eq!(bad.kind, ErrorType::ValidationError);
    assert!(bad.message.contains("invalid regular expression"), "{}", bad.message);

    let lines: String = (0..1000).map(|n| format!("hit {n}\n")).collect();
    std::fs::write(w.root.join("many.txt"), lines).unwrap();
    let capped = call(&w, "grep", json!({"pattern": "hit", "path": "many.txt"})).await.unwrap();
    assert_eq!(capped["count"], 200);
    assert!(capped["matches"].as_str().unwrap().ends_with("narrow the pattern, the path or the glob ...]\n"));
}

#[tokio::test]
async fn no_file_tool_reaches_outside_the_working_directory() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "secret needle\n").unwrap();
    let (_dir, w) = world(&[("in.txt", "needle\n")]);
    std::os::unix::fs::symlink(outside.path(), w.root.join("away")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret.txt"), w.root.join("link.txt")).unwrap();
    let secret = outside.path().join("secret.txt").display().to_string();
    for path in ["../x.txt", secret.as_str(), "away/secret.txt", "link.txt"] {
        let calls = [
            ("read_file", json!({"path": path})),
            ("write_file", json!({"path": path, "content": "pwned"})),
            ("edit_file", json!({"path": path, "old_string": "secret", "new_string": "pwned"})),
            ("grep", json!({"pattern": "needle", "path": path})),
        ];
        for (tool, arguments) in calls {
            let refused = failure(&w, tool, arguments).await;
            assert_eq!(refused.kind, ErrorType::PermissionError, "{tool} {path}: {}", refused.message);
        }
    }
    for pattern in ["../*", "/tmp/*"] {
        assert_eq!(failure(&w, "glob", json!({"pattern": pattern})).await.kind, ErrorType::PermissionError);
    }
    // A walk does not follow links: what they lead to is neither listed nor searched.
    let listed = call(&w, "glob", json!({"pattern": "**/*"})).await.unwrap();
    assert_eq!(listed["files"], json!(["in.txt"]));
    let found = call(&w, "grep", json!({"pattern": "needle"})).await.unwrap();
    assert_eq!(found["matches"], "in.txt:1:needle\n");
    assert_eq!(std::fs::read_to_string(outside.path().join("secret.txt")).unwrap(), "secret needle\n");
}

/// The host folder of the cgroup a process is in, from its `/proc/self/cgroup`: the pids
/// hierarchy's (cgroup v1) or the unified one's, where such a folder exists.
fn cgroup_folder(proc_cgroup: &str) -> Option<std::path::PathBuf> {
    let line = proc_cgroup.lines().find(|l| l.split(':').nth(1) == Some("pids"))?;
    let path = line.splitn(3, ':').nth(2)?.trim_start_matches('/');
    ["/sys/fs/cgroup/pids", "/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .iter()
        .map(|base| std::path::Path::new(base).join(path))
        .find(|folder| folder.join("cgroup.procs").exists())
}

#[tokio::test]
async fn a_world_that_runs_no_command_makes_no_sandbox_and_its_emptied_folder_goes_to_the_next() {
    let scratch = tempfile::tempdir().unwrap();
    let definition = Definition::builtin(&Shell);
    let context = SetupContext::new(scratch.path(), "ep_test");
    let files = [("in.txt".to_owned(), "x".to_owned()), ("a/b/c.txt".to_owned(), "y".to_owned())];
    let task = Task { files: files.into_iter().collect(), ..Task::new("t", "go") };
    let mut w = ShellWorld::create(&definition, &task, &context).unwrap();
    call(&w, "read_file", json!({"path": "in.txt"})).await.unwrap();
    call(&w, "write_file", json!({"path": "d/e/new.txt", "content": "z"})).await.unwrap();
    assert!(!w.sandbox.is_made(), "file tools need no sandbox");
    assert!(!w.tmp.exists(), "nor a temp dir");
    assert_eq!(w.describe()["sandbox"]["enabled"], true, "what it would enforce is recorded all the same");
    let (episode, first_root) = (w.root.parent().unwrap().to_owned(), w.root.clone());
    w.teardown().await;
    drop(w);
    assert_eq!(std::fs::read_dir(&first_root).unwrap().count(), 0, "its folder is kept, emptied");
    let mut next = ShellWorld::create(&definition, &Task::new("t", "go"), &context).unwrap();
    assert_eq!(next.root, first_root, "the next world has it");
    assert_eq!(call(&next, "list_dir", json!({})).await.unwrap()["entries"], json!([]), "with nothing of the last");
    // A folder a command ran in goes away with its world.
    call(&next, "run_command", json!({"command": "echo x > f"})).await.unwrap();
    next.teardown().await;
    drop(next);
    assert!(!episode.exists(), "a folder a command ran in is removed");
    let third = ShellWorld::create(&definition, &Task::new("t", "go"), &context).unwrap();
    assert_ne!(third.root, first_root, "and never given to another world");
}

#[tokio::test]
async fn a_worlds_sandbox_and_tmp_are_made_for_its_first_command_and_removed_with_it() {
    let (_dir, mut w) = world(&[("in.txt", "x")]);
    let episode = w.root.parent().unwrap().to_owned();
    let script = "echo made > \"$TMPDIR/t\" && cat \"$TMPDIR/t\"; echo x > ../escape; cat /proc/self/cgroup";
    let ran = call(&w, "run_command", json!({"command": script})).await.unwrap();
    let (out, err) = (ran["stdout"].as_str().unwrap(), ran["stderr"].as_str().unwrap());
    assert!(out.starts_with("made\n"), "the first command finds its TMPDIR: {ran}");
    assert!(err.contains("Permission denied") && !episode.join("escape").exists(), "confined from the first: {ran}");
    // SAFETY: geteuid cannot fail.
    let cgroup = if unsafe { libc::geteuid() } == 0 {
        let cgroup = cgroup_folder(out);
        assert!(out.contains("/world-") && cgroup.is_some(), "a root runner's command is in its world's cgroup: {out}");
        cgroup
    } else {
        None
    };
    w.teardown().await;
    assert!(!episode.exists(), "the episode's folder is removed, its temp dir with it");
    drop(w);
    if let Some(cgroup) = cgroup {
        assert!(!cgroup.exists(), "the world's cgroup {} is removed with it", cgroup.display());
    }
}

/// A layer with a shell and the libraries it needs, copied from the host and given to the
/// image's root (host id `place::ID_BASE`): the image the tests below run in.
fn shell_image(dir: &std::path::Path) -> ReadyImage {
    let layer = dir.join("layer");
    for file in ["/bin/dash", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"] {
        let to = layer.join(file.trim_start_matches('/'));
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(file, &to).unwrap();
    }
    std::os::unix::fs::symlink("dash", layer.join("bin/sh")).unwrap();
    std::fs::create_dir_all(layer.join("etc")).unwrap();
    std::fs::write(layer.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n")
        .unwrap();
    let mut all = vec![layer.clone()];
    let mut i = 0;
    while i < all.len() {
        if all[i].is_dir() && !all[i].is_symlink() {
            all.extend(std::fs::read_dir(&all[i]).unwrap().map(|e| e.unwrap().path()));
        }
        i += 1;
    }
    for path in &all {
        std::os::unix::fs::lchown(path, Some(place::ID_BASE), Some(place::ID_BASE)).unwrap();
    }
    ReadyImage {
        name: "test/shell".into(),
        layers: vec![layer],
        config: crate::image::ImageConfig {
            env: vec!["GREETING=hello from the image".into()],
            workdir: "/app".into(),
            user: "app".into(),
            ..Default::default()
        },
    }
}

/// A shell world in an image's root: the task's files land in the image's working folder
/// as its user's, commands run there with the image's variables as that user, the file
/// tools read and write the same files, and the world's paths are the image's.
#[tokio::test]
async fn a_world_in_an_images_root_runs_commands_and_tools_as_the_images_user() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        assert!(std::env::var_os("CI").is_none(), "image roots need a root runner, and CI runs as root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = shell_image(dir.path());
    let definition = Definition::builtin(&Shell);
    let task = Task { files: [("data.txt".to_owned(), "from the task\n".to_owned())].into(), ..Task::new("t", "go") };
    let scratch = dir.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let image = provider::RootfsImage(image);
    let mut w =
        ShellWorld::create_in_image(&definition, &task, &SetupContext::new(&scratch, "ep"), &image).await.unwrap();
    let script = "pwd; echo \"$GREETING\"; echo \"$HOME\"; while read l; do echo \"read: $l\"; done < data.txt; \
                  while read k v rest; do [ \"$k\" = Uid: ] && echo uid=$v; done < /proc/self/status; \
                  echo written > out.txt; echo /app/out.txt > /tmp/where";
    let ran = call(&w, "run_command", json!({"command": script})).await.unwrap();
    let out = ran["stdout"].as_str().unwrap();
    assert_eq!(ran["exit_code"], 0, "{ran}");
    assert!(out.starts_with("/app\nhello from the image\n/home/app\nread: from the task\nuid=1000\n"), "{ran}");
    let read = call(&w, "read_file", json!({"path": "out.txt"})).await.unwrap();
    assert!(read.to_string().contains("written"), "{read}");
    call(&w, "write_file", json!({"path": "sub/made.txt", "content": "by the tool\n"})).await.unwrap();
    let ran = call(
        &w,
        "run_command",
        json!({"command": "while read l; do echo $l; done < /app/sub/made.txt; echo more >> sub/made.txt"}),
    )
    .await
    .unwrap();
    assert_eq!((ran["exit_code"].as_i64(), ran["stdout"].as_str()), (Some(0), Some("by the tool\n")), "{ran}");
    let absolute = call(&w, "read_file", json!({"path": "/app/sub/made.txt"})).await.unwrap();
    assert!(absolute.to_string().contains("more"), "an absolute path is the image's: {absolute}");
    let outside = failure(&w, "read_file", json!({"path": "/etc/passwd"})).await;
    assert_eq!(outside.kind, ErrorType::PermissionError, "{}", outside.message);
    assert_eq!(w.describe()["cwd"], "/app");
    w.teardown().await;
}
