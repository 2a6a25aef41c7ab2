//! Harbor task directories as suites, their verifier, and the oracle agent.

use std::os::unix::fs::PermissionsExt;

use serde_json::Value;

use crate::{Sandbox, of_type};

const SHIPPED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tasks/harbor");

/// A task's runner.yaml that runs it on the host, its image's stand-in.
const HOST: &str = "image: host\n";

/// Writes a task directory `tasks/NAME` with this Dockerfile and verifier; the verifier
/// and the solution are made executable.
fn task_dir(sb: &Sandbox, name: &str, dockerfile: &str, test_sh: &str, solve_sh: Option<&str>) {
    sb.write(
        &format!("tasks/{name}/task.toml"),
        "version = \"1.0\"\n[verifier]\ntimeout_sec = 20.0\n[agent]\ntimeout_sec = 30.0\n",
    );
    sb.write(&format!("tasks/{name}/instruction.md"), "Write /app/out.txt.\n");
    // The host stands in for the image: these tasks check what that stand-in does.
    sb.write(&format!("tasks/{name}/runner.yaml"), HOST);
    sb.write(&format!("tasks/{name}/environment/Dockerfile"), dockerfile);
    let mut scripts = vec![(format!("tasks/{name}/tests/test.sh"), test_sh)];
    if let Some(solve) = solve_sh {
        scripts.push((format!("tasks/{name}/solution/solve.sh"), solve));
    }
    for (path, text) in scripts {
        let path = sb.write(&path, text);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
}

fn outcomes(events: &[Value]) -> Vec<(String, Value)> {
    let started: Vec<(String, String)> = of_type(events, "episode_started")
        .iter()
        .map(|e| {
            (
                e["episode_id"].as_str().unwrap_or_default().to_owned(),
                e["task_id"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let mut found: Vec<(String, Value)> = of_type(events, "episode_finished")
        .iter()
        .map(|e| {
            let task =
                started.iter().find(|(id, _)| *id == e["episode_id"]).map(|(_, t)| t.clone()).unwrap_or_default();
            (task, e["outcome"].clone())
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

#[test]
fn the_shipped_tasks_pass_under_the_scripted_builtin_agent() {
    let sb = Sandbox::new();
    let run = sb.eval(&[SHIPPED]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let found = outcomes(&events);
    let tasks: Vec<&str> = found.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(tasks, ["count-words", "fix-sum", "greeting-file"]);
    for (task, outcome) in &found {
        assert_eq!(outcome["passed"], true, "{task}: {outcome}");
    }
    // The verifier's own reward is the score, and the model's turns came from runner.yaml.
    let scores = of_type(&events, "score");
    assert_eq!(scores.len(), 3);
    assert!(scores.iter().all(|s| s["scorer"] == "verifier"), "{scores:?}");
    assert!(scores.iter().any(|s| s["explanation"].as_str().unwrap_or_default().contains("reward 1 to reward.json")));
    assert!(!of_type(&events, "model_call").is_empty());
}

#[test]
fn the_shipped_tasks_pass_under_the_oracle_without_a_model() {
    let sb = Sandbox::new();
    let run = sb.run(&["eval", SHIPPED, "--agent", "oracle", "--run-id", "test", "--out", "results"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("oracle: all 3 episode(s) passed with their reference solution"), "{run:?}");
    let events = sb.events();
    assert!(of_type(&events, "model_call").is_empty(), "the oracle asks no model");
    let commands: Vec<&Value> =
        of_type(&events, "action_dispatched").into_iter().filter(|e| e["call"]["name"] == "run_command").collect();
    assert_eq!(commands.len(), 3, "one solve.sh per task");
}

#[test]
fn a_task_that_needs_its_image_or_a_missing_program_is_unscored_with_the_reason() {
    let sb = Sandbox::new();
    let reward = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n";
    task_dir(&sb, "custom-image", "FROM ghcr.io/example/custom-task-image:3\nWORKDIR /app\n", reward, None);
    let install = "FROM ubuntu:24.04\nRUN apt-get update && apt-get install -y runner-no-such-program\nWORKDIR /app\n";
    task_dir(&sb, "missing-program", install, reward, None);
    let run = sb.eval(&["tasks"]);
    assert_eq!(run.code, 3, "all unscored: {run:?}");
    let events = sb.events();
    let found = outcomes(&events);
    let (_, image) = &found[0];
    assert_eq!(image["status"], "unscored", "{image}");
    assert_eq!(image["cause"], "environment_error");
    let message = image["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("needs its image") && message.contains("ghcr.io/example/custom-task-image:3"),
        "{message}"
    );
    let (_, program) = &found[1];
    assert_eq!(program["cause"], "environment_error", "{program}");
    assert!(program["message"].as_str().unwrap_or_default().contains("`runner-no-such-program` is not installed here"));
    // Nothing ran: no model call, no verifier.
    assert!(of_type(&events, "model_call").is_empty() && of_type(&events, "score").is_empty());
    // validate says so too, and still accepts the tasks.
    let run = sb.run(&["validate", "tasks"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("cannot run here"), "{run:?}");
}

#[test]
fn a_verifier_that_writes_no_reward_or_crashes_is_unscored_never_zero() {
    let sb = Sandbox::new();
    let base = "FROM ubuntu:24.04\nWORKDIR /app\n";
    task_dir(&sb, "silent", base, "#!/bin/bash\necho checked\nexit 0\n", None);
    task_dir(&sb, "crashing", base, "#!/bin/bash\necho 'Traceback: boom' >&2\nexit 3\n", None);
    // The agent plants a reward where the verifier's goes: it is not taken.
    for name in ["silent", "crashing"] {
        let plant = "image: host\nmock:\n  - tool_calls: [{name: run_command, arguments: {command: \"mkdir -p .harbor/logs/verifier && echo 1 > .harbor/logs/verifier/reward.txt\"}}]\n  - text: done\n";
        sb.write(&format!("tasks/{name}/runner.yaml"), plant);
    }
    let run = sb.eval(&["tasks"]);
    assert_eq!(run.code, 3, "{run:?}");
    let found = outcomes(&sb.events());
    for (task, outcome) in &found {
        assert_eq!(outcome["status"], "unscored", "{task}: {outcome}");
        assert_eq!(outcome["cause"], "verifier_error", "{task}: {outcome}");
        assert!(outcome["message"].as_str().unwrap_or_default().contains("wrote no reward"), "{outcome}");
    }
    let crashing = &found.iter().find(|(t, _)| t == "crashing").expect("crashing ran").1;
    assert!(crashing["message"].as_str().unwrap_or_default().contains("exited 3: Traceback: boom"), "{crashing}");
}

#[test]
fn a_verifier_that_runs_a_program_this_host_lacks_is_unscored_whatever_it_wrote() {
    // The usual Harbor verifier: install the test tools, run them, write 0 when they fail.
    // Here the tool is not installed, so its 0 says nothing about the agent's work.
    let sb = Sandbox::new();
    let base = "FROM ubuntu:24.04\nWORKDIR /app\n";
    let test_sh = "#!/bin/bash\nuvx-not-on-this-host --with pytest pytest /tests/test_outputs.py\n\
                   if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n";
    task_dir(&sb, "needs-uvx", base, test_sh, Some("#!/bin/bash\necho done > /app/out.txt\n"));
    // A verifier whose programs are all here is scored as before.
    let plain = "#!/bin/bash\nif grep -q done /app/out.txt; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n";
    task_dir(&sb, "plain", base, plain, Some("#!/bin/bash\necho done > /app/out.txt\n"));
    let run =
        sb.run(&["eval", "tasks", "--agent", "oracle", "--max-unscored", "1", "--run-id", "test", "--out", "results"]);
    assert_eq!(run.code, 1, "{run:?}");
    let found = outcomes(&sb.events());
    let needs = &found.iter().find(|(t, _)| t == "needs-uvx").expect("needs-uvx ran").1;
    assert_eq!(needs["status"], "unscored", "{needs}");
    assert_eq!(needs["cause"], "environment_error", "{needs}");
    let message = needs["message"].as_str().unwrap_or_default();
    assert!(message.contains("ran `uvx-not-on-this-host`, which this host lacks"), "{message}");
    let plain = &found.iter().find(|(t, _)| t == "plain").expect("plain ran").1;
    assert_eq!(plain["status"], "scored", "{plain}");
    assert_eq!(plain["passed"], true, "{plain}");
}

#[test]
fn a_reward_reached_through_a_link_out_of_the_folder_is_not_read() {
    // Code the verifier runs swaps its reward folder for a link to a folder outside that
    // holds a passing reward: the runner reads no further than the episode's folder.
    let sb = Sandbox::new();
    let outside = sb.write("outside/reward.txt", "1\n");
    let outside = outside.parent().expect("a folder").display().to_string();
    let base = "FROM ubuntu:24.04\nWORKDIR /app\n";
    let test_sh = format!("#!/bin/bash\nrm -rf /logs/verifier && ln -s {outside} /logs/verifier\n");
    task_dir(&sb, "linked", base, &test_sh, Some("#!/bin/bash\ntrue\n"));
    let run =
        sb.run(&["eval", "tasks", "--agent", "oracle", "--max-unscored", "1", "--run-id", "test", "--out", "results"]);
    assert_eq!(run.code, 1, "{run:?}");
    let found = outcomes(&sb.events());
    let linked = &found.iter().find(|(t, _)| t == "linked").expect("linked ran").1;
    assert_eq!(linked["status"], "unscored", "{linked}");
    assert_eq!(linked["cause"], "verifier_error", "{linked}");
}

#[test]
fn binary_and_executable_files_are_copied_as_they_are() {
    let sb = Sandbox::new();
    let dockerfile = "FROM ubuntu:24.04\nWORKDIR /app\nCOPY data.bin run.sh /app/\n";
    let test_sh = "#!/bin/bash\nbytes=$(od -An -tx1 /app/data.bin | tr -d ' \\n')\n\
                   if [ -x /app/run.sh ] && [ \"$(/app/run.sh)\" = ok ] && [ \"$bytes\" = 00ff10 ]; then echo 1; else echo 0; fi \
                   > /logs/verifier/reward.txt\n";
    task_dir(&sb, "copies", dockerfile, test_sh, Some("#!/bin/bash\ntrue\n"));
    let data = sb.path().join("tasks/copies/environment/data.bin");
    std::fs::write(&data, [0x00u8, 0xff, 0x10]).expect("write data.bin");
    let script = sb.write("tasks/copies/environment/run.sh", "#!/bin/sh\necho ok\n");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let run = sb.run(&["eval", "tasks", "--agent", "oracle", "--run-id", "test", "--out", "results"]);
    assert_eq!(run.code, 0, "{run:?}");
    let found = outcomes(&sb.events());
    assert_eq!(found[0].1["passed"], true, "{found:?}");
}

#[test]
fn the_oracle_names_the_tasks_whose_solution_does_not_pass() {
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        "suite: s\nenvironment: shell\nscorers:\n  - check: \"grep -qx 42 answer.txt\"\ntasks:\n  \
         - {id: right, input: Write 42 to answer.txt., solution: [\"echo 42 > answer.txt\"]}\n  \
         - {id: wrong, input: Write 42 to answer.txt., solution: [\"echo 41 > answer.txt\"]}\n  \
         - {id: none, input: Write 42 to answer.txt.}\n",
    );
    let args = ["eval", "s.yaml", "--agent", "oracle", "--max-unscored", "1", "--run-id", "test", "--out", "results"];
    let run = sb.run(&args);
    assert_eq!(run.code, 1, "a task set that fails under the oracle fails the gate: {run:?}");
    assert!(run.stdout.contains("oracle: 2 of 3 episode(s) did not pass"), "{run:?}");
    assert!(run.stdout.contains("s/wrong: failed (score 0.00): check: `grep -qx 42 answer.txt` exited 1"), "{run:?}");
    assert!(run.stdout.contains("s/none: unscored (no_solution): task `none` has no reference solution"), "{run:?}");
    assert!(!run.stdout.contains("s/right:"), "{run:?}");
}

#[test]
fn the_container_paths_of_a_task_land_in_the_episode_folder() {
    let sb = Sandbox::new();
    // A Python verifier beside test.sh, reading /app and writing /logs: both are mapped.
    let dockerfile = "FROM ubuntu:24.04\nWORKDIR /app\nCOPY seed.txt /app/notes/seed.txt\n";
    let test_sh = "#!/bin/bash\ncd /app\nsh /tests/check.sh\n";
    task_dir(&sb, "paths", dockerfile, test_sh, Some("#!/bin/bash\ncat /app/notes/seed.txt > /app/out.txt\n"));
    sb.write("tasks/paths/environment/seed.txt", "seeded\n");
    sb.write(
        "tasks/paths/tests/check.sh",
        "if grep -qx seeded /app/out.txt; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n",
    );
    let run = sb.run(&["eval", "tasks/paths", "--agent", "oracle", "--run-id", "test", "--out", "results"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let started = of_type(&events, "episode_started");
    assert_eq!(outcomes(&events)[0].1["passed"], true, "{run:?}");
    assert_eq!(started.len(), 1);
}

/// A file of the host outside every task folder, and the text that must reach nothing
/// a task makes: the agent's folder, its input, the log, the tables.
const SECRET: &str = "host-secret-7f3a9c";

/// Asserts that `SECRET` is in no file below `dir` and not in what `run` printed.
fn assert_no_secret(dir: &std::path::Path, run: &crate::Run) {
    assert!(!run.stdout.contains(SECRET) && !run.stderr.contains(SECRET), "{run:?}");
    let mut pending = vec![dir.to_owned()];
    while let Some(path) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&path) else { continue };
        for entry in entries.flatten() {
            let kind = entry.file_type().expect("file type");
            if kind.is_dir() {
                pending.push(entry.path());
            } else if kind.is_file() {
                let bytes = std::fs::read(entry.path()).expect("read a result file");
                let text = String::from_utf8_lossy(&bytes);
                assert!(!text.contains(SECRET), "{} holds the host's secret", entry.path().display());
            }
        }
    }
}

/// `validate` and `eval` of `tasks/NAME` both refuse it (exit 2) with every part of
/// `expected` in stderr, and nothing of the host's secret gets out; returns stderr.
fn refused_without_the_secret(sb: &Sandbox, name: &str, expected: &[&str]) -> String {
    let target = format!("tasks/{name}");
    let run = sb.run(&["validate", &target]);
    assert_eq!(run.code, 2, "{name}: {run:?}");
    for part in expected {
        assert!(run.stderr.contains(part), "{name}: stderr lacks {part:?}: {run:?}");
    }
    assert_no_secret(sb.path(), &run);
    let eval = sb.run(&["eval", &target, "--agent", "oracle", "--run-id", "test", "--out", "results"]);
    assert_eq!(eval.code, 2, "{name}: {eval:?}");
    assert_no_secret(sb.path(), &eval);
    run.stderr
}

const REWARD: &str = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n";
const SOLVE: &str = "#!/bin/bash\ntrue\n";

#[test]
fn a_copy_from_an_absolute_or_parent_path_is_refused_at_its_dockerfile_line() {
    for how in ["absolute", "parent", "down-and-up"] {
        let sb = Sandbox::new();
        let host = Sandbox::new();
        let secret = host.write("secret.txt", SECRET);
        // From tasks/leak/environment/, four folders up is the temporary folders' own.
        let beside = format!("../../../../{}/secret.txt", host.path().file_name().expect("a name").to_string_lossy());
        let source = match how {
            "absolute" => secret.display().to_string(),
            "parent" => beside,
            _ => format!("sub/../{beside}"),
        };
        let dockerfile = format!("FROM ubuntu:24.04\nWORKDIR /app\n\nCOPY {source} ./secret.txt\n");
        task_dir(&sb, "leak", &dockerfile, REWARD, Some(SOLVE));
        sb.write("tasks/leak/environment/sub/keep.txt", "kept\n");
        let expected = ["tasks/leak/environment/Dockerfile:4:", &format!("`COPY {source}`"), "inside environment/"];
        refused_without_the_secret(&sb, "leak", &expected);
    }
}

#[test]
fn task_files_that_lead_out_of_the_task_folder_are_refused_not_read() {
    use std::os::unix::fs::symlink;
    let copy_of = |source: &str| format!("FROM ubuntu:24.04\nWORKDIR /app\nCOPY {source} ./{source}\n");
    // (task, Dockerfile, what the error names)
    let cases = [
        ("linked-source", copy_of("leak.txt"), vec!["environment/Dockerfile:3:", "environment/leak.txt leads out"]),
        (
            "linked-in-folder",
            copy_of("data"),
            vec!["environment/Dockerfile:3:", "environment/data/inner.txt leads out"],
        ),
        ("linked-instruction", copy_of("data"), vec!["tasks/linked-instruction/instruction.md: leads out"]),
        ("linked-tests", copy_of("data"), vec!["tasks/linked-tests/tests: leads out"]),
        ("linked-solution", copy_of("data"), vec!["tasks/linked-solution/solution/solve.sh: leads out"]),
        ("linked-environment", copy_of("data"), vec!["tasks/linked-environment/environment: leads out"]),
    ];
    for (name, dockerfile, expected) in cases {
        let sb = Sandbox::new();
        let host = Sandbox::new();
        let secret = host.write("secret.txt", SECRET);
        let outside = host.path().join("outside");
        for script in ["test.sh", "solve.sh"] {
            let path = host.write(&format!("outside/{script}"), &format!("#!/bin/bash\n# {SECRET}\n"));
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        std::fs::write(outside.join("Dockerfile"), copy_of("data")).expect("write");
        task_dir(&sb, name, &dockerfile, REWARD, Some(SOLVE));
        let task = sb.path().join("tasks").join(name);
        sb.write(&format!("tasks/{name}/environment/data/plain.txt"), "plain\n");
        let replace = |rel: &str, target: &std::path::Path| {
            let path = task.join(rel);
            if path.is_dir() {
                std::fs::remove_dir_all(&path).expect("remove");
            } else {
                std::fs::remove_file(&path).expect("remove");
            }
            symlink(target, &path).expect("link");
        };
        match name {
            "linked-source" => symlink(&secret, task.join("environment/leak.txt")).expect("link"),
            "linked-in-folder" => symlink(&secret, task.join("environment/data/inner.txt")).expect("link"),
            "linked-instruction" => replace("instruction.md", &secret),
            "linked-tests" => replace("tests", &outside),
            "linked-solution" => replace("solution", &outside),
            _ => replace("environment", &outside),
        }
        refused_without_the_secret(&sb, name, &expected);
    }
}

#[test]
fn links_that_stay_inside_the_task_folder_are_followed() {
    use std::os::unix::fs::symlink;
    let sb = Sandbox::new();
    let dockerfile = "FROM ubuntu:24.04\nWORKDIR /app\nCOPY alias.txt ./seed.txt\nCOPY data ./data\n";
    let test_sh = "#!/bin/bash\nif [ \"$(cat /app/seed.txt /app/data/inner.txt)\" = \"$(printf 'seeded\\nseeded')\" ]; \
                   then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n";
    task_dir(&sb, "inside", dockerfile, test_sh, Some(SOLVE));
    let task = sb.path().join("tasks/inside");
    sb.write("tasks/inside/environment/seed.txt", "seeded\n");
    sb.write("tasks/inside/docs/instruction.md", "instruction-marker-42: read /app/seed.txt.\n");

    std::fs::create_dir_all(task.join("environment/data")).expect("mkdir");
    symlink("seed.txt", task.join("environment/alias.txt")).expect("link");
    symlink("../seed.txt", task.join("environment/data/inner.txt")).expect("link");
    std::fs::remove_file(task.join("instruction.md")).expect("remove");
    symlink("docs/instruction.md", task.join("instruction.md")).expect("link");
    // `echo` answers with the task's input.
    let run = sb.run(&["eval", "tasks/inside", "--model", "echo", "--run-id", "test", "--out", "results"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    assert_eq!(outcomes(&events)[0].1["passed"], true, "{run:?}");
    let answer = of_type(&events, "final")[0].to_string();
    assert!(answer.contains("instruction-marker-42"), "the linked instruction is the input: {answer}");
}

#[test]
fn a_pipe_in_the_build_context_is_refused_not_read() {
    let sb = Sandbox::new();
    task_dir(&sb, "piped", "FROM ubuntu:24.04\nWORKDIR /app\nCOPY pipe ./pipe\n", REWARD, Some(SOLVE));
    let pipe =
        std::ffi::CString::new(sb.path().join("tasks/piped/environment/pipe").display().to_string()).expect("a path");
    // SAFETY: mkfifo with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(pipe.as_ptr(), 0o644) }, 0, "mkfifo");
    // Read without a writer, the pipe would block the load for ever: a watchdog ends it.
    let child =
        sb.command().args(["validate", "tasks/piped"]).stderr(std::process::Stdio::piped()).spawn().expect("run");
    let id = child.id() as i32;
    let watchdog = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(60));
        // SAFETY: kill of the child this test started (gone already: ESRCH, ignored).
        unsafe { libc::kill(id, libc::SIGKILL) };
    });
    let output = child.wait_with_output().expect("wait");
    drop(watchdog);
    let run = crate::Run::from(output);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("environment/pipe is neither a regular file nor a folder"), "{run:?}");
}
