"""A command-line agent in a few lines of standard-library Python: it owns its loop and its
one tool (`write_file`), and talks to the model through the OpenAI Chat Completions API at
OPENAI_BASE_URL with OPENAI_API_KEY (under `runner`, the episode's model gateway). The task
comes on standard input; the final answer goes to standard output."""

import json
import os
import pathlib
import sys
import urllib.request

BASE, KEY = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
TOOLS = [{"type": "function", "function": {
    "name": "write_file", "description": "Write text to a file.",
    "parameters": {"type": "object", "required": ["path", "content"],
                   "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}}}]


def ask(messages):
    body = json.dumps({"model": "any", "messages": messages, "tools": TOOLS}).encode()
    request = urllib.request.Request(f"{BASE}/chat/completions", body, {
        "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)["choices"][0]["message"]


def write_file(path, content):
    pathlib.Path(path).write_text(content)
    return f"wrote {len(content)} bytes to {path}"


messages = [{"role": "user", "content": sys.stdin.read()}]
for _ in range(20):
    message = ask(messages)
    messages.append(message)
    if not message.get("tool_calls"):
        print(message.get("content") or "")
        break
    for call in message["tool_calls"]:
        result = write_file(**json.loads(call["function"]["arguments"]))
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
