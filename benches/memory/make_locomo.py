#!/usr/bin/env python3
"""Writes a file of LoCoMo's size and shape (locomo10.json: 10 conversations of ~27 dated
sessions, ~590 turns and ~200 QA items each, ~2,000 in all) and a suite that reads it, to
measure what loading the whole file costs (docs/src/performance.md).

    python3 benches/memory/make_locomo.py /tmp/locomo-bench
    /usr/bin/time -f "%M KB %e s" runner validate /tmp/locomo-bench/locomo.yaml
"""
import datetime
import json
import os
import random
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/locomo-bench"
os.makedirs(out, exist_ok=True)
rng = random.Random(7)
words = ("walk dog pottery painting camping beach concert sister job interview support group "
         "adoption book guitar marathon garden recipe trip museum photo school friend family").split()


def text(n):
    return " ".join(rng.choice(words) for _ in range(n)).capitalize() + "."


samples = []
for c in range(10):
    a, b = f"Ana{c}", f"Bo{c}"
    conversation = {"speaker_a": a, "speaker_b": b}
    start = datetime.datetime(2023, 1, 1, 13, 56) + datetime.timedelta(days=30 * c)
    sessions = 27
    for s in range(1, sessions + 1):
        when = start + datetime.timedelta(days=7 * s)
        conversation[f"session_{s}_date_time"] = when.strftime("%-I:%M %p on %-d %B, %Y").lower()
        turns = []
        for t in range(1, 23):
            turn = {"speaker": a if t % 2 else b, "dia_id": f"D{s}:{t}", "text": text(rng.randint(20, 56))}
            if t % 9 == 0:
                turn["blip_caption"] = "a photo of " + text(5)
            turns.append(turn)
        conversation[f"session_{s}"] = turns
    qa = []
    for q in range(200):
        category = q % 5 + 1
        evidence = [f"D{rng.randint(1, sessions)}:{rng.randint(1, 22)}" for _ in range(rng.randint(1, 3))]
        item = {"question": "When did " + text(6).lower(), "evidence": evidence, "category": category}
        if category == 5:
            item["adversarial_answer"] = text(3)
        else:
            item["answer"] = text(4)
        qa.append(item)
    # What the published file has beside (the reader passes it over): per-session
    # observations, summaries and events.
    observation = {f"session_{s}_observation": {a: [[text(12), f"D{s}:1"]] * 4} for s in range(1, sessions + 1)}
    summary = {f"session_{s}_summary": text(60) for s in range(1, sessions + 1)}
    events = {f"events_session_{s}": {a: [text(10)] * 2, b: [text(10)] * 2} for s in range(1, sessions + 1)}
    samples.append({"sample_id": f"conv-{c + 1}", "conversation": conversation, "qa": qa,
                    "observation": observation, "session_summary": summary, "event_summary": events})

with open(os.path.join(out, "locomo.json"), "w") as f:
    json.dump(samples, f)
with open(os.path.join(out, "locomo.yaml"), "w") as f:
    f.write("suite: locomo-bench\nenvironment: memory_store\nagent: {kind: memory}\n"
            "dataset: {path: locomo.json, format: locomo}\nscorers: [{includes: x}]\n")
