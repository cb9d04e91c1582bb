# Finds the LLVM that the raw-kernel path links (Debian's llvm-22-dev, under
# /usr/lib/llvm-22): its NVPTX backend turns LLVM IR into PTX in the compile
# worker (compiler/llvm/llvm_nvptx.cc), its Object library reads cubins for
# `kcache show`. Sets LLVM_* as LLVMConfig.cmake does; the release lands in
# the raw toolchain's fingerprint (compiler/CMakeLists.txt), so moving to
# another LLVM changes every raw key (docs/ops.md "Raw kernels").
#
# One release, named here: KCACHE_LLVM_MAJOR. LLVMConfigVersion.cmake
# accepts only a matching major.minor, hence the find_package version below.
set(KCACHE_LLVM_MAJOR 22)
set(KCACHE_LLVM_MINOR 1)
set(_kc_llvm_cmake_dir /usr/lib/llvm-${KCACHE_LLVM_MAJOR}/lib/cmake/llvm)
if(NOT EXISTS ${_kc_llvm_cmake_dir}/LLVMConfig.cmake)
  message(FATAL_ERROR
    "kcache: LLVM ${KCACHE_LLVM_MAJOR} not found under ${_kc_llvm_cmake_dir}: install "
    "llvm-${KCACHE_LLVM_MAJOR}-dev (scripts/setup.sh) or configure with -DKCACHE_WITH_LLVM=OFF")
endif()
# LLVM's exported targets name zstd::libzstd_shared, which only LLVM's own
# Findzstd.cmake defines (RocksDB's, found first, does not).
include(${_kc_llvm_cmake_dir}/Findzstd.cmake)
find_package(LLVM ${KCACHE_LLVM_MAJOR}.${KCACHE_LLVM_MINOR} CONFIG REQUIRED
  HINTS ${_kc_llvm_cmake_dir} NO_DEFAULT_PATH)
message(STATUS "kcache: LLVM ${LLVM_PACKAGE_VERSION} from ${LLVM_DIR}")
