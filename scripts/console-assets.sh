#!/usr/bin/env bash
# Fetches the console's third-party browser code, xterm.js and its fit addon, from the npm
# registry into crates/rampart-server/console/vendor/ (not in git), where the server's build
# embeds them in the binary. Each tarball is pinned by its registry integrity (SHA-512); a
# mismatch fails. Idempotent: a rerun with the files in place does nothing. Needs curl and
# the npm registry (the one npm is configured with, else registry.npmjs.org); without it,
# says so and returns 0 (the binary is then built without the terminal, and says so).
set -euo pipefail
cd "$(dirname "$0")/.."
out=crates/rampart-server/console/vendor
# name version file-in-tarball:dest ... integrity
XTERM=("@xterm/xterm" "5.5.0" "sha512-hqJHYaQb5OptNunnyAnkHyM8aCjZ1MEIDTQu1iIbbTD/xops91NB5yq1ZK/dC2JDbVWtF23zUtl9JE2NqwT87A==")
FIT=("@xterm/addon-fit" "0.10.0" "sha512-UFYkDm4HUahf2lnEyHvio51TNGiLK66mqP2JoATy7hRZeXaGMRDr00JiSF7m63vR5WKATF605yEggJKsw0JpMQ==")
want="${XTERM[1]} ${FIT[1]}"
if [[ -f "$out/.versions" && "$(cat "$out/.versions")" == "$want" ]]; then
  exit 0
fi
registry="https://registry.npmjs.org/"
if command -v npm >/dev/null; then
  registry="$(npm config get registry 2>/dev/null || echo "$registry")"
fi
registry="${registry%/}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

fetch() { # name version integrity -> $tmp/<base>/package
  local name="$1" version="$2" integrity="$3" base="${1##*/}"
  local url="$registry/$name/-/$base-$version.tgz"
  echo "console-assets: fetching $name@$version" >&2
  if ! curl -fsSL --retry 3 -o "$tmp/$base.tgz" "$url"; then
    echo "console-assets: cannot fetch $url; the console will be built without its terminal" >&2
    exit 0
  fi
  local got="sha512-$(openssl dgst -sha512 -binary "$tmp/$base.tgz" | base64 -w0)"
  if [[ "$got" != "$integrity" ]]; then
    echo "console-assets: $url does not match its pinned integrity ($got)" >&2
    exit 1
  fi
  mkdir -p "$tmp/$base"
  tar -xzf "$tmp/$base.tgz" -C "$tmp/$base"
}

fetch "${XTERM[@]}"
fetch "${FIT[@]}"
mkdir -p "$out"
install -m 0644 "$tmp/xterm/package/lib/xterm.js" "$out/xterm.js"
install -m 0644 "$tmp/xterm/package/css/xterm.css" "$out/xterm.css"
install -m 0644 "$tmp/xterm/package/LICENSE" "$out/LICENSE.xterm"
install -m 0644 "$tmp/addon-fit/package/lib/addon-fit.js" "$out/addon-fit.js"
install -m 0644 "$tmp/addon-fit/package/LICENSE" "$out/LICENSE.addon-fit" 2>/dev/null || true
echo "$want" > "$out/.versions"
