#!/usr/bin/env bash
# Installs the Debian packages Rampart needs on this host, if any is missing.
# Used by both `scripts/serve` and `scripts/test`; safe to run repeatedly.
set -euo pipefail

# Runtime: e2fsprogs (mkfs.ext4 for the per-sandbox disk), and what the `base` template
# promises inside a sandbox (bash, python3 and `python` for it as E2B's base has,
# curl, git, tput, coreutils, sudo).
# Benchmarks compare against bubblewrap, runc and util-linux's unshare.
pkgs=(e2fsprogs util-linux bash coreutils python3 python-is-python3 curl git ncurses-bin sudo ca-certificates
      procps iproute2 bubblewrap runc
      # Per-sandbox networks: the daemon loads its table through `nft -j -f -`.
      nftables
      # The secrets test makes its test CA and server certificate with openssl.
      openssl
      # `rampart template build` with from = "debian:SUITE" (the base is made by mmdebstrap).
      mmdebstrap
      # The copy-on-write store (snapshots, fork, volumes) when <data> has no reflink.
      xfsprogs
      # The code-interpreter-v1 template's IPython kernel (seen in every sandbox's /usr).
      python3-ipykernel python3-jupyter-client python3-matplotlib python3-numpy)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "rampart setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
