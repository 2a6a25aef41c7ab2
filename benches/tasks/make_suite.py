#!/usr/bin/env python3
"""Writes a suite of N one-turn tasks, like a regression set: each task has an input, a
target, a scorer of its own, and a scripted answer for `--model mock`.

    python3 benches/tasks/make_suite.py N DIR            # DIR/inline.yaml: tasks inline
    python3 benches/tasks/make_suite.py N DIR csv        # DIR/csv.yaml + DIR/rows.csv
    python3 benches/tasks/make_suite.py N DIR jsonl      # DIR/jsonl.yaml + DIR/rows.jsonl

The dataset variants put the same tasks in a file of N rows (`dataset:`), the scorer and
the answer in the suite (templated on the row's target).
"""
import csv
import json
import os
import sys

n = int(sys.argv[1])
out = sys.argv[2]
kind = sys.argv[3] if len(sys.argv) > 3 else "inline"
os.makedirs(out, exist_ok=True)


def row(i):
    return {
        "id": f"t{i:07d}",
        "input": f"Question {i}: what is {i} plus {i % 97}? Answer with the number alone.",
        "target": str(i + i % 97),
        "category": f"c{i % 13}",
    }


head = ("suite: tasks-bench\nenvironment: kv\nagent:\n  system: Answer with the number alone.\n"
        "limits: {max_steps: 2}\n")
if kind == "inline":
    with open(os.path.join(out, "inline.yaml"), "w") as f:
        f.write(head + "tasks:\n")
        for i in range(n):
            r = row(i)
            f.write(f"  - id: {r['id']}\n    input: {json.dumps(r['input'])}\n"
                    f"    target: \"{r['target']}\"\n    metadata: {{category: {r['category']}}}\n"
                    f"    scorers: [{{equals: \"{r['target']}\"}}]\n"
                    f"    mock: [{{text: \"{r['target']}\"}}]\n")
elif kind in ("csv", "jsonl"):
    data = os.path.join(out, f"rows.{kind}")
    with open(data, "w", newline="") as f:
        if kind == "csv":
            w = csv.DictWriter(f, fieldnames=["id", "input", "target", "category"])
            w.writeheader()
            for i in range(n):
                w.writerow(row(i))
        else:
            for i in range(n):
                f.write(json.dumps(row(i)) + "\n")
    with open(os.path.join(out, f"{kind}.yaml"), "w") as f:
        f.write(head + f"dataset: rows.{kind}\nscorers:\n  - equals: '{{{{ target }}}}'\n"
                "mock:\n  - text: '{{ target }}'\n")
else:
    sys.exit(f"unknown kind {kind}: inline, csv or jsonl")
