#!/usr/bin/env bash
# Installs the repository's Python SDK (sdk/python) and what its tests need (httpx, pytest,
# from PyPI; securesystemslib for the DSSE export test) into target/sdk-venv, for crates/rampart-cli/tests/python_sdk.rs. The
# dependencies are cached; the SDK itself is reinstalled from the checkout each time.
# Without registry access it says so and returns 0 (the test then prints `skipped: ...`).
set -uo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
PKGS=(httpx==0.28.1 websockets==15.0.1 pytest==8.3.4 setuptools==75.8.0 wheel==0.45.1
      "securesystemslib[crypto]==1.6.0")
venv="$target/sdk-venv"
stamp="$venv/.rampart-installed"
want="${PKGS[*]}"
if ! command -v python3 >/dev/null; then
  echo "python-sdk: no python3; the Python SDK test will be skipped" >&2
  exit 0
fi
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  echo "python-sdk: installing ${want} into $venv" >&2
  if ! { [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"; }; then
    echo "python-sdk: cannot make a venv (python3-venv missing?); the test will be skipped" >&2
    exit 0
  fi
  if ! "$venv/bin/pip" install -q --disable-pip-version-check "${PKGS[@]}"; then
    echo "python-sdk: pip install failed (no PyPI access?); the test will be skipped" >&2
    exit 0
  fi
  echo "$want" > "$stamp"
fi
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation \
  --force-reinstall ./sdk/python >&2 || echo "python-sdk: installing sdk/python failed" >&2
exit 0
