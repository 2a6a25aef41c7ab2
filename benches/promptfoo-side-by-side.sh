#!/usr/bin/env bash
# The same promptfoo configs run by runner and by promptfoo itself, on `echo`, side by side:
#
#   benches/promptfoo-side-by-side.sh [ROUNDS] [RUNNER_BINARY] [PYTHON_TESTS]
#                                      (3, target/release/runner, 1000)
#
# Two configs, generated here:
#   deterministic  1,000 tests, three assertions a test, from a mix of the common types (equals, contains,
#                  icontains, contains-any, contains-all, starts-with, regex, is-json,
#                  contains-json, levenshtein, not-contains, javascript); about a fifth fail
#   python         PYTHON_TESTS tests, one inline `python` assertion each (runner: a worker started once per
#                  run; promptfoo: an interpreter per assertion)
# Each is run ROUNDS times by each tool, interleaved (runner, promptfoo, runner, …); every
# round prints CPU (user+sys of the process and its children) and wall time, and the
# medians follow. Both tools run 4 tests at a time (promptfoo's default; runner `-j 4`),
# without a cache. After each round the verdicts are compared test by test, and a
# difference stops the bench. promptfoo comes from scripts/install-promptfoo.sh.
set -euo pipefail
rounds=${1:-3}
here=$(cd "$(dirname "$0")" && pwd)
runner=${2:-$here/../target/release/runner}
python_tests=${3:-1000}
promptfoo="$(bash "$here/../scripts/install-promptfoo.sh")/bin/promptfoo"
out=${TMPDIR:-/tmp}/runner-promptfoo-side-by-side
rm -rf "$out"
mkdir -p "$out/runner" "$out/promptfoo"
export PROMPTFOO_CONFIG_DIR="$out/promptfoo-config"

python3 - "$out" "$python_tests" <<'EOF'
import json, sys
out, python_tests = sys.argv[1], int(sys.argv[2])

def test(i):
    word = ["alpha", "beta", "gamma", "delta", "epsilon"][i % 5]
    text = f"Item {i}: {word} is number {i % 97}"
    if i % 7 == 0:
        text = json.dumps({"id": i, "word": word})
    asserts = []
    kind = i % 6
    if kind == 0:
        asserts.append({"type": "equals", "value": text})
    elif kind == 1:
        asserts.append({"type": "contains", "value": word})
    elif kind == 2:
        asserts.append({"type": "icontains-any", "value": [word.upper(), "zeta"]})
    elif kind == 3:
        asserts.append({"type": "contains-all", "value": [word, f"{i % 97}"]})
    elif kind == 4:
        asserts.append({"type": "regex", "value": r"\d+"})
    else:
        asserts.append({"type": "starts-with", "value": "Item"})
    if i % 7 == 0:
        asserts.append({"type": "is-json", "value": {"type": "object", "required": ["id", "word"]}})
        asserts.append({"type": "contains-json"})
    else:
        asserts.append({"type": "levenshtein", "value": f"Item {i}: {word} is number {i % 89}", "threshold": 2})
        asserts.append({"type": "not-contains", "value": "epsilon"})
    if i % 10 == 0:
        asserts.append({"type": "javascript", "value": "output.length > 10"})
    return {"vars": {"input": text}, "assert": asserts}

def write(name, tests):
    config = {"description": name, "prompts": ["{{ input }}"], "providers": ["echo"], "tests": tests}
    with open(f"{out}/{name}.yaml", "w") as f:
        json.dump(config, f, indent=1)  # JSON is YAML: both tools read it

write("deterministic", [test(i) for i in range(1000)])
write("python", [
    {"vars": {"input": f"answer {i}"}, "assert": [{"type": "python", "value": f"output.endswith(' {i}') and len(output) > {i % 13}"}]}
    for i in range(python_tests)
])
EOF

verdicts() { # config run-dir promptfoo-json: compares each test's verdict
    python3 - "$@" <<'EOF'
import json, sys
config, run, pf = sys.argv[1:]
theirs = {r["testIdx"] + 1: r["success"] for r in json.load(open(pf))["results"]["results"]}
ours, started = {}, {}
for line in open(f"{run}/events.jsonl"):
    e = json.loads(line)
    if e["type"] == "episode_started":
        started[e["episode_id"]] = int(e["task_id"].removeprefix("test-"))
    elif e["type"] == "episode_finished":
        ours[started[e["episode_id"]]] = e["outcome"].get("passed")
differ = [t for t in sorted(theirs) if theirs[t] != ours.get(t)]
passed = sum(theirs.values())
if differ or len(ours) != len(theirs):
    sys.exit(f"{config}: verdicts differ on tests {differ[:20]} ({len(ours)} vs {len(theirs)} tests)")
print(f"{config}: the same verdict on all {len(theirs)} tests ({passed} passed)")
EOF
}

measure() { # label command...: prints "label cpu_s wall_s", keeps the figures
    local label=$1
    shift
    /usr/bin/time -f "%U %S %e" -o "$out/time" "$@" >"$out/log" 2>&1 || true
    # The last line: time writes "Command exited with non-zero status N" first when one did.
    read -r user sys wall < <(tail -n 1 "$out/time")
    cpu=$(echo "$user + $sys" | bc)
    echo "$label cpu_s $cpu wall_s $wall"
    echo "$cpu $wall" >>"$out/$label.figures"
}

echo "load: $(uptime)"
for round in $(seq "$rounds"); do
    for config in deterministic python; do
        rm -rf "$out/r" "$out/pf.json"
        measure "runner/$config" "$runner" eval "$out/$config.yaml" -j 4 -q --out "$out/r" --run-id "$config"
        measure "promptfoo/$config" "$promptfoo" eval -c "$out/$config.yaml" --no-cache --no-table --no-write \
            -j 4 --output "$out/pf.json"
        verdicts "$config" "$out/r/$config" "$out/pf.json"
    done
done
echo "load: $(uptime)"
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
for config in deterministic python; do
    for tool in runner promptfoo; do
        f="$out/$tool/$config.figures"
        cpu=$(cut -d' ' -f1 "$f" | median)
        wall=$(cut -d' ' -f2 "$f" | median)
        tests=1000
        [ "$config" = python ] && tests=$python_tests
        per=$(echo "scale=3; $cpu * 1000 / $tests" | bc)
        echo "median of $rounds: $tool $config  CPU ${cpu} s (${per} ms a test)  wall ${wall} s"
    done
done
