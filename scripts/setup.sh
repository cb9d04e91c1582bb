#!/usr/bin/env bash
# Installs the Debian packages kcache builds against, if any are missing.
# Does nothing (and needs no network) on a machine that already has them all.
set -euo pipefail

PACKAGES=(
  cmake ninja-build g++ clang clang-format clang-tidy libclang-rt-14-dev pkg-config
  librocksdb-dev libgrpc++-dev libgrpc-dev protobuf-compiler protobuf-compiler-grpc
  libprotobuf-dev libabsl-dev libssl-dev libzstd-dev liblz4-dev libsnappy-dev libbz2-dev
  zlib1g-dev libgflags-dev libgtest-dev libgmock-dev libbenchmark-dev libyaml-cpp-dev
  nlohmann-json3-dev systemd
  llvm-22-dev
  libhiredis-dev redis-server
  libgoogle-glog-dev
  python3-grpcio python3-protobuf python3-pytest python3-yaml
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all build dependencies present"
fi

# The CUDA toolkit (headers; NVRTC at run time) comes with the machine image
# under /usr/local/cuda. Only its headers are needed to build.
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [[ ! -f "$CUDA_HOME/include/cuda.h" || ! -f "$CUDA_HOME/include/nvrtc.h" ]]; then
  echo "setup: CUDA headers not found under $CUDA_HOME (cuda.h, nvrtc.h)." >&2
  echo "setup: set CUDA_HOME to a CUDA 12/13 toolkit." >&2
  exit 1
fi
