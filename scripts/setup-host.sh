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
      # A sandbox resolves its own host name (its id; `sudo`, `hostname -f`) through
      # nss-myhostname, named in the base template's nsswitch.conf: nothing to write per
      # sandbox.
      libnss-myhostname
      # Per-sandbox networks: the daemon loads its table through `nft -j -f -`.
      nftables
      # The secrets test makes its test CA and server certificate with openssl.
      openssl
      # `rampart template build` with from = "debian:SUITE" (the base is made by mmdebstrap).
      mmdebstrap
      # The copy-on-write store (snapshots, fork, volumes) when <data> has no reflink.
      xfsprogs
      # The gVisor isolation tier (`"isolation": "gvisor"`, docs/isolation.md).
      runsc
      # The fleet (docs/fleet.md): etcd for `rampart fleet up` and the fleet tests; the etcd
      # client crate compiles etcd's protocol files with protoc and its well-known types.
      etcd-server etcd-client protobuf-compiler libprotobuf-dev
      # The code-interpreter-v1 template's kernels (seen in every sandbox's /usr): IPython with
      # matplotlib and pandas; R with IRkernel; JShell (the Java kernel is ours, over it); and
      # what bash_kernel needs besides itself (pexpect comes with IPython). pip installs
      # bash_kernel below.
      python3-ipykernel python3-jupyter-client python3-matplotlib python3-numpy python3-pandas
      python3-filetype python3-pip r-base-core r-cran-irkernel default-jdk-headless)

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

# The code interpreter's kernels that are not Debian packages, pinned, in a directory of the
# host's /usr (every sandbox of the built-in code-interpreter-v1 template sees it):
# bash_kernel from PyPI, and Deno from npm (its built-in Jupyter kernel runs JavaScript and
# TypeScript; the binary ships in the npm package @deno/linux-<arch>-glibc). The server
# (crates/rampart-core/templates/code-interpreter/server.py) looks for them there. Without
# registry access this warns and goes on; those languages then answer that their kernel is
# not installed. Nothing is fetched when a sandbox runs.
kernels=/usr/local/lib/rampart-kernels
BASH_KERNEL="bash_kernel==0.10.0"
DENO_NPM="deno@2.9.6"
if [[ "$(cat "$kernels/python/.installed" 2>/dev/null)" != "$BASH_KERNEL" ]]; then
  echo "rampart setup: pip install $BASH_KERNEL into $kernels/python" >&2
  rm -rf "$kernels/python"
  if /usr/bin/python3 -m pip install -q --disable-pip-version-check --no-deps \
       --no-compile --target "$kernels/python" "$BASH_KERNEL"; then
    echo "$BASH_KERNEL" > "$kernels/python/.installed"
  else
    echo "rampart setup: pip install $BASH_KERNEL failed; bash contexts will be refused" >&2
  fi
fi
if [[ "$(cat "$kernels/node/.installed" 2>/dev/null)" != "$DENO_NPM" ]]; then
  if ! command -v npm >/dev/null; then
    echo "rampart setup: installing npm (for $DENO_NPM)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null ||
      echo "rampart setup: no npm; javascript/typescript contexts will be refused" >&2
  fi
  if command -v npm >/dev/null; then
    echo "rampart setup: npm install $DENO_NPM into $kernels/node" >&2
    rm -rf "$kernels/node"
    mkdir -p "$kernels/node"
    echo '{"name":"rampart-kernels","private":true}' > "$kernels/node/package.json"
    # --ignore-scripts: the binary comes in the platform package; deno's postinstall only
    # links it, and the server runs it where it is.
    if (cd "$kernels/node" && npm install --no-audit --no-fund --silent --ignore-scripts "$DENO_NPM") &&
       ls "$kernels"/node/node_modules/@deno/*/deno >/dev/null 2>&1; then
      echo "$DENO_NPM" > "$kernels/node/.installed"
    else
      echo "rampart setup: npm install $DENO_NPM failed; javascript/typescript contexts will be refused" >&2
    fi
  fi
fi
chmod -R a+rX "$kernels" 2>/dev/null || true
