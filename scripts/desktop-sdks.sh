#!/usr/bin/env bash
# Installs what the desktop test (crates/rampart-cli/tests/desktop.rs) drives a desktop
# sandbox with: the unmodified `e2b-desktop` SDK and Playwright (which connects to the
# sandbox's Chromium over CDP and downloads no browser for that) from PyPI, into
# target/desktop-venv. Idempotent and cached. Without registry access it says so and
# returns 0 (the test then prints `skipped: ...`). The desktop template itself is built by
# the test from templates/desktop.toml (Debian packages; cached in its data directory).
set -uo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
PY_PKGS=(e2b-desktop==2.7.2 e2b==2.63.0 playwright==1.65.2)
JS_PKG="@e2b/desktop@2.4.0"

node_dir="$target/desktop-node"
if [[ -f "$node_dir/.rampart-installed" && "$(cat "$node_dir/.rampart-installed")" == "$JS_PKG" ]]; then
  :
elif ! command -v npm >/dev/null; then
  echo "desktop-sdks: no npm; the JS desktop script will be skipped" >&2
else
  mkdir -p "$node_dir"
  [[ -f "$node_dir/package.json" ]] || echo '{"private": true}' > "$node_dir/package.json"
  if (cd "$node_dir" && npm install -q --no-audit --no-fund "$JS_PKG" >/dev/null); then
    echo "$JS_PKG" > "$node_dir/.rampart-installed"
  else
    echo "desktop-sdks: npm install $JS_PKG failed (no npm registry access?); the JS desktop script will be skipped" >&2
  fi
fi

source scripts/venv.sh
install_venv desktop-sdks "desktop test" "$target/desktop-venv" "${PY_PKGS[@]}"
exit 0
