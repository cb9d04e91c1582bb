"""A thread model of the persistent ping-pong forward's protocol (attention_fwd.cuh,
KC_FWD_PERSISTENT; kernels/NOTES.md, session 22), run by hand when that protocol changes:

  python3 tests/kernels/model_fwd_persistent.py [TRIALS] [WARPGROUPS] [lists]

One producer thread and four consumer warps per warpgroup (two warpgroups, or three: the
head dim 64 shape of session 23) follow the kernel's order of waits, arrivals and copies:
mbarriers with phase parity (kfull / vfull / kempty / vempty per stage), named barriers
counted in warps (1 + w: warpgroup w's turn, which w and the one before it take part in;
then the compute warps; then one per warpgroup), a Q copy per warpgroup that lands after
a random delay, random delays everywhere else. Each S checks that its stage holds the
tile it expects and that its warpgroup's Q rows hold its item; each P V checks its V; the
turns must come round robin, one warpgroup at a time. Items are random tile counts, empty
ones included, walked by one CTA. A wait that lasts 5 s counts as a deadlock.

`lists` adds the drafter's design on top (kernels/NOTES.md, session 23, not in the kernel
yet): the producer builds each item's tile list, row data and block order into one of two
buffers (by item parity) before that item's copies; `listfull` (the producer's arrival)
and `listempty` (one per compute warp, after its epilogue of the item) guard them. The
consumers wait for an item's buffer before its first tile, and for the next item's before
copying its Q rows (the rows come from the block order); each tile, the Q copy and the
epilogue check that the buffer they read holds their item.
It models the kernel; it does not run it: the GPU suites do that. Exit status 1 when a
trial failed.
"""
import random
import sys
import threading
import time

TIMEOUT = 5.0


class Deadlock(Exception):
    pass


class MBar:
    """An mbarrier: `count` arrivals complete a phase; wait(parity) returns once the phase
    of that parity has completed (try_wait.parity)."""

    def __init__(self, count):
        self.count, self.n, self.phase = count, 0, 0
        self.cv = threading.Condition()

    def arrive(self):
        with self.cv:
            self.n += 1
            if self.n == self.count:
                self.n = 0
                self.phase += 1
                self.cv.notify_all()

    def wait(self, parity):
        with self.cv:
            if not self.cv.wait_for(lambda: (self.phase & 1) != parity, timeout=TIMEOUT):
                raise Deadlock("mbarrier wait")


class NamedBar:
    """bar.sync / bar.arrive, counted in warps."""

    def __init__(self, count):
        self.count, self.n, self.gen = count, 0, 0
        self.cv = threading.Condition()

    def _arrive(self):
        self.n += 1
        if self.n == self.count:
            self.n = 0
            self.gen += 1
            self.cv.notify_all()
            return None
        return self.gen

    def sync(self):
        with self.cv:
            gen = self._arrive()
            if gen is not None and not self.cv.wait_for(lambda: self.gen != gen,
                                                        timeout=TIMEOUT):
                raise Deadlock("named barrier")

    def arrive(self):
        with self.cv:
            self._arrive()


def jitter(rng):
    time.sleep(rng.random() * 0.0003)


def run(tiles_per_item, seed, nwg=2, lists=False):
    """One CTA of nwg compute warpgroups walking items with these tile counts; returns
    the failures seen. lists: the drafter's per-item buffers (see the module's doc)."""
    rng = random.Random(seed)
    warps = 4 * nwg
    kfull, vfull = [MBar(1), MBar(1)], [MBar(1), MBar(1)]  # producer: one (all its threads)
    kempty = [MBar(warps), MBar(warps)]  # one per compute warp
    vempty = [MBar(warps), MBar(warps)]
    # The kernel's kBarTurn + w, kBarCompute, kBarWg + w.
    turn_bar = {w: NamedBar(8) for w in range(nwg)}
    compute_bar = NamedBar(warps)
    wg_bar = {w: NamedBar(4) for w in range(nwg)}
    # Turns per warp, started and ended. The k-th turn of the CTA (round robin: warpgroup
    # k % nwg's turn k // nwg) may start only once every warp of warpgroup (k - 1) % nwg
    # has ended its turn (k - 1) // nwg.
    started, ended, turn_lock = [0] * warps, [0] * warps, threading.Lock()
    stage_k, stage_v = [None, None], [None, None]
    q_rows = [0] * nwg  # the item in each warpgroup's rows of Q (item 0: the prologue's copy)
    errors = []
    n_items = len(tiles_per_item)
    buf = [None, None]  # the item whose list / row data / order each buffer holds
    listfull = [MBar(1), MBar(1)]
    listempty = [MBar(warps), MBar(warps)]

    def check_buf(what, warp, item):
        if buf[item & 1] != item:
            errors.append(("buffer", what, warp, item, buf[item & 1]))

    def wait_buf(item):
        listfull[item & 1].wait((item >> 1) & 1)

    def producer():
        gbase = 0
        for item in range(n_items):
            if lists:  # build the item's buffer, once the item two back is done with it
                if item >= 2:
                    listempty[item & 1].wait(((item >> 1) - 1) & 1)
                buf[item & 1] = ("writing", item)
                jitter(rng)
                buf[item & 1] = item
                listfull[item & 1].arrive()
            for i in range(tiles_per_item[item]):
                gi = gbase + i
                st = gi & 1
                if gi >= 2:
                    kempty[st].wait(((gi >> 1) - 1) & 1)
                jitter(rng)
                stage_k[st] = (item, i)
                kfull[st].arrive()
                if gi >= 2:
                    vempty[st].wait(((gi >> 1) - 1) & 1)
                jitter(rng)
                stage_v[st] = (item, i)
                vfull[st].arrive()
            gbase += tiles_per_item[item]

    def consumer(warp):
        wg = warp >> 2
        nxt_wg = (wg + 1) % nwg
        gbase = 0
        compute_bar.sync()  # Q of the first item landed

        def turn_start():
            turn_bar[wg].sync()
            with turn_lock:
                k = started[warp] * nwg + wg
                started[warp] += 1
                if k > 0:
                    pw, pt = (k - 1) % nwg, (k - 1) // nwg
                    if any(ended[4 * pw + j] <= pt for j in range(4)):
                        errors.append(("turn out of order", warp, k))

        def turn_end(pass_on=True):
            with turn_lock:
                ended[warp] += 1
            if pass_on:
                turn_bar[nxt_wg].arrive()
        for item in range(n_items):
            n = tiles_per_item[item]

            def check_s(i):
                if stage_k[(gbase + i) & 1] != (item, i):
                    errors.append(("K", warp, item, i, stage_k[(gbase + i) & 1]))
                if q_rows[wg] != item:
                    errors.append(("Q", warp, item, i, q_rows[wg]))

            def check_pv(i):
                if stage_v[(gbase + i) & 1] != (item, i):
                    errors.append(("V", warp, item, i, stage_v[(gbase + i) & 1]))

            def front(i):
                gi = gbase + i
                kfull[gi & 1].wait((gi >> 1) & 1)
                if lists:
                    check_buf("tile", warp, item)

            if lists:
                wait_buf(item)

            if n > 0 and wg == nwg - 1:
                turn_bar[0].arrive()
            if n > 0:
                front(0)
                turn_start()
                check_s(0)  # S issued ...
                turn_end()
                jitter(rng)
                check_s(0)  # ... and waited
                kempty[gbase & 1].arrive()
            for i in range(1, n):
                front(i)
                turn_start()
                check_s(i)
                check_pv(i - 1)
                turn_end()
                jitter(rng)
                check_s(i)
                kempty[(gbase + i) & 1].arrive()
                jitter(rng)
                check_pv(i - 1)
                vempty[(gbase + i - 1) & 1].arrive()
            # copy_next_q: every S of the item is done in this warpgroup.
            nxt = item + 1
            copy = None
            if nxt < n_items:
                wg_bar[wg].sync()
                if lists:  # the rows come from the next item's block order
                    wait_buf(nxt)
                    check_buf("Q copy", warp, nxt)
                q_rows[wg] = ("copying", nxt)

                def land(wg=wg, nxt=nxt):
                    time.sleep(rng.random() * 0.002)
                    q_rows[wg] = nxt
                copy = threading.Thread(target=land)
                copy.start()
            if n > 0:  # the last tile's P V
                last = gbase + n - 1
                vfull[last & 1].wait((last >> 1) & 1)
                turn_start()
                check_pv(n - 1)
                turn_end(pass_on=wg != nwg - 1)
                jitter(rng)
                check_pv(n - 1)
                vempty[last & 1].arrive()
            if lists:  # the epilogue reads the item's row data
                jitter(rng)
                check_buf("epilogue", warp, item)
                listempty[item & 1].arrive()
            gbase += n
            if nxt >= n_items:
                return
            copy.join()  # cp_async_wait<0>
            wg_bar[wg].sync()

    def guarded(fn, *args):
        try:
            fn(*args)
        except Deadlock as e:
            errors.append(("deadlock", str(e)))

    threads = [threading.Thread(target=guarded, args=(producer,))]
    threads += [threading.Thread(target=guarded, args=(consumer, w)) for w in range(warps)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    want = sum(n + 1 for n in tiles_per_item if n > 0)
    if not errors and (set(started) != {want} or set(ended) != {want}):
        errors.append(("turns", want, started, ended))
    return errors


def main():
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    nwg = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    lists = sys.argv[3:] == ["lists"]
    bad = 0
    for trial in range(trials):
        rng = random.Random(trial)
        tiles = [rng.choice([0, 1, 1, 2, 3, 5]) for _ in range(rng.randint(1, 7))]
        errors = run(tiles, trial, nwg, lists)
        if errors:
            bad += 1
            print("trial %d, tiles per item %s: %s" % (trial, tiles, errors[:3]))
    print("%d of %d trials failed" % (bad, trials))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
