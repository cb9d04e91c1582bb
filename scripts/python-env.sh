#!/usr/bin/env bash
# Creates the Python test environment: a virtual environment under the build
# tree (never the system's site-packages) with the PyPI packages that trainers
# and the GPU machine run (torch, Triton, grpcio, protobuf, pytest, gRPC's
# reflection and health clients), installed from the hash-pinned lock file
# scripts/python-test-requirements.txt. Re-used as long as the lock file is
# unchanged; pip's cache makes a rebuild cheap, but an empty cache works too
# (PyPI's torch brings its CUDA libraries: several GB the first time).
#
# usage: scripts/python-env.sh [VENV_DIR]   (default: $KCACHE_BUILD_DIR/pyenv)
# Prints the environment's interpreter path as its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-${KCACHE_BUILD_DIR:-build}/pyenv}
lock=scripts/python-test-requirements.txt
stamp=$venv/.kcache-lock.sha256
want=$(sha256sum "$lock" | cut -d' ' -f1)

if [[ -x $venv/bin/python && -f $stamp && $(cat "$stamp") == "$want" ]]; then
  echo "python-env: $venv is current ($lock unchanged)" >&2
else
  # Any python3 >= 3.10 with venv will do; Debian's needs python3-venv.
  py=$(command -v python3)
  if ! "$py" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    py=/usr/bin/python3
    if ! "$py" -c 'import venv, ensurepip' 2>/dev/null; then
      SUDO=""
      [[ $(id -u) -ne 0 ]] && SUDO=sudo
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv
    fi
  fi
  echo "python-env: creating $venv with $("$py" --version) from $lock" >&2
  start=$SECONDS
  rm -rf "$venv"
  "$py" -m venv "$venv"
  # --require-hashes: every package, dependencies included, is pinned by hash.
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    --require-hashes -r "$lock" >&2
  echo "$want" >"$stamp"
  echo "python-env: installed in $((SECONDS - start)) s, $(du -sh "$venv" | cut -f1)" >&2
fi
"$venv/bin/python" - >&2 <<'EOF'
import grpc, google.protobuf, torch, triton
print("python-env: torch %s, triton %s, grpcio %s, protobuf %s" % (
    torch.__version__, triton.__version__, grpc.__version__, google.protobuf.__version__))
EOF
echo "$venv/bin/python"
