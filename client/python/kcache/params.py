"""The ctypes mirror of kcache::AttentionParams (kernels/attention_params.h).

This is the one Python copy of the launch struct; tests/kernels/kc_attn.py
imports it from here. Its layout is proven against the C++ header by
tests/python (a C++ program printing offsetof for every field) and by
kc_attn.check_params_layout (the same through NVRTC). ABI_VERSION must equal
kcache::kAttentionAbiVersion; a record of another ABI is refused at load
(kcache.KcacheError, code FAILED_PRECONDITION).
"""

import ctypes
from typing import Any, Dict

from kcache.errors import KcacheError

ABI_VERSION = 2
MAX_EXPR_BUFFERS = 8
_i64 = ctypes.c_int64
_i32 = ctypes.c_int32
_ptr = ctypes.c_void_p


class KcBuffer(ctypes.Structure):
    _fields_ = [("ptr", _ptr), ("rank", _i32), ("reserved", _i32), ("extent", _i64 * 4),
                ("stride", _i64 * 4)]


class AttentionParams(ctypes.Structure):
    _fields_ = [
        ("q", _ptr), ("k", _ptr), ("v", _ptr), ("o", _ptr), ("lse", _ptr),
        ("q_stride_b", _i64), ("q_stride_h", _i64), ("q_stride_s", _i64),
        ("k_stride_b", _i64), ("k_stride_h", _i64), ("k_stride_s", _i64),
        ("v_stride_b", _i64), ("v_stride_h", _i64), ("v_stride_s", _i64),
        ("o_stride_b", _i64), ("o_stride_h", _i64), ("o_stride_s", _i64),
        ("lse_stride_b", _i64), ("lse_stride_h", _i64),
        ("batch", _i32), ("num_q_heads", _i32), ("num_kv_heads", _i32), ("q_len", _i32),
        ("kv_len", _i32), ("reserved0", _i32),
        ("dout", _ptr), ("dq", _ptr), ("dk", _ptr), ("dv", _ptr), ("dq_accum", _ptr),
        ("delta", _ptr),
        ("do_stride_b", _i64), ("do_stride_h", _i64), ("do_stride_s", _i64),
        ("dq_stride_b", _i64), ("dq_stride_h", _i64), ("dq_stride_s", _i64),
        ("dk_stride_b", _i64), ("dk_stride_h", _i64), ("dk_stride_s", _i64),
        ("dv_stride_b", _i64), ("dv_stride_h", _i64), ("dv_stride_s", _i64),
        ("q_seq_id", _ptr), ("kv_seq_id", _ptr),
        ("q_seq_id_stride_b", _i64), ("kv_seq_id_stride_b", _i64),
        ("drafter_anchor", _ptr), ("drafter_keep", _ptr), ("drafter_stride_b", _i64),
        ("drafter_context_len", _i32), ("drafter_num_blocks", _i32),
        ("alibi_slopes", _ptr),
        ("buffers", KcBuffer * MAX_EXPR_BUFFERS),
        ("buffer_grads", _ptr * MAX_EXPR_BUFFERS),
        ("tile_class", _ptr),
        ("tile_class_stride_b", _i64), ("tile_class_stride_h", _i64),
        ("tile_class_stride_m", _i64),
    ]


def layout() -> Dict[str, int]:
    """{"sizeof(AttentionParams)": n, "sizeof(KcBuffer)": n, "AttentionParams.<f>": offset,
    "KcBuffer.<f>": offset}: what the layout tests compare with the C++ header."""
    out = {"sizeof(AttentionParams)": ctypes.sizeof(AttentionParams),
           "sizeof(KcBuffer)": ctypes.sizeof(KcBuffer), "kAttentionAbiVersion": ABI_VERSION}
    for f in AttentionParams._fields_:
        out["AttentionParams." + f[0]] = getattr(AttentionParams, f[0]).offset
    for f in KcBuffer._fields_:
        out["KcBuffer." + f[0]] = getattr(KcBuffer, f[0]).offset
    return out


def check_record_abi(record: Any) -> None:
    """Raises unless the record's launch ABI is the one this mirror lays out."""
    if record.abi_version != ABI_VERSION:
        raise KcacheError(
            "kernel %s uses launch-parameter ABI %d; this kcache package lays out ABI %d "
            "(kernels/attention_params.h): upgrade the package or the daemon"
            % (record.key.hex()[:16], record.abi_version, ABI_VERSION), "FAILED_PRECONDITION")
