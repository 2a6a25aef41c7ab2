//! `agent: {kind: cli}` through `runner eval`: a command-line agent that owns its loop runs in
//! the shell world's folder, in the sandbox, with the model gateway as its only network; its
//! trajectory is derived from its model traffic.

use crate::{Sandbox, have_python, of_type};

const AGENT: &str = include_str!("../../examples/agents/urllib_cli_agent.py");

/// A suite of one task whose `cli` agent is `command`, with the example agent in its folder.
fn suite(command: &str, extra_task: &str) -> String {
    let agent: String = AGENT.lines().map(|l| format!("        {l}\n")).collect();
    format!(
        "suite: cli\nenvironment: shell\nagent: {{kind: cli, command: {command}}}\nlimits: {{max_steps: 10, time_s: 60}}\n\
         tasks:\n  - id: two-step\n    input: Write hello into a.txt, then say done.\n    files:\n      agent.py: |\n{agent}\
         \x20   scorers:\n      - equals: done\n      - tool_called: write_file\n      - file_contains: {{path: a.txt, text: hello}}\n\
         \x20   mock:\n      - tool_calls: [{{name: write_file, arguments: {{path: a.txt, content: hello}}}}]\n      - text: done\n{extra_task}"
    )
}

#[test]
fn a_cli_agent_passes_a_two_step_task_with_its_trajectory_derived_from_the_gateway() {
    if !have_python() {
        return;
    }
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite("[python3, agent.py]", ""));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let dispatched: Vec<&str> =
        of_type(&events, "action_dispatched").iter().filter_map(|e| e["call"]["name"].as_str()).collect();
    assert_eq!(dispatched, ["write_file", "final_answer"], "{events:#?}");
    let observed = of_type(&events, "observation");
    // The mock names its call by the model call's step: the first call is step 1.
    assert!(
        observed.iter().any(|o| o["observation"]["call_id"] == "call_01_0"
            && o["observation"]["tool_result"] == "wrote 5 bytes to a.txt"),
        "the agent's own result is the call's observation: {observed:#?}"
    );
    assert_eq!(of_type(&events, "model_call").len(), 2);
    let exited = of_type(&events, "agent_exited");
    assert_eq!(exited[0]["exit_code"], 0, "{exited:?}");
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished[0]["outcome"]["passed"], true, "{finished:?}");
    assert_eq!(finished[0]["tool_calls"], 2, "the derived call and the final answer");
    // How the program ended is in `episode_finished` too.
    let program = &finished[0]["agent_program"];
    assert_eq!(program["exit"], "exit code 0", "{program}");
    assert!(program["wall_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{program}");
}

#[test]
fn a_cli_command_that_is_not_installed_is_refused() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite("[./missing/agent.py]", ""));
    let run = sb.run(&["validate", "s.yaml"]);
    assert_ne!(run.code, 0, "{run:?}");
    assert!(run.stderr.contains("s.yaml:3") && run.stderr.contains("is not installed"), "{run:?}");

    sb.write("s.yaml", &suite("[no-such-agent-program]", ""));
    let run = sb.eval(&["s.yaml"]);
    let events = sb.events();
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished[0]["outcome"]["status"], "unscored", "{run:?}");
    assert!(finished[0]["outcome"]["message"].as_str().unwrap().contains("`no-such-agent-program` is not installed"));
}

#[test]
fn a_cli_agent_that_never_exits_is_killed_at_its_time_limit() {
    if !have_python() {
        return;
    }
    let sb = Sandbox::new();
    let suite = "suite: cli\nenvironment: shell\nlimits: {time_s: 1}\n\
                 agent: {kind: cli, command: [python3, -c, \"import subprocess, time; subprocess.Popen(['sleep', '317']); time.sleep(300)\"]}\n\
                 tasks:\n  - {id: t, input: wait, scorers: [{equals: x}], mock: [{text: x}]}\n";
    sb.write("s.yaml", suite);
    let started = std::time::Instant::now();
    let run = sb.eval(&["s.yaml"]);
    assert!(started.elapsed().as_secs() < 20, "{run:?}");
    let events = sb.events();
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished[0]["termination"], "time_limit", "{run:?}");
    let left = std::process::Command::new("pgrep").args(["-f", "sleep 317"]).output().unwrap();
    assert!(String::from_utf8_lossy(&left.stdout).trim().is_empty(), "its whole tree was killed");
}

/// The program's exit ends the turn, though a child it left running holds its output open.
#[test]
fn a_cli_agent_that_leaves_a_child_running_answers_when_it_exits() {
    let sb = Sandbox::new();
    let suite = "suite: cli\nenvironment: shell\nlimits: {time_s: 20}\n\
                 agent: {kind: cli, command: [sh, -c, \"sleep 100 & echo done\"]}\n\
                 tasks:\n  - {id: t, input: go, scorers: [{equals: done}], mock: [{text: x}]}\n";
    sb.write("s.yaml", suite);
    let run = sb.eval(&["s.yaml"]);
    let events = sb.events();
    let exited = of_type(&events, "agent_exited");
    assert_eq!(exited.len(), 1, "{run:?}");
    assert_eq!(exited[0]["exit_code"], 0, "{exited:?}");
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished[0]["termination"], "final_answer", "{finished:?}");
    assert_eq!(finished[0]["outcome"]["passed"], true, "the answer is kept: {finished:?}");
    assert_eq!(run.code, 0, "{run:?}");
}

#[test]
fn a_cli_agent_reaches_its_gateway_and_no_other_local_listener() {
    if !have_python() {
        return;
    }
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = other.local_addr().unwrap().port();
    other.set_nonblocking(true).unwrap();
    let probe = format!(
        "import json, os, socket, urllib.request\n\
         def reach(port):\n    try:\n        socket.create_connection(('127.0.0.1', port), timeout=3).close(); return 'connected'\n    except OSError as e:\n        return 'refused'\n\
         r = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', json.dumps({{'model': 'm', 'messages': [{{'role': 'user', 'content': 'hi'}}]}}).encode(), {{'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY'], 'Content-Type': 'application/json'}})\n\
         answer = json.load(urllib.request.urlopen(r))['choices'][0]['message']['content']\n\
         print(answer, reach({port}))\n"
    );
    let indented: String = probe.lines().map(|l| format!("        {l}\n")).collect();
    let suite = format!(
        "suite: cli\nenvironment: shell\nagent: {{kind: cli, command: [python3, probe.py]}}\n\
         tasks:\n  - id: t\n    input: go\n    files:\n      probe.py: |\n{indented}\
         \x20   scorers: [{{equals: \"hi refused\"}}]\n    mock: [{{text: hi}}]\n"
    );
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite);
    let run = sb.eval(&["s.yaml"]);
    let events = sb.events();
    let finals = of_type(&events, "final");
    assert_eq!(finals[0]["answer"], "hi refused", "the gateway answered, the other listener was out of reach: {run:?}");
    assert!(other.accept().is_err(), "the other listener saw no connection");
}

/// Every way out of a `cli` agent's sandbox but TCP to its gateway: MPTCP, TCP Fast Open
/// (`sendto` with `MSG_FASTOPEN`, `TCP_FASTOPEN_CONNECT`), `listen` on an unbound socket, UDP,
/// raw, Unix (abstract), netlink, vsock and SCTP sockets. Kept whatever the kernel: a later one
/// may close some of these gaps itself.
#[test]
fn a_cli_agent_reaches_no_listener_by_any_socket_but_its_gateway() {
    use std::io::ErrorKind;
    use std::os::linux::net::SocketAddrExt;
    if !have_python() {
        return;
    }
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let name = format!("runner-escape-{}", std::process::id());
    let unix = std::os::unix::net::UnixListener::bind_addr(
        &std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap(),
    )
    .unwrap();
    for nonblocking in [tcp.set_nonblocking(true), udp.set_nonblocking(true), unix.set_nonblocking(true)] {
        nonblocking.unwrap();
    }
    let (tcp_port, udp_port) = (tcp.local_addr().unwrap().port(), udp.local_addr().unwrap().port());
    let agent: String = include_str!("../fixtures/cli/escapes.py").lines().map(|l| format!("        {l}\n")).collect();
    let suite = format!(
        "suite: cli\nenvironment: shell\nagent: {{kind: cli, command: [python3, escapes.py, '{tcp_port}', '{udp_port}', {name}]}}\n\
         limits: {{time_s: 60}}\ntasks:\n  - id: t\n    input: go\n    files:\n      escapes.py: |\n{agent}\
         \x20   scorers: [{{includes: hi}}]\n    mock: [{{text: hi}}]\n"
    );
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite);
    let run = sb.eval(&["s.yaml"]);
    let events = sb.events();
    let finals = of_type(&events, "final");
    let answer = finals.first().and_then(|f| f["answer"].as_str()).unwrap_or_default();
    let seen: serde_json::Value = serde_json::from_str(answer).unwrap_or_else(|_| panic!("{answer}\n{run:?}"));
    assert_eq!(seen["answer"], "hi", "the gateway answered: {seen}");
    let attempts = seen.as_object().unwrap().iter().filter(|(k, _)| *k != "answer");
    let through: Vec<String> = attempts
        .filter(|(_, v)| !v.as_str().is_some_and(|v| v.starts_with("failed: ")))
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    assert!(through.is_empty(), "ways out that worked: {through:?}");
    assert_eq!(seen.as_object().unwrap().len(), 14, "every attempt was made: {seen}");
    assert_eq!(tcp.accept().map(|_| ()).unwrap_err().kind(), ErrorKind::WouldBlock, "a connection came through");
    assert_eq!(udp.recv(&mut [0u8; 16]).unwrap_err().kind(), ErrorKind::WouldBlock, "a datagram came through");
    assert_eq!(unix.accept().map(|_| ()).unwrap_err().kind(), ErrorKind::WouldBlock, "a Unix connection came through");
}

#[test]
fn a_cli_agent_flooding_its_output_is_capped_with_a_marker() {
    if !have_python() {
        return;
    }
    let sb = Sandbox::new();
    let flood = "import sys; sys.stderr.write('e' * 3000000); sys.stdout.write('x' * 3000000)";
    let suite = format!(
        "suite: cli\nenvironment: shell\nagent: {{kind: cli, command: [python3, -c, \"{flood}\"]}}\n\
         tasks:\n  - {{id: t, input: go, scorers: [{{includes: truncated}}], mock: [{{text: x}}]}}\n"
    );
    sb.write("s.yaml", &suite);
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let answer = of_type(&events, "final")[0]["answer"].as_str().unwrap().to_owned();
    assert!(
        answer.len() < 1_100_000 && answer.ends_with("[... output truncated: showing 1048576 of 3000000 bytes ...]")
    );
    let tail = of_type(&events, "agent_exited")[0]["stderr_tail"].as_str().unwrap().to_owned();
    assert!(tail.len() <= 4096 + 100 && tail.contains("output truncated"), "{}", tail.len());
}

#[test]
fn a_cli_agents_setup_runs_in_its_world_first_and_its_env_reaches_it() {
    let sb = Sandbox::new();
    // The setup writes a file (its template rendered), the agent reads it and its own
    // variable, and prints both: its answer.
    let suite = "suite: cli\nenvironment: shell\n\
                 agent:\n  kind: cli\n  setup: [\"echo 'made for {{ id }}' > made.txt\"]\n  env: {GREETING: hi}\n  \
                 command: [sh, -c, \"echo \\\"$GREETING, $(cat made.txt)\\\"\"]\n\
                 tasks:\n  - {id: t1, input: x, scorers: [{equals: \"hi, made for t1\"}], mock: [{text: unused}]}\n";
    sb.write("s.yaml", suite);
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");

    // A setup command that fails: the agent never starts, and the episode is unscored.
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite.replace("echo 'made for {{ id }}' > made.txt", "echo broken >&2; exit 4"));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 3, "{run:?}");
    let events = sb.events();
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished[0]["outcome"]["cause"], "environment_error", "{finished:?}");
    let message = finished[0]["outcome"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("setup command `echo broken >&2; exit 4` exited 4: broken"), "{message}");
    assert!(of_type(&events, "agent_exited").is_empty(), "the agent did not start");
}

#[test]
fn an_answer_file_that_links_out_of_the_folder_is_not_read() {
    let sb = Sandbox::new();
    let secret = sb.write("outside/secret.txt", "the host's secret");
    let suite = format!(
        "suite: cli\nenvironment: shell\nagent: {{kind: cli, command: [ln, -s, {}, answer.txt], answer: {{file: answer.txt}}}}\n\
         tasks:\n  - {{id: t, input: x, scorers: [{{equals: x}}], mock: [{{text: x}}]}}\n",
        secret.display()
    );
    sb.write("s.yaml", &suite);
    let _ = sb.eval(&["s.yaml"]);
    let events = sb.events();
    let finals = of_type(&events, "final");
    assert!(!format!("{finals:?}").contains("the host's secret"), "{finals:?}");
    assert!(!std::fs::read_to_string(sb.path().join("results/test/events.jsonl")).unwrap().contains("host's secret"));
}

/// Claude Code as installed by `scripts/install-test-servers.sh`, when it installed.
fn claude_code_package() -> Option<std::path::PathBuf> {
    let servers = match std::env::var_os("RUNNER_TEST_SERVERS") {
        Some(dir) => std::path::PathBuf::from(dir),
        None => {
            std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/runner-test-servers")
        }
    };
    let modules = servers.join("node_modules");
    let program = modules.join("@anthropic-ai/claude-code/bin/claude.exe");
    if !program.is_file() {
        eprintln!("skipped: Claude Code is not installed at {} (scripts/install-test-servers.sh)", program.display());
        return None;
    }
    Some(modules)
}

#[test]
fn claude_code_as_a_cli_agent_passes_a_scripted_task_with_its_trajectory() {
    let Some(modules) = claude_code_package() else { return };
    let sb = Sandbox::new();
    sb.write("environments/claude.yaml", &format!("kind: shell\nsandbox: {{read_paths: [{}]}}\n", modules.display()));
    let program = modules.join("@anthropic-ai/claude-code/bin/claude.exe");
    let suite = format!(
        "suite: claude-code\nenvironment: claude\nagent:\n  kind: cli\n  \
         env: {{IS_SANDBOX: \"1\", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: \"1\"}}\n  \
         command: [{}, -p, \"{{{{ input }}}}\", --dangerously-skip-permissions]\n\
         limits: {{max_steps: 10, time_s: 120}}\ntasks:\n  - id: two-step\n    \
         input: Write hello into a.txt, then say done.\n    \
         scorers: [{{equals: done}}, {{tool_called: Bash}}, {{file_contains: {{path: a.txt, text: hello}}}}]\n    \
         mock:\n      - tool_calls: [{{name: Bash, arguments: {{command: \"echo hello > a.txt\", description: Write the file}}}}]\n      \
         - text: done\n",
        program.display()
    );
    sb.write("s.yaml", &suite);
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let bash: Vec<&serde_json::Value> =
        of_type(&events, "action_dispatched").into_iter().filter(|e| e["call"]["name"] == "Bash").collect();
    assert_eq!(bash.len(), 1, "{events:#?}");
    let id = &bash[0]["call"]["call_id"];
    let seen = of_type(&events, "observation").into_iter().find(|o| &o["observation"]["call_id"] == id);
    assert!(
        seen.is_some_and(|o| o["observation"]["error"].is_null()),
        "its result is the call's observation: {events:#?}"
    );
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished[0]["outcome"]["passed"], true, "{finished:?}");
}

#[test]
fn max_steps_counts_a_cli_agents_model_calls() {
    if !have_python() {
        return;
    }
    // Two model calls (a tool call, then the answer): `max_steps: 2` allows both.
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite("[python3, agent.py]", "").replace("max_steps: 10", "max_steps: 2"));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let steps: Vec<u64> = of_type(&events, "model_call").iter().filter_map(|c| c["step"].as_u64()).collect();
    assert_eq!(steps, [1, 2], "{events:#?}");
    assert!(of_type(&events, "gateway_refused").is_empty(), "{events:#?}");
}

#[test]
fn a_cli_agent_that_prints_before_it_reads_a_long_input_does_not_wedge() {
    // 200 KB out before reading 200 KB in: both pipes fill unless the input is written while
    // the output is read.
    let sb = Sandbox::new();
    let input = "x".repeat(200_000);
    let suite = format!(
        "suite: cli\nenvironment: shell\nlimits: {{time_s: 10}}\n\
         agent: {{kind: cli, command: [sh, -c, \"head -c 200000 /dev/zero | tr '\\\\000' a; echo; wc -c; echo done\"]}}\n\
         tasks:\n  - {{id: t, input: {input}, scorers: [{{includes: done}}, {{includes: \"200000\"}}], mock: [{{text: x}}]}}\n"
    );
    sb.write("s.yaml", &suite);
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{}", run.stdout);
    let finished = of_type(&sb.events(), "episode_finished").into_iter().cloned().collect::<Vec<_>>();
    assert_eq!(finished[0]["termination"], "final_answer", "{finished:?}");
}

#[test]
fn a_program_the_sandbox_may_not_read_names_its_folder_and_the_read_paths_to_add() {
    let sb = Sandbox::new();
    let elsewhere = tempfile::tempdir().unwrap();
    let program = elsewhere.path().join("agent.sh");
    std::fs::write(&program, "#!/bin/sh\necho done\n").unwrap();
    std::fs::set_permissions(&program, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let suite = format!(
        "suite: cli\nenvironment: shell\nagent: {{kind: cli, command: [{}]}}\n\
         tasks:\n  - {{id: t, input: go, scorers: [{{equals: done}}], mock: [{{text: x}}]}}\n",
        program.display()
    );
    sb.write("s.yaml", &suite);
    let run = sb.eval(&["s.yaml"]);
    let events = sb.events();
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished[0]["outcome"]["status"], "unscored", "{run:?}");
    assert_eq!(finished[0]["outcome"]["cause"], "environment_error");
    let message = finished[0]["outcome"]["message"].as_str().unwrap();
    let folder = elsewhere.path().canonicalize().unwrap();
    assert!(message.contains(&format!("read_paths: [{}]", folder.display())), "{message}");
    assert!(message.contains("os error 13"), "{message}");
    // The terminal says why, not only the log.
    assert!(run.stdout.contains("read_paths"), "{run:?}");
}
