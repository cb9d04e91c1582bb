#!/usr/bin/env python3
"""A trainer's first attention call: kcache beside torch.compile(flex_attention).

Each measurement runs in a fresh Python process (as a new trainer process
would), timing from just before the first call to the synchronized result,
with torch already imported and CUDA initialized:
  kcache cold   the daemon has never seen the spec: it compiles and verifies;
  kcache warm   another new process: the daemon answers from its store;
  flex cold     torch.compile(flex_attention), empty inductor cache (its own
                fresh TORCHINDUCTOR_CACHE_DIR), block mask built inside;
  flex warm     another new process on that now-filled inductor cache.
Forward only, one causal bf16 case (B4 H32/8 S4096 D128) and the drafter mask
(B2 H32/8, context 3072, 512 blocks of 16). Prints a table with the ratio.

  python3 bench/attention/bench_first_call.py --kcached dist/kcached --pythonpath-gen DIR
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

CHILD = r"""
import json, os, sys, time
sys.path[:0] = json.loads(os.environ["KC_PATHS"])
import torch
torch.cuda.init(); torch.zeros(1, device="cuda")
case, which = sys.argv[1], sys.argv[2]
g = torch.Generator(device="cuda").manual_seed(0)
if case == "causal":
    B, Hq, Hkv, Lq, Lk, D = 4, 32, 8, 4096, 4096, 128
else:
    B, Hq, Hkv, S, N, BS, D = 2, 32, 8, 3072, 512, 16, 128
    Lq, Lk = N * BS, S + N * BS
q = torch.randn(B, Hq, Lq, D, device="cuda", dtype=torch.bfloat16, generator=g)
k = torch.randn(B, Hkv, Lk, D, device="cuda", dtype=torch.bfloat16, generator=g)
v = torch.randn(B, Hkv, Lk, D, device="cuda", dtype=torch.bfloat16, generator=g)
if case == "drafter":
    anchors = torch.randint(1, S + 1, (B, N), device="cuda", dtype=torch.int32, generator=g)
torch.cuda.synchronize()
t0 = time.perf_counter()
if which == "kcache":
    import kcache
    client = kcache.Client(os.environ["KC_TARGET"])
    if case == "causal":
        spec = kcache.spec(dtype="bf16", head_dim=128, q_heads=Hq, kv_heads=Hkv, mask=kcache.causal())
        o = kcache.attention_forward(q, k, v, spec, client=client)
    else:
        spec = kcache.spec(dtype="bf16", head_dim=128, q_heads=Hq, kv_heads=Hkv,
                           mask=kcache.drafter(block_size=BS))
        o = kcache.attention_forward(q, k, v, spec, client=client, anchors=anchors)
else:
    from torch.nn.attention.flex_attention import flex_attention, create_block_mask
    if case == "causal":
        def mask_mod(b, h, qi, ki):
            return qi >= ki
    else:
        def mask_mod(b, h, qi, ki):
            blk = qi // BS
            ctx = (ki < S) & (ki < anchors[b, blk])
            own = (ki >= S) & ((ki - S) // BS == blk)
            return ctx | own
    bm = create_block_mask(mask_mod, B, None, Lq, Lk, device="cuda", _compile=True)
    fa = torch.compile(flex_attention)
    o = fa(q, k, v, block_mask=bm, enable_gqa=True)
torch.cuda.synchronize()
dt = time.perf_counter() - t0
assert torch.isfinite(o.float()).all().item()
print(json.dumps({"seconds": dt}))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kcached", required=True)
    ap.add_argument("--pythonpath-gen", dest="gen", required=True)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(REPO, "tests", "python"))
    import gpu_e2e  # the daemon runner and import setup of the GPU end-to-end test
    gpu_e2e.setup_imports(args.gen)
    paths = [os.path.join(REPO, "client", "python"), os.path.abspath(args.gen)]
    work = tempfile.mkdtemp(prefix="kc-first-")
    daemon = gpu_e2e.Daemon(os.path.abspath(args.kcached), work, compile_only=False)
    daemon.start()
    inductor = os.path.join(work, "inductor")
    rows = []
    try:
        for case in ("causal", "drafter"):
            t = {}
            for which, label in (("kcache", "kcache cold"), ("kcache", "kcache warm"),
                                 ("flex", "flex cold"), ("flex", "flex warm")):
                env = dict(os.environ, KC_PATHS=json.dumps(paths), KC_TARGET=daemon.target,
                           TORCHINDUCTOR_CACHE_DIR=inductor + "-" + case,
                           KCACHE_PROTO_PATH=os.path.abspath(args.gen))
                out = subprocess.run([sys.executable, "-c", CHILD, case, which], env=env,
                                     capture_output=True, text=True, timeout=600)
                if out.returncode != 0:
                    print(out.stderr[-3000:])
                    raise SystemExit("%s %s failed" % (case, label))
                t[label] = json.loads(out.stdout.strip().splitlines()[-1])["seconds"]
                print("%-8s %-12s %8.3f s" % (case, label, t[label]), flush=True)
            rows.append((case, t))
    finally:
        daemon.stop()
    print("\n| case | kcache cold | kcache warm | flex cold | flex warm | cold ratio | warm ratio |")
    print("|---|---|---|---|---|---|---|")
    for case, t in rows:
        print("| %s | %.2f s | %.3f s | %.2f s | %.3f s | %.0fx | %.0fx |" % (
            case, t["kcache cold"], t["kcache warm"], t["flex cold"], t["flex warm"],
            t["flex cold"] / t["kcache cold"], t["flex warm"] / t["kcache warm"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
