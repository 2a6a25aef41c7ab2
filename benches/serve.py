"""The benchmark of `runner serve` (run by benches/serve.sh): the server's own CPU per
episode and per step beyond the episodes' work, episodes per second with `mock` at 64 at
once, and the server's memory over many episodes.

- Episodes: 64 threads, each on its own kept-alive connection, POST /v1/episodes with
  `"model": "mock"` one after another until N episodes have ended. The server's CPU time
  (utime + stime of its process) per episode, minus that of `runner eval --model mock` per
  episode of the same suite (the episodes' own work: world, agent, log), is the server's
  overhead per episode; over the steps an episode takes, per step.
- Steps: 64 threads drive HTTP step sessions (/reset, then /step until done); the server's
  CPU per /step call minus the eval's CPU per step is the step API's overhead per step.
- Memory: the server's RSS after each tenth of the episodes.

usage: serve.py RUNNER SUITE EPISODES STEP_SESSIONS
"""

import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

runner, suite, episodes, sessions = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ticks = os.sysconf("SC_CLK_TCK")
work = tempfile.mkdtemp(prefix="serve-bench-")


def cpu_s(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ticks


def rss_mb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def start():
    server = subprocess.Popen(
        [runner, "serve", suite, "--listen", "127.0.0.1:0", "-j", "64", "--out", work, "--sandbox", "off"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    address = server.stdout.readline().strip().removeprefix("listening on http://")
    host, port = address.rsplit(":", 1)
    return server, host, int(port)


def drive(host, port, total, one):
    """64 threads, each with one connection, until `total` calls of `one` are done."""
    lock = threading.Lock()
    left = [total]
    done = [0]

    def worker():
        conn = http.client.HTTPConnection(host, port)
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            one(conn)
            with lock:
                done[0] += 1

    threads = [threading.Thread(target=worker) for _ in range(64)]
    for t in threads:
        t.start()
    return threads, done


def post(conn, path, body):
    conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    response = conn.getresponse()
    return json.loads(response.read())


def episode(conn):
    answer = post(conn, "/v1/episodes", {"task": task, "model": "mock"})
    assert answer["outcome"]["status"] == "scored", answer


step_calls = [0]
step_lock = threading.Lock()


def session(conn):
    observed = post(conn, "/reset", {"task": task})
    sid = observed["session_id"]
    for action in actions:
        observed = post(conn, "/step", {"session_id": sid, "action": action})
        with step_lock:
            step_calls[0] += 1
    assert observed["done"] and observed["reward"] == 1.0, observed


# The episodes' own work: the same suite's episodes run by `runner eval --model mock`.
evaluation = subprocess.Popen([runner, "eval", suite, "--model", "mock", "--epochs", "2000", "--out", work, "-j", "8",
                               "--sandbox", "off", "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
_, _, usage = os.wait4(evaluation.pid, 0)
user, system = usage.ru_utime, usage.ru_stime
events = [json.loads(l) for l in open(os.path.join(work, sorted(d for d in os.listdir(work) if not d.startswith("."))[0], "events.jsonl"))]
finished = [e for e in events if e["type"] == "episode_finished"]
eval_cpu_per_episode = (user + system) / len(finished)
steps_per_episode = sum(e["steps"] for e in finished) / len(finished)
task = "add"
actions = [{"tool_calls": [{"name": "calc", "arguments": {"expression": "2+2"}}]}, {"text": "4"}]

server, host, port = start()
time.sleep(0.3)
base_cpu = cpu_s(server.pid)
rss = [rss_mb(server.pid)]
started = time.monotonic()
threads, done = drive(host, port, episodes, episode)
mark = episodes // 10
while any(t.is_alive() for t in threads):
    time.sleep(0.05)
    if done[0] >= mark and len(rss) <= 10:
        rss.append(rss_mb(server.pid))
        mark += episodes // 10
wall = time.monotonic() - started
served_cpu = cpu_s(server.pid) - base_cpu
rss.append(rss_mb(server.pid))

before = cpu_s(server.pid)
started = time.monotonic()
threads, _ = drive(host, port, sessions, session)
for t in threads:
    t.join()
step_wall = time.monotonic() - started
step_cpu = cpu_s(server.pid) - before
server.terminate()
server.wait()

per_episode = served_cpu / episodes
print(json.dumps({
    "episodes": episodes,
    "episodes_per_s": round(episodes / wall, 1),
    "server_cpu_ms_per_episode": round(per_episode * 1e3, 3),
    "eval_cpu_ms_per_episode": round(eval_cpu_per_episode * 1e3, 3),
    "overhead_cpu_ms_per_episode": round((per_episode - eval_cpu_per_episode) * 1e3, 3),
    "steps_per_episode": steps_per_episode,
    "overhead_cpu_ms_per_step": round((per_episode - eval_cpu_per_episode) / steps_per_episode * 1e3, 3),
    "step_sessions": sessions,
    "step_api_calls": step_calls[0] + sessions,
    "step_api_cpu_ms_per_call": round(step_cpu / (step_calls[0] + sessions) * 1e3, 3),
    "step_api_overhead_cpu_ms_per_step": round((step_cpu / sessions - eval_cpu_per_episode) / steps_per_episode * 1e3, 3),
    "step_sessions_per_s": round(sessions / step_wall, 1),
    "rss_mb_each_tenth": [round(r, 1) for r in rss],
}, indent=1))
