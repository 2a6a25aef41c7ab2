#!/usr/bin/env node
// A reference client of runner's external agent protocol (version 1), in Node.js with no
// dependencies: the same fixed policy as echo_agent.py. runner writes one JSON message per
// line on stdin (`start`, `observations`, `end`); each `observations` gets one `actions`
// line back on stdout.
import { createInterface } from "node:readline";

const send = (message) => process.stdout.write(JSON.stringify(message) + "\n");

// The calls (or the final text) for this turn.
function decide(task, step, observations) {
  const path = task?.metadata?.path;
  if (step === 1) {
    return path
      ? { calls: [{ name: "read_file", arguments: { path } }] }
      : { calls: [{ name: "list_dir", arguments: {} }] };
  }
  const [first] = observations;
  if (first.error) return { text: `error: ${first.error.message}` };
  const result = first.tool_result ?? {};
  if (path) {
    // read_file numbers its lines: "     1\thello".
    const line = String(result.content ?? "").split("\n")[0] ?? "";
    return { text: line.split("\t").slice(1).join("\t") || line };
  }
  const names = (result.entries ?? []).map((e) => e.name ?? String(e)).sort();
  return { calls: [{ name: "final_answer", arguments: { answer: names.join(", ") } }] };
}

let task = null;
const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  const message = JSON.parse(line);
  if (message.type === "start") {
    task = message.task;
    process.stderr.write(`episode ${message.episode_id}: ${message.tools.length} tools\n`);
  } else if (message.type === "observations") {
    const { step, observations } = message;
    send({ type: "log", message: `step ${step}: ${observations.length} observation(s)` });
    // A token per four characters of what a model would read: the messages, results and
    // errors observed. Not the whole line: its budget (the time left) and the observations'
    // info (a working folder named after the run) vary from run to run.
    const seen = JSON.stringify(observations.map((o) => [o.messages ?? null, o.tool_result ?? null, o.error ?? null]));
    send({ type: "usage", model: "echo", input_tokens: Math.floor(seen.length / 4), output_tokens: 1, cost_usd: 0 });
    send({ type: "actions", ...decide(task, step, observations) });
  } else if (message.type === "end") {
    // With `reuse: true` another `start` may follow; runner closes stdin when done.
    task = null;
  }
}
