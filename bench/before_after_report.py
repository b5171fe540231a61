#!/usr/bin/env python3
"""The table of bench/kernels_before_after.sh: each benchmark row of the older tree against this
tree, from OUT_DIR/NAME-{before,after}-{1,2}.txt (the bench binaries' rows: op, shape, batch,
time_us, MB_moved, GB/s, %copy[, x_dense]).

    bench/before_after_report.py OUT_DIR

Per row: the faster of the two rounds of each tree, and after / before. Per benchmark: the
geometric mean of after / before, its extremes, and the noise: the same tree's two rounds
(max over rows of |round 2 / round 1 - 1|, both trees). A row whose time moved by more than the
larger of 5% and twice that noise is listed."""
import math
import sys
from pathlib import Path


def rows(path):
    """{key: time_us} of the benchmark rows of one output file."""
    out = {}
    for line in Path(path).read_text().splitlines():
        tok = line.split()
        pct = [i for i, t in enumerate(tok) if t.endswith("%")]
        if not pct or pct[0] < 4:
            continue
        i = pct[0]
        try:
            t = float(tok[i - 3])
        except ValueError:
            continue
        out[" ".join(tok[: i - 3])] = t
    return out


def main():
    d = Path(sys.argv[1])
    names = sorted({p.name.split("-")[0] for p in d.glob("*-before-1.txt")})
    print("| benchmark | rows | after / before, geometric mean | min | max | noise (same tree, 2 rounds) |")
    print("|---|---|---|---|---|---|")
    moved = []
    for n in names:
        r = {(side, k): rows(d / f"{n}-{side}-{k}.txt") for side in ("before", "after") for k in (1, 2)}
        keys = [k for k in r[("before", 1)] if all(k in v for v in r.values())]
        if not keys:
            continue
        noise = max(abs(r[(s, 2)][k] / r[(s, 1)][k] - 1) for s in ("before", "after") for k in keys)
        ratios = []
        for k in keys:
            b = min(r[("before", 1)][k], r[("before", 2)][k])
            a = min(r[("after", 1)][k], r[("after", 2)][k])
            ratios.append(a / b)
            if abs(a / b - 1) > max(0.05, 2 * noise):
                moved.append((n, k, b, a))
        gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        print(f"| {n} | {len(keys)} | {gm:.3f} | {min(ratios):.3f} | {max(ratios):.3f} | {noise * 100:.1f}% |")
    print()
    if moved:
        print("Rows that moved by more than max(5%, 2 x noise):")
        for n, k, b, a in moved:
            print(f"- {n}: `{k}`: {b:.2f} -> {a:.2f} us ({a / b:.3f})")
    else:
        print("No row moved by more than max(5%, 2 x noise).")


if __name__ == "__main__":
    main()
