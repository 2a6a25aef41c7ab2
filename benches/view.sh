#!/bin/sh
# The viewer on a big run: how long a 100,000-episode run takes to open (a fresh viewer
# reads its log, then answers the run's page and its first page of episodes) and to filter
# (the episodes of one outcome, a text search, a far page), over HTTP as the page asks:
#
#   benches/view.sh RUNNER [ROUNDS]        e.g. benches/view.sh target/release/runner 5
#
# Needs curl. Makes the run once under $TMPDIR/runner-view (kv-episode.yaml, --epochs 100000)
# and keeps it for later rounds; prints each round's times and the medians, in seconds.
set -eu
bin=$1
rounds=${2:-5}
here=$(cd "$(dirname "$0")" && pwd)
out=${TMPDIR:-/tmp}/runner-view
mkdir -p "$out"
if [ ! -f "$out/big/events.jsonl" ] || ! grep -q run_finished "$out/big/events.jsonl"; then
    rm -rf "$out/big"
    "$bin" eval "$here/suites/kv-episode.yaml" --model mock --epochs 100000 -j 64 -q --out "$out" --run-id big >/dev/null 2>&1 || true
fi
echo "run: $(wc -l <"$out/big/events.jsonl") events, $(du -h "$out/big/events.jsonl" | cut -f1)"
at() { curl -s -o /dev/null -w '%{time_total}' "$url$1"; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
: >"$out/open" ; : >"$out/failed" ; : >"$out/text" ; : >"$out/far"
for round in $(seq "$rounds"); do
    # A fresh file: the last round's address must not be read for this round's.
    rm -f "$out/viewer.out"
    "$bin" view "$out/big" --listen 127.0.0.1:0 >"$out/viewer.out" 2>&1 &
    pid=$!
    while ! grep -qs '^viewer:' "$out/viewer.out"; do sleep 0.05; done
    url=$(awk '/^viewer:/ {print $2}' "$out/viewer.out" | sed 's:/$::')
    start=$(date +%s.%N)
    at /api/runs/big >/dev/null
    at '/api/runs/big/episodes?limit=100' >/dev/null
    open=$(echo "$(date +%s.%N) - $start" | bc)
    failed=$(at '/api/runs/big/episodes?status=failed&limit=100')
    text=$(at '/api/runs/big/episodes?q=99999&limit=100')
    far=$(at '/api/runs/big/episodes?status=passed&offset=90000&limit=100')
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    echo "round $round: open $open s, filter failed $failed s, search $text s, page at 90,000 $far s"
    echo "$open" >>"$out/open"; echo "$failed" >>"$out/failed"; echo "$text" >>"$out/text"; echo "$far" >>"$out/far"
done
echo "median: open $(median <"$out/open") s, filter failed $(median <"$out/failed") s, search $(median <"$out/text") s, page at 90,000 $(median <"$out/far") s"
