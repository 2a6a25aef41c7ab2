"""An evaluation on a Ray cluster: one Ray task per shard, each retried by Ray, then merged.

    python examples/ray/driver.py --address auto --shards 4 --out /shared/results \
        --run-name nightly-2026-12-02 -- tasks/ --model openai/gpt-4o-mini

Each shard is a Ray task (Ray's public API only: ray.init, @ray.remote, .options, ray.get)
that runs `runner eval SUITES... --shard I/N --out OUT/RUN_NAME --run-id shard-I` in the
folder the driver was started from. A shard whose process dies (killed, the node lost) is
retried by Ray (`max_retries`), and the retry resumes it (`--resume`): the episodes it
finished are kept. When every shard is done, the driver runs `runner merge` into
OUT/RUN_NAME/merged and exits with its verdict. A shard that failed every attempt is named,
and nothing is merged (unless --allow-partial). OUT and the suites must be at the same path
on every node (a shared file system), and `runner` on every node's PATH (or --runner).
"""

import argparse
import os
import signal
import socket
import subprocess
import sys

import ray

# runner's exit codes that are verdicts, judged after the merge: 0 passed, 1 a gate failed,
# 3 too many unscored. Anything else fails the shard.
VERDICTS = (0, 1, 3)


class ShardDied(RuntimeError):
    """The shard's process was killed: Ray runs the task again, which resumes the shard."""


class ShardFailed(RuntimeError):
    """runner refused or could not write its results: another attempt would fail the same way."""


def die_with_parent():
    """In the shard's process, before runner starts: killed when its Ray worker dies, so that
    a retry never finds the shard still being written by an orphan (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@ray.remote(retry_exceptions=[ShardDied])
def run_shard(index, shards, runner, eval_args, out, cwd):
    """One shard: a fresh run, or the resumption of what an earlier attempt left."""
    folder = os.path.join(out, f"shard-{index}")
    if os.path.isfile(os.path.join(folder, "events.jsonl")):
        where = ["--resume", folder]
    else:
        where = ["--run-id", f"shard-{index}"]
    command = [runner, "eval", *eval_args, "--shard", f"{index}/{shards}", "--out", out, "-q", *where]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, preexec_fn=die_with_parent)
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        raise ShardDied(f"shard {index}/{shards}: runner was killed by {name}")
    if done.returncode not in VERDICTS:
        raise ShardFailed(f"shard {index}/{shards}: runner exited {done.returncode}: {done.stderr.strip()}")
    return {"shard": index, "code": done.returncode, "resumed": where[0] == "--resume"}


def reachable(address, timeout_s=5.0):
    """Whether a `host:port` address answers; `auto` and `ray://` addresses are left to Ray."""
    if address in ("auto", "local") or "://" in address:
        return True
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", default="auto", help="the Ray cluster: host:port of its head, or auto")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--out", default="results", help="the results folder, on a shared file system")
    parser.add_argument("--run-name", required=True, help="one name per evaluation: OUT/RUN_NAME/")
    parser.add_argument("--runner", default="runner", help="the runner binary on the nodes")
    parser.add_argument("--cpus-per-shard", type=float, default=1, help="Ray's num_cpus for each shard")
    parser.add_argument("--memory-per-shard", type=int, default=None, help="Ray's memory (bytes) for each shard")
    parser.add_argument("--max-retries", type=int, default=2, help="attempts after the first, per shard")
    parser.add_argument("--allow-partial", action="store_true", help="merge even when a shard failed")
    parser.add_argument("--merge-flag", action="append", default=[], help="a flag for runner merge (repeat)")
    parser.add_argument("eval_args", nargs="+", help="after --: the suites and flags of runner eval")
    args = parser.parse_args()

    if not reachable(args.address):
        print(f"error: cannot reach the Ray cluster at {args.address}: nothing was run or merged", file=sys.stderr)
        return 2
    try:
        ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
    except Exception as e:  # Ray raises ConnectionError and others, by version.
        print(f"error: cannot reach the Ray cluster at {args.address}: {e}; nothing was run or merged", file=sys.stderr)
        return 2

    out = os.path.abspath(os.path.join(args.out, args.run_name))
    os.makedirs(out, exist_ok=True)
    resources = {"num_cpus": args.cpus_per_shard, "max_retries": args.max_retries}
    if args.memory_per_shard:
        resources["memory"] = args.memory_per_shard
    pending = {
        run_shard.options(**resources).remote(i, args.shards, args.runner, args.eval_args, out, os.getcwd()): i
        for i in range(1, args.shards + 1)
    }
    failed = []
    for ref, index in pending.items():
        try:
            done = ray.get(ref)
            again = " (resumed after a retry)" if done["resumed"] else ""
            print(f"shard {index}/{args.shards}: done, exit {done['code']}{again}")
        except Exception as e:  # a task's error arrives wrapped (RayTaskError), its cause inside.
            cause = getattr(e, "cause", None) or e
            tries = 1 + args.max_retries if isinstance(cause, ShardDied) else 1
            print(f"shard {index}/{args.shards}: failed after {tries} attempt(s): {cause}", file=sys.stderr)
            failed.append(index)
    ray.shutdown()

    if failed and not args.allow_partial:
        names = ", ".join(f"{i}/{args.shards}" for i in failed)
        print(f"error: shard(s) {names} failed: nothing merged; rerun to resume them, or pass --allow-partial",
              file=sys.stderr)
        return 1
    shards = [os.path.join(out, f"shard-{i}") for i in range(1, args.shards + 1)]
    shards = [s for s in shards if os.path.isfile(os.path.join(s, "events.jsonl"))]
    merge = [args.runner, "merge", *shards, "--out", out, "--run-id", "merged", *args.merge_flag]
    if failed:
        merge.append("--allow-partial")
    return subprocess.run(merge).returncode


if __name__ == "__main__":
    sys.exit(main())
