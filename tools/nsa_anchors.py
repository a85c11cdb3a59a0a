"""Anchors of the NSA part 1 benchmark (issue 15), timed in the same GPU run as `bench_gpu`.

For each NSA row of `bench_gpu --json`:
- `nsa_compress_kv_*` fixed length: PyTorch `x.view(B, TC, BS, H, D).float().mean(2).to(x.dtype)`
  for k, then for v (two launches each, the plain pooling); varlen: a Python loop of that pooling
  per sequence, and FLA 0.6.0 `mean_pooling(x, BS, cu_seqlens)` for k then v;
- `nsa_gate_combine_w_*`: the PyTorch formula (gate logits by `einsum`, `sigmoid`, the weighted
  sum in fp32, one cast);
- `nsa_select_blocks_fla_*`: FLA 0.6.0 `parallel_nsa_topk(q, k_cmp, T, None, 16, 64)` (lse
  computed inside, as our op defines it), and with the compressed branch's `lse` given.
- issue 16's attention rows (bf16, HQ 64, H 4, K = V = 128, BS 64, 16 blocks):
  `nsa_compression_attention_*`: FLA `parallel_nsa_compression_fwd(q, k_cmp, v_cmp, T, 64, scale)`;
  `nsa_selection_attention_*`: FLA `parallel_nsa_fwd(q, k, v, block_indices, 16, 64, scale)` on
  indices drawn alike (the current block and random distinct past ones, -1 padded);
  `nsa_fwd_*_w0`: FLA `parallel_nsa(q, k, v, g_cmp, g_slc, g_swa, block_counts=16)` (computed
  selection); `nsa_fwd_*_w512`: dense causal attention, SDPA's flash backend on the same q and
  k, v repeated to HQ heads (and `parallel_nsa` with the window when flash_attn is installed).
  Their TFLOP/s are compared with a dense bf16 matmul (8192^3) timed in the same run.
The copy ceiling is a 1 GiB `Tensor.copy_` (2 GiB moved). Times: `triton.testing.do_bench`
medians (L2 flushed). `run(rows, ceiling)` (called by `bench_anchors.py`; `--ours bench_gpu.json` standalone) prints ours, the anchor, the ratio and the
shares of the ceiling, and the issue's targets.
"""
import argparse
import json

import torch
import triton

# name -> (min share of ceiling or None, min speedup vs the first anchor)
TARGETS = {
    "nsa_compress_kv_1x65536x4x128_bs32": (0.85, 6.0),
    "nsa_compress_kv_4x16384x8x128_bs64": (0.85, 6.0),
    "nsa_compress_kv_varlen64_h4x128_bs32": (0.80, 1.0),
    "nsa_gate_combine_w_1x32768x32x128": (0.80, None),
    "nsa_select_blocks_fla_t32768_hq64_h4_k128_bs64_s16": (None, 1.0),
}
for _t in (32768, 65536):
    _tag = f"t{_t}_hq64_h4_k128_bs64"
    TARGETS[f"nsa_compression_attention_{_tag}"] = (None, 1.0)
    TARGETS[f"nsa_selection_attention_{_tag}_s16"] = (None, 1.0)
    TARGETS[f"nsa_fwd_{_tag}_s16_w0"] = (None, 1.3)


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def pool(x, bs):
    b, t, h, d = x.shape
    tc = t // bs
    return x[:, : tc * bs].view(b, tc, bs, h, d).float().mean(2).to(x.dtype)


def slots(t, h, bs, s, dev):
    """[1, t, h, s] int64: the current block and random distinct past ones, -1 padded."""
    nb = triton.cdiv(t, bs)
    cur = torch.arange(t, device=dev) // bs
    out = torch.empty(t, h, s, dtype=torch.long, device=dev)
    for i in range(0, t, 4096):  # chunks keep the random scores small
        c = cur[i:i + 4096]
        r = torch.rand(c.numel(), h, nb, device=dev)
        blk = torch.arange(nb, device=dev)
        r[(blk[None, :] > c[:, None])[:, None, :].expand_as(r)] = -1.0
        r[torch.arange(c.numel(), device=dev), :, c] = 2.0
        sc, ix = r.topk(s, dim=-1)
        out[i:i + 4096] = torch.where(sc < 0, -1, ix)
    return out.unsqueeze(0)


def attention_anchors(row):
    name, (_, t, hq, d) = row["name"], row["shape"]
    h, bs, s, w = row["h"], row["block_size"], row["s"], row["window"]
    dev, bf = "cuda", torch.bfloat16
    u = lambda *sh: (torch.rand(*sh, device=dev) * 2 - 1).to(bf)
    q, k, v = u(1, t, hq, d), u(1, t, h, d), u(1, t, h, d)
    scale = d ** -0.5
    out = {}
    if name.startswith("nsa_compression_attention"):
        from fla.ops.nsa.compression import parallel_nsa_compression_fwd
        kc, vc = u(1, t // bs, h, d), u(1, t // bs, h, d)
        out["fla_parallel_nsa_compression"] = bench(lambda: parallel_nsa_compression_fwd(q, kc, vc, t, bs, scale))
    elif name.startswith("nsa_selection_attention"):
        from fla.ops.nsa.parallel import parallel_nsa_fwd
        idx = slots(t, h, bs, s, dev)
        out["fla_parallel_nsa_fwd"] = bench(lambda: parallel_nsa_fwd(q, k, v, idx, s, bs, scale))
    else:
        from fla.ops.nsa.parallel import parallel_nsa
        g = [torch.rand(1, t, hq, device=dev).to(bf) for _ in range(3)]
        if w == 0:
            out["fla_parallel_nsa"] = bench(lambda: parallel_nsa(q, k, v, g[0], g[1], g[2], block_counts=s,
                                                                 block_size=bs, window_size=0))
        else:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            import torch.nn.functional as F
            qh = q.transpose(1, 2).contiguous()
            kh = k.repeat_interleave(hq // h, dim=2).transpose(1, 2).contiguous()
            vh = v.repeat_interleave(hq // h, dim=2).transpose(1, 2).contiguous()
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                out["sdpa_flash_dense_causal"] = bench(lambda: F.scaled_dot_product_attention(qh, kh, vh, is_causal=True))
            try:
                import flash_attn  # noqa: F401
                out["fla_parallel_nsa_w"] = bench(lambda: parallel_nsa(q, k, v, g[0], g[1], g[2], block_counts=s,
                                                                       block_size=bs, window_size=w))
            except ImportError:
                pass
    return out


def dense_tflops():
    """The dense bf16 tensor-core rate of this device: an 8192^3 matmul."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = bench(lambda: a @ b)
    return 2 * 8192 ** 3 / (ms * 1e-3) / 1e12


def anchors_for(row):
    name, shape = row["name"], row["shape"]
    dev = "cuda"
    bf = torch.bfloat16
    out = {}
    if name.startswith("nsa_compress_kv"):
        b, t, h, d = shape
        bs = int(name.rsplit("bs", 1)[1])
        k = torch.randn(b, t, h, d, device=dev, dtype=bf)
        v = torch.randn(b, t, h, d, device=dev, dtype=bf)
        lens = row.get("seqlens")
        if lens:
            cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device=dev, dtype=torch.int32)
            starts = [int(s) for s in cu[:-1]]

            def loop():
                for s, l in zip(starts, lens):
                    pool(k[:, s:s + l], bs), pool(v[:, s:s + l], bs)

            out["torch_loop"] = bench(loop)
            from fla.ops.utils.pooling import mean_pooling
            out["fla_mean_pooling"] = bench(lambda: (mean_pooling(k, bs, cu), mean_pooling(v, bs, cu)))
        else:
            out["torch_mean"] = bench(lambda: (pool(k, bs), pool(v, bs)))
    elif name.startswith("nsa_gate_combine_w"):
        _, t, hq, d = shape
        q = torch.randn(1, t, hq, d, device=dev, dtype=bf)
        o = [torch.randn(1, t, hq, d, device=dev, dtype=bf) for _ in range(3)]
        w = torch.randn(hq, 3, d, device=dev, dtype=bf) * 0.2

        def formula():
            g = torch.sigmoid(torch.einsum("bthd,hcd->bthc", q.float(), w.float()))
            return (g[..., 0:1] * o[0].float() + g[..., 1:2] * o[1].float() + g[..., 2:3] * o[2].float()).to(bf), g

        out["torch_formula"] = bench(formula)
    elif name.startswith("nsa_select_blocks_fla"):
        _, t, hq, k_dim = shape
        h, bs, s = 4, 64, 16
        from fla.ops.nsa.compression import parallel_nsa_compression_fwd
        from fla.ops.nsa.parallel import parallel_nsa_topk
        q = torch.randn(1, t, hq, k_dim, device=dev, dtype=bf)
        kc = torch.randn(1, triton.cdiv(t, bs), h, k_dim, device=dev, dtype=bf)
        scale = k_dim ** -0.5
        out["fla_topk"] = bench(lambda: parallel_nsa_topk(q, kc, t, None, s, bs, scale))
        _, lse = parallel_nsa_compression_fwd(q, kc, kc, t, bs, scale)
        out["fla_topk_given_lse"] = bench(lambda: parallel_nsa_topk(q, kc, t, lse, s, bs, scale))
    return out


def run(rows, ceiling):
    """Times the anchors of the NSA rows of `bench_gpu --json`, prints the tables (ours, the
    anchor, the ratio, the shares and the targets) and returns them as a dict. `ceiling` is the
    copy ceiling (GB/s) measured in this run. Called by `bench_anchors.py` and by `main`."""
    dev = torch.cuda.get_device_name()
    print(f"NSA anchors on {dev}: torch {torch.__version__}, triton {triton.__version__}; "
          f"copy ceiling {ceiling:.0f} GB/s")
    doc = {"device": dev, "ceiling_gbps": ceiling, "rows": []}
    attn = [r for r in rows if "flops" in r]
    rows = [r for r in rows if "flops" not in r]
    if rows:
        print(f"{'case':<52} {'ours ms':>9} {'ours %':>7} {'anchor':>20} {'ms':>9} {'%':>6} {'ratio':>7}  target")
    for r in rows:
        anchors = anchors_for(r)
        share_t, speed_t = TARGETS.get(r["name"], (None, None))
        first = True
        for a, ms in anchors.items():
            share = r["bytes"] / (ms * 1e-3) / 1e9 / ceiling
            ratio = ms / r["median_ms"]
            tgt = []
            if first and share_t is not None:
                tgt.append(f"share >= {share_t:.0%}: {'met' if r['share'] >= share_t else 'MISSED'}")
            if speed_t is not None:
                tgt.append(f">= {speed_t}x: {'met' if ratio >= speed_t else 'MISSED'}")
            print(f"{r['name']:<52} {r['median_ms']:>9.4f} {100 * r['share']:>6.1f}% {a:>20} {ms:>9.4f} "
                  f"{100 * share:>5.1f}% {ratio:>6.2f}x  {'; '.join(tgt)}")
            doc["rows"].append({"name": r["name"], "anchor": a, "anchor_ms": ms, "ours_ms": r["median_ms"],
                                "ours_share": r["share"], "anchor_share": share, "ratio": ratio})
            first = False
    if attn:
        dense = dense_tflops()
        doc["dense_bf16_tflops"] = dense
        print(f"dense bf16 matmul (8192^3): {dense:.0f} TFLOP/s")
        print(f"{'case':<52} {'ours ms':>9} {'TFLOP/s':>8} {'dense %':>7} {'anchor':>26} {'ms':>9} {'ratio':>7}  target")
    for r in attn:
        _, speed_t = TARGETS.get(r["name"], (None, None))
        for a, ms in attention_anchors(r).items():
            ratio = ms / r["median_ms"]
            tgt = f">= {speed_t}x: {'met' if ratio >= speed_t else 'MISSED'}" if speed_t and a.startswith("fla") else ""
            print(f"{r['name']:<52} {r['median_ms']:>9.4f} {r['tflops']:>8.1f} {100 * r['tflops'] / dense:>6.1f}% "
                  f"{a:>26} {ms:>9.4f} {ratio:>6.2f}x  {tgt}", flush=True)
            doc["rows"].append({"name": r["name"], "anchor": a, "anchor_ms": ms, "ours_ms": r["median_ms"],
                                "ours_tflops": r["tflops"], "dense_share": r["tflops"] / dense, "ratio": ratio})
    return doc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True, help="bench_gpu --json output")
    ap.add_argument("--json", help="write the anchors here")
    args = ap.parse_args()
    ours = json.load(open(args.ours))
    rows = [r for r in ours["cases"] if r["name"].startswith("nsa_")]
    src = torch.empty(1 << 28, device="cuda", dtype=torch.float32)
    dst = torch.empty_like(src)
    copy_ms = bench(lambda: dst.copy_(src))
    ceiling = 2 * src.numel() * 4 / (copy_ms * 1e-3) / 1e9
    doc = run(rows, ceiling)
    if args.json:
        json.dump(doc, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
