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
venv="$target/mcp-venv"
stamp="$venv/.rampart-installed"
want="${PKGS[*]}"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi
if ! command -v python3 >/dev/null; then
  echo "mcp-sdks: no python3; the MCP test will be skipped" >&2
  exit 0
fi
echo "mcp-sdks: installing ${want} into $venv" >&2
if [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"; then
  if "$venv/bin/pip" install -q --disable-pip-version-check "${PKGS[@]}"; then
    echo "$want" > "$stamp"
  else
    echo "mcp-sdks: pip install failed (no PyPI access?); the MCP test will be skipped" >&2
  fi
else
  echo "mcp-sdks: cannot make a venv (python3-venv missing?); the MCP test will be skipped" >&2
fi
exit 0
