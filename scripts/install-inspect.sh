#!/usr/bin/env bash
# Installs inspect_ai from PyPI into a virtual environment in one cache folder:
# $RUNNER_INSPECT, else ~/.cache/runner-inspect. Idempotent, and quick when it is already
# there. Prints the folder; then
#   $dir/bin/inspect          inspect_ai's command line (it sends no telemetry unless a hook
#                              is named in INSPECT_TELEMETRY, which the wrapper unsets)
# Needs python3 (>= 3.10) with its venv module. Takes a minute or two the first time.
set -euo pipefail
dir="${RUNNER_INSPECT:-$HOME/.cache/runner-inspect}"
inspect_version="0.3.285"
if [ ! -x "$dir/venv/bin/python" ]; then
    python3 -m venv "$dir/venv"
fi
if ! "$dir/venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('inspect_ai') != '$inspect_version')" 2>/dev/null; then
    "$dir/venv/bin/pip" install --quiet --disable-pip-version-check "inspect_ai==$inspect_version" >/dev/null
fi
mkdir -p "$dir/bin"
cat >"$dir/bin/inspect" <<INNER
#!/usr/bin/env bash
# inspect_ai $inspect_version from $dir/venv.
unset INSPECT_TELEMETRY INSPECT_API_KEY_OVERRIDE
exec "$dir/venv/bin/inspect" "\$@"
INNER
chmod +x "$dir/bin/inspect"
echo "$dir"
