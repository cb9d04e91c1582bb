"""A model of how the forward's items spread over CTAs (kernels/NOTES.md, session 22, v18),
for choosing the persistent forward's static order (attention_fwd.cuh, item_of_round):

  python3 bench/attention/persistent_schedule_model.py

An item is (query tile, head, batch) in the forward's launch order (launch_order_at: four
(batch, head) pairs at a time, heavy query tiles first); its weight is the key tiles a
causal item walks (tile m: m + 1). Printed per CTA count W, as multiples of the mean load:
- dynamic: the hardware's order today (each CTA, as it finishes, takes the next item),
  with a fixed cost of FIXED tiles paid at each item's start;
- turns: item i to CTA i % W, the fixed cost hidden but once;
- snake: the same, every other round of W items in reverse (what the kernel does).
No GPU: a list-scheduling model, not a measurement.
"""
import heapq

FIXED = 2.0  # tiles' worth of per-item start cost (session 9's v10: ~8 % of causal D128)


def launch_order(nt, npairs, chunk=4):
    """Query tile of each item, in launch order (launch_order_at, heavy tiles first)."""
    out = []
    cp = min(chunk, npairs)
    for lin in range(nt * npairs):
        c = lin // (nt * cp)
        inner = lin - c * nt * cp
        size = min(cp, npairs - c * cp)
        out.append(nt - 1 - inner // size)
    return out


def dynamic(weights, workers):
    finish = [0.0] * workers
    for w in weights:
        t = heapq.heappop(finish)
        heapq.heappush(finish, t + w + FIXED)
    return max(finish)


def static(weights, workers, snake):
    load = [0.0] * workers
    for i, w in enumerate(weights):
        rnd, pos = divmod(i, workers)
        load[workers - 1 - pos if snake and rnd % 2 else pos] += w
    return max(load) + FIXED


def main():
    for name, nt, pairs in (("causal B4 H32 S4096, 128-row tiles", 32, 4 * 32),
                            ("causal B8 H32 S2048, 128-row tiles", 16, 8 * 32)):
        weights = [m + 1 for m in launch_order(nt, pairs)]
        print(name)
        for workers in (78, 114, 120, 128, 132, 144, 148):
            mean = sum(weights) / workers
            print("  W %3d  dynamic %.3f  turns %.3f  snake %.3f" % (
                workers, dynamic(weights, workers) / mean, static(weights, workers, False) / mean,
                static(weights, workers, True) / mean))


if __name__ == "__main__":
    main()
