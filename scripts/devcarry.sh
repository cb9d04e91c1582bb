#!/usr/bin/env bash
# Prepares .devcarry/ (ignored) for a GPU machine that has only the driver, NVRTC and
# PyTorch (the lent H200), so that scripts/gpu-suite.sh runs there with nothing to build:
#   .devcarry/pack/kcache-dist.tar.xz   kcached and its compile worker, static (build-static.sh)
#   .devcarry/bin/                      cuda_driver_gpu_test, client_gpu_test, stripped
#   .devcarry/pygen/kcache/             the generated Python protobuf / gRPC modules
#   .devcarry/pack/cubins.tar.xz        every forward and backward kernel-suite variant and
#                                       bench_attention.py's kernels, compiled here with
#                                       NVRTC (tests/kernels/kc_attn.py)
# The kernel suites then spend no device time compiling (their ~390 variants took minutes
# there), and the cubins travel packed: unpacked they are over half of the 64 MiB a device
# call may carry. Carry the three folders: .devcarry/pack .devcarry/bin .devcarry/pygen.
# KCACHE_JOBS as for build.sh; KC_SKIP_CUBINS=1 leaves the cubin pack out.
# There: `scripts/devcarry.sh --unpack` (gpu-suite.sh and run_issue27.sh call it) puts the
# programs into dist/ and the cubins into .devcarry/cubins, each unless already there.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ${1:-} == --unpack ]]; then
  # Python's tarfile: the GPU machine may lack xz. The dist archive holds the two programs
  # without a folder (build-static.sh packs them from dist/).
  if [[ ! -x dist/kcached && -f .devcarry/pack/kcache-dist.tar.xz ]]; then
    mkdir -p dist
    python3 -c "import tarfile; tarfile.open('.devcarry/pack/kcache-dist.tar.xz').extractall('dist')"
  fi
  if [[ ! -d .devcarry/cubins && -f .devcarry/pack/cubins.tar.xz ]]; then
    python3 -c "import tarfile; tarfile.open('.devcarry/pack/cubins.tar.xz').extractall('.devcarry')"
  fi
  exit 0
fi
BUILD_DIR=${KCACHE_BUILD_DIR:-build}
scripts/build-static.sh
cmake --build "$BUILD_DIR" -j "${KCACHE_JOBS:-$(nproc)}" \
  --target client_gpu_test cuda_driver_gpu_test kcache_python_proto
mkdir -p .devcarry/bin .devcarry/pack .devcarry/pygen
cp dist/kcache-dist.tar.xz .devcarry/pack/
for t in client_gpu_test cuda_driver_gpu_test; do
  strip -o ".devcarry/bin/$t" "$BUILD_DIR/bin/$t"
done
rm -rf .devcarry/pygen/kcache
cp -r "$BUILD_DIR/client/python/gen/kcache" .devcarry/pygen/
if [[ -z ${KC_SKIP_CUBINS:-} ]]; then
  # compile_spec touches each cubin it is asked for, cached or new: what is newer than the
  # stamp is exactly what today's kernels and variants use, and only that is packed.
  stamp=.devcarry/cubins.stamp
  mkdir -p .devcarry/cubins
  touch "$stamp"
  sleep 1  # mtime granularity: a cubin used now must come out newer than the stamp
  python3 tests/kernels/test_attention_fwd.py --compile-only >/dev/null
  python3 tests/kernels/test_attention_bwd.py --compile-only >/dev/null
  python3 bench/attention/bench_attention.py --precompile >/dev/null
  python3 bench/attention/bench_attention.py --precompile --backward >/dev/null
  (cd .devcarry && find cubins -type f -newer cubins.stamp -print0 |
    tar --null -cf - -T - | xz -6 -T0 >pack/cubins.tar.xz.tmp)
  mv .devcarry/pack/cubins.tar.xz.tmp .devcarry/pack/cubins.tar.xz
  rm -f "$stamp"
fi
du -sh .devcarry/pack .devcarry/bin .devcarry/pygen
