#!/usr/bin/env bash
# C++ projects can consume the client: configure kcache with only the client
# (KCACHE_CLIENT_ONLY: gRPC, Protobuf and abseil, no RocksDB, LLVM, GTest or
# Google Benchmark), install it into a prefix, then build and run a consumer
# project against it twice: through the CMake package (kcache::client) and
# through pkg-config (kcache-client.pc).
#
# usage: install_test.sh SOURCE_DIR WORK_DIR
set -euo pipefail
src=$1 work=$2
rm -rf "$work"
mkdir -p "$work"
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
echo "install_test: configuring the client alone"
cmake -S "$src" -B "$work/build" -G Ninja -DKCACHE_CLIENT_ONLY=ON -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang "${launcher[@]}" \
  -DCMAKE_INSTALL_PREFIX="$work/prefix" >"$work/configure.log" 2>&1 \
  || { cat "$work/configure.log"; exit 1; }
if grep -qE '^(RocksDB|LLVM|GTest|benchmark|zstd)_DIR' "$work/build/CMakeCache.txt"; then
  echo "install_test: FAILED: the client-only configuration looked for other packages:" >&2
  grep -E '^(RocksDB|LLVM|GTest|benchmark|zstd)_DIR' "$work/build/CMakeCache.txt" >&2
  exit 1
fi
cmake --build "$work/build" -j "${KCACHE_JOBS:-2}" >"$work/build.log" 2>&1 \
  || { tail -50 "$work/build.log"; exit 1; }
cmake --install "$work/build" >"$work/install.log"

echo "install_test: consumer through find_package(kcache)"
cmake -S "$src/tests/install/consumer" -B "$work/consumer" -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/consumer-configure.log" 2>&1 \
  || { cat "$work/consumer-configure.log"; exit 1; }
cmake --build "$work/consumer" >"$work/consumer-build.log" 2>&1 \
  || { cat "$work/consumer-build.log"; exit 1; }
"$work/consumer/consumer"

echo "install_test: consumer through pkg-config"
export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig:$work/prefix/lib/x86_64-linux-gnu/pkgconfig"
clang++ -std=c++20 -o "$work/consumer-pc" "$src/tests/install/consumer/main.cc" \
  $(pkg-config --cflags --libs kcache-client)
"$work/consumer-pc"
echo "install_test: passed"
