"""Anchors of the whole delta-rule forward rows of bench_gpu (`fwd_gdn_*`, `fwd_kda_*`, see
tools/src/bin/bench_gpu/forward.rs): FLA 0.6.0 `chunk_gated_delta_rule` and `chunk_kda`
(forward, `FLA_DISABLE_BACKEND_DISPATCH=1`, under `torch.inference_mode()`), and FlashQLA's
`chunk_gated_delta_rule` with `auto_cp=False` (its serial fused kernel) when `flash_qla` imports.
Same rows and options as ours: bf16, K = V = 128, q/k L2-normalised in the kernel,
initial_state, final state, cu_seqlens; GDN with g given; KDA with the gate in the kernel
(A_log, dt_bias, lower bound -5) and safe_gate.

Usage: forward_anchors.py --ours bench_gpu.json [--json OUT] [--filter SUBSTR[,...]]
Prints, per row: ours, FLA, FlashQLA, the ratios and ours' share of the copy ceiling, with the
issue's targets.
"""

import argparse
import json
import os

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")

import torch  # noqa: E402
import triton  # noqa: E402

K = V = 128


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def inputs(h, hv, seqs, kda):
    t = sum(seqs)
    dev = "cuda"
    cu = torch.tensor([0] + list(torch.tensor(seqs).cumsum(0).tolist()), device=dev, dtype=torch.int32)
    q = torch.randn(1, t, h, K, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, t, h, K, device=dev, dtype=torch.bfloat16)
    v = torch.randn(1, t, hv, V, device=dev, dtype=torch.bfloat16)
    if kda:
        g = torch.randn(1, t, hv, K, device=dev, dtype=torch.float32)
    else:
        g = torch.nn.functional.logsigmoid(torch.randn(1, t, hv, device=dev, dtype=torch.float32))
    beta = torch.rand(1, t, hv, device=dev, dtype=torch.float32)
    h0 = 0.1 * torch.randn(len(seqs), hv, K, V, device=dev, dtype=torch.float32)
    a_log = torch.rand(hv, device=dev, dtype=torch.float32) * 2.7
    dt_bias = torch.rand(hv * K, device=dev, dtype=torch.float32) * 4.7 - 7.0
    return dict(q=q, k=k, v=v, g=g, beta=beta, h0=h0, cu=cu, a_log=a_log, dt_bias=dt_bias)


def fla_fn(x, kda):
    if kda:
        from fla.ops.kda import chunk_kda

        return lambda: chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"],
                                 output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                 safe_gate=True, lower_bound=-5.0, A_log=x["a_log"], dt_bias=x["dt_bias"],
                                 cu_seqlens=x["cu"].long())
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    return lambda: chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"],
                                          output_final_state=True, use_qk_l2norm_in_kernel=True,
                                          cu_seqlens=x["cu"].long())


def qla_fn(x):
    import flash_qla

    return lambda: flash_qla.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"],
                                                   output_final_state=True, use_qk_l2norm_in_kernel=True,
                                                   cu_seqlens=x["cu"], auto_cp=False)


def timed(fn):
    with torch.inference_mode():
        fn()
        return bench(fn)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True)
    ap.add_argument("--json")
    ap.add_argument("--filter", default="")
    args = ap.parse_args()
    with open(args.ours) as f:
        ours = json.load(f)
    rows = [c for c in ours["cases"] if c["name"].startswith("fwd_") and any(p in c["name"] for p in args.filter.split(","))]
    if not rows:
        return
    try:
        import flash_qla  # noqa: F401

        have_qla = True
    except Exception as e:  # not installed: the column says so
        have_qla = False
        print(f"FlashQLA not available ({e!r}); its column is empty")
    out = []
    print(f"whole forward, ours on {ours['device']} (copy ceiling {ours['ceiling_gbps']:.0f} GB/s), anchors in the same run")
    hdr = f"{'row':<26} {'ours ms':>8} {'FLA ms':>8} {'QLA ms':>8} {'vs FLA':>7} {'vs QLA':>7} {'%copy':>6} {'TFLOP/s':>8}  targets"
    print(hdr)
    print("-" * len(hdr))
    for c in rows:
        kda = c["name"].startswith("fwd_kda")
        _, t, h, hv, _, _ = c["shape"]
        x = inputs(h, hv, c["seqs"], kda)
        r = {"name": c["name"], "ours_ms": c["median_ms"]}
        try:
            r["fla_ms"] = timed(fla_fn(x, kda))
        except Exception as e:  # an anchor that cannot run is reported, not fatal
            r["fla_error"] = repr(e)
        if have_qla and not kda:
            try:
                r["qla_ms"] = timed(qla_fn(x))
            except Exception as e:
                r["qla_error"] = repr(e)
        del x
        torch.cuda.empty_cache()
        vf = r["fla_ms"] / c["median_ms"] if "fla_ms" in r else None
        vq = r["qla_ms"] / c["median_ms"] if "qla_ms" in r else None
        tg = ["FLA>=1.3x " + ("met" if vf and vf >= 1.3 else "MISS")]
        if hv >= 16 or h >= 16:
            tg.append("FLA>=2.5x " + ("met" if vf and vf >= 2.5 else "MISS"))
            if kda:
                tg.append("FLA>=2x " + ("met" if vf and vf >= 2.0 else "MISS"))
            elif vq is not None:
                tg.append("QLA>=1.15x " + ("met" if vq >= 1.15 else "MISS"))
        fmt = lambda v, p=4: f"{v:.{p}f}" if v is not None else "-"  # noqa: E731
        print(f"{c['name']:<26} {c['median_ms']:8.4f} {fmt(r.get('fla_ms')):>8} {fmt(r.get('qla_ms')):>8} "
              f"{fmt(vf, 2):>7} {fmt(vq, 2):>7} {100 * c['share']:6.1f} {c['tflops']:8.1f}  {', '.join(tg)}")
        out.append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": out}, f, indent=2)


if __name__ == "__main__":
    main()
