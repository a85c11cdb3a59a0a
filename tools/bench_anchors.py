#!/usr/bin/env python3
"""Times today's alternatives (the anchors) on the shapes of `bench_gpu`, in the same GPU run,
and prints ours next to them.

Anchors: `torch.cumsum` for the cumsum cases; FLA 0.6.0 `chunk_local_cumsum`,
`chunk_global_cumsum`, `kda_gate_fwd`, `kda_gate_chunk_cumsum` (Triton) for the others, plus the
two-kernel `kda_gate_fwd` + `chunk_local_cumsum` for the first fused shape. Times are medians of
`triton.testing.do_bench` (warm-up 25 ms, 100 ms of repeats, L2 flushed before each repeat).
Bytes count each input element read once and each output element written once. The copy
ceiling is a 1 GiB `Tensor.copy_` (2 GiB moved) timed the same way.

The delta-rule rows (FWD_H) time FLA 0.6.0's serial `chunk_gated_delta_rule_fwd_h` and its
`intracard_pre_scan` on random bf16 inputs of the spec's anchor shapes; the split rows
(FWD_H_SPLIT) time FLA's serial path and its intra-card split (`FLA_INTRACARD_CP=1` under
`torch.inference_mode()`) next to our serial, auto and forced-split times.

Usage: bench_anchors.py [--json OUT.json] [--ours bench_gpu.json] [--filter SUBSTR[,SUBSTR]]
With --ours, prints: case, ours (ms), anchor (ms), speedup (anchor / ours), the shares of each
side's own copy ceiling, and the target.
"""
import argparse
import json
import math

import torch
import triton

RCP_LN2 = 1.4426950216

# name -> (shape, in dtype, out dtype, anchor, target share of ceiling, min speedup vs anchor)
CASES = {
    "cumsum_seed_dim2_f32": ([16, 16, 1024, 64, 64], "float32", "float32", ("cumsum", 2), 0.90, 1.0),
    "cumsum_seed_dim2_bf16_f32": ([16, 16, 1024, 64, 64], "bfloat16", "float32", ("cumsum", 2), 0.85, 1.0),
    "cumsum_rows_last_f32": ([1048576, 1024], "float32", "float32", ("cumsum", -1), 0.85, 1.0),
    "cumsum_rows_last_bf16_f32": ([1048576, 1024], "bfloat16", "float32", ("cumsum", -1), 0.85, 1.0),
    "cumsum_dim0_f32": ([1024, 1048576], "float32", "float32", ("cumsum", 0), 0.90, 1.0),
    "cumsum_one_lane_f32": ([1 << 28], "float32", "float32", ("cumsum", 0), 0.80, 1.0),
    "chunk_local_cumsum_bf16_f32": ([1, 32768, 32, 128], "bfloat16", "float32", ("fla_local",), 0.92, 1.05),
    "chunk_global_cumsum_bf16_f32": ([1, 32768, 32, 128], "bfloat16", "float32", ("fla_global",), None, 1.0),
    "kda_gate_bf16_f32": ([1, 32768, 32, 128], "bfloat16", "float32", ("fla_gate",), None, 1.0),
    "kda_gate_chunk_cumsum_1x32768x32x128": ([1, 32768, 32, 128], "bfloat16", "float32", ("fla_fused",), 0.92, 1.05),
    "kda_gate_chunk_cumsum_8x4096x16x128": ([8, 4096, 16, 128], "bfloat16", "float32", ("fla_fused",), 0.92, 1.05),
    "kda_gate_chunk_cumsum_1x131072x8x128": ([1, 131072, 8, 128], "bfloat16", "float32", ("fla_fused",), 0.92, 1.05),
}

# The delta-rule rows (`conformance/spec/anchors.md`, fwd_h table): bf16, K = V = 128, chunk 64, gk,
# initial_state, final state, v_new, varlen cu_seqlens. name -> (value heads, sequence lengths,
# anchor, target share of ceiling, min speedup vs FLA serial). The pre-scan row: 32 pieces.
FWD_H = {
    "fwd_h_h4_4096": (4, [4096], "fla_fwd_h", None, 1.0),
    "fwd_h_h4_32768": (4, [32768], "fla_fwd_h", None, 1.5),
    "fwd_h_h4_65536": (4, [65536], "fla_fwd_h", None, 1.5),
    "fwd_h_h4_131072": (4, [131072], "fla_fwd_h", None, 1.5),
    "fwd_h_h4_131072+10x1024": (4, [131072] + [1024] * 10, "fla_fwd_h", None, 1.5),
    "fwd_h_h4_4x8192": (4, [8192] * 4, "fla_fwd_h", None, 1.0),
    "fwd_h_h4_28672+4096": (4, [28672, 4096], "fla_fwd_h", None, 1.0),
    "fwd_h_h8_131072": (8, [131072], "fla_fwd_h", None, 1.0),
    "fwd_h_h16_131072": (16, [131072], "fla_fwd_h", None, 1.0),
    "fwd_h_h32_32768": (32, [32768], "fla_fwd_h", 0.70, 1.2),
    "fwd_h_h32_8x8192": (32, [8192] * 8, "fla_fwd_h", 0.70, 1.2),
    "fwd_h_pre_scan_h4_131072_32pieces": (4, [131072], "fla_prescan", None, None),
}
DK = DV = 128

# The intra-card split rows (`fwd_h_split_h{H}_{shape}` of bench_gpu's split.rs): FLA 0.6.0 serial
# and FLA's own split (`FLA_INTRACARD_CP=1` under `torch.inference_mode()`), same inputs as FWD_H.
K1 = 1024
SPLIT_SHAPES = {
    "4096": [4096], "32768": [32 * K1], "65536": [64 * K1], "131072": [128 * K1],
    "131072+10x1024": [128 * K1] + [K1] * 10, "131072+1024": [128 * K1, K1],
    "131072+2x1024": [128 * K1] + [K1] * 2, "131072+5x1024": [128 * K1] + [K1] * 5,
    "65536+512+256+128": [64 * K1, 512, 256, 128], "28672+4096": [28 * K1, 4 * K1],
    "8x4096": [4 * K1] * 8, "4x8192": [8 * K1] * 4, "2x16384": [16 * K1] * 2,
    "24576+8192": [24 * K1, 8 * K1], "32768+256+256": [32 * K1, 256, 256],
    "40960+1024+8192": [40 * K1, K1, 8 * K1],
}
FWD_H_SPLIT = {f"fwd_h_split_h{h}_{n}": (h, s) for h in (4, 8) for n, s in SPLIT_SHAPES.items()}
FWD_H_SPLIT.update({"fwd_h_split_h16_131072": (16, [128 * K1]), "fwd_h_split_h32_32768": (32, [32 * K1]),
                    "fwd_h_split_h32_8x8192": (32, [8 * K1] * 8)})
# issue 14's targets: auto / FLA serial (every row: auto >= 0.98x our serial and faster than FLA split)
SPLIT_TARGETS = {"fwd_h_split_h4_131072": 4.0, "fwd_h_split_h4_131072+10x1024": 4.0,
                 "fwd_h_split_h4_65536": 2.5, "fwd_h_split_h8_131072": 2.0}


def split_anchor(name):
    """(FLA serial ms, FLA split ms) for a split row."""
    import os

    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
    heads, seqs = FWD_H_SPLIT[name]
    t = sum(seqs)
    dev = "cuda"
    k = ((torch.rand(1, t, heads, DK, device=dev) * 2 - 1) * 0.02).to(torch.bfloat16)
    w = ((torch.rand(1, t, heads, DK, device=dev) * 2 - 1) * 0.02).to(torch.bfloat16)
    u = (torch.rand(1, t, heads, DV, device=dev) * 2 - 1).to(torch.bfloat16)
    gk = -0.1 * torch.rand(1, t, heads, DK, device=dev)
    cu = torch.tensor([0] + list(__import__("itertools").accumulate(seqs)), device=dev, dtype=torch.long)
    h0 = torch.rand(len(seqs), heads, DK, DV, device=dev) * 2 - 1

    def fn():
        return chunk_gated_delta_rule_fwd_h(k=k, w=w, u=u, g=None, gk=gk, initial_state=h0,
                                            output_final_state=True, chunk_size=64,
                                            save_new_value=True, cu_seqlens=cu)
    out = []
    for cp in ("0", "1"):
        os.environ["FLA_INTRACARD_CP"] = cp
        try:
            with torch.inference_mode():
                fn()
                out.append(bench(fn))
        finally:
            os.environ.pop("FLA_INTRACARD_CP", None)
    return out


def split_table(ours, rows, filt):
    """Ours (serial, auto, forced split) against FLA (serial, split) for the split rows."""
    mine = [c for c in ours["cases"] if c["name"].startswith("fwd_h_split_") and any(f in c["name"] for f in filt)]
    if not mine:
        return
    print()
    hdr = (f"{'case':<36} {'ours ser':>9} {'ours auto':>9} {'split?':>6} {'forced':>9} {'FLA ser':>9} {'FLA split':>9}"
           f" {'auto/ser':>8} {'auto/FLA':>8} {'auto/FLAsp':>10}  target")
    print(hdr)
    print("-" * len(hdr))
    for c in mine:
        a = rows.get(c["name"], {})
        fs, fc = a.get("fla_serial_ms"), a.get("fla_split_ms")
        auto, ser = c["median_ms"], c["serial_ms"]
        guard = auto * 0.98 <= ser
        tgt = SPLIT_TARGETS.get(c["name"])
        ok = guard and (fc is None or auto < fc) and (tgt is None or fs is None or fs / auto >= tgt)
        f = lambda v: f"{v:9.4f}" if v else f"{'n/a':>9}"
        r = lambda x, y: f"{x / y:.2f}x" if x and y else "n/a"
        print(f"{c['name']:<36} {f(ser)} {f(auto)} {('yes' if c['auto_split'] else 'no'):>6} {f(c['split_ms'])} {f(fs)} {f(fc)}"
              f" {r(ser, auto):>8} {r(fs, auto):>8} {r(fc, auto):>10}  "
              f"{'>=' + str(tgt) + 'x FLA, ' if tgt else ''}>=0.98x ours, < FLA split {'ok' if ok else 'MISS'}")

DT = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def delta_fn(name):
    """FLA 0.6.0 on random inputs of the row's shapes (time does not depend on the values)."""
    heads, seqs, anchor, _, _ = FWD_H[name]
    t = sum(seqs)
    dev = "cuda"
    k = ((torch.rand(1, t, heads, DK, device=dev) * 2 - 1) * 0.02).to(torch.bfloat16)
    w = ((torch.rand(1, t, heads, DK, device=dev) * 2 - 1) * 0.02).to(torch.bfloat16)
    u = (torch.rand(1, t, heads, DV, device=dev) * 2 - 1).to(torch.bfloat16)
    gk = -0.1 * torch.rand(1, t, heads, DK, device=dev)
    cu = torch.tensor([0] + list(__import__("itertools").accumulate(seqs)), device=dev, dtype=torch.long)
    if anchor == "fla_prescan":
        from fla.ops.common.intracard_cp import intracard_pre_scan
        step = -(-(t // 32) // 64) * 64
        cuts = torch.tensor([min(j * step, t) for j in range(32)] + [t], device=dev, dtype=torch.long)
        return lambda: intracard_pre_scan(k=k, w=w, u=u, g=None, gk=gk, cu_seqlens=cuts, num_subseqs=32, chunk_size=64)
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
    h0 = torch.rand(len(seqs), heads, DK, DV, device=dev) * 2 - 1
    return lambda: chunk_gated_delta_rule_fwd_h(k=k, w=w, u=u, g=None, gk=gk, initial_state=h0,
                                               output_final_state=True, chunk_size=64,
                                               save_new_value=True, cu_seqlens=cu)


def delta_bytes(name):
    heads, seqs, anchor, _, _ = FWD_H[name]
    tok = sum(seqs) * heads
    ins = tok * (2 * DK + DV) * 2 + tok * DK * 4
    if anchor == "fla_prescan":
        return ins + 32 * heads * DK * (DV + DK) * 4
    chunks = sum(-(-s // 64) for s in seqs)
    return ins + chunks * heads * DK * DV * 2 + tok * DV * 2 + 2 * len(seqs) * heads * DK * DV * 4


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def anchor_fn(anchor, shape, din):
    x = (torch.rand(shape, device="cuda", dtype=torch.float32) * 2 - 1)
    if anchor[0] == "cumsum":
        x = x.to(DT[din])
        dim = anchor[1]
        if din == "float32":
            return lambda: torch.cumsum(x, dim)
        return lambda: torch.cumsum(x, dim, dtype=torch.float32)
    from fla.ops.utils.cumsum import chunk_global_cumsum, chunk_local_cumsum
    from fla.ops.kda.gate import kda_gate_chunk_cumsum, kda_gate_fwd

    g = (x * 6).to(DT[din])
    if anchor[0] == "fla_local":
        return lambda: chunk_local_cumsum(g, chunk_size=64, output_dtype=torch.float)
    if anchor[0] == "fla_global":
        return lambda: chunk_global_cumsum(g, output_dtype=torch.float)
    H, K = shape[2], shape[3]
    a_log = torch.rand(H, device="cuda") * 3 - 2
    dt_bias = torch.rand(H * K, device="cuda") * 2 - 1
    if anchor[0] == "fla_gate":
        return lambda: kda_gate_fwd(g, a_log, dt_bias)
    if anchor[0] == "fla_fused":
        return lambda: kda_gate_chunk_cumsum(g, a_log, chunk_size=64, scale=RCP_LN2, dt_bias=dt_bias, output_dtype=torch.float)
    if anchor[0] == "fla_two_kernels":
        return lambda: chunk_local_cumsum(kda_gate_fwd(g, a_log, dt_bias), chunk_size=64, scale=RCP_LN2, output_dtype=torch.float)
    raise ValueError(anchor)


def nbytes(shape, din, dout):
    n = math.prod(shape)
    return n * (torch.finfo(DT[din]).bits // 8 + torch.finfo(DT[dout]).bits // 8)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--ours")
    ap.add_argument("--filter", default="")
    ap.add_argument("--decode-only", action="store_true", help="only the decode anchors (needs --ours)")
    args = ap.parse_args()

    src = torch.rand(1 << 28, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = bench(lambda: dst.copy_(src))
    ceiling = 2 * src.numel() * 4 / (copy_ms * 1e-3) / 1e9
    del src, dst
    dev = torch.cuda.get_device_name()
    print(f"anchors on {dev}: torch {torch.__version__}, triton {triton.__version__}; copy ceiling {ceiling:.0f} GB/s")
    rows = {}
    cases = dict(CASES)
    cases["kda_gate_then_chunk_local_cumsum_1x32768x32x128"] = ([1, 32768, 32, 128], "bfloat16", "float32", ("fla_two_kernels",), None, None)
    for name in FWD_H:
        cases[name] = (None, None, None, (FWD_H[name][2],), FWD_H[name][3], FWD_H[name][4])
    for name, (shape, din, dout, anchor, _, _) in cases.items():
        if not any(f in name for f in args.filter.split(",")) or args.decode_only:
            continue
        try:
            if name in FWD_H:
                with torch.no_grad():
                    fn = delta_fn(name)
                    fn()
                    ms = bench(fn)
                b = delta_bytes(name)
            else:
                fn = anchor_fn(anchor, shape, din)
                ms = bench(fn)
                b = nbytes(shape, din, dout)
            rows[name] = {"anchor": anchor[0], "median_ms": ms, "bytes": b, "gbps": b / (ms * 1e-3) / 1e9,
                          "share": b / (ms * 1e-3) / 1e9 / ceiling}
            print(f"  {name:<50} {anchor[0]:<16} {ms:9.4f} ms {rows[name]['gbps']:7.0f} GB/s {100 * rows[name]['share']:5.1f}%")
        except Exception as e:  # an anchor that cannot run is reported, not fatal
            rows[name] = {"anchor": anchor[0], "error": repr(e)}
            print(f"  {name:<50} {anchor[0]:<16} failed: {e!r}")
        torch.cuda.empty_cache()
    for name in FWD_H_SPLIT:
        if not any(f in name for f in args.filter.split(",")) or args.decode_only:
            continue
        try:
            fs, fc = split_anchor(name)
            rows[name] = {"anchor": "fla_fwd_h", "fla_serial_ms": fs, "fla_split_ms": fc}
            print(f"  {name:<50} FLA serial {fs:9.4f} ms, FLA split {fc:9.4f} ms")
        except Exception as e:  # an anchor that cannot run is reported, not fatal
            rows[name] = {"anchor": "fla_fwd_h", "error": repr(e)}
            print(f"  {name:<50} failed: {e!r}")
        torch.cuda.empty_cache()
    doc = {"device": dev, "torch": torch.__version__, "triton": triton.__version__, "ceiling_gbps": ceiling,
           "copy_ms": copy_ms, "cases": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    if args.ours:
        with open(args.ours) as f:
            ours = json.load(f)
        import decode_anchors  # beside this script

        decode_rows = [c for c in ours["cases"] if c["name"].startswith("decode_") and any(f in c["name"] for f in args.filter.split(","))]
        if decode_rows:
            doc["decode"] = decode_anchors.run(decode_rows, ceiling, ours.get("read_ceiling_gbps"))
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(doc, f, indent=2)
        import nsa_anchors  # beside this script

        nsa_rows = [c for c in ours["cases"] if c["name"].startswith("nsa_") and any(f in c["name"] for f in args.filter.split(","))]
        if nsa_rows and not args.decode_only:
            print()
            doc["nsa"] = nsa_anchors.run(nsa_rows, ceiling)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(doc, f, indent=2)
        split_rows = [c for c in ours["cases"] if c["name"].startswith("fwd_h_split_")]
        ours["cases"] = [c for c in ours["cases"] if not c["name"].startswith(("decode_", "nsa_", "fwd_h_split_", "fwd_gdn_", "fwd_kda_"))]
        print()
        print(f"ours on {ours['device']} (copy ceiling {ours['ceiling_gbps']:.0f} GB/s), anchors on {dev} (copy ceiling {ceiling:.0f} GB/s)")
        hdr = f"{'case':<40} {'ours ms':>9} {'anchor ms':>10} {'speedup':>8} {'ours %ceil':>10} {'anchor %ceil':>12}  target"
        print(hdr)
        print("-" * len(hdr))
        for c in ours["cases"]:
            a = rows.get(c["name"], {})
            spec = CASES.get(c["name"]) or cases.get(c["name"])
            tgt = ""
            ok = True
            if spec:
                share, speed = spec[4], spec[5]
                if share:
                    tgt += f">={100 * share:.0f}%"
                    ok &= c["share"] >= share
                if speed and "median_ms" in a:
                    tgt += f" >={speed:.2f}x"
                    ok &= a["median_ms"] / c["median_ms"] >= speed
            am = a.get("median_ms")
            sp = f"{am / c['median_ms']:.2f}x" if am else "n/a"
            ash = f"{100 * a['share']:.1f}%" if am else "n/a"
            amt = f"{am:.4f}" if am else "n/a"
            more = ""
            if "tflops" in c:
                more += f" {c['tflops']:.1f} TFLOP/s"
            if "longest_seq_step_us" in c and "tflops" not in c:
                more += f" step {c['longest_seq_step_us']:.3f} us"
                if am:
                    more += f" (FLA {c['longest_seq_step_us'] * am / c['median_ms']:.3f} us)"
            print(f"{c['name']:<40} {c['median_ms']:9.4f} {amt:>10} {sp:>8} {100 * c['share']:9.1f}% {ash:>12}  {tgt} {'ok' if ok else 'MISS'}{more}")
        if not args.decode_only:
            split_table({"cases": split_rows}, rows, args.filter.split(","))


if __name__ == "__main__":
    main()
