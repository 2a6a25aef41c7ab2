//! Escapes from the sandbox, each scripted with `mock:` turns: every attempt must fail and
//! leave nothing outside changed. Each kind of escape is also run once with the sandbox
//! off, where it succeeds, so that the test can tell.

use std::io::ErrorKind;
use std::net::{TcpListener, UdpSocket};

use serde_json::{Value, json};

use crate::{Sandbox, of_type, tool_observations};

/// Runs one episode of `shell` whose agent runs `commands`, one per turn; returns the
/// observations in order and the run.
fn run_commands(sb: &Sandbox, sandbox: &str, commands: &[&str], extra: &[&str]) -> (Vec<Value>, crate::Run) {
    sb.write("environments/box.yaml", &format!("kind: shell\nlimits: {{command_timeout_s: 20}}\nsandbox: {sandbox}\n"));
    let mut mock = String::new();
    for command in commands {
        mock.push_str(&format!(
            "      - tool_calls: [{{name: run_command, arguments: {}}}]\n",
            json!({ "command": command })
        ));
    }
    mock.push_str("      - text: ok\n");
    sb.write("s.yaml", &format!("suite: probe\nenvironment: box\nscorers: [{{includes: ok}}]\ntasks:\n  - id: t\n    input: go\n    mock:\n{mock}"));
    let _ = std::fs::remove_dir_all(sb.path().join("results"));
    let mut args = vec!["eval", "s.yaml", "--model", "mock", "--run-id", "test", "--out", "results", "-q"];
    args.extend_from_slice(extra);
    let run = sb.run(&args);
    let events = sb.events();
    let observations = tool_observations(&events).into_iter().cloned().collect();
    (observations, run)
}

fn output(observation: &Value) -> String {
    let result = if observation["tool_result"].is_null() { &observation["error"] } else { &observation["tool_result"] };
    format!("{}{}", result["stdout"].as_str().unwrap_or_default(), result["stderr"].as_str().unwrap_or_default())
}

fn first_info(sb: &Sandbox) -> Value {
    let events = sb.events();
    of_type(&events, "observation")[0]["observation"]["info"].clone()
}

#[test]
fn writes_outside_the_episode_folder_fail_by_every_path_and_change_nothing() {
    let sb = Sandbox::new();
    let outside = sb.write("outside.txt", "original");
    let o = outside.display();
    let commands = [
        format!("echo changed > {o}"),
        "cd .. && echo x > planted.txt".to_owned(),
        format!("ln -s {o} link && echo changed > link"),
        format!("ln {o} hard && echo changed > hard"),
        "echo inside > mine.txt && cat mine.txt".to_owned(),
    ];
    let commands: Vec<&str> = commands.iter().map(String::as_str).collect();
    let (obs, run) = run_commands(&sb, "on", &commands, &[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(obs.len(), 6, "five commands and the final answer: {obs:?}");
    for (i, o) in obs[..4].iter().enumerate() {
        assert_ne!(o["tool_result"]["exit_code"], 0, "escape {i} succeeded: {o}");
    }
    assert!(output(&obs[0]).contains("Permission denied"), "{}", obs[0]);
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "original");
    // The world's own folder stays writable.
    assert_eq!(obs[4]["tool_result"]["stdout"], "inside\n", "{}", obs[4]);
    assert_eq!(first_info(&sb)["sandbox"]["enabled"], true);

    // Unconfined, the same command does change the file.
    let (obs, _) = run_commands(&sb, "off", &commands[..1], &[]);
    assert_eq!(obs[0]["tool_result"]["exit_code"], 0, "{}", obs[0]);
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "changed\n");
}

#[test]
fn files_in_home_beside_the_suite_and_in_the_results_cannot_be_read() {
    let sb = Sandbox::new();
    let home = sb.path().join("home");
    let planted = sb.write("home/planted.txt", "secret-in-home");
    let command = format!(
        "cat {}; cat {}/s.yaml; ls {}/results; ls $HOME/..",
        planted.display(),
        sb.path().display(),
        sb.path().display()
    );
    sb.write("environments/box.yaml", "kind: shell\n");
    let args = ["eval", "s.yaml", "--model", "mock", "--run-id", "test", "--out", "results", "-q"];
    let mock = format!(
        "      - tool_calls: [{{name: run_command, arguments: {}}}]\n      - text: ok\n",
        json!({"command": command})
    );
    sb.write("s.yaml", &format!("suite: probe\nenvironment: box\nscorers: [{{includes: ok}}]\ntasks:\n  - id: t\n    input: go\n    mock:\n{mock}"));
    let out = sb.command().args(args).env("HOME", &home).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let events = sb.events();
    let obs = tool_observations(&events);
    let text = output(obs[0]);
    assert!(!text.contains("secret-in-home") && !text.contains("suite: probe"), "{text}");
    assert_eq!(text.matches("Permission denied").count(), 4, "{text}");
}

#[test]
fn no_tcp_or_udp_reaches_a_listener_on_localhost_unless_the_network_is_allowed() {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    udp.set_nonblocking(true).unwrap();
    let (tcp_port, udp_port) = (tcp.local_addr().unwrap().port(), udp.local_addr().unwrap().port());
    let connect = format!(
        "python3 -c 'import socket; s = socket.create_connection((\"127.0.0.1\", {tcp_port}), 2); s.sendall(b\"hi\"); print(\"tcp sent\")'"
    );
    let send = format!(
        "python3 -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b\"hi\", (\"127.0.0.1\", {udp_port})); print(\"udp sent\")'"
    );
    let v6 = "python3 -c 'import socket; socket.socket(socket.AF_INET6, socket.SOCK_STREAM); print(\"v6 made\")'";
    // A Unix socket by path could reach a daemon outside (Landlock does not check connect).
    let unix = "python3 -c 'import socket; socket.socketpair(); print(\"pair ok\"); socket.socket(socket.AF_UNIX); print(\"unix made\")'";
    let sb = Sandbox::new();
    let (obs, run) = run_commands(&sb, "on", &[&connect, &send, v6, unix], &[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(output(&obs[3]).starts_with("pair ok\n"), "{}", obs[3]);
    for o in &obs[..4] {
        let text = output(o);
        assert!(text.contains("PermissionError") && !text.contains("sent") && !text.contains(" made"), "{text}");
    }
    assert_eq!(tcp.accept().map(|_| ()).unwrap_err().kind(), ErrorKind::WouldBlock, "a connection came through");
    let mut buf = [0u8; 8];
    assert_eq!(udp.recv(&mut buf).unwrap_err().kind(), ErrorKind::WouldBlock, "a datagram came through");
    assert!(first_info(&sb)["sandbox"]["network"].as_str().unwrap().starts_with("blocked"));

    // With `network: true` both get through.
    let sb = Sandbox::new();
    let (obs, _) = run_commands(&sb, "{network: true}", &[&connect, &send], &[]);
    assert_eq!(obs[0]["tool_result"]["stdout"], "tcp sent\n", "{}", obs[0]);
    assert_eq!(obs[1]["tool_result"]["stdout"], "udp sent\n", "{}", obs[1]);
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(tcp.accept().is_ok());
    assert_eq!(udp.recv(&mut buf).unwrap(), 2);
}

#[test]
fn a_fork_bomb_stops_at_the_process_limit_and_leaves_nothing() {
    let sb = Sandbox::new();
    let bomb = "for i in $(seq 300); do sleep 59.25 & done; echo spawned-all";
    let (obs, run) = run_commands(&sb, "{limits: {processes: 40}}", &[bomb], &[]);
    assert_eq!(run.code, 0, "{run:?}");
    let text = output(&obs[0]);
    assert!(text.contains("fork") && !text.contains("spawned-all"), "{text}");
    assert!(crate::world_hazards::pids_with("sleep 59.25").is_empty(), "sleeps outlived the command");
}

#[test]
fn allocating_past_the_memory_limit_fails_inside_the_command() {
    let sb = Sandbox::new();
    let grab = "python3 -c 'b = bytearray(600 * 1024 * 1024); print(\"allocated\")'";
    let (obs, _) = run_commands(&sb, "{limits: {memory_mb: 300}}", &[grab], &[]);
    let text = output(&obs[0]);
    assert!(text.contains("MemoryError") && !text.contains("allocated"), "{text}");
    let (obs, _) = run_commands(&sb, "{limits: {memory_mb: 2048}}", &[grab], &[]);
    assert_eq!(obs[0]["tool_result"]["stdout"], "allocated\n", "{}", obs[0]);
}

#[test]
fn cpu_time_and_file_size_are_limited_per_process() {
    let sb = Sandbox::new();
    let (obs, _) = run_commands(
        &sb,
        "{limits: {cpu_s: 1, file_size_mb: 1}}",
        &["python3 -c 'while True: pass'", "head -c 3000000 /dev/zero > big; ls -l big | awk '{print $5}'"],
        &[],
    );
    // SIGXCPU at the soft limit (the shell reports its child's death as 128 + 24).
    assert_eq!(obs[0]["tool_result"]["exit_code"], 152, "{}", obs[0]);
    let text = output(&obs[1]);
    assert!(text.contains("File size limit exceeded") || text.contains("1048576"), "{text}");
}

#[test]
fn a_command_cannot_signal_its_keeper_or_read_the_runners_environment() {
    let sb = Sandbox::new();
    let command = "kill -9 $PPID; R=$(awk '/^PPid/ {print $2}' /proc/$PPID/status); \
                   cat /proc/$R/environ; tr '\\0' '\\n' < /proc/$PPID/environ; env; \
                   python3 -c \"import os, resource; resource.prlimit($R, resource.RLIMIT_NOFILE, (0, 0))\" 2>&1 | tail -1; \
                   python3 -c \"import os; os.setpriority(os.PRIO_PROCESS, $R, 19)\" 2>&1 | tail -1; echo alive";
    sb.write("environments/box.yaml", "kind: shell\n");
    let mock = format!(
        "      - tool_calls: [{{name: run_command, arguments: {}}}]\n      - text: ok\n",
        json!({"command": command})
    );
    sb.write("s.yaml", &format!("suite: probe\nenvironment: box\nscorers: [{{includes: ok}}]\ntasks:\n  - id: t\n    input: go\n    mock:\n{mock}"));
    let out = sb
        .command()
        .args(["eval", "s.yaml", "--model", "mock", "--run-id", "test", "--out", "results", "-q"])
        .env("OPENAI_API_KEY", "sk-sandbox-probe-0123456789")
        .env("RUNNER_PROBE_VALUE", "probe-value-not-a-key")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let events = sb.events();
    let obs = tool_observations(&events);
    let text = output(obs[0]);
    assert!(text.ends_with("alive\n") || text.contains("alive\n"), "{text}");
    assert!(text.contains("kill: Operation not permitted"), "the keeper could be signalled: {text}");
    assert_eq!(
        text.matches("PermissionError: [Errno 1] Operation not permitted").count(),
        2,
        "limits or priority: {text}"
    );
    assert!(!text.contains("probe-value-not-a-key") && !text.contains("[REDACTED]"), "{text}");
    let log = std::fs::read_to_string(sb.path().join("results/test/events.jsonl")).unwrap();
    assert!(!log.contains("sk-sandbox-probe"), "the key is in the log");
}

#[test]
fn the_sandbox_off_on_the_command_line_is_recorded() {
    let sb = Sandbox::new();
    let (obs, run) = run_commands(&sb, "on", &["grep CapEff /proc/self/status"], &["--sandbox", "off"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(first_info(&sb)["sandbox"], json!({"enabled": false, "turned_off_by": "the command line"}));
    assert_ne!(obs[0]["tool_result"]["stdout"], "CapEff:\t0000000000000000\n", "{}", obs[0]);
    let run_json: Value =
        serde_json::from_str(&std::fs::read_to_string(sb.path().join("results/test/run.json")).unwrap()).unwrap();
    assert_eq!(run_json["suites"][0]["sandbox"]["enabled"], false, "{run_json}");

    let (_, _) = run_commands(&sb, "on", &["true"], &[]);
    let run_json: Value =
        serde_json::from_str(&std::fs::read_to_string(sb.path().join("results/test/run.json")).unwrap()).unwrap();
    assert_eq!(run_json["suites"][0]["sandbox"]["enabled"], true, "{run_json}");
}
