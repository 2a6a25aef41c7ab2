#!/usr/bin/env bash
# Submits an evaluation to Slurm: the shards as a job array, then the merge as a job that
# starts only when every shard succeeded (--dependency=afterok:<array job id>). Run it from
# the folder that holds the suites; it prints the two job ids.
#
#   RUN_NAME=nightly-$(date +%F) SHARDS=4 MODEL=openai/gpt-4o-mini SUITES='tasks/' \
#       examples/slurm/submit.sh
#
# Also read: OUT (default results), RUNNER (default runner, on every node's PATH),
# EVAL_FLAGS and MERGE_FLAGS (more flags for eval and merge), SBATCH_FLAGS (for both jobs,
# such as --partition=gpu --time=2:00:00). The jobs see this shell's environment (an API
# key included: export it here, never write it into the scripts).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${RUN_NAME:?set RUN_NAME: one name per evaluation}"
export RUN_NAME
export SHARDS=${SHARDS:-4}
export OUT=${OUT:-results}
logs=$OUT/$RUN_NAME/slurm
mkdir -p "$logs"
# shellcheck disable=SC2086
array=$(sbatch --parsable ${SBATCH_FLAGS:-} --array="0-$((SHARDS - 1))" \
    --output="$logs/eval-%A_%a.out" "$here/eval-array.sbatch")
array=${array%%;*} # --parsable prints JOBID[;CLUSTER]
# A shard that fails cancels the merge instead of leaving it pending for ever.
# shellcheck disable=SC2086
merge=$(sbatch --parsable ${SBATCH_FLAGS:-} --dependency="afterok:$array" --kill-on-invalid-dep=yes \
    --output="$logs/merge-%j.out" "$here/merge.sbatch")
merge=${merge%%;*}
echo "array $array"
echo "merge $merge"
