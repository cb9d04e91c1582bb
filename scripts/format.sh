#!/usr/bin/env bash
# The project's C++/CUDA style (.clang-format, Debian's clang-format 14):
#   scripts/format.sh          reformat every file in place
#   scripts/format.sh --check  list the files that differ and fail (CTest style_format_test)
# Files: every tracked .cc/.h/.cu/.cuh except generator output kept byte-exact
# (bench/attention/generated/, checked by generated_source_drift_test) and test
# fixtures written by other compilers (tests/fixtures/).
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
if ! command -v "$CLANG_FORMAT" >/dev/null; then
  echo "format: $CLANG_FORMAT not found (scripts/setup.sh installs clang-format)" >&2
  exit 1
fi
list() {  # tracked files; outside a git checkout, the source folders' files
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files '*.cc' '*.h' '*.cu' '*.cuh'
  else
    find bench cache client compiler kernels proto service tests tools \
      \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -type f | sort
  fi
}
mapfile -t files < <(list | grep -vE '^(bench/attention/generated|tests/fixtures)/')
if [[ ${1:-} == --check ]]; then
  bad=()
  for f in "${files[@]}"; do
    "$CLANG_FORMAT" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if ((${#bad[@]})); then
    echo "format: ${#bad[@]} of ${#files[@]} files differ from .clang-format (scripts/format.sh fixes them):" >&2
    printf '  %s\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "format: ${#files[@]} files follow .clang-format"
else
  "$CLANG_FORMAT" -i "${files[@]}"
fi
