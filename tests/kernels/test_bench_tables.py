"""CPU test (CI): bench_attention's forward + backward table tells a failed check from none;
its interleaved rounds start each round one place further along.

A kcache result whose errors exceed the bound, or are NaN against a reference, must print
FAIL; a drafter case timed with --no-flex has no reference (SDPA cannot run its mask), so
its NaN errors mean "not checked", printed as the time with a "?", not as FAIL (session 32
read FAIL there on a GPU run). No GPU or torch needed: the table is fed rows as the
benchmark writes them.

  python3 tests/kernels/test_bench_tables.py
"""

import contextlib
import importlib.util
import io
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAN = float("nan")


def load_bench():
    path = os.path.join(REPO, "bench", "attention", "bench_attention.py")
    spec = importlib.util.spec_from_file_location("bench_attention", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def result(ms, err):
    return dict(ms=ms, bwd_ms=ms * 0.75, err_o=err, err_dq=err, err_dk=err, err_dv=err)


def table(bench, rows):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        bench.print_bwd_table(rows)
    return {line.split()[0]: line for line in out.getvalue().splitlines()
            if line and not line.startswith((" ", "case", "forward"))}, out.getvalue()


def main():
    bench = load_bench()
    rows = [
        dict(case="checked", density=0.5, flop=2e12, reference="flex", flex=5.0,
             kcache=dict(sm90a=result(4.0, 1e-3), sm90=result(6.0, 5e-2),
                         sm90a_det=result(5.0, NAN))),
        dict(case="unchecked", density=0.137, flop=1.5e12, reference=None,
             kcache=dict(sm90a=result(4.1, NAN), sm90=result(6.3, NAN),
                         sm90a_det=dict(error="compile failed"))),
    ]
    lines, text = table(bench, rows)
    cells = {case: [c.strip() for c in line.split("|")[1:4]] for case, line in lines.items()}
    failures = []
    checks = 0

    def expect(what, ok):
        nonlocal checks
        checks += 1
        if not ok:
            failures.append(what)

    a, p, d = cells["checked"]
    expect("a passing check prints the time: %r" % a, a.startswith("4.000 ms") and "?" not in a)
    expect("an error above the bound prints FAIL: %r" % p, p == "FAIL")
    expect("a NaN error against a reference prints FAIL: %r" % d, d == "FAIL")
    expect("the passing result's ratio to flex: %r" % lines["checked"],
           lines["checked"].rstrip().endswith("1.25x/-/-"))
    a, p, d = cells["unchecked"]
    expect("no reference prints the time marked '?': %r" % a,
           a.startswith("4.100 ms") and a.endswith("?"))
    expect("no reference, portable path, marked '?': %r" % p, p.endswith("?"))
    expect("a result with no time (an error) stays FAIL: %r" % d, d == "FAIL")
    expect("the unchecked lines say why", text.count("not checked: no reference") == 2)
    # round_times: each round starts one place further along, so that over len(timers)
    # rounds every fn is timed once in each place of a round (no place favoured).
    order = []
    timers = [(k, k) for k in "abcd"]
    per = bench.round_times(timers, 8, lambda fn: order.append(fn) or len(order))
    expect("round_times times every fn once a round: %r" % order,
           all(sorted(order[4 * r:4 * r + 4]) == list("abcd") for r in range(8)))
    expect("round_times rotates the start: %r" % order,
           [order[4 * r] for r in range(8)] == list("abcdabcd"))
    expect("round_times keeps each fn's times in round order: %r" % per,
           all(len(v) == 8 and v == sorted(v) and order[v[0] - 1] == k
               for k, v in per.items()))
    for f in failures:
        print("FAIL", f)
    print(text if failures else "bench_attention's checks (tables, rounds): %d passed" % checks)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
