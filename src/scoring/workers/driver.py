# The worker of `python:` code scorers: started once per run (per interpreter and scorer
# file), it answers one JSON line on stdin with one JSON line on stdout, for as long as the
# runner keeps it. Argument 1 is the scorer file ("" for inline expressions).
import importlib.util
import asyncio
import inspect
import json
import math
import os
import re
import sys
import traceback

PROTOCOL = os.fdopen(os.dup(1), "w", encoding="utf-8")
# What the scorer prints goes to stderr, never into the protocol.
os.dup2(2, 1)
sys.stdout = sys.stderr


def send(message):
    PROTOCOL.write(json.dumps(message, allow_nan=False) + "\n")
    PROTOCOL.flush()


def last_lines(text, lines=8):
    return "\n".join(text.rstrip().splitlines()[-lines:])[-2000:]


class Files:
    """The final world's files, read when asked: files["out.txt"] is its text."""

    def __init__(self, root):
        self.root = root

    def path(self, name):
        if self.root is None:
            raise KeyError(name)
        return os.path.join(self.root, name)

    def __getitem__(self, name):
        try:
            with open(self.path(name), encoding="utf-8", errors="replace") as f:
                return f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise KeyError(name) from None

    def get(self, name, default=None):
        try:
            return self[name]
        except KeyError:
            return default

    def __contains__(self, name):
        return self.root is not None and os.path.isfile(self.path(name))

    def __iter__(self):
        if self.root is None:
            return
        for folder, _, names in os.walk(self.root):
            for name in sorted(names):
                yield os.path.relpath(os.path.join(folder, name), self.root)

    def keys(self):
        return list(self)

    def __repr__(self):
        return "Files(%r)" % self.root


module = None
if len(sys.argv) > 1 and sys.argv[1]:
    path = sys.argv[1]
    try:
        sys.path.insert(0, os.path.dirname(path))
        spec = importlib.util.spec_from_file_location("scorer", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except BaseException:
        send({"ready": False, "error": last_lines(traceback.format_exc())})
        sys.exit(0)
send({"ready": True})

compiled = {}


def inline(expression, names):
    code = compiled.get(expression)
    if code is None:
        text = expression.strip()
        # Several lines, or one `return` statement: a function's body.
        if "\n" in text or re.match(r"return\b", text):
            body = "\n".join("    " + line for line in expression.splitlines())
            code = ("body", compile("def __scorer__():\n" + body + "\n", "<python scorer>", "exec"))
        else:
            code = ("expression", compile(text, "<python scorer>", "eval"))
        compiled[expression] = code
    kind, code = code
    scope = dict(names, json=json, math=math, re=re)
    if kind == "expression":
        return eval(code, scope)
    exec(code, scope)
    return scope["__scorer__"]()


for line in sys.stdin:
    request = json.loads(line)
    answer = {"id": request["id"]}
    try:
        context = request["context"]
        context["files"] = Files(context.get("files"))
        output = request["output"]
        if request.get("function"):
            function = getattr(module, request["function"], None)
            if not callable(function):
                raise NameError("the scorer file has no function `%s`" % request["function"])
            result = function(output, context)
        else:
            names = dict(context, output=output, context=context)
            result = inline(request["expression"], names)
        if inspect.iscoroutine(result):
            result = asyncio.run(result)
        try:
            answer["result"] = json.loads(json.dumps(result, allow_nan=False))
        except (TypeError, ValueError):
            answer["other"] = repr(result)[:300]
    except BaseException:
        answer["error"] = last_lines(traceback.format_exc())
    send(answer)
