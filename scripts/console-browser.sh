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
source scripts/venv.sh
install_venv console-browser "console test" "$target/console-venv" "${PKGS[@]}"
exit 0
