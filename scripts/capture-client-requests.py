"""A tiny stand-in model endpoint that saves the requests a real client sends, for the
gateway's golden fixtures (tests/fixtures/gateway/golden/). It answers every model call
with the text `done` in the shape of the API it came in by — OpenAI Chat Completions,
OpenAI Responses or Anthropic Messages, streaming or not — so that the client ends after
its first turn, and writes each request as `NAME-NN.json`:

    {"path": "/v1/responses", "headers": {...}, "body": {...}}

Headers that carry a key are dropped. Usage:

    python3 scripts/capture-client-requests.py OUT_DIR NAME [PORT]

It prints its port on its first line, then serves until killed."""

import json
import pathlib
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

OUT = pathlib.Path(sys.argv[1])
NAME = sys.argv[2]
PORT = int(sys.argv[3]) if len(sys.argv) > 3 else 0
SECRET_HEADERS = {"authorization", "x-api-key", "cookie", "openai-organization", "openai-project"}
KEPT_HEADERS = {"content-type", "anthropic-version", "anthropic-beta", "openai-beta", "user-agent", "accept",
                "x-stainless-lang", "x-stainless-package-version", "originator", "version"}
count = 0


def sse(events):
    out = ""
    for kind, data in events:
        if kind:
            out += f"event: {kind}\n"
        out += f"data: {json.dumps(data) if not isinstance(data, str) else data}\n\n"
    return out


def chat(body):
    usage = {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}
    if not body.get("stream"):
        return "application/json", json.dumps({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body.get("model", "m"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "done"}, "finish_reason": "stop"}],
            "usage": usage})
    chunk = lambda delta, finish: {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0,
                                   "model": body.get("model", "m"),
                                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    events = [(None, chunk({"role": "assistant", "content": "done"}, None)), (None, chunk({}, "stop"))]
    if (body.get("stream_options") or {}).get("include_usage"):
        events.append((None, {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0,
                              "model": body.get("model", "m"), "choices": [], "usage": usage}))
    events.append((None, "[DONE]"))
    return "text/event-stream", sse(events)


def responses(body):
    message = {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
               "content": [{"type": "output_text", "text": "done", "annotations": []}]}
    usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 1,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 11}
    response = lambda status, output: {
        "id": "resp_1", "object": "response", "created_at": 0, "status": status, "model": body.get("model", "m"),
        "output": output, "usage": usage if status == "completed" else None, "error": None,
        "incomplete_details": None, "instructions": None, "metadata": {}, "parallel_tool_calls": True,
        "temperature": None, "tool_choice": "auto", "tools": [], "top_p": None, "text": {"format": {"type": "text"}}}
    if not body.get("stream"):
        return "application/json", json.dumps(response("completed", [message]))
    at = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    events = [
        ("response.created", {"type": "response.created", "response": response("in_progress", [])}),
        ("response.output_item.added", {"type": "response.output_item.added", "output_index": 0,
                                        "item": dict(message, status="in_progress", content=[])}),
        ("response.content_part.added", dict(at, type="response.content_part.added",
                                             part={"type": "output_text", "text": "", "annotations": []})),
        ("response.output_text.delta", dict(at, type="response.output_text.delta", delta="done")),
        ("response.output_text.done", dict(at, type="response.output_text.done", text="done")),
        ("response.content_part.done", dict(at, type="response.content_part.done", part=message["content"][0])),
        ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": message}),
        ("response.completed", {"type": "response.completed", "response": response("completed", [message])}),
    ]
    for i, (_, event) in enumerate(events):
        event["sequence_number"] = i
    return "text/event-stream", sse(events)


def messages(body):
    usage = {"input_tokens": 10, "output_tokens": 1}
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": body.get("model", "m"),
               "content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn", "stop_sequence": None,
               "usage": usage}
    if not body.get("stream"):
        return "application/json", json.dumps(message)
    events = [
        ("message_start", {"type": "message_start", "message": dict(message, content=[], stop_reason=None)}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "done"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                           "usage": {"output_tokens": 1}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    return "text/event-stream", sse(events)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, kind, text):
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_HEAD(self):
        self.answer(200, "application/json", "")

    def do_GET(self):
        path = self.path.split("?")[0].rstrip("/")
        if path.endswith("/models"):
            self.answer(200, "application/json", json.dumps({"object": "list", "data": [
                {"id": "gpt-test", "object": "model", "created": 0, "owned_by": "capture"}]}))
        else:
            self.answer(200, "application/json", "{}")

    def do_POST(self):
        global count
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        path = self.path.split("?")[0].rstrip("/")
        try:
            body = json.loads(raw)
        except ValueError:
            self.answer(400, "application/json", json.dumps({"error": {"message": "not JSON"}}))
            return
        count += 1
        headers = {k.lower(): v for k, v in self.headers.items()
                   if k.lower() in KEPT_HEADERS and k.lower() not in SECRET_HEADERS}
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{NAME}-{count:02}.json").write_text(
            json.dumps({"path": path, "headers": headers, "body": body}, indent=1) + "\n")
        if path.endswith("/chat/completions"):
            kind, text = chat(body)
        elif path.endswith("/responses"):
            kind, text = responses(body)
        elif path.endswith("/messages"):
            kind, text = messages(body)
        else:
            self.answer(404, "application/json", json.dumps({"error": {"message": f"no {path}"}}))
            return
        self.answer(200, kind, text)


server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
