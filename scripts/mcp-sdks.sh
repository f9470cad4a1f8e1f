#!/usr/bin/env bash
# Installs what the MCP test (crates/rampart-cli/tests/mcp.rs) drives the daemon with: the
# official MCP Python SDK (`mcp` from PyPI) and one agent framework's MCP client (the OpenAI
# Agents SDK, `openai-agents`, used without a model), into target/mcp-venv. Idempotent and
# cached. Without registry access it says so and returns 0 (the test then prints
# `skipped: ...`). Uses only the PyPI registry.
set -uo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
PKGS=(mcp==2.3.0 openai-agents==0.24.0)
source scripts/venv.sh
install_venv mcp-sdks "MCP test" "$target/mcp-venv" "${PKGS[@]}"
exit 0
