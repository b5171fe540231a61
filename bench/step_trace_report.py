#!/usr/bin/env python3
"""Where a served step's time goes, from the step-loop traces (`scheduler.step_trace: PREFIX`).

    bench/step_trace_report.py PREFIX

reads PREFIX.coordinator.csv and PREFIX.worker0.csv (t_ns,event,step,a,b on the host's
monotonic clock) and prints, per batch size (rows of the plan), the distribution (p10/p50/p90,
microseconds) of:
  plan transit     coordinator sent the plan -> the worker took it
  submit           the worker took the plan -> it was queued on the device
  result transit   the worker sent the result -> the coordinator took it
  turnaround       the coordinator took result s -> it sent the plan of step s+2 (with two steps
                   in flight, the plan the device needs next)
  result period    time between consecutive results at the worker (the served step)
  flush            the coordinator's delivery of one step's request events to the HTTP side
"""
import csv
import sys


def load(path):
    with open(path) as f:
        return [(int(r["t_ns"]), r["event"], int(r["step"]), int(r["a"]), int(r["b"])) for r in csv.DictReader(f)]


def q(v):
    v = sorted(v)
    n = len(v)
    if not n:
        return "-"
    return "n=%d p10 %.0f p50 %.0f p90 %.0f" % (n, v[n // 10], v[n // 2], v[n * 9 // 10])


def main():
    prefix = sys.argv[1]
    co = load(prefix + ".coordinator.csv")
    wk = load(prefix + ".worker0.csv")
    cplan = {s: (t, b) for t, e, s, a, b in co if e == "plan"}
    cres = {s: t for t, e, s, a, b in co if e == "result"}
    wplan = {s: t for t, e, s, a, b in wk if e == "plan"}
    wsub = {s: t for t, e, s, a, b in wk if e == "submitted"}
    wres = {s: t for t, e, s, a, b in wk if e == "result"}
    sizes = sorted({b for _, b in cplan.values()}, key=lambda b: -sum(1 for _, x in cplan.values() if x == b))[:4]
    for rows in sorted(sizes):
        S = [s for s in sorted(cplan) if cplan[s][1] == rows and s in wplan and s in wres and s in cres]
        print("rows %d: %d steps" % (rows, len(S)))
        print("  plan transit   ", q([(wplan[s] - cplan[s][0]) / 1e3 for s in S]))
        print("  submit         ", q([(wsub[s] - wplan[s]) / 1e3 for s in S if s in wsub]))
        print("  result transit ", q([(cres[s] - wres[s]) / 1e3 for s in S]))
        print("  turnaround     ", q([(cplan[s + 2][0] - cres[s]) / 1e3 for s in S if s + 2 in cplan]))
        print("  result period  ", q([(wres[s] - wres[s - 1]) / 1e3 for s in S if s - 1 in wres]))
    flushes, start = {}, None
    for t, e, s, a, b in co:
        if e == "flush":
            start = (t, a)
        elif e == "flushed" and start:
            flushes.setdefault(start[1], []).append((t - start[0]) / 1e3)
            start = None
    for n in sorted(flushes, key=lambda n: -len(flushes[n]))[:4]:
        print("flush of %d events:" % n, q(flushes[n]))


if __name__ == "__main__":
    main()
