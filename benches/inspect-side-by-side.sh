#!/usr/bin/env bash
# The same one-turn tasks run by runner and by inspect_ai, side by side:
#
#   benches/inspect-side-by-side.sh [ROUNDS] [RUNNER_BINARY] [N...]
#                                    (1, target/release/runner, 1000 10000)
#
# For each N, N tasks are generated once (tasks.csv: an id, an input, a target) and read by
# both tools: runner's suite.yaml under `--model mock`, whose `mock:` answers every task with
# the text inspect_ai's `mockllm/model` answers, and inspect_ai's task.py, whose one solver
# is `generate()` against `mockllm/model`. Both score with a case-insensitive `includes`
# of the target; five targets in eight are in the answer. Each N is run ROUNDS times by each
# tool, interleaved (runner, inspect, runner, …), both 64 episodes at a time (runner `-j 64
# -q`; inspect `--max-samples 64 --max-connections 64 --display none`), each writing its own
# log to a fresh folder. Every run prints its CPU (user+sys of the process and its
# children, from wait4 as /usr/bin/time reads it, but to the microsecond), its CPU per
# episode (the whole process's CPU over N: the start included) and its wall time, and the
# ratio inspect/runner of the round's pair; the medians follow. After each pair the
# verdicts are compared task by task, and a difference stops the bench. N=1 measures each
# tool's start. inspect_ai comes from scripts/install-inspect.sh.
#
# mockllm counts the input's tokens with tiktoken when an answer carries no usage, which
# downloads an encoding on first use; offline that fails every sample. task.py gives
# mockllm its default text as a custom output with the usage filled in, which skips the
# count: inspect does a little less than by default, so the ratios lean its way.
set -euo pipefail
rounds=${1:-1}
here=$(cd "$(dirname "$0")" && pwd)
runner=$(realpath "${2:-$here/../target/release/runner}")
shift 2 || shift $#
sizes=("$@")
[ ${#sizes[@]} -eq 0 ] && sizes=(1000 10000)
inspect="$(bash "$here/../scripts/install-inspect.sh")/bin/inspect"
python="$(dirname "$inspect")/../venv/bin/python"
out=${TMPDIR:-/tmp}/runner-inspect-side-by-side
rm -rf "$out"
mkdir -p "$out"
answer="Default output from mockllm/model"

for n in "${sizes[@]}"; do
    mkdir -p "$out/n$n"
    python3 - "$out/n$n" "$n" "$answer" <<'EOF'
import csv, sys
folder, n, answer = sys.argv[1], int(sys.argv[2]), sys.argv[3]
# Five in the answer (in any case), three not.
targets = ["output", "MOCKLLM/MODEL", "Default Output", "zebra", "from mock",
           "output from model", "default output from mockllm/model", "nothing here"]
with open(f"{folder}/tasks.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["id", "input", "target"])
    for i in range(n):
        w.writerow([f"task-{i}", f"Question {i}: what does item {i % 97} say?", targets[i % len(targets)]])
with open(f"{folder}/suite.yaml", "w") as f:
    f.write(f"""suite: inspect-side-by-side
description: {n} one-turn tasks, the mock's fixed answer scored by includes.
environment: kv
tools: []
dataset:
  path: tasks.csv
  columns: {{id: id, input: input, target: target}}
scorers:
  - includes: "{{{{ target }}}}"
    ignore_case: true
mock:
  - text: "{answer}"
""")
with open(f"{folder}/task.py", "w") as f:
    f.write(f'''from pathlib import Path

from inspect_ai import Task, task
from inspect_ai.dataset import FieldSpec, csv_dataset
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import includes
from inspect_ai.solver import generate

TEXT = "{answer}"


def answer(input, tools, tool_choice, config):
    # mockllm's default answer, with a usage so that mockllm need not count tokens.
    output = ModelOutput.from_content(model="mockllm", content=TEXT)
    output.usage = ModelUsage(input_tokens=8, output_tokens=len(TEXT), total_tokens=8 + len(TEXT))
    return output


@task
def side_by_side():
    return Task(
        dataset=csv_dataset(str(Path(__file__).parent / "tasks.csv"), FieldSpec(input="input", target="target", id="id")),
        solver=generate(),
        scorer=includes(),
        model=get_model("mockllm/model", custom_outputs=answer),
    )
''')
EOF
done

verdicts() { # runner-run-dir inspect-log-dir n: compares each task's verdict
    "$python" - "$@" <<'EOF'
import glob, json, sys
from inspect_ai.log import read_eval_log_sample_summaries
run, logs, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
files = glob.glob(f"{logs}/*.eval")
if len(files) != 1:
    sys.exit(f"inspect wrote {len(files)} logs in {logs}")
theirs = {}
for s in read_eval_log_sample_summaries(files[0]):
    if s.error or "includes" not in (s.scores or {}):
        sys.exit(f"inspect: sample {s.id} unscored: {s.error}")
    theirs[s.id] = s.scores["includes"].value == "C"
ours, started = {}, {}
for line in open(f"{run}/events.jsonl"):
    e = json.loads(line)
    if e["type"] == "episode_started":
        started[e["episode_id"]] = e["task_id"]
    elif e["type"] == "episode_finished":
        ours[started[e["episode_id"]]] = e["outcome"].get("passed")
differ = [t for t in sorted(theirs) if theirs[t] != ours.get(t)]
if differ or len(ours) != n or len(theirs) != n:
    sys.exit(f"n={n}: verdicts differ on tasks {differ[:20]} ({len(ours)} vs {len(theirs)} tasks)")
print(f"n={n}: the same verdict on all {n} tasks ({sum(theirs.values())} passed)")
EOF
}

# Runs a command and writes "user_s sys_s wall_s" of it and its children to a file, from
# wait4: /usr/bin/time prints hundredths, and a runner of 1,000 episodes takes a few.
timer='
import os, sys, time
figures, log, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(log, "w") as f:
    start = time.monotonic()
    pid = os.posix_spawnp(cmd[0], cmd, os.environ, file_actions=[
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, f.fileno(), 1), (os.POSIX_SPAWN_DUP2, f.fileno(), 2)])
    _, status, usage = os.wait4(pid, 0)
    wall = time.monotonic() - start
with open(figures, "w") as f:
    f.write(f"{usage.ru_utime:.6f} {usage.ru_stime:.6f} {wall:.6f}\n")
sys.exit(os.waitstatus_to_exitcode(status))
'

measure() { # label n command...: prints the run's CPU, CPU per episode and wall time
    local label=$1 n=$2
    shift 2
    python3 -c "$timer" "$out/time" "$out/log" "$@" || {
        tail -n 20 "$out/log"
        echo "$label n=$n failed"
        exit 1
    }
    read -r user sys wall <"$out/time"
    cpu=$(awk "BEGIN {printf \"%.3f\", $user + $sys}")
    wall=$(awk "BEGIN {printf \"%.3f\", $wall}")
    per=$(awk "BEGIN {printf \"%.4f\", $cpu * 1000 / $n}")
    echo "$label n=$n cpu_s $cpu per_episode_ms $per wall_s $wall"
    echo "$cpu $wall" >>"$out/$label-$n.figures"
}

echo "load: $(uptime)"
for round in $(seq "$rounds"); do
    for n in "${sizes[@]}"; do
        rm -rf "$out/r" "$out/i"
        measure runner "$n" "$runner" eval "$out/n$n/suite.yaml" --model mock -j 64 -q --out "$out/r" --run-id run
        # inspect takes a task file's path relative to the folder it runs in.
        measure inspect "$n" env -C "$out/n$n" "$inspect" eval task.py --max-samples 64 --max-connections 64 \
            --display none --log-dir "$out/i"
        r=$(tail -n 1 "$out/runner-$n.figures" | cut -d' ' -f1)
        i=$(tail -n 1 "$out/inspect-$n.figures" | cut -d' ' -f1)
        ratio=$(awk "BEGIN {printf \"%.1f\", $i / $r}")
        echo "round $round n=$n inspect/runner CPU ${ratio}x"
        echo "$ratio" >>"$out/ratio-$n.figures"
        verdicts "$out/r/run" "$out/i" "$n"
    done
done
echo "load: $(uptime)"
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
for n in "${sizes[@]}"; do
    for tool in runner inspect; do
        f="$out/$tool-$n.figures"
        cpu=$(cut -d' ' -f1 "$f" | median)
        wall=$(cut -d' ' -f2 "$f" | median)
        per=$(awk "BEGIN {printf \"%.4f\", $cpu * 1000 / $n}")
        echo "median of $rounds: $tool n=$n  CPU ${cpu} s (${per} ms an episode, start included)  wall ${wall} s"
    done
    ratios=$(sort -n "$out/ratio-$n.figures" | tr '\n' ' ')
    echo "median of $rounds: n=$n inspect/runner CPU $(median <"$out/ratio-$n.figures")x (rounds: ${ratios% })"
done
