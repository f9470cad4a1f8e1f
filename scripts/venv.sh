# Sourced by the scripts that install test clients from PyPI (e2b-sdks.sh, mcp-sdks.sh,
# python-sdk.sh, desktop-sdks.sh, console-browser.sh, kubernetes-validate.sh).
#
# install_venv LABEL WHAT DIR PACKAGES...: a venv at DIR with exactly PACKAGES, stamped
# (DIR/.rampart-installed), so a rerun with the same pins does nothing. Without python3, a
# venv or PyPI it says that WHAT will be skipped and returns 1.
install_venv() {
  local label="$1" what="$2" venv="$3"
  shift 3
  local stamp="$venv/.rampart-installed" want="$*"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return 0
  fi
  if ! command -v python3 >/dev/null; then
    echo "$label: no python3; the $what will be skipped" >&2
    return 1
  fi
  echo "$label: installing $want into $venv" >&2
  if ! { [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"; }; then
    echo "$label: cannot make a venv (python3-venv missing?); the $what will be skipped" >&2
    return 1
  fi
  if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@"; then
    echo "$label: pip install failed (no PyPI access?); the $what will be skipped" >&2
    return 1
  fi
  echo "$want" > "$stamp"
}
