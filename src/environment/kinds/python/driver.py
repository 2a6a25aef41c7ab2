# The driver of the `python` world's interpreter (see mod.rs). It reads one JSON request
# a line on its standard input and answers each with one JSON line on its standard output;
# both are moved to private descriptors first, so that the session's code reads nothing
# and its output (print, subprocesses) lands in two capture files instead.
#
# Arguments: the stdout capture file, the stderr capture file, the output cap in bytes.
# A request: {"id": N, "op": "define_function" | "call_function" | "eval" | "exec", ...}.
# An answer: {"id": N, "ok": true, "result": {...}} or {"id": N, "ok": false, "error": {...}}.


def _driver():
    import ast
    import inspect
    import io
    import json
    import linecache
    import os
    import sys
    import traceback

    out_path, err_path, cap = sys.argv[1], sys.argv[2], int(sys.argv[3])
    # Descriptors from os.dup are not inherited: subprocesses cannot see the protocol.
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for target, path in ((1, out_path), (2, err_path)):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        os.dup2(fd, target)
        os.close(fd)

    def stream(fd):
        raw = io.FileIO(fd, "w", closefd=False)
        return io.TextIOWrapper(raw, encoding="utf-8", errors="backslashreplace", line_buffering=True)

    sys.stdin = open(os.devnull, "r")
    sys.stdout, sys.stderr = stream(1), stream(2)
    driver_globals = globals()
    session = {"__name__": "__main__", "__builtins__": __builtins__}
    counter = [0]

    def cut(text, limit=cap):
        if len(text) <= limit:
            return text, False
        return text[:limit] + "\n[... cut: showing %d of %d characters ...]" % (limit, len(text)), True

    def captured(fd):
        size = os.fstat(fd).st_size
        data = os.pread(fd, cap, 0) if size else b""
        text = data.decode("utf-8", "replace")
        if size > len(data):
            text += "\n[... output cut: showing %d of %d bytes ...]" % (len(data), size)
        return text

    def value_of(v):
        kind = type(v).__name__
        try:
            text = json.dumps(v, allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            text = None
        if text is not None and len(text) <= cap:
            return {"value": v, "type": kind}
        if text is None:
            try:
                text = repr(v)
            except BaseException as e:  # a broken __repr__ is the session's, not ours
                text = "<%s object; repr failed: %s: %s>" % (kind, type(e).__name__, e)
        shown, was_cut = cut(text)
        result = {"repr": shown, "type": kind}
        if was_cut:
            result["truncated"] = True
        return result

    def source_name(op):
        # A name per piece of code, kept in linecache so that tracebacks show its lines.
        counter[0] += 1
        return "<%s #%d>" % (op, counter[0])

    def remember(name, code):
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)

    def failure(e):
        tb = e.__traceback__
        # The driver's own frames come first; the session's code starts below them.
        while tb is not None and tb.tb_frame.f_globals is driver_globals:
            tb = tb.tb_next
        lines = "".join(traceback.format_exception(type(e), e, tb)).rstrip("\n").split("\n")
        if len(lines) > 12:
            lines = lines[:1] + ["  [... %d lines cut ...]" % (len(lines) - 11)] + lines[-10:]
        message = str(e) if not isinstance(e, SyntaxError) else (e.msg or "")
        return {"type": type(e).__name__, "message": message, "traceback": cut("\n".join(lines))[0]}

    def run_statements(code, name, last_value):
        tree = compile(code, name, "exec", ast.PyCF_ONLY_AST)
        tail = None
        if last_value and tree.body and isinstance(tree.body[-1], ast.Expr):
            tail = ast.Expression(body=tree.body.pop().value)
        exec(compile(tree, name, "exec"), session)
        if tail is not None:
            return True, eval(compile(tail, name, "eval"), session)
        return False, None

    def define_function(request):
        source = request["source"]
        name = source_name("define_function")
        remember(name, source)
        before = {k: v for k, v in session.items() if callable(v)}
        run_statements(source, name, False)
        defined = []
        for key, v in session.items():
            if callable(v) and before.get(key) is not v and not key.startswith("__"):
                try:
                    signature = key + str(inspect.signature(v))
                except (TypeError, ValueError):
                    signature = key + "(...)"
                defined.append(signature)
        if not defined:
            raise _Refused(
                "the source ran but defined no function or class; use exec for other statements"
            )
        return {"defined": defined}

    def call_function(request):
        path = request["name"].split(".")
        if path[0] not in session:
            known = sorted(k for k, v in session.items() if callable(v) and not k.startswith("__"))
            raise _Refused(
                "no function `%s` in the session (defined: %s)"
                % (path[0], ", ".join(known) or "none")
            )
        target = session[path[0]]
        for part in path[1:]:
            target = getattr(target, part)
        if not callable(target):
            raise _Refused("`%s` is a %s, not a function" % (request["name"], type(target).__name__))
        return value_of(target(*request.get("args", []), **request.get("kwargs", {})))

    def evaluate(request):
        code = request["code"]
        name = source_name("eval")
        remember(name, code)
        return value_of(eval(compile(code, name, "eval"), session))

    def execute(request):
        code = request["code"]
        name = source_name("exec")
        remember(name, code)
        has_value, v = run_statements(code, name, True)
        return value_of(v) if has_value else {}

    ops = {"define_function": define_function, "call_function": call_function, "eval": evaluate, "exec": execute}

    def answer(message):
        answers.write(json.dumps(message) + "\n")
        answers.flush()

    answer({"ready": True, "version": sys.version.split()[0]})
    for line in requests:
        request = json.loads(line)
        for fd in (1, 2):
            os.ftruncate(fd, 0)
        try:
            reply = {"ok": True, "result": ops[request["op"]](request)}
        except _Refused as e:
            reply = {"ok": False, "refused": str(e)}
        except BaseException as e:  # SystemExit and KeyboardInterrupt too: the session goes on
            reply = {"ok": False, "error": failure(e)}
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except BaseException:
                pass
        reply["stdout"], reply["stderr"] = captured(1), captured(2)
        reply["id"] = request["id"]
        try:
            answer(reply)
        except (TypeError, ValueError, RecursionError):
            # A value json.dumps took alone but not inside the reply (a NaN key, say).
            reply.pop("result", None)
            reply.update(ok=False, refused="the result could not be encoded as JSON")
            answer(reply)


class _Refused(Exception):
    """A request the driver turns down itself: no traceback, the session is unchanged."""


_driver()
