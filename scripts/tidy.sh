#!/usr/bin/env bash
# The project's static checks (.clang-tidy, Debian's clang-tidy 14), warnings
# as errors:
#   scripts/tidy.sh --check [FILE...]  check every file, or only these; list each
#                                      finding as file:line and fail (CTest style_tidy_test)
# It reads the compile commands of a configured and built tree
# ($KCACHE_BUILD_DIR, default build/; scripts/build.sh makes one): the
# generated protobuf and gRPC headers must exist. Files: the translation units
# in compile_commands.json under cache/ client/ compiler/ service/ tools/
# tests/, and the headers they include from those folders and kernels/; not
# generated code (under the build tree), bench/, tests/fixtures/, nor the CUDA
# kernels (.cuh, compiled by NVRTC); tests/.clang-tidy leaves out clang-analyzer
# there. KCACHE_JOBS files at a time (default nproc). About 19 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
CLANG_TIDY=${CLANG_TIDY:-clang-tidy}
BUILD_DIR=${KCACHE_BUILD_DIR:-build}
JOBS=${KCACHE_JOBS:-$(nproc)}
if ! command -v "$CLANG_TIDY" >/dev/null; then
  echo "tidy: $CLANG_TIDY not found (scripts/setup.sh installs clang-tidy)" >&2
  exit 1
fi
[[ ${1:-} == --check ]] && shift
db=$BUILD_DIR/compile_commands.json
if [[ ! -f $db ]]; then
  echo "tidy: $db not found: configure and build first (scripts/build.sh)" >&2
  exit 1
fi
# Headers from the project's folders (matched as clang-tidy sees them,
# absolute); this overrides .clang-tidy's HeaderFilterRegex, which is for editors.
header_filter="^$root/(cache|client|compiler|service|tools|tests|kernels)/"
if (($#)); then
  files=("$@")
else
  mapfile -t files < <(python3 - "$db" "$root" <<'EOF'
import json, os, sys
db, root = sys.argv[1], sys.argv[2]
seen = set()
for entry in json.load(open(db)):
    path = os.path.normpath(os.path.join(entry["directory"], entry["file"]))
    rel = os.path.relpath(path, root)
    if rel.split(os.sep)[0] in ("cache", "client", "compiler", "service", "tools", "tests") \
            and not rel.startswith("tests/fixtures/") and rel.endswith(".cc"):
        seen.add(rel)
print("\n".join(sorted(seen)))
EOF
  )
fi
n=${#files[@]}
if ((n == 0)); then
  echo "tidy: no files to check in $db" >&2
  exit 1
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "tidy: $n files, $JOBS at a time ($($CLANG_TIDY --version | grep -o 'version [0-9.]*'))"
start=$SECONDS
# One clang-tidy per file; each writes what it said to $out/<index>.log (and
# $out/<index>.failed if it failed) and prints "[done/n] file ok|FAILED (seconds)"
# as it ends.
check_one() {
  local i=$1 f=$2 log="$out/$1.log" rc=0 t0=$SECONDS
  "$CLANG_TIDY" -p "$BUILD_DIR" --quiet --header-filter="$header_filter" \
    --warnings-as-errors='*' "$f" >"$log" 2>"$log.err" || rc=$?
  # "N warnings generated." counts the findings in headers filtered out.
  grep -vE '^[0-9]+ (warning|error)s? generated\.$|^Suppressed [0-9]+ warnings|^Use -header-filter' \
    "$log.err" >>"$log" || true
  local status=ok
  if ((rc)); then
    status=FAILED
    echo "$f" >"$out/$i.failed"
  fi
  echo "$f" >>"$out/done"
  printf 'tidy: [%d/%d] %s %s (%d s)\n' "$(wc -l <"$out/done")" "$n" "$f" "$status" $((SECONDS - t0))
}
export -f check_one
export CLANG_TIDY BUILD_DIR header_filter out n
for i in "${!files[@]}"; do printf '%s\0%s\0' "$i" "${files[$i]}"; done |
  xargs -0 -n 2 -P "$JOBS" bash -c 'check_one "$@"' _
elapsed=$((SECONDS - start))
failed=$(find "$out" -name '*.failed' | wc -l)
if ((failed == 0)); then
  echo "tidy: $n files follow .clang-tidy (${elapsed} s)"
  exit 0
fi
# A header's finding comes once for each file that includes it: list each
# once, relative to the root, in file and line order.
finding='^[^ ]+:[0-9]+:[0-9]+: (warning|error): '
findings=$(cat "$out"/*.log | grep -E "$finding" | sed "s|^$root/||" |
  sort -t: -k1,1 -k2,2n -k3,3n -k4 -u || true)
echo "tidy: $(grep -c . <<<"$findings" || true) findings in $failed of $n files (${elapsed} s):" >&2
[[ -n $findings ]] && echo "$findings" >&2
# A file that failed with no finding (clang-tidy could not run, say): all it said.
for m in "$out"/*.failed; do
  log=${m%.failed}.log
  if ! grep -qE "$finding" "$log"; then
    echo "tidy: $(cat "$m") failed:" >&2
    cat "$log" >&2
  fi
done
echo "tidy: fix them, or see .clang-tidy for when a check does not apply" >&2
exit 1
