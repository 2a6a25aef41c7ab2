#!/usr/bin/env bash
# Installs the MCP servers the tests, the example suite and the bench run against, from
# the registries, into one cache folder: $RUNNER_TEST_SERVERS, else
# ~/.cache/runner-test-servers. Idempotent, and quick when they are already there.
#   node_modules/.bin/mcp-server-everything   (npm: @modelcontextprotocol/server-everything)
#   venv/bin/mcp-server-time                  (PyPI: mcp-server-time, in a venv of Debian's python3)
#   sdk-venv/bin/python3                      (PyPI: the official `openai` and `anthropic` SDKs,
#                                              the clients the model gateway's tests speak through)
#   playwright/node_modules/playwright-core   (npm: playwright-core, which drives Debian's chromium
#                                              in the viewer's browser test; a prefix of its own)
#   node_modules/.bin/claude                  (npm: @anthropic-ai/claude-code, a real CLI agent
#                                              run against the gateway; its test is skipped,
#                                              saying so, when it would not install)
# The venv is made from /usr/bin/python3 because the sandbox lets a server read its own
# installation and the system's folders, not an interpreter under a home folder.
set -euo pipefail
dir="${RUNNER_TEST_SERVERS:-$HOME/.cache/runner-test-servers}"
everything_version="2026.8.31"
time_version="2026.10.19"
openai_version="3.57.0"
anthropic_version="2.14.0"
claude_code_version="2.1.197"
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
if [ ! -f "$dir/node_modules/@anthropic-ai/claude-code/package.json" ] \
    || ! grep -q "\"version\": \"$claude_code_version\"" "$dir/node_modules/@anthropic-ai/claude-code/package.json"; then
    npm install --prefix "$dir" --no-audit --no-fund --loglevel=error \
        "@anthropic-ai/claude-code@$claude_code_version" >/dev/null \
        || echo "Claude Code did not install: its test will be skipped" >&2
fi
if [ ! -f "$dir/playwright/node_modules/playwright-core/package.json" ] \
    || ! grep -q "\"version\": \"$playwright_version\"" "$dir/playwright/node_modules/playwright-core/package.json"; then
    mkdir -p "$dir/playwright"
    npm install --prefix "$dir/playwright" --no-audit --no-fund --loglevel=error \
        "playwright-core@$playwright_version" >/dev/null
fi
echo "test MCP servers, model SDKs, Claude Code and playwright-core in $dir"
