#!/usr/bin/env bash
# Installs the unmodified E2B SDKs the compatibility test (crates/rampart-cli/tests/e2b_sdk.rs)
# runs against a daemon: `e2b==2.63.0` and `e2b-code-interpreter==2.11.5` from PyPI into
# target/e2b-venv, an older release (`e2b==2.45.1`, `e2b-code-interpreter==2.9.1`, the routes
# programs not yet moved call) into target/e2b-venv-old, and `e2b` and `@e2b/code-interpreter`
# from npm into target/e2b-node.
# Idempotent and cached: a rerun
# with the same versions does nothing. Without registry access it says so and returns 0 (the
# test then prints `skipped: ...`). Uses only the PyPI and npm registries.
set -uo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
PY_PKGS=(e2b==2.63.0 e2b-code-interpreter==2.11.5)
PY_OLD_PKGS=(e2b==2.45.1 e2b-code-interpreter==2.9.1)
JS_PKGS=(e2b@2.51.0 @e2b/code-interpreter@2.8.0)

source scripts/venv.sh
install_venv e2b-sdks "Python SDK test" "$target/e2b-venv" "${PY_PKGS[@]}"
install_venv e2b-sdks "older Python SDK's script" "$target/e2b-venv-old" "${PY_OLD_PKGS[@]}"

node_dir="$target/e2b-node"
node_stamp="$node_dir/.rampart-installed"
if [[ -f "$node_stamp" && "$(cat "$node_stamp")" == "${JS_PKGS[*]}" ]]; then
  :
elif ! command -v npm >/dev/null; then
  echo "e2b-sdks: no npm; the JS SDK script will be skipped" >&2
else
  mkdir -p "$node_dir"
  [[ -f "$node_dir/package.json" ]] ||
    echo '{"name":"rampart-e2b-sdk-test","private":true,"type":"module"}' > "$node_dir/package.json"
  echo "e2b-sdks: npm install ${JS_PKGS[*]} into $node_dir" >&2
  if (cd "$node_dir" && npm install --no-audit --no-fund --silent "${JS_PKGS[@]}"); then
    echo "${JS_PKGS[*]}" > "$node_stamp"
  else
    echo "e2b-sdks: npm install failed (no npm registry access?); the JS SDK script will be skipped" >&2
  fi
fi
exit 0
