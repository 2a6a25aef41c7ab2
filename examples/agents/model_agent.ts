// An external agent whose decisions come from the run's model, in TypeScript with no
// dependencies: the same policy as model_agent.py. Run it with Node's type stripping
// (`node --experimental-strip-types model_agent.ts`, Node 22.6 and later; by default from
// Node 23.6), or compiled (`tsc --target es2022 --module nodenext model_agent.ts`, then
// `node model_agent.js`). Only erasable type syntax is used, so both give the same program.
//
// It speaks runner's external agent protocol (version 1) on stdin/stdout and asks the model
// through the episode's model gateway (OpenAI Chat Completions at `gateway.openai_base_url`
// with `gateway.key`, both in `start`): every call is a `model_call` of the episode, and under
// `--model mock` the task's `mock:` turns answer.
import { createInterface } from "node:readline";

interface Gateway {
  openai_base_url: string;
  key: string;
}

interface ToolSpec {
  name: string;
  description: string;
  parameters: unknown;
}

interface Observation {
  call_id: string | null;
  error: unknown;
  tool_result: unknown;
}

interface ChatCall {
  id: string;
  function: { name: string; arguments: string };
}

interface ChatMessage {
  role: string;
  content?: string | null;
  tool_calls?: ChatCall[];
  tool_call_id?: string;
}

type FromRunner =
  | { type: "start"; gateway: Gateway; system: string | null; task: { input: string }; tools: ToolSpec[] }
  | { type: "observations"; observations: Observation[] }
  | { type: "end" };

const send = (message: object): void => {
  process.stdout.write(JSON.stringify(message) + "\n");
};

async function ask(gateway: Gateway, messages: ChatMessage[], tools: ToolSpec[]): Promise<ChatMessage> {
  const response = await fetch(gateway.openai_base_url + "/chat/completions", {
    method: "POST",
    headers: { Authorization: "Bearer " + gateway.key, "Content-Type": "application/json" },
    body: JSON.stringify({ model: "runner", messages, tools: tools.map((t) => ({ type: "function", function: t })) }),
  });
  if (!response.ok) {
    throw new Error(`${response.status} ${(await response.text()).slice(0, 300)}`);
  }
  const body = (await response.json()) as { choices: { message: ChatMessage }[] };
  return body.choices[0].message;
}

let gateway: Gateway | null = null;
let messages: ChatMessage[] = [];
let tools: ToolSpec[] = [];

async function handle(message: FromRunner): Promise<void> {
  if (message.type === "start") {
    gateway = message.gateway;
    messages = message.system ? [{ role: "system", content: message.system }] : [];
    messages.push({ role: "user", content: message.task.input });
    tools = message.tools;
  } else if (message.type === "observations") {
    for (const seen of message.observations) {
      if (seen.call_id) {
        const result = seen.error ?? seen.tool_result;
        messages.push({ role: "tool", tool_call_id: seen.call_id, content: JSON.stringify(result) });
      }
    }
    if (!gateway) {
      send({ type: "fault", cause: "agent_error", message: "observations before start" });
      return;
    }
    let reply: ChatMessage;
    try {
      reply = await ask(gateway, messages, tools);
    } catch (e) {
      // The gateway said why (a limit, the model's failure): runner knows it too.
      send({ type: "log", message: `the model call failed: ${String(e)}` });
      send({ type: "actions", calls: [] });
      return;
    }
    messages.push({ role: "assistant", content: reply.content ?? null, tool_calls: reply.tool_calls });
    const calls = (reply.tool_calls ?? []).map((c) => ({
      call_id: c.id,
      name: c.function.name,
      arguments: JSON.parse(c.function.arguments || "{}"),
    }));
    send({ type: "actions", calls, text: reply.content ?? null });
  } else {
    gateway = null;
  }
}

// One message at a time, in order: each `observations` gets its `actions` before the next.
let queue: Promise<void> = Promise.resolve();
createInterface({ input: process.stdin }).on("line", (line: string) => {
  queue = queue.then(() => handle(JSON.parse(line) as FromRunner));
});
