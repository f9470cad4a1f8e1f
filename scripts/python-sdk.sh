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
source scripts/venv.sh
install_venv python-sdk "Python SDK test" "$venv" "${PKGS[@]}" || exit 0
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation \
  --force-reinstall ./sdk/python >&2 || echo "python-sdk: installing sdk/python failed" >&2
exit 0
