#!/bin/sh
# `runner eval --since` against a full rerun, on a 10,000-task suite of which 1% changed:
#
#   benches/since.sh RUNNER [ROUNDS]        e.g. benches/since.sh target/release/runner 3
#
# Makes a 10,000-task `kv` suite (each task a tool call and an answer under --model mock),
# runs it once (the earlier run), changes the input of 100 tasks, then per round measures
# (CPU from /usr/bin/time, user + sys; wall in seconds):
#   - the plan alone (`--since RUN --dry-run`, which loads the suite, reads the earlier log
#     and decides every episode), and the planning time the plan prints;
#   - the `--since` run;
#   - a full rerun of the changed suite;
# and, for the last two, the model calls made (the `model_call` events of the episodes
# that ran, not of those carried).
set -eu
runner=$1
rounds=${2:-3}
out=${TMPDIR:-/tmp}/runner-since-bench
rm -rf "$out"
mkdir -p "$out"

suite() { # changed: the first $1 tasks' inputs changed
    python3 - "$1" <<'EOF'
import sys
changed = int(sys.argv[1])
print("suite: since-bench\nenvironment: kv\nscorers: [{equals: ok}]\ntasks:")
for i in range(10000):
    q = f"q{i} changed" if i < changed else f"q{i}"
    print(f"  - {{id: t{i:05}, input: {q}, mock: [{{tool_calls: [{{name: get, arguments: {{key: k}}}}]}}, {{text: ok}}]}}")
EOF
}

calls_made() { # run folder: model calls of the episodes that ran
    python3 - "$1/events.jsonl" <<'EOF'
import json, sys
carried, calls = set(), {}
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e["type"] == "episode_carried":
        carried.add(e["episode_id"])
    elif e["type"] == "model_call":
        calls[e["episode_id"]] = calls.get(e["episode_id"], 0) + 1
print(sum(n for ep, n in calls.items() if ep not in carried))
EOF
}

measure() { # label args...: prints "label cpu_s wall_s"
    label=$1
    shift
    /usr/bin/time -f "%U %S %e" -o "$out/time" "$@" >"$out/stdout" 2>"$out/stderr" || true
    read -r user sys wall <"$out/time"
    echo "$label cpu_s=$(echo "$user + $sys" | bc) wall_s=$wall"
}

suite 0 >"$out/s.yaml"
"$runner" eval "$out/s.yaml" --model mock -j 64 -q --out "$out/r" --run-id nightly >/dev/null
suite 100 >"$out/s.yaml"
for round in $(seq "$rounds"); do
    measure "round $round plan (--dry-run)" "$runner" eval "$out/s.yaml" --model mock --out "$out/r" \
        --since "$out/r/nightly" --dry-run
    grep -o "planned in [0-9.]* s" "$out/stdout" | sed "s/^/round $round /"
    head -1 "$out/stdout" | sed "s/^/round $round /"
    rm -rf "$out/r/since" "$out/r/full"
    measure "round $round --since run" "$runner" eval "$out/s.yaml" --model mock -j 64 -q --out "$out/r" \
        --since "$out/r/nightly" --run-id since
    echo "round $round --since model calls: $(calls_made "$out/r/since")"
    measure "round $round full rerun" "$runner" eval "$out/s.yaml" --model mock -j 64 -q --out "$out/r" --run-id full
    echo "round $round full rerun model calls: $(calls_made "$out/r/full")"
done
