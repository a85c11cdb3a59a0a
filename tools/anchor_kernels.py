#!/usr/bin/env python3
"""Per-kernel GPU times of an anchor's whole forward (FLA 0.6.0 `chunk_kda` /
`chunk_gated_delta_rule`, serial, `FLA_DISABLE_BACKEND_DISPATCH=1`) on one of
tools/forward_anchors.py's rows, through `torch.profiler`: where the anchor spends its time,
stage by stage, beside our own per-kernel times (`ncu`, `bench_gpu`'s "intra" column).

Usage: anchor_kernels.py --ours bench_gpu.json --row fwd_kda_h32_8x8192 [--iters 10]

The row's shape and gates are forward_anchors.py's (`inputs`, `fla_fn`: the same seeds and
options as the timed anchors). The first call compiles and autotunes (untimed); then `--iters`
calls run under the profiler and each kernel's mean time per call is printed, largest first,
with its share of the sum.
"""

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import forward_anchors as fa  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True, help="a bench_gpu JSON holding the row (its shape)")
    ap.add_argument("--row", required=True)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    with open(args.ours) as f:
        cases = [c for c in json.load(f)["cases"] if c["name"] == args.row]
    if not cases:
        sys.exit(f"row {args.row} not in {args.ours}")
    row = fa.row_of(cases[0])
    with torch.inference_mode():
        fn = fa.fla_fn(fa.inputs(row), row)
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.iters):
                fn()
            torch.cuda.synchronize()
    per = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name] += e.device_time / args.iters
    total = sum(per.values())
    print(f"FLA {'chunk_kda' if row['kda'] else 'chunk_gated_delta_rule'} on {args.row}: "
          f"{total / 1e3:.3f} ms of kernels per call ({args.iters} calls)")
    for name, us in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"{us / 1e3:9.3f} ms {100 * us / total:5.1f}%  {name[:110]}")


if __name__ == "__main__":
    main()
