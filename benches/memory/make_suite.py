#!/usr/bin/env python3
"""Writes a memory suite of one question whose haystack has MESSAGES messages (sessions of
SESSION messages), scripted for `--model mock`: to measure the runner's own cost per
replayed message (docs/src/performance.md).

    python3 benches/memory/make_suite.py MESSAGES [SESSION] > /tmp/memory-bench.yaml
"""
import datetime
import json
import sys

messages = int(sys.argv[1])
per_session = int(sys.argv[2]) if len(sys.argv) > 2 else 20
sessions, n = [], 0
while n < messages:
    count = min(per_session, messages - n)
    turns = [{"role": "user" if i % 2 == 0 else "assistant",
              "content": f"message {n + i + 1}: the user talks about topic {(n + i) % 37} and the number {n + i}"}
             for i in range(count)]
    day = len(sessions) + 1
    date = datetime.date(2024, 1, 1) + datetime.timedelta(days=day)
    sessions.append({"id": f"s{day}", "date": date.isoformat(), "messages": turns})
    n += count
# One turn that writes whichever call the agent asks for, and answers.
turn = {"text": "42", "tool_calls": [
    {"name": "add_entry", "arguments": {"summary": "the user said something", "raw_entry": "x"}},
    {"name": "put_context", "arguments": {"content": "context"}}]}
asks = messages + messages // 6 + len(sessions) + 1
suite = {
    "suite": "memory-bench",
    "environment": "memory_store",
    "agent": {"kind": "memory", "flush_every": 6},
    "limits": {"max_steps": 10 * messages + 100, "time_s": 3600},
    "scorers": [{"includes": "42"}],
    "tasks": [{"id": "q", "input": "What number?", "metadata": {"sessions": sessions}, "mock": [turn] * asks}],
}
json.dump(suite, sys.stdout)
