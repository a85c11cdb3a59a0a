#!/usr/bin/env python3
"""Summarise one kernel's Nsight Compute source page: where its instructions and stalls are.

Input: the csv that `ncu --import REP --page source --csv --print-source sass` prints for a
report of one kernel launch taken with the SourceCounters section (`--set full` has it). Output:
executed warp instructions, stall reasons as shares of the warp-state samples, the opcode mix
(executed / sampled), the hottest instructions, regions of the program by samples, and the
memory sectors each access class sends to L2 (global, the part ncu calls excessive, local).

    ncu --import p.ncu-rep --page source --csv --print-source sass > src.csv
    python3 tools/ncu_source.py src.csv [--top 30] [--region 250]

Instructions run once per warp in a long straight-line program show up as executions equal to
the warps launched, and as `no_inst` stalls (instruction fetch) spread over the whole program.
"""
import argparse
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def kernels(path):
    """(name, header, rows) per kernel of the csv (ncu prints a "Kernel Name" row before each)."""
    rows = list(csv.reader(open(path, newline="")))
    starts = [i for i, r in enumerate(rows) if r and r[0] == "Kernel Name"] or [0]
    for k, s in enumerate(starts):
        block = rows[s:starts[k + 1] if k + 1 < len(starts) else len(rows)]
        head = next((i for i, r in enumerate(block) if r and r[0] == "Address"), None)
        if head is None:
            continue
        hdr = block[head]
        name = block[0][1] if block[0] and block[0][0] == "Kernel Name" and len(block[0]) > 1 else "?"
        yield name, hdr, [r for r in block[head + 1:] if len(r) == len(hdr)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30, help="hottest instructions listed")
    ap.add_argument("--region", type=int, default=250, help="instructions per region")
    ap.add_argument("--kernel", default="", help="only kernels whose name contains this")
    args = ap.parse_args()
    seen = 0
    for name, hdr, data in kernels(args.csv):
        if args.kernel in name:
            seen += 1
            summarise(args, name, hdr, data)
            print()
    if not seen:
        sys.exit(f"{args.csv}: no kernel{' named like ' + args.kernel if args.kernel else ''} with a source page")


def summarise(args, name, hdr, data):
    ix = {h: i for i, h in enumerate(hdr)}
    for need in (SAMPLES, EXECUTED, "Source"):
        if need not in ix:
            sys.exit(f"{args.csv}: no column '{need}' (take the report with the SourceCounters section)")

    def num(r, h):
        try:
            return float(r[ix[h]].replace(",", "")) if h in ix else 0.0
        except ValueError:
            return 0.0

    def opcode(r):
        t = r[ix["Source"]].split()
        if t and t[0].startswith("@"):
            t = t[1:]
        return t[0].split(".")[0] if t else "?"

    total_s = sum(num(r, SAMPLES) for r in data) or 1.0
    total_e = sum(num(r, EXECUTED) for r in data) or 1.0
    print(f"{name}: {len(data)} SASS instructions, {total_e:.3e} warp instructions executed, {total_s:.0f} samples")
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    share = {h[6:]: sum(num(r, h) for r in data) / total_s for h in stalls}
    print("stalls: " + ", ".join(f"{k} {v * 100:.1f}%" for k, v in sorted(share.items(), key=lambda x: -x[1]) if v >= 0.01))
    ex, sa = collections.Counter(), collections.Counter()
    for r in data:
        ex[opcode(r)] += num(r, EXECUTED)
        sa[opcode(r)] += num(r, SAMPLES)
    print("mix (% executed / % samples): " + ", ".join(f"{k} {v / total_e * 100:.1f}/{sa[k] / total_s * 100:.1f}" for k, v in ex.most_common(20)))
    print(f"\nhottest {args.top} instructions (index, share of samples, executions, top two stalls):")
    for i in sorted(sorted(range(len(data)), key=lambda i: -num(data[i], SAMPLES))[: args.top]):
        r = data[i]
        top2 = sorted(((num(r, h), h[6:]) for h in stalls), reverse=True)[:2]
        print(f"{i:6d} {num(r, SAMPLES) / total_s * 100:5.2f}% {num(r, EXECUTED):10.0f}  {r[ix['Source']][:56]:56s} "
              + " ".join(f"{n}:{v / total_s * 100:.1f}" for v, n in top2))
    print(f"\nregions of {args.region} instructions with at least 1% of samples or executions:")
    for b in range(0, len(data), args.region):
        blk = data[b:b + args.region]
        s = sum(num(r, SAMPLES) for r in blk)
        e = sum(num(r, EXECUTED) for r in blk)
        if s / total_s < 0.01 and e / total_e < 0.01:
            continue
        ops = collections.Counter()
        for r in blk:
            ops[opcode(r)] += num(r, EXECUTED)
        mix = " ".join(f"{k}:{v / e * 100:.0f}" for k, v in ops.most_common(5)) if e else ""
        print(f"{b:6d}-{b + len(blk):6d} samples {s / total_s * 100:5.1f}% executed {e / total_e * 100:5.1f}%  {mix}")
    g = sum(num(r, "L2 Theoretical Sectors Global") for r in data)
    gx = sum(num(r, "L2 Theoretical Sectors Global Excessive") for r in data)
    loc = sum(num(r, "L2 Theoretical Sectors Local") for r in data)
    print(f"\nL2 sectors: global {g:.3e} (excessive {gx:.3e}), local {loc:.3e}")
    for r in sorted(data, key=lambda r: -num(r, "L2 Theoretical Sectors Local"))[:4]:
        if num(r, "L2 Theoretical Sectors Local") > 0:
            print(f"  local: {num(r, 'L2 Theoretical Sectors Local'):.3e} sectors, {num(r, EXECUTED):.0f} executions  {r[ix['Source']][:60]}")


if __name__ == "__main__":
    main()
