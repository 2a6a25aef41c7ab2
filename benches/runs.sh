#!/bin/sh
# Whole runs, measured by the process's own CPU time and peak RSS, for one or more runner
# binaries side by side (an old build against a new one, in alternate rounds):
#
#   benches/runs.sh ROUNDS BINARY...        e.g. benches/runs.sh 3 /tmp/runner-old target/release/runner
#
# Prints, per binary and round: CPU per episode of kv-episode.yaml at N=10,000 (-j 64);
# CPU per test of the 1,000-test regex suite (regex-1000.yaml, 5 epochs); peak RSS at
# N=100,000, and again with the log writer slowed to 20 µs a line (RUNNER_LOG_WRITE_DELAY_US,
# a test hook: about 15 MB/s, slower than the episodes make events); then the wall time of
# `runner --version` and of a one-episode eval (hyperfine, when installed).
set -eu
rounds=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
out=${TMPDIR:-/tmp}/runner-runs
rm -rf "$out"
mkdir -p "$out"

measure() { # label binary args...: prints "label  user+sys s  peak KB  wall s"
    label=$1
    shift
    /usr/bin/time -f "%U %S %M %e" -o "$out/time" "$@" >/dev/null 2>&1 || true
    read -r user sys rss wall <"$out/time"
    echo "$label $(echo "$user + $sys" | bc) $rss $wall"
}

for round in $(seq "$rounds"); do
    for bin in "$@"; do
        rm -rf "$out/r"
        measure "round $round $bin kv-episode N=10000 cpu_s" "$bin" eval "$here/suites/kv-episode.yaml" --model mock \
            --epochs 10000 -j 64 -q --out "$out/r" --run-id kv
        measure "round $round $bin regex-1000 x5 cpu_s" "$bin" eval "$here/suites/regex-1000.yaml" --model mock \
            --epochs 5 -j 64 -q --out "$out/r" --run-id regex
        measure "round $round $bin kv-episode N=100000 peak_KB" "$bin" eval "$here/suites/kv-episode.yaml" --model mock \
            --epochs 100000 -j 64 -q --out "$out/r" --run-id big
        rm -rf "$out/r"
        RUNNER_LOG_WRITE_DELAY_US=20 measure "round $round $bin kv-episode N=100000 slow-writer peak_KB" "$bin" eval \
            "$here/suites/kv-episode.yaml" --model mock --epochs 100000 -j 64 -q --out "$out/r" --run-id slow
    done
done
rm -rf "$out/r"
if command -v hyperfine >/dev/null; then
    for bin in "$@"; do
        hyperfine -N -w 20 -r 200 "$bin --version" 2>/dev/null | grep -E "Time|Benchmark"
        hyperfine -w 3 -r 30 --prepare "rm -rf $out/one" \
            "$bin eval $here/suites/kv-episode.yaml --model mock -q --out $out/one --run-id one" 2>/dev/null |
            grep -E "Time|Benchmark"
    done
fi
