#!/usr/bin/env python3
"""An external agent whose decisions come from the run's model, standard library only.

It speaks runner's external agent protocol (version 1) on stdin/stdout, and asks the model
through the episode's model gateway (OpenAI Chat Completions at `gateway.openai_base_url`,
with `gateway.key`, both in `start`), so `runner eval --model …` picks the model, and every
call is a `model_call` of the episode: counted, limited, recorded and replayed, and under
`--model mock` answered by the task's `mock:` turns. Each turn: the observations go back to
the model as tool results, and the calls it asks for are this agent's `actions`.
"""
import json
import sys
import urllib.error
import urllib.request


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def ask(gateway, messages, tools):
    body = json.dumps({"model": "runner", "messages": messages, "tools": tools}).encode()
    request = urllib.request.Request(
        gateway["openai_base_url"] + "/chat/completions",
        data=body,
        headers={"Authorization": "Bearer " + gateway["key"], "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)["choices"][0]["message"]


def main():
    gateway, messages, tools = None, [], []
    for line in sys.stdin:
        message = json.loads(line)
        if message["type"] == "start":
            gateway = message["gateway"]
            messages = [{"role": "system", "content": message["system"]}] if message.get("system") else []
            messages.append({"role": "user", "content": message["task"]["input"]})
            tools = [{"type": "function", "function": t} for t in message["tools"]]
        elif message["type"] == "observations":
            for seen in message["observations"]:
                if seen.get("call_id"):
                    result = seen.get("error") or seen.get("tool_result")
                    messages.append({"role": "tool", "tool_call_id": seen["call_id"], "content": json.dumps(result)})
            try:
                reply = ask(gateway, messages, tools)
            except urllib.error.HTTPError as e:
                # The gateway said why (a limit, the model's failure): runner knows it too.
                send({"type": "log", "message": f"the model call failed: {e.code} {e.read()[:300]!r}"})
                send({"type": "actions", "calls": []})
                continue
            messages.append({k: v for k, v in reply.items() if k in ("role", "content", "tool_calls")})
            calls = [
                {"call_id": c["id"], "name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"] or "{}")}
                for c in reply.get("tool_calls") or []
            ]
            send({"type": "actions", "calls": calls, "text": reply.get("content")})
        elif message["type"] == "end":
            gateway = None


if __name__ == "__main__":
    main()
