#!/bin/bash
# Writes reward.json: 1 when both sums come out right.
mkdir -p /logs/verifier
a=$(python3 /app/sum.py 1 2 3 4 5)
b=$(python3 /app/sum.py 7)
if [ "$a" = "$EXPECTED" ] && [ "$b" = "7" ]; then
  echo '{"reward": 1.0}' > /logs/verifier/reward.json
else
  echo "got '$a' and '$b'" >&2
  echo '{"reward": 0.0}' > /logs/verifier/reward.json
fi
