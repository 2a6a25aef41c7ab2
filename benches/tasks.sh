#!/bin/sh
# Peak RSS against the number of tasks, for one or more runner binaries side by side (an
# old build against a new one, in alternate rounds):
#
#   benches/tasks.sh RUNNER...              e.g. benches/tasks.sh /tmp/runner-old target/release/runner
#
# ROUNDS (default 3), NS (default "1000 10000 100000") and ROWS (default 1000000) set the
# rounds, the suite sizes and the rows of the big dataset. The suites are made once by
# benches/tasks/make_suite.py under $TMPDIR/runner-tasks: N one-turn tasks written inline
# (each with an input, a target, metadata, a scorer and a mock answer of its own), and the
# same tasks as a CSV dataset; ROWS rows as CSV and as JSONL for `validate` alone.
#
# Prints one line per measurement, "what N binary round peak_KB", then the median of the
# rounds per binary.
set -eu
rounds=${ROUNDS:-3}
ns=${NS:-1000 10000 100000}
rows=${ROWS:-1000000}
here=$(cd "$(dirname "$0")" && pwd)
data=${TMPDIR:-/tmp}/runner-tasks
mkdir -p "$data"
for n in $ns; do
    for kind in inline csv; do
        [ -f "$data/$n/$kind.yaml" ] || python3 "$here/tasks/make_suite.py" "$n" "$data/$n" "$kind"
    done
done
for kind in csv jsonl; do
    [ -f "$data/rows-$rows/$kind.yaml" ] || python3 "$here/tasks/make_suite.py" "$rows" "$data/rows-$rows" "$kind"
done
log=$data/measured.txt
: >"$log"

peak() { # label binary args...: appends "label peak_KB"
    label=$1
    shift
    rm -rf "$data/out"
    if ! /usr/bin/time -f "%M" -o "$data/time" "$@" >/dev/null 2>"$data/stderr"; then
        echo "failed: $label" >&2
        tail -3 "$data/stderr" >&2
    fi
    echo "$label $(tail -1 "$data/time")" | tee -a "$log"
}

for round in $(seq "$rounds"); do
    for bin in "$@"; do
        for n in $ns; do
            for kind in inline csv; do
                peak "validate-$kind $n $bin $round" "$bin" validate "$data/$n/$kind.yaml"
                peak "eval-$kind $n $bin $round" "$bin" eval "$data/$n/$kind.yaml" --model mock -q --out "$data/out"
            done
        done
        for kind in csv jsonl; do
            peak "validate-$kind $rows $bin $round" "$bin" validate "$data/rows-$rows/$kind.yaml"
        done
    done
done
rm -rf "$data/out"
echo "median peak RSS (MiB) of $rounds rounds:"
# Sorted by what, N and binary, then the rounds' figures in order: the middle one.
awk '{ key = $1 " " $2 " " $3; v[key] = v[key] " " $5 } END { for (k in v) print k, v[k] }' "$log" |
    sort -k1,1 -k2,2n |
    while read -r what n bin figures; do
        median=$(printf '%s\n' $figures | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
        echo "$what $n $bin $(echo "scale=1; $median / 1024" | bc)"
    done
