#!/bin/sh
# What waiting on a model costs, and how close a latency-bound run comes to its ideal wall
# time, for one or more runner binaries side by side (alternate rounds):
#
#   benches/waiting.sh ROUNDS BINARY...      e.g. benches/waiting.sh 3 /tmp/runner-old target/release/runner
#
# Each model call of kv-episode.yaml (4 calls an episode) waits `--mock-delay-ms`; CPU is
# user + sys of the process (/usr/bin/time), wall is the run's own (`run_finished.wall_ms`).
# Prints per binary and round:
# - idle: one episode whose 4 calls wait 2.5 s each (10 s of waiting): CPU in ms, less the
#   same episode without waiting, per second of waiting;
# - j1: 200 episodes at -j 1, 20 ms a call (16 s of waiting): CPU per second of waiting,
#   less the same run without waiting;
# - j64, j256: 10,000 episodes at 20 ms a call: the ideal wall (10,000 × 4 × 20 ms / j)
#   as a share of the run's wall.
set -eu
rounds=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
suite=$here/suites/kv-episode.yaml
out=${TMPDIR:-/tmp}/runner-waiting
rm -rf "$out"
mkdir -p "$out"

cpu_ms() { # binary args...: the run's CPU (user + sys) in ms
    /usr/bin/time -f "%U %S" -o "$out/time" "$@" >/dev/null 2>&1 || true
    read -r user sys <"$out/time"
    echo "($user + $sys) * 1000" | bc
}

wall_ms() { # run folder: the run's own wall time in ms
    tail -1 "$1/events.jsonl" | sed 's/.*"wall_ms":\([0-9.]*\).*/\1/'
}

for round in $(seq "$rounds"); do
    for bin in "$@"; do
        rm -rf "$out/r"
        base=$(cpu_ms "$bin" eval "$suite" --model mock -q --out "$out/r" --run-id base)
        waited=$(cpu_ms "$bin" eval "$suite" --model mock --mock-delay-ms 2500 -q --out "$out/r" --run-id idle)
        echo "round $round $bin idle cpu_ms_per_s $(echo "scale=3; ($waited - $base) / 10" | bc)"
        base=$(cpu_ms "$bin" eval "$suite" --model mock --epochs 200 -j 1 -q --out "$out/r" --run-id j1base)
        waited=$(cpu_ms "$bin" eval "$suite" --model mock --mock-delay-ms 20 --epochs 200 -j 1 -q --out "$out/r" --run-id j1)
        echo "round $round $bin j1 cpu_ms_per_s $(echo "scale=3; ($waited - $base) / 16" | bc) wall_ms $(wall_ms "$out/r/j1")"
        for j in 64 256; do
            "$bin" eval "$suite" --model mock --mock-delay-ms 20 --epochs 10000 -j $j -q --out "$out/r" --run-id j$j \
                >/dev/null 2>&1 || true
            wall=$(wall_ms "$out/r/j$j")
            echo "round $round $bin j$j wall_ms $wall of_ideal $(echo "scale=4; 10000 * 4 * 20 / $j / $wall" | bc)"
        done
    done
done
rm -rf "$out"
