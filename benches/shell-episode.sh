#!/bin/sh
# What a one-turn episode in the sandboxed `shell` world costs in CPU, for one or more runner
# binaries side by side (an old build against a new one, in alternate rounds):
#
#   benches/shell-episode.sh ROUNDS BINARY...    e.g. benches/shell-episode.sh 3 /tmp/runner-old target/release/runner
#
# Runs suites/shell-one-turn.yaml (1,000 tasks, each answered by `mock` in one turn, no
# command) with -j 64, and the same suite's first task alone (--range 0..1), the run's fixed
# cost; per binary and round it prints user and system seconds of both, and the CPU per
# episode: (user+sys of 1,000 less user+sys of 1) / 999. Then the medians per binary.
# EPOCHS=N runs each task N times (N*1,000 episodes) for a steadier figure.
set -eu
rounds=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
epochs=${EPOCHS:-1}
out=${TMPDIR:-/tmp}/runner-shell-episode
rm -rf "$out"
mkdir -p "$out"

cpu() { # binary args...: prints "user sys" of one run, which must succeed
    rm -rf "$out/r"
    if ! /usr/bin/time -f "%U %S" -o "$out/time" "$@" --out "$out/r" --run-id r >"$out/log" 2>&1; then
        echo "the run failed: $*" >&2
        cat "$out/log" >&2
        exit 1
    fi
    cat "$out/time"
}

for round in $(seq "$rounds"); do
    for bin in "$@"; do
        suite="$here/suites/shell-one-turn.yaml"
        set -- $(cpu "$bin" eval "$suite" --model mock -j 64 -q --epochs "$epochs") \
            $(cpu "$bin" eval "$suite" --model mock -j 64 -q --range 0..1) "$@"
        n=$((1000 * epochs))
        per=$(echo "scale=1; ($1 + $2 - $3 - $4) * 1000000 / ($n - 1)" | bc)
        echo "round $round $bin N=$n user_s $1 sys_s $2 N=1 user_s $3 sys_s $4 cpu_per_episode_us $per" |
            tee -a "$out/rounds"
        shift 4
    done
done
echo "medians of $rounds rounds, CPU per episode (µs):"
for bin in "$@"; do
    grep " $bin " "$out/rounds" | awk '{print $NF}' | sort -n |
        awk -v bin="$bin" '{v[NR] = $1} END {m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; print bin, m}'
done
rm -rf "$out/r"
