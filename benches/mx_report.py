#!/usr/bin/env python3
"""The tables of benches/mx.sh, from its per-run TSV (argv[1]).

Environment: MACHINE, VERSIONS_TEXT, BUSY_TEXT, FAILED_TEXT (one item a
line).
Ratios to A (smarthost) are taken per round, then the median of those.
"""

import csv
import os
import statistics
import sys

NAMES = {"A": "A smarthost", "B": "B mx-dane", "C": "C mx-may"}


def fnum(x, digits=0):
    return f"{x:,.{digits}f}"


def span(values, digits=0):
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return fnum(med, digits)
    return f"{fnum(med, digits)} ({fnum(min(values), digits)}-{fnum(max(values), digits)})"


def table(header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    out = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths)).rstrip()]
    out.append("  ".join("-" * w for w in widths))
    for r in rows:
        out.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(out)


def main():
    with open(sys.argv[1]) as f:
        runs = list(csv.DictReader(f, delimiter="\t"))
    print("MX mode through a real DNS rig (Knot + Unbound, DNSSEC), beside smarthost mode")
    print(f"machine: {os.environ.get('MACHINE', '?')}")
    for line in os.environ.get("VERSIONS_TEXT", "").splitlines():
        if line.strip():
            print(f"  {line}")
    print()
    if not runs:
        print("no runs recorded")
        return

    rows = []
    for r in runs:
        rows.append([
            NAMES.get(r["kind"], r["kind"]), r["round"], r["acked"],
            fnum(float(r["accept_mps"])), r["p99_ms"],
            fnum(float(r["e2e_mps"])), r["e2e_s"], r["sink_conns"],
            r["relay_cpu_ms"], r["sink_cpu_ms"], r["inflow_wait_s"], r["dns_queries"], r["other_cpu_pct"], r["secured"],
        ])
    print("Per run (accept: 250s / time to the last bench process's end; end to end: 250s / time to the last delivery recorded)")
    print(table(["run", "round", "250s", "accept/s", "p99 ms", "e2e/s", "e2e s", "sink conns",
                 "relay cpu ms/msg", "sink cpu ms/msg", "inflow wait s", "dns queries", "other cpu %", "attempts by outcome and security"], rows))
    print()

    by = {}
    for r in runs:
        if r["e2e_s"] == "timeout":
            continue
        by.setdefault(r["kind"], {})[r["round"]] = r
    kinds = [k for k in ("A", "B", "C") if k in by]
    rows = []
    for k in kinds:
        rs = list(by[k].values())
        acc = [float(r["accept_mps"]) for r in rs]
        e2e = [float(r["e2e_mps"]) for r in rs]
        ratio_acc, ratio_e2e = [], []
        if k != "A" and "A" in by:
            for rnd, r in by[k].items():
                a = by["A"].get(rnd)
                if a and float(a["accept_mps"]) > 0 and float(a["e2e_mps"]) > 0:
                    ratio_acc.append(float(r["accept_mps"]) / float(a["accept_mps"]))
                    ratio_e2e.append(float(r["e2e_mps"]) / float(a["e2e_mps"]))
        rows.append([
            NAMES[k], str(len(rs)), span(acc), span(e2e),
            span(ratio_acc, 2) if ratio_acc else "1" if k == "A" else "-",
            span(ratio_e2e, 2) if ratio_e2e else "1" if k == "A" else "-",
            span([float(r["sink_conns"]) for r in rs]),
            span([float(r["relay_cpu_ms"]) for r in rs], 3),
            span([float(r["sink_cpu_ms"]) for r in rs], 3),
        ])
    print("Median over rounds (min-max); ratios to A per round, then the median")
    print(table(["run", "rounds", "accept msgs/s", "end-to-end msgs/s", "accept / A", "e2e / A",
                 "sink conns", "relay cpu ms/msg", "sink cpu ms/msg"], rows))

    busy = [l for l in os.environ.get("BUSY_TEXT", "").splitlines() if l.strip()]
    if busy:
        print()
        print("Runs that shared the machine (other cpu % over 15: CPU used by processes not in the run):")
        for l in busy:
            print(f"  {l}")

    failed = [l for l in os.environ.get("FAILED_TEXT", "").splitlines() if l.strip()]
    if failed:
        print()
        print("FAILED or MISMATCHED runs (left out of the medians only if they timed out):")
        for l in failed:
            print(f"  {l}")


if __name__ == "__main__":
    sys.exit(main())
