"""An agent on the OpenAI Agents SDK (PyPI `openai-agents`), run as a `cli` agent: it
reads the task from stdin, owns its loop and its one tool (`write_file`, which writes in its
working folder), and prints its final answer. The SDK reaches the run's model through the
gateway by OPENAI_BASE_URL and OPENAI_API_KEY, which runner sets.

    python3 agents_sdk_agent.py [--stream] [--chat]

--stream runs the agent streamed (Runner.run_streamed); --chat speaks Chat Completions
instead of the SDK's default, the Responses API."""

import asyncio
import pathlib
import sys

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

# Traces would go to the provider's own service, which the sandbox does not reach.
set_tracing_disabled(True)


@function_tool
def write_file(path: str, content: str) -> str:
    """Write `content` into the file at `path` (relative to the working folder)."""
    target = pathlib.Path(path)
    target.write_text(content)
    return f"wrote {len(content)} bytes to {target}"


async def main() -> None:
    task = sys.stdin.read().strip()
    client = AsyncOpenAI(max_retries=0)
    model = OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client) if "--chat" in sys.argv else None
    agent = Agent(
        name="writer",
        instructions="You write files with your tool, then answer in one word.",
        tools=[write_file],
        **({"model": model} if model else {"model": "gpt-4o-mini"}),
    )
    if "--stream" in sys.argv:
        result = Runner.run_streamed(agent, task)
        async for _ in result.stream_events():
            pass
    else:
        result = await Runner.run(agent, task)
    print(result.final_output)


if __name__ == "__main__":
    asyncio.run(main())
