// The worker of `js:` code scorers: started once per run (per interpreter and scorer file),
// it answers one JSON line on stdin with one JSON line on stdout, for as long as the runner
// keeps it. Argument 1 is the scorer file ("" for inline expressions).
"use strict";
const fs = require("fs");
const path = require("path");
const readline = require("readline");
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
  const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const line of lines) {
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
        result = await found(request.output, context);
      } else {
        const f = inline(request.expression);
        result = await f(...NAMES.map((n) => (n === "output" ? request.output : n === "context" ? context : context[n])));
      }
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
