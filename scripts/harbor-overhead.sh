#!/usr/bin/env bash
# What a Harbor task costs beyond the agent's and the verifier's own commands.
#
# Runs tasks/harbor/greeting-file under the oracle, and a YAML task that runs the same
# solution command and the same verifier commands as a `check:` scorer, N episodes each, one
# at a time, ROUNDS times alternately; prints each run's median episode wall time and the
# median of the differences. Usage: scripts/harbor-overhead.sh [RUNNER] [N] [ROUNDS]
set -euo pipefail
runner=${1:-target/debug/runner}
n=${2:-60}
rounds=${3:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
runner=$(cd "$(dirname "$runner")" && pwd)/$(basename "$runner")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$here/tasks/harbor/greeting-file" "$work/"
cat > "$work/plain.yaml" <<'EOF'
suite: plain
environment: shell
scorers:
  - check: |
      bash -c 'mkdir -p logs/verifier
      if [ "$(cat greeting.txt 2>/dev/null)" = "hello, harbor" ]; then
        echo 1 > logs/verifier/reward.txt
      else
        echo 0 > logs/verifier/reward.txt
      fi'
tasks:
  - id: greeting-file
    input: Create greeting.txt containing exactly one line, hello, harbor.
    solution:
      - |
        bash -c '#!/bin/bash
        echo "hello, harbor" > "$HOME"/greeting.txt
        '
EOF
cd "$work"
for i in $(seq 1 "$rounds"); do
  "$runner" eval greeting-file --agent oracle --epochs "$n" -j 1 -q --out r --run-id "harbor$i" >/dev/null
  "$runner" eval plain.yaml --agent oracle --epochs "$n" -j 1 -q --out r --run-id "plain$i" >/dev/null
done
python3 - "$rounds" <<'EOF'
import json, statistics, sys
rounds = int(sys.argv[1])
def median_wall(run):
    events = [json.loads(line) for line in open(f"r/{run}/events.jsonl")]
    finished = [e for e in events if e["type"] == "episode_finished"]
    assert all(e["outcome"].get("passed") for e in finished), f"{run}: an episode did not pass"
    return statistics.median(e["wall_ms"] for e in finished)
gaps = []
for i in range(1, rounds + 1):
    h, p = median_wall(f"harbor{i}"), median_wall(f"plain{i}")
    gaps.append(h - p)
    print(f"round {i}: harbor task {h:.1f} ms, same commands as a YAML task {p:.1f} ms, overhead {h - p:.1f} ms")
print(f"median overhead per Harbor episode: {statistics.median(gaps):.1f} ms")
EOF
