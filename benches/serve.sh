#!/usr/bin/env bash
# The benchmark of `runner serve`: the server's own CPU time per episode and per step beyond
# the episodes' work (against `runner eval` of the same suite), episodes per second with
# `mock` at 64 at once, the step API's CPU per call, and the server's memory over the
# episodes. Builds the release binary first.
#   bash benches/serve.sh [EPISODES] [STEP_SESSIONS]     (defaults: 20000 and 2000)
# PROFILE=debug measures the debug build instead (no release build; its figures are higher).
set -euo pipefail
cd "$(dirname "$0")/.."
episodes="${1:-20000}"
sessions="${2:-2000}"
profile="${PROFILE:-release}"
if [ "$profile" = release ]; then
    cargo build --release --bin runner >/dev/null
else
    cargo build --bin runner >/dev/null
fi
target="${CARGO_TARGET_DIR:-target}"
python3 benches/serve.py "$target/$profile/runner" benches/suites/serve.yaml "$episodes" "$sessions"
