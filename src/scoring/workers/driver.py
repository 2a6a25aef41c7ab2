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
import stat
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
    """The final world's files, read when asked: files["out.txt"] is its text.

    A name is a path below the folder, reached through no link. Anything but a regular
    file of at most `cap` bytes (a pipe, a device, a link, a folder, a larger file) is
    missing, as for the `file_contains` check: a model cannot make the scorer block or
    read without end, and so leave its episode unscored instead of failed.
    """

    def __init__(self, root, cap):
        self.root = root
        self.cap = cap

    def path(self, name):
        if self.root is None:
            raise KeyError(name)
        return os.path.join(self.root, name)

    def _open(self, name):
        """A descriptor of the regular file `name`, or None."""
        parts = [p for p in str(name).split("/") if p not in ("", ".")]
        if self.root is None or not parts or ".." in parts or str(name).startswith("/"):
            return None
        folder = None
        try:
            folder = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
            for part in parts[:-1]:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=folder)
                os.close(folder)
                folder = inner
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
        except OSError:
            return None
        finally:
            if folder is not None:
                os.close(folder)
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode) or status.st_size > self.cap:
            os.close(fd)
            return None
        return fd

    def __getitem__(self, name):
        fd = self._open(name)
        if fd is None:
            raise KeyError(name)
        with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
            return f.read()

    def get(self, name, default=None):
        try:
            return self[name]
        except KeyError:
            return default

    def __contains__(self, name):
        fd = self._open(name)
        if fd is None:
            return False
        os.close(fd)
        return True

    def __iter__(self):
        if self.root is None:
            return
        for folder, _, names in os.walk(self.root):
            for name in sorted(names):
                relative = os.path.relpath(os.path.join(folder, name), self.root)
                if relative in self:
                    yield relative

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
        context["files"] = Files(context.get("files"), request["files_cap"])
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
