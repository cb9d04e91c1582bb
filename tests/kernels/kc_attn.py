"""Host side of the attention kernels for tests and benchmarks (Python, ctypes).

Builds the generated prelude exactly as docs/kernel-contract.md writes it,
compiles it with NVRTC (libnvrtc through ctypes, kernels/* passed as named
headers), loads the cubin with the CUDA driver (ctypes) and launches on
torch's current stream. The ctypes mirror of kcache::AttentionParams comes
from the kcache package (client/python/kcache/params.py);
check_params_layout() proves it against the C++ struct by compiling
static_asserts of every offset with NVRTC (no GPU needed).

The NVRTC part works without torch or a GPU (compile-only smoke tests).
"""

import ctypes
import hashlib
import math
import os
import struct
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KERNELS = os.path.join(REPO, "kernels")
# Every file of kernels/ (*.h, *.cuh) is handed to NVRTC as a named header, as the
# contract asks; attention_bwd.cuh is simply absent until it lands.
HEADERS = sorted(f for f in os.listdir(KERNELS) if f.endswith((".h", ".cuh")))
BWD_HEADER = "attention_bwd.cuh"
CUBIN_DIR = os.path.join(REPO, ".devcarry", "cubins")

MASKS = {"none": 0, "causal": 1, "window": 2, "document": 3, "drafter": 4, "expr": 5}
SCORES = {"none": 0, "softcap": 1, "alibi": 2, "expr": 3}

# ---------------------------------------------------------------------------
# Tile selection: a Python copy of kernels/attention_tiles.h, checked against
# the header by check_tiles_against_header().
# ---------------------------------------------------------------------------
MAX_LIST_TILES = 2048


def smem_bytes(bm, bn, stages, dqk, dv, elem=2):
    return (bm * dqk * elem + stages * bn * (dqk + dv) * elem + 2 * MAX_LIST_TILES + 16 * bm + 16
            + 64 + 1024)


# make_spec's mask names as kernels/attention_params.h's KC_MASK_* values.
MASK_KIND = {"none": 0, "causal": 1, "window": 2, "document": 3, "drafter": 4, "expr": 5}


def select_tiles(arch, dqk, dv, sm90a=False, mask="none"):
    """kcache::SelectAttentionTiles without smem_bytes (None when unsupported)."""
    dmax = max(dqk, dv)
    analytic = mask in ("none", "causal", "window")
    if arch == 90 and sm90a and dqk == dv == 64 and analytic:
        t = (192, 128, 12, 2)  # three warpgroups (session 23)
    elif arch == 90 and sm90a and dmax <= 128:
        t = (128, 64 if dmax <= 64 else 128, 8, 2)
    else:
        t = (128, 64, 4, 2) if dmax <= 64 else (128, 32, 4, 2) if dmax <= 128 else (64, 32, 4, 2)
    limit = {80: 166912, 86: 101376, 89: 101376, 90: 232448}.get(arch, 0)
    if dqk not in (64, 128, 256) or dv not in (64, 128, 256) or smem_bytes(t[0], t[1], t[3], dqk, dv) > limit:
        return None
    return t


def check_tiles_against_header():
    """SelectAttentionTiles from kernels/attention_tiles.h (through NVRTC) == select_tiles()."""
    import re
    combos = [(a, q, v, x, m) for a in (80, 86, 89, 90) for q in (64, 128, 256)
              for v in (64, 128, 256) for x in (False, True) for m in sorted(MASK_KIND)]
    src = ['#include "attention_tiles.h"']
    for i, (a, q, v, x, m) in enumerate(combos):
        src.append('extern "C" __global__ void probe_t%d(long long* o) { constexpr auto t = '
                   'kcache::SelectAttentionTiles(%d, %d, %d, %d, false, %s); *o = (long long)'
                   't.block_m | ((long long)t.block_n << 12) | ((long long)t.num_warps << 24) | '
                   '((long long)t.stages << 32) | ((long long)t.smem_bytes << 40); }'
                   % (i, a, q, v, MASK_KIND[m], "true" if x else "false"))
        src.append('extern "C" __global__ void probe_f%d(long long* o) { constexpr auto t = '
                   'kcache::SelectAttentionTiles(%d, %d, %d, %d, false, %s); *o = (long long)'
                   'kcache::AttentionFwdThreads(t, %s, %d, %d); }'
                   % (i, a, q, v, MASK_KIND[m], "true" if x else "false", "true" if x else "false",
                      q, v))
    # Tuned tiles: the ping-pong's shapes (block_n 176; three warpgroups for head dim 64)
    # and their neighbours, for fwd_threads.
    tuned = [(t, q, v, x) for t in ((128, 64, 8, 2), (128, 128, 8, 2), (128, 176, 8, 2),
                                    (128, 128, 8, 3), (64, 64, 4, 2), (192, 128, 12, 2),
                                    (192, 176, 12, 2), (192, 64, 12, 2))
             for q in (64, 128) for v in (64, 128) for x in (False, True)]
    for i, (t, q, v, x) in enumerate(tuned):
        src.append('extern "C" __global__ void probe_u%d(long long* o) { *o = (long long)'
                   'kcache::AttentionFwdThreads(kcache::AttentionTiles{%d, %d, %d, %d, 0}, %s, '
                   '%d, %d); }' % ((i,) + t + ("true" if x else "false", q, v)))
    ptx = _nvrtc_ptx("\n".join(src) + "\n")
    bad = []
    for i, (t, q, v, x) in enumerate(tuned):
        body = ptx.split(".entry probe_u%d(" % i, 1)[1].split("ret;", 1)[0]
        m = re.search(r"mov\.[ub](?:32|64)\s+%r[d]?\d+,\s*(-?\d+);", body)
        threads = int(m.group(1)) if m else None
        if threads != fwd_threads(t, q, v, x):
            bad.append("tiles %s sm90a=%s %d/%d: header threads %s, python %d"
                       % (t, x, q, v, threads, fwd_threads(t, q, v, x)))
    for i, (a, q, v, x, m) in enumerate(combos):
        body = ptx.split(".entry probe_t%d(" % i, 1)[1].split("ret;", 1)[0]
        mo = re.search(r"mov\.[ub]64\s+%rd\d+,\s*(-?\d+);", body)
        val = int(mo.group(1))
        got = (val & 4095, (val >> 12) & 4095, (val >> 24) & 255, (val >> 32) & 255, val >> 40)
        t = select_tiles(a, q, v, x, m)
        want = (t + (smem_bytes(t[0], t[1], t[3], q, v),)) if t else (0, 0, 0, 0, 0)
        if got != want:
            bad.append("sm_%d%s %d/%d %s: header %s, python %s"
                       % (a, "a" if x else "", q, v, m, got, want))
        if t:
            body = ptx.split(".entry probe_f%d(" % i, 1)[1].split("ret;", 1)[0]
            mo = re.search(r"mov\.[ub](?:32|64)\s+%r[d]?\d+,\s*(-?\d+);", body)
            threads = int(mo.group(1)) if mo else None
            if threads != fwd_threads(t, q, v, x):
                bad.append("sm_%d%s %d/%d %s: header threads %s, python %d"
                           % (a, "a" if x else "", q, v, m, threads, fwd_threads(t, q, v, x)))
    if bad:
        raise RuntimeError("tile selection out of step: " + "; ".join(bad))


# ---------------------------------------------------------------------------
# Backward tiles: a Python copy of SelectAttentionBwdTiles and the shared-memory
# formulas of kernels/attention_tiles.h, checked by check_bwd_tiles_against_header().
# ---------------------------------------------------------------------------
BWD_ROWS_PER_CTA = 64   # kAttnBwdRowsPerCta: rows per CTA of preprocess / dq_convert
BWD_AUX_THREADS = 256   # kAttnBwdAuxThreads: their block size
_SMEM_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448}


BWD_MAX_LIST = 1024     # kAttnBwdMaxList: uint32 tile-list entries


def fwd_threads(tiles, dqk, dv, sm90a):
    """kcache::AttentionFwdThreads: sm_90a's ping-pong forward has a producer warpgroup."""
    bm, bn, nw, st = tiles
    two = nw == 8 and bm == 128 and dqk == 128 and 64 <= dv <= 128
    three = nw == 12 and bm == 192 and dqk == dv == 64 and bn == 128
    pingpong = bool(sm90a) and st == 2 and (two or three)
    return nw * 32 + (128 if pingpong else 0)


def bwd_wgmma(arch, dqk, dv, sm90a):
    """kcache::AttentionBwdWgmma: the dK/dV kernel runs wgmma (sm_90a, head dims 64/128)."""
    return arch == 90 and bool(sm90a) and dqk in (64, 128) and dv in (64, 128)


def bwd_smem_dkdv(arch, bm, bn, dqk, dv, sm90a=False):
    ds_buffers = 2 if arch >= 90 else 1  # kcache::AttentionBwdDsBuffers
    return (bn * (dqk + dv) * 2 + 2 * bm * (dqk + dv) * 2 + ds_buffers * bn * bm * 2 + 2 * bm * 8
            + 2 * bm * 16 + 4 * BWD_MAX_LIST + 16
            # wgmma: alignment slack, the drafter's block order, the producer's four
            # mbarriers, the dQ stage
            + (1024 + 2 * BWD_MAX_LIST + 32 + 2 * bm * 64 * 4 if bwd_wgmma(arch, dqk, dv, sm90a)
               else 0))


def bwd_smem_dq(bm, bn, dqk, dv):
    # The dQ kernel owns bn query rows and steps over bm keys.
    return bn * (dqk + dv) * 2 + 2 * bm * (dqk + dv) * 2 + bn * 16 + 4 * BWD_MAX_LIST + 16


def select_bwd_tiles(arch, dqk, dv, sm90a=False):
    """kcache::SelectAttentionBwdTiles as (block_m, block_n, num_warps), None when unsupported."""
    limit = _SMEM_LIMIT.get(arch, 0)
    if limit == 0 or dqk not in (64, 128) or dv not in (64, 128):
        return None
    if bwd_smem_dkdv(arch, 64, 128, dqk, dv, sm90a) > limit or bwd_smem_dq(64, 128, dqk, dv) > limit:
        return None
    return (64, 128, 8)


def _probe_values(exprs):
    """Compiles one kernel per C++ constant expression (long long) and reads the values
    back from the PTX. exprs: list of (name, expr) -> {name: int}."""
    import re
    src = ['#include "attention_tiles.h"']
    for name, expr in exprs:
        src.append('extern "C" __global__ void probe_%s(long long* o) { *o = (long long)(%s); }'
                   % (name, expr))
    ptx = _nvrtc_ptx("\n".join(src) + "\n")
    out = {}
    for name, _ in exprs:
        body = ptx.split(".entry probe_%s(" % name, 1)[1].split("ret;", 1)[0]
        m = re.search(r"mov\.[ub]64\s+%rd\d+,\s*(-?\d+);", body)
        if m is None:  # a zero may be stored as an immediate
            m = re.search(r"st\.global\.[ub]64\s+\[%rd\d+\],\s*(-?\d+);", body)
        out[name] = int(m.group(1)) if m else None
    return out


def check_bwd_tiles_against_header():
    """SelectAttentionBwdTiles (through NVRTC) == select_bwd_tiles() and the smem formulas."""
    combos = [(a, q, v, x) for a in (80, 86, 89, 90) for q in (64, 128, 256)
              for v in (64, 128, 256) for x in (False, True)]
    exprs = [("rows", "kcache::kAttnBwdRowsPerCta"), ("aux", "kcache::kAttnBwdAuxThreads"),
             ("list", "kcache::kAttnBwdMaxList")]
    for i, (a, q, v, x) in enumerate(combos):
        call = "kcache::SelectAttentionBwdTiles(%d, %d, %d, 0, false, %s)" % (
            a, q, v, "true" if x else "false")
        exprs.append(("t%d" % i, "%s.block_m | ((long long)%s.block_n << 12) | "
                      "((long long)%s.num_warps << 24)" % (call, call, call)))
        exprs.append(("k%d" % i, "%s.smem_dkdv" % call))
        exprs.append(("d%d" % i, "%s.smem_dq" % call))
    got = _probe_values(exprs)
    bad = []
    if (got["rows"], got["aux"], got["list"]) != (BWD_ROWS_PER_CTA, BWD_AUX_THREADS,
                                                  BWD_MAX_LIST):
        bad.append("rows/threads per aux CTA, list entries: header %s/%s/%s, python %d/%d/%d"
                   % (got["rows"], got["aux"], got["list"], BWD_ROWS_PER_CTA, BWD_AUX_THREADS,
                      BWD_MAX_LIST))
    for i, (a, q, v, x) in enumerate(combos):
        t = got["t%d" % i]
        hdr = (t & 4095, (t >> 12) & 4095, (t >> 24) & 255, got["k%d" % i], got["d%d" % i])
        py = select_bwd_tiles(a, q, v, x)
        want = (py + (bwd_smem_dkdv(a, py[0], py[1], q, v, x), bwd_smem_dq(py[0], py[1], q, v))
                if py else (0, 0, 0, 0, 0))
        if hdr != want:
            bad.append("sm_%d%s %d/%d: header %s, python %s" % (a, "a" if x else "", q, v, hdr,
                                                                  want))
    if bad:
        raise RuntimeError("backward tile selection out of step: " + "; ".join(bad))


# ---------------------------------------------------------------------------
# Specs and the prelude
# ---------------------------------------------------------------------------
def hexfloat(x):
    """A float32 value as a C hex-float literal with an f suffix (as codegen writes it)."""
    x = struct.unpack("f", struct.pack("f", float(x)))[0]
    if x == 0.0:
        return "0x0p+0f"
    return float.hex(x) + "f"


def _env_defines():
    """KC_EXTRA_DEFINES="NAME=V,NAME2=V2": defines added to every spec, for a kernel experiment
    run through the whole suites."""
    items = os.environ.get("KC_EXTRA_DEFINES", "")
    return tuple(tuple(x.split("=", 1)) for x in items.split(",") if x)


def make_spec(dtype="bf16", dqk=128, dv=None, mask="none", score="none", *, bottom_right=False,
              window=(-1, 0), doc_causal=False, drafter_block=16, drafter_causal=False,
              drafter_window=0, softcap=0.0, scale=None, return_lse=True, tiles=None, arch=90,
              sm90a=False, expr_mask_code=None, expr_score_code=None, extra_defines=(),
              backward=False, deterministic=False, bwd_tiles=None, expr_score_grad_code=None):
    """A kernel variant. backward=True adds the backward entry points (LSE forced on);
    bwd_tiles = (block_m, block_n, num_warps), default select_bwd_tiles(); score "expr" with
    backward needs expr_score_grad_code (the body of kc_expr_score_grad)."""
    dv = dv or dqk
    spec = dict(dtype=dtype, dqk=dqk, dv=dv, mask=mask, score=score, bottom_right=bottom_right,
                window=tuple(window), doc_causal=doc_causal, drafter_block=drafter_block,
                drafter_causal=drafter_causal, drafter_window=drafter_window,
                softcap=float(softcap), scale=float(scale if scale else 1.0 / math.sqrt(dqk)),
                return_lse=bool(return_lse or backward), arch=arch, sm90a=sm90a,
                tiles=(tuple(tiles) if tiles else select_tiles(arch, dqk, dv, sm90a, mask)
                       or (0, 0, 0, 0)),
                expr_mask_code=expr_mask_code, expr_score_code=expr_score_code,
                extra_defines=tuple(extra_defines) + _env_defines())
    if backward:
        # Only backward specs carry these keys, so that forward specs (and their cache
        # keys) are what they were.
        if score == "expr" and not expr_score_grad_code:
            raise ValueError("make_spec: score 'expr' with backward needs expr_score_grad_code")
        spec.update(backward=True, deterministic=bool(deterministic),
                    bwd_tiles=(tuple(bwd_tiles) if bwd_tiles
                               else select_bwd_tiles(arch, dqk, dv, sm90a) or (0, 0, 0)),
                    expr_score_grad_code=expr_score_grad_code)
    elif deterministic or bwd_tiles or expr_score_grad_code:
        raise ValueError("make_spec: deterministic / bwd_tiles / expr_score_grad_code need "
                         "backward=True")
    return spec


def generated_spec(source, arch="sm_90a"):
    """A spec whose translation unit is `source`, as the real code generator wrote it
    (`kcache-compile --source`, e.g. bench/attention/generated/): compiled as it is, with
    the launch facts (tiles, mask and score kind, head dims, passes) read from its
    defines, so that the harness launches what the daemon would serve."""
    import re
    d = {m.group(1): m.group(2) for m in re.finditer(r"^#define (KC_\w+) (\S+)$", source, re.M)}
    num = lambda k: int(d[k])  # noqa: E731
    masks = {v: k for k, v in MASKS.items()}
    scores = {v: k for k, v in SCORES.items()}
    backward = num("KC_BACKWARD") == 1
    spec = make_spec("bf16" if num("KC_DTYPE_BF16") else "fp16", num("KC_HEAD_DIM_QK"),
                     num("KC_HEAD_DIM_V"), masks[num("KC_MASK")], scores[num("KC_SCORE_MOD")],
                     tiles=(num("KC_BLOCK_M"), num("KC_BLOCK_N"), num("KC_NUM_WARPS"),
                            num("KC_STAGES")),
                     arch=num("KC_ARCH"), sm90a=num("KC_ARCH_SM90A") == 1,
                     return_lse=num("KC_RETURN_LSE") == 1, backward=backward,
                     deterministic=backward and num("KC_DETERMINISTIC") == 1,
                     bwd_tiles=((num("KC_BWD_BLOCK_M"), num("KC_BWD_BLOCK_N"),
                                 num("KC_BWD_NUM_WARPS")) if backward else None),
                     expr_score_grad_code=("generated" if backward and num("KC_SCORE_MOD") == 3
                                           else None))
    spec["source"] = source
    return spec


def class_block_m(spec):
    """Query rows per tile class of an expression mask's forward classification: the
    generated source's KC_CLASS_BLOCK_M, else kernels/attention_tiles.h's
    AttentionClassBlockM (the backward's block_m where its tiles refine the forward's)."""
    import re
    bm, bn = spec["tiles"][0], spec["tiles"][1]
    if spec.get("source"):
        m = re.search(r"^#define KC_CLASS_BLOCK_M (\d+)$", spec["source"], re.M)
        return int(m.group(1)) if m else bm
    if spec.get("backward"):
        bbm, bbn = spec["bwd_tiles"][0], spec["bwd_tiles"][1]
        if bbm > 0 and bbn == bn and bm % bbm == 0:
            return bbm
    return bm


def prelude(spec):
    if spec.get("source"):
        return spec["source"]  # generated by compiler/attention (generated_spec)
    bm, bn, nw, st = spec["tiles"]
    backward = spec.get("backward", False)
    wl, wr = spec["window"]
    lines = [
        f"#define KC_ARCH {spec['arch']}",
        f"#define KC_ARCH_SM90A {1 if spec['sm90a'] else 0}",
        f"#define KC_DTYPE_BF16 {1 if spec['dtype'] == 'bf16' else 0}",
        f"#define KC_HEAD_DIM_QK {spec['dqk']}",
        f"#define KC_HEAD_DIM_V {spec['dv']}",
        f"#define KC_BLOCK_M {bm}",
        f"#define KC_BLOCK_N {bn}",
        f"#define KC_NUM_WARPS {nw}",
        f"#define KC_STAGES {st}",
        f"#define KC_MASK {MASKS[spec['mask']]}",
        f"#define KC_MASK_BOTTOM_RIGHT {1 if spec['bottom_right'] else 0}",
        f"#define KC_WINDOW_LEFT {wl}",
        f"#define KC_WINDOW_RIGHT {wr}",
        f"#define KC_DOC_CAUSAL {1 if spec['doc_causal'] else 0}",
        f"#define KC_DRAFTER_BLOCK {spec['drafter_block']}",
        f"#define KC_DRAFTER_CAUSAL {1 if spec['drafter_causal'] else 0}",
        f"#define KC_DRAFTER_WINDOW {spec['drafter_window']}",
        f"#define KC_SCORE_MOD {SCORES[spec['score']]}",
        f"#define KC_SOFTCAP {hexfloat(spec['softcap'])}",
        f"#define KC_SOFTMAX_SCALE {hexfloat(spec['scale'])}",
        f"#define KC_RETURN_LSE {1 if spec['return_lse'] else 0}",
        f"#define KC_BACKWARD {1 if backward else 0}",
        f"#define KC_DETERMINISTIC {1 if spec.get('deterministic') else 0}",
    ]
    if spec["mask"] == "expr":
        lines.append(f"#define KC_CLASS_BLOCK_M {class_block_m(spec)}")
    if backward:
        bbm, bbn, bnw = spec["bwd_tiles"]
        lines += [f"#define KC_BWD_BLOCK_M {bbm}", f"#define KC_BWD_BLOCK_N {bbn}",
                  f"#define KC_BWD_NUM_WARPS {bnw}"]
        # As compiler/attention/codegen.cc: wgmma dK/dV where AttentionBwdWgmma says so
        # (an extra define KC_BWD_WGMMA=0 selects the portable path, for comparisons).
        if not any(k == "KC_BWD_WGMMA" for k, _ in spec.get("extra_defines", ())):
            wg = bwd_wgmma(spec["arch"], spec["dqk"], spec["dv"], spec["sm90a"])
            lines.append(f"#define KC_BWD_WGMMA {1 if wg else 0}")
    lines += ["#define %s %s" % kv for kv in spec.get("extra_defines", ())] + [
        '#include "attention_params.h"',
    ]
    if spec["mask"] == "expr":
        lines.append("__device__ __forceinline__ bool kc_expr_mask(int b, int h, int q_idx, "
                     "int kv_idx, const kcache::AttentionParams& p) {")
        lines.append(spec["expr_mask_code"])
        lines.append("}")
    if spec["score"] == "expr":
        lines.append("__device__ __forceinline__ float kc_expr_score(float score, int b, int h, "
                     "int q_idx, int kv_idx, const kcache::AttentionParams& p) {")
        lines.append(spec["expr_score_code"])
        lines.append("}")
        if backward:
            lines.append("__device__ __forceinline__ float kc_expr_score_grad(float score, "
                         "float grad, int b, int h, int q_idx, int kv_idx, "
                         "const kcache::AttentionParams& p, bool buffer_grads) {")
            lines.append(spec["expr_score_grad_code"])
            lines.append("}")
    lines.append('#include "attention_fwd.cuh"')
    if backward:
        lines += ["#if KC_BACKWARD", '#include "attention_bwd.cuh"', "#endif"]
    return "\n".join(lines) + "\n"


# Expression bodies used by the tests (what the code generator would emit).
# Buffer 0: int32 [batch] prefix lengths; buffer 1: float32 [num_q_heads] bias.
EXPR_MASK_PREFIX_LM = """  const kcache::KcBuffer& buf = p.buffers[0];
  int pl = 0;
  if (b >= 0 && b < buf.extent[0]) pl = static_cast<const int*>(buf.ptr)[b * buf.stride[0]];
  return kv_idx < pl || kv_idx <= q_idx;"""


def mask_variants():
    """(name, make_spec keywords) for every mask the kernel tests draw from: each kind, both
    causal alignments, windows with and without a bound, document (also causal), drafter
    blocks (also causal within a block, with a window) and an expression mask."""
    return [
        ("none", dict(mask="none")),
        ("causal", dict(mask="causal")),
        ("causal_br", dict(mask="causal", bottom_right=True)),
        ("win37_0", dict(mask="window", window=(37, 0))),
        ("win100_20_br", dict(mask="window", window=(100, 20), bottom_right=True)),
        ("win_u_15", dict(mask="window", window=(-1, 15))),
        ("doc", dict(mask="document")),
        ("doc_causal", dict(mask="document", doc_causal=True)),
        ("drafter16", dict(mask="drafter", drafter_block=16)),
        ("drafter16_causal", dict(mask="drafter", drafter_block=16, drafter_causal=True)),
        ("drafter7_w50", dict(mask="drafter", drafter_block=7, drafter_window=50)),
        ("expr_prefix", dict(mask="expr", expr_mask_code=EXPR_MASK_PREFIX_LM)),
    ]
EXPR_SCORE_BIAS = """  const kcache::KcBuffer& buf = p.buffers[1];
  float bias = 0.0f;
  if (h >= 0 && h < buf.extent[0]) bias = static_cast<const float*>(buf.ptr)[h * buf.stride[0]];
  return score + bias * static_cast<float>(((q_idx - kv_idx) % 7 + 7) % 7);"""
# Its gradient (what codegen emits for a trainable buffer 1): d/dscore = 1, and
# d/dbias[h] = c(q, kv), added with an fp32 atomic when buffer_grads is true.
EXPR_SCORE_BIAS_GRAD = """  (void)score;
  (void)b;
  if (buffer_grads) {
    const kcache::KcBuffer& buf = p.buffers[1];
    float* g = p.buffer_grads[1];
    if (g != nullptr && h >= 0 && h < buf.extent[0]) {
      atomicAdd(g + h * buf.stride[0],
                grad * static_cast<float>(((q_idx - kv_idx) % 7 + 7) % 7));
    }
  }
  return grad;"""


# ---------------------------------------------------------------------------
# NVRTC through ctypes
# ---------------------------------------------------------------------------
_nvrtc = None


def _lib_nvrtc():
    global _nvrtc
    if _nvrtc is None:
        for name in ("libnvrtc.so.13", "/usr/local/cuda/lib64/libnvrtc.so.13", "libnvrtc.so",
                     "/usr/local/cuda/lib64/libnvrtc.so"):
            try:
                _nvrtc = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if _nvrtc is None:
            raise RuntimeError("libnvrtc not found")
        _nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
    return _nvrtc


def _header_sources():
    out = []
    for h in HEADERS:
        with open(os.path.join(KERNELS, h), "rb") as f:
            out.append(f.read())
    return out


def _lineinfo():
    """KC_LINEINFO=1: cubins carry source lines (for ncu's source view); part of the cache key."""
    return os.environ.get("KC_LINEINFO") == "1"


def nvrtc_compile(source, arch=90, sm90a=False, extra_options=(), name=b"kcache_attn.cu",
                  want_cubin=True):
    """Compiles `source` with kernels/* as named headers. Returns (cubin bytes or None, log)."""
    lib = _lib_nvrtc()
    prog = ctypes.c_void_p()
    hdrs = _header_sources()
    n = len(HEADERS)
    hsrc = (ctypes.c_char_p * n)(*hdrs)
    hname = (ctypes.c_char_p * n)(*[h.encode() for h in HEADERS])
    src = source.encode() if isinstance(source, str) else source
    r = lib.nvrtcCreateProgram(ctypes.byref(prog), src, name, n, hsrc, hname)
    if r != 0:
        raise RuntimeError("nvrtcCreateProgram: %s" % lib.nvrtcGetErrorString(r))
    target = ("sm_90a" if sm90a else "sm_%d" % arch)
    opts = ["--gpu-architecture=" + target, "--std=c++17", "--ptxas-options=-v"] + list(
        extra_options)
    if _lineinfo():
        opts.append("--generate-line-info")
    copts = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    r = lib.nvrtcCompileProgram(prog, len(opts), copts)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    logbuf = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, logbuf)
    log = logbuf.value.decode(errors="replace")
    cubin = None
    if r == 0 and want_cubin:
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetCUBIN(prog, buf)
        cubin = buf.raw
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    if r != 0:
        raise RuntimeError("NVRTC failed (%s):\n%s" % (lib.nvrtcGetErrorString(r).decode(), log))
    return cubin, log


BWD_INCLUDE = '#include "attention_bwd.cuh"'


def module_units(source):
    """The translation units of a module, as compiler/attention/codegen.cc cuts them
    (GeneratedSource.units): a module with backward compiles as two units, each into an
    image of its own, so that NVRTC's CPU time per unit stays within issue 27's budget:
    the forward (the source without the backward's include) and the backward (KC_OMIT_FWD:
    the same source without the forward's kernels). Otherwise the source alone.
    KC_COMPILE_WHOLE=1 among the defines (a measurement switch): the source alone."""
    if BWD_INCLUDE not in source or "#define KC_COMPILE_WHOLE 1" in source:
        return [source]
    fwd = "\n".join(l for l in source.split("\n") if l.strip() != BWD_INCLUDE)
    return [fwd, "#define KC_OMIT_FWD 1\n" + source]


def compile_module(source, arch=90, sm90a=False):
    """A module's cubin as the daemon builds it: each of module_units compiled into an
    image of its own, the images one after another (compiler/cuda/cubin_images.h).
    Returns (cubin, the units' logs joined)."""
    outs = [nvrtc_compile(u, arch=arch, sm90a=sm90a) for u in module_units(source)]
    return b"".join(c for c, _ in outs), "\n".join(l for _, l in outs)


def spec_key(spec):
    # A forward-only spec never includes the backward template: its key leaves it out, so
    # that forward cubins cached before a backward change stay valid.
    names = [h for h in HEADERS if spec.get("backward") or h != BWD_HEADER]
    src = prelude(spec) + "".join(h.decode(errors="replace")
                                  for n, h in zip(HEADERS, _header_sources()) if n in names)
    lineinfo = "lineinfo" if _lineinfo() else ""
    units = "units%d" % len(module_units(prelude(spec)))
    return hashlib.sha256((src + repr(spec["arch"]) + repr(spec["sm90a"]) + lineinfo + units
                           ).encode()
                          ).hexdigest()[:20]


def compile_spec(spec, cache_dir=CUBIN_DIR):
    """Cubin for a spec, from the cache directory when present (filled on CPU machines)."""
    key = spec_key(spec)
    path = os.path.join(cache_dir, key + ".cubin")
    if os.path.exists(path):
        # Touched: a cubin's mtime is its last use, so that scripts/devcarry.sh packs only
        # those today's variants use (the directory keeps every older kernel's too).
        for touched in (path, path + ".log"):
            try:
                os.utime(touched)
            except OSError:
                pass
        with open(path, "rb") as f:
            return f.read(), open(path + ".log").read() if os.path.exists(path + ".log") else ""
    cubin, log = compile_module(prelude(spec), arch=spec["arch"], sm90a=spec["sm90a"])
    os.makedirs(cache_dir, exist_ok=True)
    tmp = "%s.tmp%d" % (path, os.getpid())  # compile_many runs several processes
    with open(tmp + ".log", "w") as f:
        f.write(log)
    os.replace(tmp + ".log", path + ".log")
    with open(tmp, "wb") as f:
        f.write(cubin)
    os.replace(tmp, path)
    return cubin, log


def _compile_one(spec):
    try:
        return compile_spec(spec), None
    except Exception as e:  # returned, so that one failure does not hide the others
        return None, str(e)


def compile_many(specs, jobs=None):
    """compile_spec for each spec, `jobs` NVRTC processes at once (default: the CPU count,
    at most 16). Returns [((cubin, log) or None, error or None)] in order. Forks: call it
    before CUDA work in the parent, or at least never use CUDA in the children (they don't)."""
    import multiprocessing
    jobs = jobs or min(16, os.cpu_count() or 1)
    todo = [sp for sp in specs if not os.path.exists(os.path.join(CUBIN_DIR, spec_key(sp)
                                                                  + ".cubin"))]
    if jobs > 1 and len(todo) > 1:
        with multiprocessing.get_context("fork").Pool(min(jobs, len(todo))) as pool:
            pool.map(_compile_one, todo, chunksize=1)
    return [_compile_one(sp) for sp in specs]  # cached now (or failing again, with the error)


def ptxas_summary(log, entry="kcache_attn_fwd"):
    """'regs=N spill=S/L stack=F' for one entry point from a --ptxas-options=-v log."""
    import re
    out = {}
    cur = None
    for line in log.splitlines():
        # A function's stack / spill line follows its "Function properties" line, also for
        # out-of-line device functions after an entry's report (those must not overwrite it).
        m = re.search(r"Compiling entry function '(\w+)'|Function properties for (\w+)", line)
        if m:
            cur = m.group(1) or m.group(2)
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                      line)
        if m and cur:
            out.setdefault(cur, {}).update(stack=int(m.group(1)), spill_st=int(m.group(2)),
                                           spill_ld=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            out.setdefault(cur, {})["regs"] = int(m.group(1))
    f = out.get(entry, {})
    return "regs=%s spill=%s/%s stack=%s" % (f.get("regs"), f.get("spill_st"), f.get("spill_ld"),
                                             f.get("stack"))


# ---------------------------------------------------------------------------
# The ctypes mirror of kcache::AttentionParams (kernels/attention_params.h)
# lives in the kcache Python package (client/python/kcache/params.py).
# ---------------------------------------------------------------------------
sys.path.insert(0, os.path.join(REPO, "client", "python"))
from kcache.params import (  # noqa: E402,F401 (re-exported for the harness and benchmarks)
    ABI_VERSION, MAX_EXPR_BUFFERS, AttentionParams, KcBuffer)


def _nvrtc_ptx(source, arch=80):
    lib = _lib_nvrtc()
    prog = ctypes.c_void_p()
    hdrs = _header_sources()
    n = len(HEADERS)
    lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"layout_probe.cu", n,
                           (ctypes.c_char_p * n)(*hdrs),
                           (ctypes.c_char_p * n)(*[h.encode() for h in HEADERS]))
    opts = [b"--gpu-architecture=compute_%d" % arch, b"--std=c++17"]
    r = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    if r != 0:
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, buf)
        raise RuntimeError("layout probe failed:\n" + buf.value.decode(errors="replace"))
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, buf)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return buf.value.decode()


def check_params_layout():
    """Proves the ctypes mirror against the C++ struct as NVRTC lays it out.

    Compiles one tiny kernel per field that stores the field's offset (and
    one for each sizeof) and reads the constants back from the PTX. Raises
    on any difference; returns sizeof(AttentionParams). Needs no GPU."""
    import re
    items = [("size_params", "sizeof(kcache::AttentionParams)", ctypes.sizeof(AttentionParams)),
             ("size_buffer", "sizeof(kcache::KcBuffer)", ctypes.sizeof(KcBuffer)),
             ("abi", "kcache::kAttentionAbiVersion", ABI_VERSION)]
    for name, _ in AttentionParams._fields_:
        items.append(("p_" + name, "reinterpret_cast<const char*>(&g_p.%s) - "
                      "reinterpret_cast<const char*>(&g_p)" % name,
                      getattr(AttentionParams, name).offset))
    for name, _ in KcBuffer._fields_:
        items.append(("b_" + name, "reinterpret_cast<const char*>(&g_b.%s) - "
                      "reinterpret_cast<const char*>(&g_b)" % name, getattr(KcBuffer, name).offset))
    src = ['#include "attention_params.h"', "__device__ kcache::AttentionParams g_p;",
           "__device__ kcache::KcBuffer g_b;"]
    for kname, expr, _ in items:
        src.append('extern "C" __global__ void probe_%s(long long* o) { *o = (long long)(%s); }'
                   % (kname, expr))
    ptx = _nvrtc_ptx("\n".join(src) + "\n")
    bad = []
    for kname, _, want in items:
        body = ptx.split(".entry probe_%s(" % kname, 1)[1].split("ret;", 1)[0]
        m = re.search(r"mov\.[ub]64\s+%rd\d+,\s*(-?\d+);", body)
        got = int(m.group(1)) if m else None
        if got != want:
            bad.append("%s: C++ %s, ctypes %s" % (kname, got, want))
    if bad:
        raise RuntimeError("AttentionParams mirror out of step: " + "; ".join(bad))
    return ctypes.sizeof(AttentionParams)


# ---------------------------------------------------------------------------
# CUDA driver through ctypes (GPU machines only)
# ---------------------------------------------------------------------------
_cuda = None
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


def _lib_cuda():
    global _cuda
    if _cuda is None:
        _cuda = ctypes.CDLL("libcuda.so.1")
    return _cuda


def _check(r, what):
    if r != 0:
        s = ctypes.c_char_p()
        _lib_cuda().cuGetErrorString(r, ctypes.byref(s))
        raise RuntimeError("%s failed: %d %s" % (what, r, s.value))


class Kernel:
    """A loaded kcache_attn_fwd (and kcache_attn_mask_build for expression masks); for a
    backward spec also the backward entry points (prepare_backward / BackwardLaunch)."""

    def __init__(self, spec, cubin):
        import torch
        torch.cuda.init()
        torch.zeros(1, device="cuda")  # makes the primary context current
        cu = _lib_cuda()
        self.spec = spec
        from kcache.cuda import load_images
        self.modules = load_images(cubin)  # one module per image, as the clients load them
        self.fwd = self._function("kcache_attn_fwd")
        bm, bn, _, st = spec["tiles"]
        self.block_m, self.block_n = bm, bn
        self.threads = fwd_threads(spec["tiles"], spec["dqk"], spec["dv"], spec["sm90a"])
        self.smem = smem_bytes(bm, bn, st, spec["dqk"], spec["dv"])
        _check(cu.cuFuncSetAttribute(self.fwd, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                     self.smem), "cuFuncSetAttribute")
        self.mask_build = None
        self.class_block_m = class_block_m(spec) if spec["mask"] == "expr" else bm
        # The forward's classes serve the backward (prepare_backward(classes=...)).
        self.shares_classes = False
        if spec["mask"] == "expr":
            self.mask_build = self._function("kcache_attn_mask_build")
        self.bwd = {}
        if spec.get("backward"):
            bbm, bbn, bnw = spec["bwd_tiles"]
            self.bwd_block_m, self.bwd_block_n, self.bwd_threads = bbm, bbn, bnw * 32
            # kcache::AttentionBwdDkdvThreads: the wgmma dK/dV's producer warpgroup.
            self.dkdv_threads = self.bwd_threads + (
                128 if bwd_wgmma(spec["arch"], spec["dqk"], spec["dv"], spec["sm90a"]) and
                not spec["deterministic"] and
                ("KC_BWD_WGMMA", "0") not in tuple(spec.get("extra_defines", ())) else 0)
            self.smem_dkdv = bwd_smem_dkdv(spec["arch"], bbm, bbn, spec["dqk"], spec["dv"],
                                           spec["sm90a"])
            self.smem_dq = bwd_smem_dq(bbm, bbn, spec["dqk"], spec["dv"])
            self.shares_classes = (spec["mask"] == "expr" and
                                   (self.class_block_m, bn) == (bbm, bbn))
            names = ["kcache_attn_bwd_preprocess", "kcache_attn_bwd_dkdv",
                     "kcache_attn_bwd_dq" if spec["deterministic"] else
                     "kcache_attn_bwd_dq_convert"]
            if spec["mask"] == "expr":
                names.append("kcache_attn_bwd_mask_build")
            for name in names:
                self.bwd[name] = self._function(name)
            for name, smem in (("kcache_attn_bwd_dkdv", self.smem_dkdv),
                               ("kcache_attn_bwd_dq", self.smem_dq)):
                if name in self.bwd and smem > 48 * 1024:
                    _check(cu.cuFuncSetAttribute(
                        self.bwd[name], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
                        "cuFuncSetAttribute(%s, %d)" % (name, smem))

    def _function(self, name):
        """The entry point from the first image that defines it (the client's search)."""
        from kcache.cuda import find_function
        return ctypes.c_void_p(find_function(self.modules, name))

    def _launch(self, func, grid, threads, smem, params):
        import torch
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        args = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(params), ctypes.c_void_p))
        _check(_lib_cuda().cuLaunchKernel(func, grid[0], grid[1], grid[2], threads, 1, 1, smem,
                                          stream, args, None), "cuLaunchKernel")

    def grid(self, params):
        return ((params.q_len + self.block_m - 1) // self.block_m, params.num_q_heads,
                params.batch)

    def new_tile_classes(self, params):
        """The class tensor for the forward's mask build (new_classes), set in `params`."""
        return new_classes(params, self.class_block_m, self.block_n)

    def launch_mask_build(self, params):
        grid = ((params.q_len + self.class_block_m - 1) // self.class_block_m,
                params.num_q_heads, params.batch)
        self._launch(self.mask_build, grid, 128, 0, params)

    def launch(self, params):
        self._launch(self.fwd, self.grid(params), self.threads, self.smem, params)

    def prepare_backward(self, p_fwd, dout, dq, dk, dv, buffer_grads=None, classes=None):
        """A BackwardLaunch for the forward's params `p_fwd` (copied, mask inputs and
        buffers included; its lse must hold the forward's LSE when run): dO and the
        gradient outputs ([B, H, S, D] views), fp32 scratch (delta, dq_accum unless
        deterministic, the backward's tile classes for expression masks) allocated here.
        buffer_grads: {buffer index: fp32 tensor like the buffer}, zeroed by the caller.
        classes: the forward's class tensor (new_tile_classes, filled by its mask build
        before run()); used instead of the backward's own mask build where the kernel's
        classification serves both (shares_classes), as kcache's client does."""
        import torch
        if not self.bwd:
            raise RuntimeError("prepare_backward: the spec was compiled without backward=True")
        p = AttentionParams.from_buffer_copy(p_fwd)
        if not p.lse:
            raise ValueError("prepare_backward: the forward's params have no lse")
        set_backward_tensors(p, dout, dq, dk, dv)
        B, Hq, Lq = p.batch, p.num_q_heads, p.q_len
        dev = dout.device
        scratch = [torch.empty(B, Hq, Lq, device=dev, dtype=torch.float32)]
        p.delta = scratch[0].data_ptr()
        if not self.spec["deterministic"]:
            scratch.append(torch.empty(B, Hq, Lq, self.spec["dqk"], device=dev,
                                       dtype=torch.float32))
            p.dq_accum = scratch[-1].data_ptr()
        p.tile_class = None
        own_build = True
        if self.spec["mask"] == "expr" and classes is not None and self.shares_classes:
            scratch.append(classes)
            set_tile_classes(p, classes)
            own_build = False
        elif self.spec["mask"] == "expr":
            scratch.append(new_classes(p, self.bwd_block_m, self.bwd_block_n, dev))
        for i, g in (buffer_grads or {}).items():
            if g.dtype != torch.float32:
                raise ValueError("buffer_grads[%d]: fp32 expected, got %s" % (i, g.dtype))
            p.buffer_grads[i] = g.data_ptr()
        return BackwardLaunch(self, p, scratch, own_build)


class BackwardLaunch:
    """The backward sequence of docs/kernel-contract.md on torch's current stream:
    (bwd mask build) -> preprocess -> dkdv -> dq (deterministic) or dq_convert.
    Keeps its params and scratch alive; run() may be called repeatedly (benchmarks)."""

    def __init__(self, kern, params, scratch, own_build=True):
        self.kern, self.params, self.scratch = kern, params, scratch
        self.own_build = own_build  # False: the forward's classes (prepare_backward)

    def launches(self):
        """[(entry name, grid, threads, dynamic smem)] in launch order."""
        k, p = self.kern, self.params
        B, Hq, Hkv, Lq, Lkv = p.batch, p.num_q_heads, p.num_kv_heads, p.q_len, p.kv_len
        aux = (-(-Lq // BWD_ROWS_PER_CTA), Hq, B)
        out = []
        if "kcache_attn_bwd_mask_build" in k.bwd and self.own_build:
            out.append(("kcache_attn_bwd_mask_build", (-(-Lq // k.bwd_block_m), Hq, B), 128, 0))
        out.append(("kcache_attn_bwd_preprocess", aux, BWD_AUX_THREADS, 0))
        out.append(("kcache_attn_bwd_dkdv", (-(-Lkv // k.bwd_block_n), Hkv, B), k.dkdv_threads,
                    k.smem_dkdv))
        if "kcache_attn_bwd_dq" in k.bwd:
            out.append(("kcache_attn_bwd_dq", (-(-Lq // k.bwd_block_n), Hq, B), k.bwd_threads,
                        k.smem_dq))
        else:
            out.append(("kcache_attn_bwd_dq_convert", aux, BWD_AUX_THREADS, 0))
        return out

    def run(self):
        if self.params.q_len < 1 or self.params.kv_len < 1 or self.params.batch < 1:
            return
        for name, grid, threads, smem in self.launches():
            self.kern._launch(self.kern.bwd[name], grid, threads, smem, self.params)


def set_tile_classes(p, tc):
    """An int8 [B, H, M tiles, N tiles] class tensor as params' tile_class."""
    p.tile_class = tc.data_ptr()
    p.tile_class_stride_b, p.tile_class_stride_h, p.tile_class_stride_m = tc.stride()[:3]


def new_classes(p, rows, cols, device="cuda"):
    """A class tensor for params `p` with classes of `rows` queries x `cols` keys, filled
    with 77 (which no class is, so that a class the mask build missed shows), set in `p`;
    returned to be kept alive."""
    import torch
    tc = torch.full((p.batch, p.num_q_heads, -(-p.q_len // rows), max(-(-p.kv_len // cols), 1)),
                    77, device=device, dtype=torch.int8)
    set_tile_classes(p, tc)
    return tc


def make_params(q, k, v, o, lse=None):
    """Params for [B, H, S, D] views (any strides with a contiguous last dim)."""
    p = AttentionParams()
    p.q, p.k, p.v, p.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
    p.q_stride_b, p.q_stride_h, p.q_stride_s = q.stride(0), q.stride(1), q.stride(2)
    p.k_stride_b, p.k_stride_h, p.k_stride_s = k.stride(0), k.stride(1), k.stride(2)
    p.v_stride_b, p.v_stride_h, p.v_stride_s = v.stride(0), v.stride(1), v.stride(2)
    p.o_stride_b, p.o_stride_h, p.o_stride_s = o.stride(0), o.stride(1), o.stride(2)
    if lse is not None:
        p.lse = lse.data_ptr()
        p.lse_stride_b, p.lse_stride_h = lse.stride(0), lse.stride(1)
    p.batch, p.num_q_heads, p.q_len = q.shape[0], q.shape[1], q.shape[2]
    p.num_kv_heads, p.kv_len = k.shape[1], k.shape[2]
    return p


def set_backward_tensors(p, dout, dq, dk, dv):
    """dO and the gradient outputs ([B, H, S, D] views, contiguous head dim) into params."""
    for name, t in (("dout", dout), ("dq", dq), ("dk", dk), ("dv", dv)):
        if t.stride(3) != 1 and t.shape[3] > 1:
            raise ValueError("%s: the head dimension must be contiguous" % name)
        if t.data_ptr() % 16:
            raise ValueError("%s: not 16-byte aligned" % name)
    p.dout, p.dq, p.dk, p.dv = dout.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
    p.do_stride_b, p.do_stride_h, p.do_stride_s = dout.stride(0), dout.stride(1), dout.stride(2)
    p.dq_stride_b, p.dq_stride_h, p.dq_stride_s = dq.stride(0), dq.stride(1), dq.stride(2)
    p.dk_stride_b, p.dk_stride_h, p.dk_stride_s = dk.stride(0), dk.stride(1), dk.stride(2)
    p.dv_stride_b, p.dv_stride_h, p.dv_stride_s = dv.stride(0), dv.stride(1), dv.stride(2)


def set_mask_inputs(p, spec, c):
    """The mask / score inputs of a test case dict (test_attention_fwd.build_case's keys:
    qid/kvid, anchor/keep/dstride/S/N, slopes, prefix/bias) into params."""
    if spec["mask"] == "document":
        p.q_seq_id, p.kv_seq_id = c["qid"].data_ptr(), c["kvid"].data_ptr()
        p.q_seq_id_stride_b, p.kv_seq_id_stride_b = c["qid"].stride(0), c["kvid"].stride(0)
    if spec["mask"] == "drafter":
        p.drafter_anchor = c["anchor"].data_ptr()
        p.drafter_keep = c["keep"].data_ptr() if c.get("keep") is not None else None
        p.drafter_stride_b = c["dstride"]
        p.drafter_context_len, p.drafter_num_blocks = c["S"], c["N"]
    if spec["score"] == "alibi":
        p.alibi_slopes = c["slopes"].data_ptr()
    if "prefix" in c:
        set_buffer(p, 0, c["prefix"])
        set_buffer(p, 1, c["bias"])


def set_buffer(p, i, t):
    """Expression buffer i from a torch tensor (rank = t.dim())."""
    p.buffers[i].ptr = t.data_ptr()
    p.buffers[i].rank = t.dim()
    for d in range(t.dim()):
        p.buffers[i].extent[d] = t.shape[d]
        p.buffers[i].stride[d] = t.stride(d)
