"""The backward kernel suite's reference and tolerances (tests/kernels/test_attention_bwd.py),
checked on the CPU: a float64 model of a correct FA2-style backward (O rounded to the dtype,
delta from that O, P and dS rounded before their products, d bias from the fp32 dS) must
pass check() on every case, and the same gradients with dQ or dK off by 3 % must fail it
wherever the gradient is above the suite's floor. The suite itself launches kernels on a
GPU; this keeps its reference honest where CI has no GPU (torch's "cuda" tensors are made
on the CPU for the duration of the test).
"""
import os
import random

import pytest

torch = pytest.importorskip("torch")

KERNEL_TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "kernels")
CASES = 48
SEED = 2611


@pytest.fixture
def on_cpu(monkeypatch):
    """torch's factories and generators with device="cuda" give CPU tensors."""
    for name in ("arange", "full", "ones", "zeros", "empty", "randn", "rand", "randint",
                 "tensor"):
        orig = getattr(torch, name)

        def cpu(*a, _orig=orig, **kw):
            if "device" in kw:
                kw["device"] = "cpu"
            return _orig(*a, **kw)
        monkeypatch.setattr(torch, name, cpu)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.syspath_prepend(KERNEL_TESTS)
    import test_attention_bwd as T
    return T


def fa2_model(T, spec, c):
    """The backward of a correct kernel, in float64 with the kernel's roundings; fills the
    case's O and LSE as the forward would. Returns check()'s `got`."""
    rep = c["Hq"] // c["Hkv"]
    dt = c["dtype"]
    q, k, v = c["q"].double(), c["k"].double(), c["v"].double()
    ke, ve = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    bias = c["bias"].double() if spec["score"] == "expr" else None
    scale, s, dcap, cmul, vis, dead = T.masked_scores(torch, spec, c, q, ke, bias)
    p = torch.softmax(s.masked_fill(dead, 0.0), -1).masked_fill(dead | ~vis, 0.0)
    o = (p @ ve).to(dt)
    c["o"].copy_(o)
    c["lse"].copy_(torch.logsumexp(s, -1).float())
    dout = c["dout"].double()
    delta = (dout * o.double()).sum(-1, keepdim=True)
    shape = (c["B"], c["Hkv"], rep, c["Lkv"], -1)
    dv = (p.to(dt).double().transpose(-1, -2) @ dout).view(shape).sum(2)
    ds = p * (dout @ ve.transpose(-1, -2) - delta)
    if dcap is not None:
        ds = ds * dcap
    dsr = ds.to(dt).double()  # the products' operand; d bias sums the fp32 dS
    dq = dsr @ ke * scale
    dk = (dsr.transpose(-1, -2) @ q * scale).view(shape).sum(2)
    got = dict(dQ=dq, dK=dk, dV=dv, backing=(dq, dk, dv))
    if T.trainable_bias(spec):
        got["dbias"] = (ds.float().double() * cmul).sum(dim=(0, 2, 3))
    return got


def test_reference_passes_a_correct_model_and_catches_errors(on_cpu):
    T = on_cpu
    variants = sorted((n, s) for n, s in T.variants() if not s["sm90a"])
    rng = random.Random(SEED)
    random.seed(SEED)  # the layouts' padding comes from the global generator
    torch.manual_seed(SEED)
    failed, missed, planted = [], [], 0
    for i in range(CASES):
        name, spec = variants[(i * 7) % len(variants)]
        c = T.build_bwd_case(torch, spec, rng)
        got = fa2_model(T, spec, c)
        ref = T.reference(torch, spec, c)
        msgs, errs, _, _ = T.check(torch, spec, c, got, ref)
        if msgs:
            failed.append((name, c["Lq"], c["Lkv"], msgs))
        grads, scale_of = ref[2], ref[5]
        for grad in ("dQ", "dK"):
            if grads[grad].norm().item() < T.FLOOR * scale_of[grad]:
                continue  # under the floor (nearly one-hot rows): 3 % of it is within tolerance
            off = dict(got)
            off[grad] = got[grad] * 1.03
            planted += 1
            if not T.check(torch, spec, c, off, ref)[0]:
                missed.append((name, grad, errs))
    assert not failed, failed
    assert not missed, missed
    assert planted >= CASES, "too few cases with a gradient above the floor: %d" % planted
