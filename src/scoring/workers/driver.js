// The worker of `js:` code scorers: started once per run (per interpreter and scorer file),
// it answers one JSON line on stdin with one JSON line on stdout, for as long as the runner
// keeps it. Argument 1 is the scorer file ("" for inline expressions).
"use strict";
const fs = require("fs");
const path = require("path");
const { pathToFileURL } = require("url");

const send = (message) => fs.writeSync(1, JSON.stringify(message) + "\n");
// What the scorer prints goes to stderr, never into the protocol.
for (const name of ["log", "info", "debug", "warn", "trace"]) console[name] = console.error;

const lastLines = (error) => {
  const text = error && error.stack ? String(error.stack) : String(error);
  return text.trimEnd().split("\n").slice(-8).join("\n").slice(-2000);
};

// The final world's files, read when asked: files["out.txt"] is its text. A name is a path
// below the folder, reached through no link; anything but a regular file of at most `cap`
// bytes (a pipe, a device, a link, a folder, a larger file) is missing, as for the
// `file_contains` check: a model cannot make the scorer block or read without end.
const openRegular = (root, cap, name) => {
  if (root === null || typeof name !== "string" || name.startsWith("/")) return null;
  const parts = name.split("/").filter((p) => p !== "" && p !== ".");
  if (parts.length === 0 || parts.includes("..")) return null;
  const { O_RDONLY, O_NOFOLLOW, O_NONBLOCK } = fs.constants;
  try {
    let here = root;
    for (const part of parts.slice(0, -1)) {
      here = path.join(here, part);
      if (!fs.lstatSync(here).isDirectory()) return null;
    }
    const fd = fs.openSync(path.join(here, parts[parts.length - 1]), O_RDONLY | O_NOFOLLOW | O_NONBLOCK);
    const status = fs.fstatSync(fd);
    if (!status.isFile() || status.size > cap) {
      fs.closeSync(fd);
      return null;
    }
    return fd;
  } catch (e) {
    return null;
  }
};

const filesOf = (root, cap) =>
  new Proxy(
    {},
    {
      get(_, name) {
        const fd = openRegular(root, cap, name);
        if (fd === null) return undefined;
        try {
          return fs.readFileSync(fd, "utf8");
        } catch (e) {
          return undefined;
        } finally {
          fs.closeSync(fd);
        }
      },
      has(_, name) {
        const fd = openRegular(root, cap, name);
        if (fd === null) return false;
        fs.closeSync(fd);
        return true;
      },
    },
  );

const compiled = new Map();
const NAMES = ["output", "answer", "task", "vars", "trajectory", "files", "context"];
const inline = (expression) => {
  let f = compiled.get(expression);
  if (!f) {
    const body = expression.trim().includes("\n") ? expression : `return (${expression});`;
    f = new Function(...NAMES, body);
    compiled.set(expression, f);
  }
  return f;
};

// Requests are read straight from the descriptor, blocking until one comes: a stream and a
// turn of the event loop per request cost several times the call itself. A scorer's
// promise is still awaited (the event loop runs while it settles).
const lineReader = (fd) => {
  const chunk = Buffer.alloc(1 << 16);
  let held = [];
  let rest = Buffer.alloc(0);
  return () => {
    for (;;) {
      const end = rest.indexOf(10);
      if (end >= 0) {
        const line = Buffer.concat([...held, rest.subarray(0, end)]).toString("utf8");
        held = [];
        rest = rest.subarray(end + 1);
        return line;
      }
      if (rest.length > 0) held.push(rest);
      let n;
      try {
        n = fs.readSync(fd, chunk, 0, chunk.length, null);
      } catch (e) {
        // A descriptor left non-blocking: wait a millisecond and read again.
        if (e.code !== "EAGAIN") throw e;
        Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1);
        n = -1;
      }
      if (n === 0) return null;
      rest = n > 0 ? Buffer.from(chunk.subarray(0, n)) : Buffer.alloc(0);
    }
  };
};

async function main() {
  const file = process.argv[1] || "";
  let scorer = null;
  if (file) {
    try {
      scorer = await import(pathToFileURL(file).href);
    } catch (e) {
      send({ ready: false, error: lastLines(e) });
      process.exit(0);
    }
  }
  send({ ready: true });
  const nextLine = lineReader(0);
  for (let line = nextLine(); line !== null; line = nextLine()) {
    const request = JSON.parse(line);
    const answer = { id: request.id };
    try {
      const context = request.context;
      context.files = filesOf(context.files, request.files_cap);
      let result;
      if (request.function) {
        const name = request.function;
        const found = scorer[name] ?? (scorer.default && scorer.default[name]);
        if (typeof found !== "function") throw new Error(`the scorer file has no function \`${name}\``);
        result = found(request.output, context);
      } else {
        const f = inline(request.expression);
        result = f(...NAMES.map((n) => (n === "output" ? request.output : n === "context" ? context : context[n])));
      }
      if (result !== null && typeof result === "object" && typeof result.then === "function") result = await result;
      const kept = result === undefined ? undefined : JSON.stringify(result);
      if (kept === undefined || (typeof result === "number" && !Number.isFinite(result))) {
        answer.other = String(result).slice(0, 300);
      } else {
        answer.result = JSON.parse(kept);
      }
    } catch (e) {
      answer.error = lastLines(e);
    }
    send(answer);
  }
}

main();
