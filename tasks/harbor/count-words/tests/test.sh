#!/bin/bash
# The expected count is computed here, from the task's own copy of the essay.
mkdir -p /logs/verifier
expected=$(wc -w < /app/data/essay.txt | tr -d ' ')
got=$(tr -d ' \n' < /app/count.txt 2>/dev/null)
if [ "$got" = "$expected" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "expected $expected words, found '$got'" >&2
  echo 0 > /logs/verifier/reward.txt
fi
