#!/usr/bin/env bash
# Runs `cargo deny check` with deny.toml: licenses, bans and sources always; advisories when
# a RustSec advisory database is on this machine (see below).
#
# cargo-deny itself comes from crates.io, pinned (`cargo install --locked`), into
# $RAMPART_TOOLS/cargo-deny-<version> (default ~/.cache/rampart/tools): outside the clone, so
# that a fresh clone on the same machine (as CI makes) does not build it again. Installed only
# when that version is missing: the first run on a clean machine builds it (several minutes
# on 2 cores), later runs do not.
#
# Advisories: the RustSec database is a git repository on GitHub, which this project's
# machines (and CI) do not reach, and no package registry they reach ships a copy. So the
# check runs offline (`--offline`) on a clone already at
#   ${CARGO_HOME:-~/.cargo}/advisory-dbs/advisory-db-<hash>/   (deny.toml's db-path)
# which `cargo deny fetch db` makes on a machine that reaches GitHub (a clone copied there
# works too; cargo-deny refuses one older than 90 days). Without it the advisories check
# is skipped, and this script says so.
#
# Usage: scripts/cargo-deny.sh [CHECK...]  (default: every check; e.g. `licenses bans`)
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.20.2
root="${RAMPART_TOOLS:-$HOME/.cache/rampart/tools}/cargo-deny-$VERSION"
deny="$root/bin/cargo-deny"

if ! [[ -x "$deny" ]] || [[ "$("$deny" --version 2>/dev/null)" != "cargo-deny $VERSION" ]]; then
  echo "cargo-deny.sh: installing cargo-deny $VERSION from crates.io into $root" >&2
  start=$SECONDS
  cargo install --locked --quiet cargo-deny --version "=$VERSION" --root "$root"
  echo "cargo-deny.sh: installed in $((SECONDS - start))s" >&2
fi

checks=("$@")
if ((${#checks[@]} == 0)); then
  checks=(advisories licenses bans sources)
fi

db_root="${CARGO_HOME:-$HOME/.cargo}/advisory-dbs"
run=()
for c in "${checks[@]}"; do
  if [[ "$c" == advisories ]] && ! compgen -G "$db_root/advisory-db-*/.git" >/dev/null; then
    echo "cargo-deny.sh: advisories skipped: no RustSec advisory database at" \
      "$db_root/advisory-db-*/ (it comes from GitHub, which CI does not reach; see" \
      "scripts/cargo-deny.sh)" >&2
    continue
  fi
  run+=("$c")
done
if ((${#run[@]} == 0)); then
  exit 0
fi

# The crates of the whole graph (every platform's) from crates.io, so that cargo-deny itself
# can run --offline: it then fetches nothing, neither crates nor an advisory database (it
# opens the local clone).
cargo fetch --locked --quiet
echo "cargo-deny.sh: cargo deny check ${run[*]}" >&2
exec "$deny" --locked --offline check "${run[@]}"
