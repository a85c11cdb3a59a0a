"""Anchors of the context-parallel rows of bench_gpu (`cp_gdn_*`, `cp_kda_*`, see
tools/src/bin/bench_gpu/cp.rs): FLA 0.6.0's KCP (`fla.ops.cp.build_cp_context`, then
`chunk_gated_delta_rule` / `chunk_kda` with `cp_context=`) and FlashQLA's inter-card CP
(`flash_qla.ops.gated_delta_rule.chunk.build_cp_context(cu, enable_inter=True, group=...)`, then
`flash_qla.chunk_gated_delta_rule(..., cp_context=)`; GDN only, FlashQLA has no KDA), on the
same rows, over the ranks of one `torchrun`:

    torchrun --nproc_per_node N tools/cp_anchors.py [--ours bench_gpu.json] [--json OUT]
        [--filter SUBSTR[,...]] [--iters 10] [--warmup 3] [--anchors fla,qla]

Rows (named as ours, `_r{N}`): bf16, K = V = 128, H = HV = 4 and 16, one sequence of 1,048,576
tokens or 524,288 + 64 x 4096, q/k L2-normalised in the kernel, the decay g given per token
(natural log; GDN [T, H], KDA [T, H, K]) in the regimes strong and trained of
tools/src/gates.rs (the `decays` of forward_anchors.py).
Each rank holds the contiguous token range [r T/N, (r+1) T/N) (the layout both libraries take);
inputs are created on the ranks, not scattered. Both anchors are called the only way they
support: B = 1 varlen, *no* initial_state and *no* final state (FLA's KCP asserts both away; ours
runs with both). Timing: per rank, CUDA events around one call after a barrier, median of
`--iters` after `--warmup` calls; the row's time is the max over ranks. FLA runs under
`torch.inference_mode()` with FLA_DISABLE_BACKEND_DISPATCH=1 (its Triton kernels), as in
tools/forward_anchors.py.

With `--ours`, rank 0 prints ours (the `median_ms` of the same row) beside the anchors and the
ratio of the faster anchor to ours (target >= 1.2x, issue 25).
"""

import argparse
import json
import os

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from forward_anchors import decays  # noqa: E402  (the same directory)

K = V = 128
DECAYS = ("strong", "trained")
LAYOUTS = {"1048576": [1 << 20], "524288p64x4096": [1 << 19] + [4096] * 64}
NOTE = ("anchors called without initial_state and final state (FLA's KCP refuses both; FlashQLA's "
        "inter-card CP likewise run without); ours runs with both")


def rows(world):
    """Every row of this world size: (name, op, h, seqs, decay)."""
    out = []
    for op in ("gdn", "kda"):
        for h in (4, 16):
            for lname, seqs in LAYOUTS.items():
                for decay in DECAYS:
                    out.append((f"cp_{op}_h{h}_{lname}_{decay}_r{world}", op, h, seqs, decay))
    return out


def local_inputs(op, h, seqs, decay, rank, world):
    """This rank's contiguous slice of the row's tokens (random, seeded by the rank)."""
    t = sum(seqs)
    if t % world:
        raise ValueError(f"{t} tokens do not split evenly over {world} ranks")
    n = t // world
    gen = torch.Generator(device="cuda").manual_seed(1000 + rank)
    dev = "cuda"

    def uniform(shape, lo, hi, dtype):
        return (torch.rand(shape, generator=gen, device=dev, dtype=torch.float32) * (hi - lo) + lo).to(dtype)

    gk = K if op == "kda" else 1
    cu = [0]
    for s in seqs:
        cu.append(cu[-1] + s)
    return dict(
        q=uniform((1, n, h, K), -1, 1, torch.bfloat16),
        k=uniform((1, n, h, K), -1, 1, torch.bfloat16),
        v=uniform((1, n, h, V), -1, 1, torch.bfloat16),
        g=decays(decay, n, h, gk, gen).reshape((1, n, h, K) if op == "kda" else (1, n, h)),
        beta=uniform((1, n, h), 0, 1, torch.float32),
        cu=cu,
    )


def fla_call(op, x, group):
    from fla.ops.cp import build_cp_context

    ctx = build_cp_context(torch.tensor(x["cu"], device="cuda", dtype=torch.long), group=group)
    if op == "kda":
        from fla.ops.kda import chunk_kda

        return lambda: chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], use_qk_l2norm_in_kernel=True,
                                 cp_context=ctx)
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    return lambda: chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                          use_qk_l2norm_in_kernel=True, cp_context=ctx)


def qla_call(op, x, group):
    if op != "gdn":
        return None
    import flash_qla
    from flash_qla.ops.gated_delta_rule.chunk import build_cp_context

    ctx = build_cp_context(torch.tensor(x["cu"], device="cuda", dtype=torch.int32), enable_inter=True,
                           group=group)
    return lambda: flash_qla.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                                   use_qk_l2norm_in_kernel=True, output_final_state=False,
                                                   cp_context=ctx)


def timed(fn, iters, warmup):
    """Max over ranks of this rank's median CUDA-event time (ms) of `fn`; NaN when any rank
    failed (the error of this rank, or None)."""
    err = None
    ms = float("nan")
    try:
        with torch.inference_mode():
            for _ in range(warmup):
                fn()
            samples = []
            for _ in range(iters):
                dist.barrier()
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end))
            samples.sort()
            ms = samples[len(samples) // 2]
    except Exception as e:  # noqa: BLE001 - reported per row, the other rows go on
        err = repr(e)
    buf = torch.tensor([ms if ms == ms else -1.0], device="cuda", dtype=torch.float64)
    dist.all_reduce(buf, op=dist.ReduceOp.MAX)
    failed = torch.tensor([1.0 if err else 0.0], device="cuda")
    dist.all_reduce(failed, op=dist.ReduceOp.MAX)
    if failed.item() > 0:
        return float("nan"), err or "failed on another rank"
    return buf.item(), None


def anchor(make, op, x, group, iters, warmup):
    """(ms, error) of one anchor, ("-", reason) when it does not apply or does not import."""
    try:
        fn = make(op, x, group)
    except Exception as e:  # noqa: BLE001 - an anchor missing here is reported, not fatal
        fn, err = None, repr(e)
    else:
        err = None if fn is not None else f"no {op} in this library"
    # every rank must agree before entering the timed collectives
    ok = torch.tensor([0.0 if fn is None else 1.0], device="cuda")
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if ok.item() == 0:
        return None, err or "unavailable on another rank"
    return timed(fn, iters, warmup)


def fmt(x):
    return "-" if x is None or x != x else f"{x:.3f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", help="bench_gpu --json output holding the cp_* rows")
    ap.add_argument("--json", help="write the rows here (rank 0)")
    ap.add_argument("--filter", default="", help="rows whose name contains any of these (comma-separated)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--anchors", default="fla,qla",
                    help="which anchors to time, comma-separated: fla (KCP), qla (FlashQLA inter-card CP)")
    args = ap.parse_args()
    chosen = set(args.anchors.split(","))
    if not chosen <= {"fla", "qla"}:
        ap.error(f"--anchors: unknown {sorted(chosen - {'fla', 'qla'})}")

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    ours = {}
    if args.ours and rank == 0:
        with open(args.ours) as f:
            ours = {c["name"]: c for c in json.load(f).get("cases", [])}
    if rank == 0:
        print(f"cp anchors on {world} GPU(s) ({torch.cuda.get_device_name()}); {NOTE}")
        print(f"{'row':<40} {'ours':>9} {'FLA KCP':>9} {'QLA inter':>9} {'anchor/ours':>11}  (ms; target >= 1.2x)")
    out = []
    wanted = [f for f in args.filter.split(",") if f] or [""]
    for name, op, h, seqs, decay in rows(world):
        if not any(f in name for f in wanted):
            continue
        x = local_inputs(op, h, seqs, decay, rank, world)
        fla_ms, fla_err = (anchor(fla_call, op, x, group, args.iters, args.warmup) if "fla" in chosen
                           else (None, "not asked (--anchors)"))
        qla_ms, qla_err = (anchor(qla_call, op, x, group, args.iters, args.warmup) if "qla" in chosen
                           else (None, "not asked (--anchors)"))
        del x
        torch.cuda.empty_cache()
        if rank != 0:
            continue
        o = ours.get(name, {}).get("median_ms")
        times = [m for m in (fla_ms, qla_ms) if m is not None and m == m]
        ratio = min(times) / o if times and o else None
        r = {"name": name, "ranks": world, "ours_ms": o, "fla_ms": fla_ms, "qla_ms": qla_ms,
             "fla_error": fla_err, "qla_error": qla_err, "anchor_over_ours": ratio, "note": NOTE}
        out.append(r)
        mark = "" if ratio is None else ("  ok" if ratio >= 1.2 else "  MISS")
        errs = "; ".join(f"{k}: {e}" for k, e in (("FLA", fla_err), ("QLA", qla_err)) if e)
        print(f"{name:<40} {fmt(o):>9} {fmt(fla_ms):>9} {fmt(qla_ms):>9} {fmt(ratio):>11}{mark}"
              f"{'  (' + errs[:160] + ')' if errs else ''}", flush=True)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"world": world, "device": torch.cuda.get_device_name(), "note": NOTE, "rows": out}, f,
                      indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
