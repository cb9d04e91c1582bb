"""Shared pieces of the flex tests: the skip rule, mask and score functions written the way
flex_attention users write them, and the evaluation of a recorded mask as kcache's kernel
would see it (kcache._reference over the spec and the launch tensors)."""

import pytest


def require_torch():
    """Skips the calling module unless torch >= 2.5 with flex_attention is importable."""
    torch = pytest.importorskip("torch", reason="kcache.flex needs torch (not installed)")
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
        from torch.library import custom_op  # noqa: F401
    except ImportError as e:
        pytest.skip("kcache.flex needs torch >= 2.5 with flex_attention and "
                    "torch.library.custom_op; this torch is %s (%s)" % (torch.__version__, e),
                    allow_module_level=True)
    return torch


def eval_recorded(bm, B, H, q_len, kv_len):
    """bool [B, H, q_len, kv_len]: the mask kcache launches for BlockMask bm."""
    import torch
    from kcache import _protos, _reference
    from kcache.flex import mask_launch
    pb = _protos.modules()[0]
    spec = pb.AttentionSpec()
    spec.mask.CopyFrom(bm.spec_mask())
    names, tensors = mask_launch(bm._part, bm.tensors, B, q_len, kv_len)
    buffers = {n: t for n, t in zip(names, tensors) if not n.startswith("@")}
    inputs = {n[1:]: t for n, t in zip(names, tensors) if n.startswith("@")}
    m = _reference.mask_values(spec, B, H, q_len, kv_len, buffers, inputs)
    return m.expand(B, H, q_len, kv_len).to(torch.bool)


def block_classes(mask, bq, bkv):
    """[B, H, q blocks, kv blocks] int: 0 empty, 1 partial, 2 full (flex's BlockMask split
    into kv_num_blocks / full_kv_num_blocks; like flex, a block past the end is partial)."""
    import torch
    B, H, Lq, Lkv = mask.shape
    nq, nk = -(-Lq // bq), -(-Lkv // bkv)
    pad = torch.zeros(B, H, nq * bq, nk * bkv, dtype=torch.bool)
    pad[:, :, :Lq, :Lkv] = mask
    t = pad.view(B, H, nq, bq, nk, bkv).sum(dim=(3, 5))
    return torch.where(t == 0, 0, torch.where(t == bq * bkv, 2, 1))


def flex_block_classes(tbm):
    """The same classes from torch's BlockMask fields."""
    import torch
    B, H = tbm.kv_num_blocks.shape[:2]
    nq = tbm.kv_num_blocks.shape[2]
    nk = -(-tbm.seq_lengths[1] // tbm.BLOCK_SIZE[1])
    out = torch.zeros(B, H, nq, nk, dtype=torch.int64)
    for num, idx, cls in ((tbm.kv_num_blocks, tbm.kv_indices, 1),
                          (tbm.full_kv_num_blocks, tbm.full_kv_indices, 2)):
        if num is None:
            continue
        for b in range(B):
            for h in range(H):
                for i in range(nq):
                    for j in idx[b, h, i, :num[b, h, i]].tolist():
                        out[b, h, i, j] = cls
    return out


# ---------------------------------------------------------------------------
# Functions as flex users write them
# ---------------------------------------------------------------------------
def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding(window):
    def sliding_window(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx <= window) & (q_idx >= kv_idx)
    return sliding_window


def document(doc_ids, is_causal=True):
    def document_mask(b, h, q_idx, kv_idx):
        same = doc_ids[b, q_idx] == doc_ids[b, kv_idx]
        return same & (q_idx >= kv_idx) if is_causal else same
    return document_mask


def dflash(anchor_positions, block_keep_mask, S, block_size, clamp=False):
    """SpecForge's DFlash mask_mod (keys: context S | N blocks; queries: the N blocks)."""
    N = anchor_positions.shape[1]

    def dflash_mask_mod(b, h, q_idx, kv_idx):
        q_block_id = q_idx // block_size
        if clamp:
            q_block_id = q_block_id.clamp(max=N - 1)
        anchor_pos = anchor_positions[b, q_block_id]
        is_context = kv_idx < S
        mask_context = is_context & (kv_idx < anchor_pos)
        is_draft = kv_idx >= S
        kv_block_id = (kv_idx - S) // block_size
        mask_draft = is_draft & (q_block_id == kv_block_id)
        is_valid_block = block_keep_mask[b, q_block_id]
        return (mask_context | mask_draft) & is_valid_block
    return dflash_mask_mod


def prefix_lm(prefix_len):
    def prefix_mask(b, h, q_idx, kv_idx):
        return (kv_idx < prefix_len[b]) | (q_idx >= kv_idx)
    return prefix_mask


def block_diagonal(bs):
    def block_mask(b, h, q_idx, kv_idx):
        return (q_idx // bs == kv_idx // bs) | (kv_idx % 7 == 0)
    return block_mask


def dilated(b, h, q_idx, kv_idx):
    return ((q_idx - kv_idx) % 3 == 0) & ~(kv_idx > q_idx)


def head_dependent(b, h, q_idx, kv_idx):
    import torch
    return torch.where(h % 2 == 0, q_idx >= kv_idx, kv_idx <= q_idx + 4)


def softcap(score, b, h, q_idx, kv_idx):
    import torch
    return torch.tanh(score / 20.0) * 20.0


def relative_bias(score, b, h, q_idx, kv_idx):
    return score + (q_idx - kv_idx) * 0.01


def alibi_like(slopes):
    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)
    return alibi


def bias_table(table):
    def biased(score, b, h, q_idx, kv_idx):
        return score + table[h, kv_idx]
    return biased
