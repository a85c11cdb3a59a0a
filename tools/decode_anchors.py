"""Anchors of the decode benchmark (issue 12), run by bench_anchors.py in the same GPU run.

For each decode row of `bench_gpu --json` (its shape, lengths and mode):
- `sdpa_masked`: `scaled_dot_product_attention(q, k_cache, v_cache, attn_mask)` with the boolean
  mask `j < n_b` over the whole static cache `[B, H_kv, S, D]` (default backend; `enable_gqa`
  for GQA), what a static-cache decoder does today;
- `flash_slice`: SDPA flash on the sliced valid prefix `k_cache[:, :, :L]` when every row has
  the same length (the ideal today, not graph-capturable since L changes every step); with mixed
  lengths, flash varlen (`torch.ops.aten._flash_attention_forward`) on the valid keys packed
  beforehand (packing not timed);
- graph rows: `sdpa_masked` captured in a CUDA graph of 32 steps, per-step time.
FlashInfer is not run: its wheel (flashinfer-python 0.7.2, 62 MB) does not fit the 64 MiB a
device call may carry with the tree, and it JIT-compiles its kernels with nvcc at first use.
Bytes = the valid K and V only. Times: triton do_bench medians (L2 flushed) for launches.
Shares: of ours' read ceiling (`read_ceiling_gbps`, 2 GiB read once and reduced, same process as
ours) and of the copy ceiling; the anchors' own torch read ceiling (the best of `sum` and `amax`
over 2 GiB of fp32) is printed beside it.
"""
import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

GRAPH_STEPS = 32
# issue 26: name -> (min share of the read ceiling, min speedup vs flash_slice, min speedup vs
# sdpa_masked); every launch row: >= 1x sdpa_masked and >= 1x flash_slice; the graph row of
# B=1, H=8, L=128: <= 4.5 us per step.
TARGETS = {
    "decode_b16_h8_l4000": (0.88, 1.3, 1.0),
    "decode_serving_b32_h32_kv8_d128_s8192_mixed": (0.85, 1.0, 1.0),
    "decode_serving_b64_h32_kv8_d128_s32768_full": (0.92, 1.0, 1.05),
}
GRAPH_TARGET_US = {"decode_graph_b1_h8_l128": 4.5}


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def graph_ms(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            for _ in range(GRAPH_STEPS):
                fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(30):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / GRAPH_STEPS)
    times.sort()
    return times[len(times) // 2]


def inputs(row):
    b, h, h_kv, d, s = row["shape"]
    lens = row["lens"]
    q = torch.randn(b, h, 1, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, h_kv, s, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, h_kv, s, d, device="cuda", dtype=torch.bfloat16)
    n = torch.tensor(lens, device="cuda")
    mask = (torch.arange(s, device="cuda")[None, :] < n[:, None])[:, None, None, :]
    return q, k, v, lens, mask, h != h_kv


def flash_slice_fn(q, k, v, lens, gqa):
    if len(set(lens)) == 1:
        L = lens[0]
        ks, vs = k[:, :, :L], v[:, :, :L]

        def run():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, ks, vs, enable_gqa=gqa)

        return run
    # mixed lengths: flash varlen over the valid keys, packed [sum n, H_kv, D]
    b, h, _, d = q.shape
    kp = torch.cat([k[i, :, :n].transpose(0, 1) for i, n in enumerate(lens)]).contiguous()
    vp = torch.cat([v[i, :, :n].transpose(0, 1) for i, n in enumerate(lens)]).contiguous()
    qp = q.transpose(1, 2).reshape(b, h, d).contiguous()
    cu_q = torch.arange(b + 1, device="cuda", dtype=torch.int32)
    cu_k = torch.zeros(b + 1, device="cuda", dtype=torch.int32)
    cu_k[1:] = torch.cumsum(torch.tensor(lens, device="cuda"), 0)
    mk = max(lens)
    return lambda: torch.ops.aten._flash_attention_forward(qp, kp, vp, cu_q, cu_k, 1, mk, 0.0, False, False)


def torch_read_ceiling():
    """GB/s of the best of torch.sum and torch.amax over 2 GiB of fp32 (read once)."""
    x = torch.empty(1 << 29, device="cuda", dtype=torch.float32)
    x.fill_(1.0)
    ms = min(bench(lambda: torch.sum(x)), bench(lambda: torch.amax(x)))
    del x
    torch.cuda.empty_cache()
    return (1 << 31) / (ms * 1e-3) / 1e9


def run(ours_rows, ceiling, read_ceiling=None):
    """Times the anchors of every decode row of `ours_rows`; returns {name: {...}} and prints."""
    out = {}
    torch_read = torch_read_ceiling()
    print(f"  torch read ceiling {torch_read:.0f} GB/s (ours: {read_ceiling or 0:.0f} GB/s)")
    for row in ours_rows:
        name, mode = row["name"], row.get("mode")
        if not name.startswith("decode_"):
            continue
        res = {"bytes": row["bytes"]}
        try:
            q, k, v, lens, mask, gqa = inputs(row)
            masked = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
            if mode == "Launch":
                res["sdpa_masked_ms"] = bench(masked)
                try:
                    res["flash_slice_ms"] = bench(flash_slice_fn(q, k, v, lens, gqa))
                except Exception as e:  # reported, not fatal
                    res["flash_slice_error"] = repr(e)[:200]
            else:
                res["sdpa_masked_graph_ms"] = graph_ms(masked)
            del q, k, v, mask
        except Exception as e:
            res["error"] = repr(e)[:300]
        torch.cuda.empty_cache()
        out[name] = res
        print(f"  {name:<50} " + " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items()))
    report(ours_rows, out, ceiling, torch_read)
    out["torch_read_ceiling_gbps"] = torch_read
    return out


def report(ours_rows, anchors, ceiling, torch_read):
    print()
    print(f"decode (bytes = valid K and V; anchors' copy ceiling {ceiling:.0f} GB/s, torch read ceiling {torch_read:.0f} GB/s;"
          " %read / %copy: ours against the read / copy ceilings of its own process)")
    hdr = f"{'case':<46} {'ours us':>9} {'%read':>6} {'%copy':>6} {'masked us':>10} {'x':>6} {'flash us':>9} {'x':>6}  target"
    print(hdr)
    print("-" * len(hdr))
    for row in ours_rows:
        name = row["name"]
        if name not in anchors:
            continue
        a = anchors[name]
        us = row["median_ms"] * 1e3
        rd = 100 * row.get("read_share", 0.0)
        ok, tgt = True, ""
        if row.get("mode") == "Launch":
            m = a.get("sdpa_masked_ms")
            f = a.get("flash_slice_ms")
            sm = m / row["median_ms"] if m else None
            sf = f / row["median_ms"] if f else None
            share_t, flash_t, masked_t = TARGETS.get(name, (None, 1.0, 1.0))
            tgt = f">={masked_t}x masked, >={flash_t}x flash"
            ok &= sm is not None and sm >= masked_t
            ok &= sf is None or sf >= flash_t
            if share_t:
                tgt += f", >={100 * share_t:.0f}% read"
                ok &= row.get("read_share", 0.0) >= share_t
            ms = f"{m * 1e3:10.1f}" if m else f"{'n/a':>10}"
            fs = f"{f * 1e3:9.1f}" if f else f"{'n/a':>9}"
            print(f"{name:<46} {us:9.1f} {rd:5.1f}% {100 * row['share']:5.1f}% {ms} {sm or 0:5.2f}x {fs} {sf or 0:5.2f}x  {tgt} {'ok' if ok else 'MISS'}")
        else:
            m = a.get("sdpa_masked_graph_ms")
            t = GRAPH_TARGET_US.get(name)
            if t:
                tgt = f"<= {t} us/step"
                ok = us <= t
            ms = f"{m * 1e3:10.2f}" if m else f"{'n/a':>10}"
            sm = m / row["median_ms"] if m else 0
            print(f"{name:<46} {us:9.2f} {rd:5.1f}% {100 * row['share']:5.1f}% {ms} {sm:5.2f}x {'graph':>9} {'':>6}  {tgt} {'ok' if ok else ('MISS' if t else '')}")
