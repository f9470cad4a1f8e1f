#!/usr/bin/env bash
# Installs kubernetes-validate (PyPI), which checks manifests against the API schemas of a
# Kubernetes release offline, into target/kubernetes-venv, for
# crates/rampart-cli/tests/kubernetes.rs (the manifests in deploy/kubernetes/). Idempotent and
# cached. Without registry access it says so and returns 0 (the test then prints
# `skipped: ...`). Uses only the PyPI registry.
set -uo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
PKGS=(kubernetes-validate==1.37.0)
source scripts/venv.sh
install_venv kubernetes-validate "Kubernetes manifest test" "$target/kubernetes-venv" "${PKGS[@]}"
exit 0
