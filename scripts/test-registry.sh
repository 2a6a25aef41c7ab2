#!/usr/bin/env bash
# A real OCI registry for the image tests: Debian's `docker-registry` on 127.0.0.1, with
# test images pushed into it. Usage: scripts/test-registry.sh DIR
#
# The images are made once and cached in $RUNNER_TEST_IMAGES (else
# ~/.cache/runner-test-images), so reruns are quick:
#   base   `mmdebstrap --variant=minbase bookworm` as one layer (umoci)
#   top    base and a second layer: a whiteout of /etc/issue, an opaque
#          /usr/share/doc holding only `only-this`, a setuid /usr/local/bin/runner-test
#          owned 1000:1000; working folder /srv, FOO=bar, user 1000
# The registry keeps its blobs in DIR/storage and serves
#   runner-test/base:bookworm  (OCI media types)
#   runner-test/base:docker    (Docker v2 schema 2 media types)
#   runner-test/top:1          (OCI)
# When it is ready its address (127.0.0.1:PORT) is written to DIR/address. The script then
# stays until its parent is gone (or it is sent TERM), and stops the registry then.
set -euo pipefail
dir="$(realpath "${1:?usage: test-registry.sh DIR}")"
cache="${RUNNER_TEST_IMAGES:-$HOME/.cache/runner-test-images}"
parent=$PPID
mkdir -p "$cache" "$dir/storage"

make_images() {
    local work
    work="$(mktemp -d "$cache/tmp.XXXXXX")"
    mmdebstrap --quiet --variant=minbase --mode=root bookworm "$work/rootfs.tar" >/dev/null
    umoci init --layout "$work/oci"
    umoci new --image "$work/oci:base"
    umoci raw add-layer --image "$work/oci:base" "$work/rootfs.tar"
    umoci config --image "$work/oci:base" --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --config.cmd /bin/bash --os linux --architecture amd64
    mkdir -p "$work/top/etc" "$work/top/usr/share/doc" "$work/top/usr/local/bin"
    : >"$work/top/etc/.wh.issue"
    : >"$work/top/usr/share/doc/.wh..wh..opq"
    echo "the only entry" >"$work/top/usr/share/doc/only-this"
    printf '#!/bin/sh\necho hi\n' >"$work/top/usr/local/bin/runner-test"
    chown 1000:1000 "$work/top/usr/local/bin/runner-test"
    chmod 4755 "$work/top/usr/local/bin/runner-test"
    tar --numeric-owner -C "$work/top" -cf "$work/top.tar" etc usr
    umoci tag --image "$work/oci:base" top
    umoci raw add-layer --image "$work/oci:top" "$work/top.tar"
    umoci config --image "$work/oci:top" --config.workingdir /srv --config.env FOO=bar --config.user 1000
    rm -rf "$cache/oci"
    mv "$work/oci" "$cache/oci"
    rm -rf "$work"
}

[ -f "$cache/oci/index.json" ] || make_images

port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
cat >"$dir/config.yml" <<EOF
version: 0.1
log:
  level: error
storage:
  filesystem:
    rootdirectory: $dir/storage
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$port
EOF
docker-registry serve "$dir/config.yml" >"$dir/registry.log" 2>&1 &
registry=$!
trap 'kill $registry 2>/dev/null || true' EXIT
for _ in $(seq 100); do
    if python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" 2>/dev/null; then break; fi
    sleep 0.1
done
push() {
    skopeo copy --quiet --dest-tls-verify=false "$@"
}
push "oci:$cache/oci:base" "docker://127.0.0.1:$port/runner-test/base:bookworm"
push --format v2s2 "oci:$cache/oci:base" "docker://127.0.0.1:$port/runner-test/base:docker"
push "oci:$cache/oci:top" "docker://127.0.0.1:$port/runner-test/top:1"
echo "127.0.0.1:$port" >"$dir/address.tmp"
mv "$dir/address.tmp" "$dir/address"
while kill -0 "$parent" 2>/dev/null && kill -0 "$registry" 2>/dev/null; do
    sleep 0.5
done
