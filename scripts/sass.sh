#!/usr/bin/env bash
# The SASS of a cubin on a machine that has NVRTC but not the CUDA toolkit's binaries (the
# CPU machines here): nvdisasm and cuobjdump from NVIDIA's wheels on PyPI, pinned by hash,
# unpacked once into $KCACHE_BUILD_DIR/sass-tools. For reading kernels without a GPU: what a
# change did to the instructions of a loop, spills, the barriers a path waits on.
#   scripts/sass.sh CUBIN [nvdisasm options]    default options: -c (code only)
#   scripts/sass.sh --cuobjdump CUBIN [options] e.g. -res-usage
# The kernel suites' cubins are in .devcarry/cubins (tests/kernels/kc_attn.py spec_key).
set -euo pipefail
# No cd: the cubin's path is the caller's.
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KCACHE_BUILD_DIR:-build}
[[ $build == /* ]] || build=$root/$build
tools=$build/sass-tools
bin=$tools/nvidia/cu13/bin
if [[ ! -x $bin/nvdisasm || ! -x $bin/cuobjdump ]]; then
  mkdir -p "$tools/wheels"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --require-hashes \
    --dest "$tools/wheels" -r /dev/stdin <<'EOF'
nvidia-cuda-nvdisasm==13.5.37 --hash=sha256:d3fdbdd49fa53e2e4aacd3db8259d052bd2b049ececdcb69e92e083c6728e7ca
nvidia-cuda-cuobjdump==13.5.37 --hash=sha256:38780fee50863252a0b8926357faa91615ca1c8346490563f33a06100cd73f58
EOF
  for w in "$tools"/wheels/*.whl; do python3 -m zipfile -e "$w" "$tools"; done
  chmod +x "$bin/nvdisasm" "$bin/cuobjdump"
fi
if [[ ${1:-} == --cuobjdump ]]; then
  shift
  exec "$bin/cuobjdump" "$@"
fi
cubin=${1:?usage: scripts/sass.sh [--cuobjdump] CUBIN [options]}
shift
if (($# == 0)); then set -- -c; fi
exec "$bin/nvdisasm" "$@" "$cubin"
