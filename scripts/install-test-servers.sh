#!/usr/bin/env bash
# Installs the MCP servers the tests, the example suite and the bench run against, from
# the registries, into one cache folder: $RUNNER_TEST_SERVERS, else
# ~/.cache/runner-test-servers. Idempotent, and quick when they are already there.
#   node_modules/.bin/mcp-server-everything   (npm: @modelcontextprotocol/server-everything)
#   venv/bin/mcp-server-time                  (PyPI: mcp-server-time, in a venv of Debian's python3)
#   sdk-venv/bin/python3                      (PyPI: the official `openai` and `anthropic` SDKs,
#                                              the clients the model gateway's tests speak through)
#   openenv-venv/bin/python3                  (PyPI: openenv-core, OpenEnv's own client, which
#                                              steps `runner serve`'s environments)
#   ray-venv/bin/ray                          (PyPI: ray, the cluster examples/ray/ runs on in its test)
#   playwright/node_modules/playwright-core   (npm: playwright-core, which drives Debian's chromium
#                                              in the viewer's browser test; a prefix of its own)
#   node_modules/.bin/claude                  (npm: @anthropic-ai/claude-code, a real CLI agent
#                                              run against the gateway; its test is skipped,
#                                              saying so, when it would not install)
#   node_modules/.bin/codex                   (npm: @openai/codex, the Codex CLI, a real CLI agent
#                                              speaking the Responses API to the gateway)
#   node_modules/.bin/tsc                     (npm: typescript with @types/node, to compile the
#                                              TypeScript reference agent where Node is older
#                                              than its type stripping)
#   agents-venv/bin/mini                      (PyPI: mini-swe-agent, which calls models through
#                                              litellm, and openai-agents, the Agents SDK)
# The venv is made from /usr/bin/python3 because the sandbox lets a server read its own
# installation and the system's folders, not an interpreter under a home folder.
set -euo pipefail
dir="${RUNNER_TEST_SERVERS:-$HOME/.cache/runner-test-servers}"
everything_version="2026.8.31"
time_version="2026.10.19"
openai_version="3.57.0"
anthropic_version="2.14.0"
claude_code_version="2.1.197"
openenv_version="0.3.0"
ray_version="2.60.0"
codex_version="0.169.0"
mini_swe_agent_version="2.4.6"
openai_agents_version="0.24.0"
typescript_version="7.0.2"
types_node_version="20.19.43"
playwright_version="1.65.1"
mkdir -p "$dir"
if [ ! -f "$dir/node_modules/@modelcontextprotocol/server-everything/package.json" ] \
    || ! grep -q "\"version\": \"$everything_version\"" "$dir/node_modules/@modelcontextprotocol/server-everything/package.json"; then
    npm install --prefix "$dir" --no-audit --no-fund --loglevel=error \
        "@modelcontextprotocol/server-everything@$everything_version" >/dev/null
fi
if [ ! -x "$dir/venv/bin/mcp-server-time" ] || ! "$dir/venv/bin/pip" show mcp-server-time 2>/dev/null | grep -q "^Version: $time_version$"; then
    [ -x "$dir/venv/bin/python3" ] || /usr/bin/python3 -m venv "$dir/venv"
    "$dir/venv/bin/pip" install --quiet --disable-pip-version-check "mcp-server-time==$time_version"
fi
if ! "$dir/sdk-venv/bin/pip" show openai 2>/dev/null | grep -q "^Version: $openai_version$" \
    || ! "$dir/sdk-venv/bin/pip" show anthropic 2>/dev/null | grep -q "^Version: $anthropic_version$"; then
    [ -x "$dir/sdk-venv/bin/python3" ] || /usr/bin/python3 -m venv "$dir/sdk-venv"
    "$dir/sdk-venv/bin/pip" install --quiet --disable-pip-version-check \
        "openai==$openai_version" "anthropic==$anthropic_version"
fi
if ! "$dir/openenv-venv/bin/pip" show openenv-core 2>/dev/null | grep -q "^Version: $openenv_version$"; then
    [ -x "$dir/openenv-venv/bin/python3" ] || /usr/bin/python3 -m venv "$dir/openenv-venv"
    "$dir/openenv-venv/bin/pip" install --quiet --disable-pip-version-check "openenv-core==$openenv_version"
fi
if ! "$dir/ray-venv/bin/pip" show ray 2>/dev/null | grep -q "^Version: $ray_version$"; then
    [ -x "$dir/ray-venv/bin/python3" ] || /usr/bin/python3 -m venv "$dir/ray-venv"
    "$dir/ray-venv/bin/pip" install --quiet --disable-pip-version-check "ray==$ray_version"
fi
if [ ! -f "$dir/node_modules/@anthropic-ai/claude-code/package.json" ] \
    || ! grep -q "\"version\": \"$claude_code_version\"" "$dir/node_modules/@anthropic-ai/claude-code/package.json"; then
    npm install --prefix "$dir" --no-audit --no-fund --loglevel=error \
        "@anthropic-ai/claude-code@$claude_code_version" >/dev/null \
        || echo "Claude Code did not install: its test will be skipped" >&2
fi
if [ ! -f "$dir/node_modules/@openai/codex/package.json" ] \
    || ! grep -q "\"version\": \"$codex_version\"" "$dir/node_modules/@openai/codex/package.json"; then
    npm install --prefix "$dir" --no-audit --no-fund --loglevel=error \
        "@openai/codex@$codex_version" >/dev/null \
        || echo "Codex CLI did not install: its test will be skipped" >&2
fi
if [ ! -f "$dir/node_modules/typescript/package.json" ] \
    || ! grep -q "\"version\": \"$typescript_version\"" "$dir/node_modules/typescript/package.json"; then
    npm install --prefix "$dir" --no-audit --no-fund --loglevel=error \
        "typescript@$typescript_version" "@types/node@$types_node_version" >/dev/null \
        || echo "TypeScript did not install: the TypeScript agent's test will be skipped" >&2
fi
if ! "$dir/agents-venv/bin/pip" show mini-swe-agent 2>/dev/null | grep -q "^Version: $mini_swe_agent_version$" \
    || ! "$dir/agents-venv/bin/pip" show openai-agents 2>/dev/null | grep -q "^Version: $openai_agents_version$"; then
    [ -x "$dir/agents-venv/bin/python3" ] || /usr/bin/python3 -m venv "$dir/agents-venv"
    "$dir/agents-venv/bin/pip" install --quiet --disable-pip-version-check \
        "mini-swe-agent==$mini_swe_agent_version" "openai-agents==$openai_agents_version" \
        || echo "mini-swe-agent or openai-agents did not install: their tests will be skipped" >&2
fi
if [ ! -f "$dir/playwright/node_modules/playwright-core/package.json" ] \
    || ! grep -q "\"version\": \"$playwright_version\"" "$dir/playwright/node_modules/playwright-core/package.json"; then
    mkdir -p "$dir/playwright"
    npm install --prefix "$dir/playwright" --no-audit --no-fund --loglevel=error \
        "playwright-core@$playwright_version" >/dev/null
fi
echo "test MCP servers, model SDKs, OpenEnv, Ray, the CLI agents and playwright-core in $dir"
