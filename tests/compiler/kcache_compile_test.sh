#!/usr/bin/env bash
# The offline kcache-compile command: a spec compiles to a cubin (ELF) and a
# record; a bad spec names its field (exit 1); a bad flag is a usage error
# (exit 2). Usage: kcache_compile_test.sh PATH/TO/kcache-compile
set -u
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAILED: $1"; fail=1; fi; }

cat > "$dir/spec.json" <<'JSON'
{"dtype": "DTYPE_FP16", "head_dim_qk": 64, "num_q_heads": 8, "num_kv_heads": 2,
 "mask": {"sliding_window": {"left": 128, "right": 0}}, "return_lse": true}
JSON
"$bin" "$dir/spec.json" --arch=sm_80 --out="$dir/k.cubin" --record="$dir/k.json" >"$dir/out" 2>&1
rc=$?
check "compiles (exit 0)" '[ $rc -eq 0 ]'
check "cubin is ELF" '[ "$(head -c4 "$dir/k.cubin" | od -An -c | tr -d " ")" = "177ELF" ]'
check "record names the entry point" 'grep -q kcache_attn_fwd "$dir/k.json"'
check "record has the arch" 'grep -q "\"arch\": \"sm_80\"" "$dir/k.json"'
check "summary describes the spec" 'grep -q "fp16 d64 h8/2" "$dir/out"'

# A backward spec with a trainable buffer: the record carries the backward's
# entry points with their roles, and deterministic_backward stays false.
cat > "$dir/bwd.json" <<'JSON'
{"dtype": "DTYPE_BF16", "head_dim_qk": 64, "num_q_heads": 4, "num_kv_heads": 2,
 "mask": {"causal": {}}, "backward": true,
 "buffers": [{"name": "bias", "type": "ELEM_TYPE_FLOAT32", "rank": 1, "trainable": true}],
 "score_mod": {"expr": {"value": {"binary": {"op": "OP_ADD", "lhs": {"score": true},
   "rhs": {"read": {"buffer": "bias", "index": [{"index": "INDEX_VAR_H"}]}}}}}}}
JSON
"$bin" "$dir/bwd.json" --arch=sm_80 --record="$dir/bwd_rec.json" --source="$dir/bwd.cu" \
  >"$dir/bwd_out" 2>&1
rc=$?
check "backward spec compiles (exit 0)" '[ $rc -eq 0 ]'
check "backward entry points printed with roles" \
  'grep -q "kcache_attn_bwd_dkdv (backward)" "$dir/bwd_out" && grep -q "kcache_attn_bwd_dq_convert (backward_postprocess)" "$dir/bwd_out"'
check "record has the backward entry points" \
  'grep -q ENTRY_ROLE_BACKWARD_PREPROCESS "$dir/bwd_rec.json" && ! grep -q "\"kcache_attn_bwd_dq\"" "$dir/bwd_rec.json"'
check "source has kc_expr_score_grad and the backward template" \
  'grep -q kc_expr_score_grad "$dir/bwd.cu" && grep -q "attention_bwd.cuh" "$dir/bwd.cu"'
sed -e 's/"backward": true,/"backward": true, "deterministic": true,/' "$dir/bwd.json" \
  | "$bin" - --arch=sm_80 >"$dir/det" 2>&1
rc=$?
check "deterministic with a trainable buffer exits 1 naming the reason" \
  '[ $rc -eq 1 ] && grep -q "deterministic backward has no atomics" "$dir/det"'

echo '{"dtype": "DTYPE_BF16", "head_dim_qk": 128, "num_q_heads": 32, "num_kv_heads": 5}' \
  | "$bin" - >"$dir/bad" 2>&1
rc=$?
check "bad spec exits 1" '[ $rc -eq 1 ]'
check "bad spec names the field" 'grep -q "spec.num_kv_heads" "$dir/bad"'

echo '{"dtype": "DTYPE_BF16", "head_dim_qk": 128, "num_q_heads": 8}' \
  | "$bin" - --arch=sm_70 >"$dir/arch" 2>&1
rc=$?
check "bad arch exits 1 naming target.arch" '[ $rc -eq 1 ] && grep -q "target.arch" "$dir/arch"'

"$bin" "$dir/spec.json" --frobnicate >"$dir/usage" 2>&1
rc=$?
check "unknown flag exits 2" '[ $rc -eq 2 ] && grep -q "unknown flag" "$dir/usage"'
[ $fail -eq 0 ] && echo "kcache-compile: all checks passed"
exit $fail
