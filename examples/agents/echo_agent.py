#!/usr/bin/env python3
"""A reference client of runner's external agent protocol (version 1), standard library only.

runner writes one JSON message per line on stdin (`start`, `observations`, `end`); the agent
answers each `observations` with one `actions` line on stdout. This one is a fixed policy:
it reads the file the task's metadata names (`path`; `reads` times, one turn each, default
1) and answers with its first line, or, without one, lists the working folder and answers
with the names it sees. It exits when
stdin closes, so that it also serves `reuse: true` (a `start` … `end` per episode).
"""
import json
import sys


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def decide(task, step, observations):
    """The calls (or the final text) for this turn."""
    path = task.get("metadata", {}).get("path")
    reads = int(task.get("metadata", {}).get("reads", 1))
    if path and step <= reads:
        return {"calls": [{"name": "read_file", "arguments": {"path": path}}]}
    if step == 1:
        return {"calls": [{"name": "list_dir", "arguments": {}}]}
    result = observations[0].get("tool_result") or {}
    if observations[0].get("error"):
        return {"text": "error: " + observations[0]["error"]["message"]}
    if path:
        # read_file numbers its lines: "     1\thello".
        first = str(result.get("content", "")).splitlines()[:1]
        return {"text": first[0].split("\t", 1)[-1] if first else ""}
    names = sorted(e["name"] if isinstance(e, dict) else str(e) for e in result.get("entries", []))
    return {"calls": [{"name": "final_answer", "arguments": {"answer": ", ".join(names)}}]}


def main():
    task = None
    for line in sys.stdin:
        message = json.loads(line)
        kind = message["type"]
        if kind == "start":
            task = message["task"]
            print(f"episode {message['episode_id']}: {len(message['tools'])} tools", file=sys.stderr)
        elif kind == "observations":
            step = message["step"]
            send({"type": "log", "message": f"step {step}: {len(message['observations'])} observation(s)"})
            # A token per four characters of what a model would read: the messages, results
            # and errors observed. Not the whole line: its budget (the time left) and the
            # observations' info (a working folder named after the run) vary from run to run.
            read = [[o.get("messages"), o.get("tool_result"), o.get("error")] for o in message["observations"]]
            seen = json.dumps(read, separators=(",", ":"))
            send({"type": "usage", "model": "echo", "input_tokens": len(seen) // 4, "output_tokens": 1, "cost_usd": 0.0})
            send({"type": "actions", **decide(task, step, message["observations"])})
        elif kind == "end":
            # With `reuse: true` another `start` may follow; runner closes stdin when done.
            task = None


if __name__ == "__main__":
    main()
