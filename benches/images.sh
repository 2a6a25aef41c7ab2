#!/usr/bin/env bash
# What an image costs, for one runner binary, against podman on the same machine:
#
#   benches/images.sh RUNNER [ROUNDS]       e.g. benches/images.sh target/release/runner 3
#
# Needs root, Debian's docker-registry, mmdebstrap, umoci and skopeo (scripts/test-registry.sh
# serves a minbase bookworm image, about 170 MB unpacked), and hyperfine; podman (with runc)
# for its lines, skipped when missing. Prints, each round:
#   - CPU per command: a scripted agent's 200 `run_command`s (`true`) in a shell world in the
#     image and in a shell world on the host, less the same suites' 0-command runs, per command;
#   - an episode's start on a cached image: the wall time per episode of 100 one-command
#     episodes (-j 1) in the image, less the same on the host;
#   - a pull and unpack of the image into an empty store, and the same image served from the
#     store (`runner images pull`);
#   - a cached rebuild of a 6-step Dockerfile on it (`runner validate --build`);
#   - `podman run --rm IMAGE true` and `podman exec CONTAINER true`.
set -euo pipefail
runner=$(realpath "$1")
rounds=${2:-3}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'kill $registry_pid 2>/dev/null || true; rm -rf "$work"' EXIT
bash "$here/../scripts/test-registry.sh" "$work/registry" &
registry_pid=$!
while [ ! -f "$work/registry/address" ]; do sleep 0.2; done
address=$(cat "$work/registry/address")
image="$address/runner-test/base:bookworm"
export RUNNER_IMAGE_STORE="$work/store"
cd "$work"
printf 'images:\n  insecure: ["%s"]\n' "$address" >runner.yaml
mkdir -p environments
printf 'kind: shell\nimage: %s\n' "$image" >environments/img.yaml
printf 'kind: shell\n' >environments/host.yaml

suite() { # NAME ENVIRONMENT COMMANDS
    {
        printf 'suite: %s\nenvironment: %s\nlimits: {max_steps: 1000}\ntasks:\n  - id: t\n    input: go\n    scorers: [{equals: done}]\n    mock:\n' "$1" "$2"
        for _ in $(seq "$3"); do
            printf '      - tool_calls: [{name: run_command, arguments: {command: "true"}}]\n'
        done
        printf '      - text: done\n'
    } >"$1.yaml"
}
suite img-200 img 200
suite img-0 img 0
suite host-200 host 200
suite host-0 host 0
suite img-1 img 1
suite host-1 host 1

cpu() { # SUITE EXTRA...: user+sys seconds of one eval
    rm -rf out
    /usr/bin/time -f "%U %S" -o time "$runner" eval "$1.yaml" --model mock -q --out out --run-id r "${@:2}" >/dev/null 2>&1 || true
    read -r user sys <time
    echo "$user + $sys" | bc
}
wall() { # SUITE EXTRA...: wall seconds of one eval
    rm -rf out
    /usr/bin/time -f "%e" -o time "$runner" eval "$1.yaml" --model mock -q --out out --run-id r "${@:2}" >/dev/null 2>&1 || true
    cat time
}

mkdir -p build
cat >build/Dockerfile <<DOCKERFILE
FROM $image
ENV GREETING=hello
WORKDIR /app
COPY data.txt /app/data.txt
RUN echo built > /app/built.txt
RUN useradd -m -u 1000 app
USER app
DOCKERFILE
echo data >build/data.txt
printf 'kind: shell\nbuild: ../build\n' >environments/built.yaml
printf 'suite: built\nenvironment: built\ntasks: [{id: t, input: go, scorers: [{equals: x}]}]\n' >built.yaml

"$runner" images pull "$image" >/dev/null   # the store warm for the runs below
"$runner" validate --build built.yaml >/dev/null 2>&1
for round in $(seq "$rounds"); do
    per_command() { echo "scale=1; ($(cpu "$1-200") - $(cpu "$1-0")) * 1000000 / 200" | bc; }
    echo "round $round cpu per command in the image: $(per_command img) µs"
    echo "round $round cpu per command on the host: $(per_command host) µs"
    start=$(echo "scale=2; ($(wall img-1 --epochs 100 -j 1) - $(wall host-1 --epochs 100 -j 1)) * 1000 / 100" | bc)
    echo "round $round an episode's start on a cached image, beyond the host's: $start ms"
done
hyperfine -r $((rounds * 2)) --prepare "rm -rf $work/cold" \
    "RUNNER_IMAGE_STORE=$work/cold $runner images pull $image" 2>/dev/null | grep -E "Benchmark|Time"
hyperfine -r $((rounds * 5)) "$runner images pull $image" 2>/dev/null | grep -E "Benchmark|Time"
hyperfine -r $((rounds * 5)) "$runner validate --build built.yaml" 2>/dev/null | grep -E "Benchmark|Time"
if command -v podman >/dev/null; then
    skopeo copy -q oci:"${RUNNER_TEST_IMAGES:-$HOME/.cache/runner-test-images}/oci:base" \
        containers-storage:localhost/runner-bench/base:bookworm
    p=(podman --log-level=error --runtime runc)
    limits=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
    hyperfine -r $((rounds * 5)) "${p[*]} run --rm ${limits[*]} localhost/runner-bench/base:bookworm true" 2>/dev/null |
        grep -E "Benchmark|Time"
    "${p[@]}" run -d --name runner-bench "${limits[@]}" localhost/runner-bench/base:bookworm sleep 600 >/dev/null
    hyperfine -r $((rounds * 10)) "${p[*]} exec runner-bench true" 2>/dev/null | grep -E "Benchmark|Time"
    "${p[@]}" rm -f runner-bench >/dev/null
fi
