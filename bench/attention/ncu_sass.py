"""Where a kernel's warps wait, from Nsight Compute's SASS view with its stall samples
(run_issue27.sh's ncu part writes it: ncu -i R --page source --csv --print-source sass):

  python3 bench/attention/ncu_sass.py dkdv-sass.csv [--top 40]

Prints the sampled stall reasons summed over the kernel, the opcodes that hold the most
samples, and the instructions that hold the most, each with its leading reasons. The CSV's
columns differ between Nsight Compute versions, so they are found by name: the SASS text
("Source"), the address, the sample count (the first "... Samples" column that is not the
"Not-issued" one) and the stall reasons ("stall_*", without their "(Not Issued)" copies).
"""
import argparse
import collections
import csv
import re
import sys


def read_rows(path):
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    # ncu may print notes before the table: the header is the first line naming "Source".
    start = next((i for i, ln in enumerate(lines) if '"Source"' in ln or ln.startswith("Source")),
                 None)
    if start is None:
        sys.exit(f"{path}: no header with a Source column")
    return list(csv.DictReader(lines[start:]))


def number(x):
    try:
        return float(str(x).replace(",", ""))
    except ValueError:
        return 0.0


def opcode(sass):
    s = re.sub(r"^@!?U?P\w+\s+", "", sass.strip())  # the predicate
    return s.split(" ")[0].split(".")[0] if s else "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    rows = read_rows(args.csv)
    if not rows:
        sys.exit(f"{args.csv}: no rows")
    cols = list(rows[0].keys())
    total_col = next((c for c in cols if "Samples" in c and "Not" not in c), None)
    # Reasons: stall_* columns, counted over all samples (not the "(Not Issued)" copies).
    reason_cols = [c for c in cols if c.startswith("stall_") and "Not Issued" not in c]
    print("columns:", ", ".join(cols))
    if total_col is None:
        sys.exit("no sample column")
    total = sum(number(r[total_col]) for r in rows)
    print(f"\n{len(rows)} instructions, {total:.0f} samples ({total_col})")
    by_reason = collections.Counter()
    for r in rows:
        for c in reason_cols:
            by_reason[c] += number(r[c])
    print("\nreasons (share of all samples):")
    for c, n in by_reason.most_common():
        if n > 0:
            print(f"  {100 * n / total:6.2f} %  {c}")
    by_op = collections.Counter()
    count_op = collections.Counter()
    for r in rows:
        op = opcode(r.get("Source", ""))
        by_op[op] += number(r[total_col])
        count_op[op] += 1
    print("\nopcodes (share of samples, static count):")
    for op, n in by_op.most_common(25):
        print(f"  {100 * n / total:6.2f} %  {op:10s} {count_op[op]}")
    print(f"\ntop {args.top} instructions:")
    addr_col = next((c for c in cols if "Address" in c), None)
    ranked = sorted(range(len(rows)), key=lambda i: -number(rows[i][total_col]))
    for i in ranked[:args.top]:
        r = rows[i]
        n = number(r[total_col])
        lead = sorted(((number(r[c]), c) for c in reason_cols), reverse=True)[:3]
        why = "; ".join(f"{c} {100 * v / n:.0f} %" for v, c in lead if v > 0 and n > 0)
        where = r.get(addr_col, "") if addr_col else ""
        print(f"  {100 * n / total:5.2f} %  #{i:<5d} {where:>8s}  {r.get('Source', '')[:60]:60s}  {why}")


if __name__ == "__main__":
    main()
