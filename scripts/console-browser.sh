#!/usr/bin/env bash
# Installs what the console's browser test (crates/rampart-cli/tests/console.rs) drives:
# Debian's chromium and chromium-driver, and Selenium from PyPI into target/console-venv.
# Idempotent and cached. Without the registries it says so and returns 0 (the test then
# prints `skipped: ...`).
set -uo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
PKGS=(selenium==4.27.1)
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  echo "console-browser: installing chromium and chromium-driver" >&2
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null; } ||
    echo "console-browser: apt-get install chromium chromium-driver failed; the console test will be skipped" >&2
fi
venv="$target/console-venv"
stamp="$venv/.rampart-installed"
want="${PKGS[*]}"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi
if ! command -v python3 >/dev/null; then
  echo "console-browser: no python3; the console test will be skipped" >&2
  exit 0
fi
echo "console-browser: installing ${want} into $venv" >&2
if ! { [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"; }; then
  echo "console-browser: cannot make a venv (python3-venv missing?); the console test will be skipped" >&2
  exit 0
fi
if ! "$venv/bin/pip" install -q --disable-pip-version-check "${PKGS[@]}"; then
  echo "console-browser: pip install failed (no PyPI access?); the console test will be skipped" >&2
  exit 0
fi
echo "$want" > "$stamp"
exit 0
