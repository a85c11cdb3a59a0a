"""Cases of `conformance/spec/ops-decode.md`: `kv_cache_update`, `decode_attention` (static KV
cache).

`kv_cache_update` outputs come from torch indexing and are checked bit for bit against an
element-by-element loop. `decode_attention`: the float64 oracle is SDPA's math backend on the
`bhsd` view with the boolean mask "key j visible" (j < n, and j <= n - L_q + i when causal),

    s_j = softmax_scale * q_i . k_j,  o_i = sum_j softmax(s)_j v_j,  lse_i = log sum_j exp(s_j)

cross-checked against an explicit float64 softmax (no visible key: o = 0, lse = -inf). The
`torch-sdpa-flash` cases are what users get today: PyTorch's flash kernel in bf16 on each row's
sliced valid prefix (lower-right causal alignment), checked against the oracle. Cache positions
past each row's valid length, and unused cache rows, are NaN in every case.
"""

from __future__ import annotations

import math

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from .case import THRESHOLD, Case, gen, provenance, randn
from .registry import Ctx, case

DT = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
      "float16": torch.float16}


def to_bhsd(cache: torch.Tensor, layout: str) -> torch.Tensor:
    """`[B_cache, H_kv, S, D]` view of a cache in `layout`."""
    return cache if layout == "bhsd" else cache.transpose(1, 2)


def make_cache(g_, b_cache, s, h_kv, d, layout, dtype):
    shape = (b_cache, s, h_kv, d) if layout == "bshd" else (b_cache, h_kv, s, d)
    return randn(g_, *shape).to(DT[dtype])


def poison(cache, lens, rows, layout):
    """NaN at every position past the valid length of each used row, and in unused rows."""
    c = cache.clone()
    cv = to_bhsd(c, layout)
    used = dict(zip(rows, lens, strict=True))
    for r in range(c.shape[0]):
        n = used.get(r, 0)
        cv[r, :, n:, :] = float("nan")
    return c


# ----------------------------------------------------------------------------- kv_cache_update

def kv_update_loop(k_cache, v_cache, k, v, seqlens, rows, layout):
    """Element-by-element write (the bit-exact oracle)."""
    kc, vc = k_cache.clone(), v_cache.clone()
    kcv, vcv = to_bhsd(kc, layout), to_bhsd(vc, layout)
    for b in range(k.shape[0]):
        for i in range(k.shape[1]):
            for h in range(k.shape[2]):
                kcv[rows[b], h, seqlens[b] + i] = k[b, i, h]
                vcv[rows[b], h, seqlens[b] + i] = v[b, i, h]
    return kc, vc


def kv_update_torch(k_cache, v_cache, k, v, seqlens, rows, layout, device):
    """Vectorised torch indexing on `device` (what a gpt-fast style cache does)."""
    kc, vc = k_cache.to(device).clone(), v_cache.to(device).clone()
    l_new = k.shape[1]
    pos = torch.tensor(seqlens, device=device)[:, None] + torch.arange(l_new, device=device)
    ridx = torch.tensor(rows, device=device)[:, None].expand_as(pos)
    kd, vd = k.to(device), v.to(device)
    if layout == "bshd":
        kc[ridx, pos] = kd
        vc[ridx, pos] = vd
    else:
        kc.transpose(1, 2)[ridx, pos] = kd
        vc.transpose(1, 2)[ridx, pos] = vd
    return kc.cpu(), vc.cpu()


KV_UPDATE = [
    # name, seed, B, B_cache, S, H_kv, D, L_new, seqlens, cache_batch_idx, layout, dtype, where
    ("bshd_bf16_lnew1", 201, 3, 3, 64, 2, 64, 1, [0, 17, 63], None, "bshd", "bfloat16", "cuda"),
    ("bhsd_f32_lnew5_batch_idx", 202, 2, 4, 64, 2, 32, 5, [10, 59], [3, 1], "bhsd", "float32",
     "cuda"),
    ("bshd_f16_lnew7_batch_idx", 203, 3, 3, 32, 1, 80, 7, [0, 25, 9], [2, 0, 1], "bshd",
     "float16", "cpu"),
    ("bhsd_bf16_lnew2_gqa", 204, 2, 2, 48, 4, 16, 2, [46, 0], None, "bhsd", "bfloat16", "cpu"),
]


def kv_update_case(ctx, name, seed, b, b_cache, s, h_kv, d, l_new, seqlens, idx, layout, dtype,
                   where):
    g_ = gen(seed)
    k_cache = make_cache(g_, b_cache, s, h_kv, d, layout, dtype)
    v_cache = make_cache(g_, b_cache, s, h_kv, d, layout, dtype)
    k = randn(g_, b, l_new, h_kv, d).to(DT[dtype])
    v = randn(g_, b, l_new, h_kv, d).to(DT[dtype])
    rows = idx if idx is not None else list(range(b))
    kc, vc = kv_update_torch(k_cache, v_cache, k, v, seqlens, rows, layout, where)
    rk, rv = kv_update_loop(k_cache, v_cache, k, v, seqlens, rows, layout)
    inputs = {"k_cache": k_cache, "v_cache": v_cache, "k": k, "v": v,
              "cache_seqlens": torch.tensor(seqlens, dtype=torch.int32)}
    if idx is not None:
        inputs["cache_batch_idx"] = torch.tensor(idx, dtype=torch.int32)
    dev = ctx.device_name if where == "cuda" else "cpu"
    return Case(op="kv_cache_update", name=name, inputs=inputs,
                params={"cache_layout": layout}, outputs={"k_cache": kc, "v_cache": vc},
                oracle={"k_cache": rk, "v_cache": rv}, threshold={"k_cache": None, "v_cache": None},
                source=provenance("torch", seed, "advanced-index assignment", dev),
                description=f"torch indexing ({where}) {layout} {dtype} B={b} B_cache={b_cache} "
                            f"S={s} H_kv={h_kv} D={d} L_new={l_new} seqlens={seqlens}"
                            + (f" cache_batch_idx={idx}" if idx else ""),
                note="exact: outputs compare bit for bit")


def _register_kv(row):
    name, seed, *rest = row

    @case("kv_cache_update", name, needs_cuda=(rest[-1] == "cuda"))
    def build(ctx: Ctx):
        return kv_update_case(ctx, name, seed, *rest)


for _row in KV_UPDATE:
    _register_kv(_row)


# ----------------------------------------------------------------------------- decode_attention

def visible_mask(lens, l_q, s, causal):
    """`[B, 1, L_q, S]` boolean: key j visible to query i of row b."""
    j = torch.arange(s)[None, None, :]
    i = torch.arange(l_q)[None, :, None]
    n = torch.tensor(lens)[:, None, None]
    m = j < n
    if causal:
        m = m & (j <= n - l_q + i)
    return m[:, None]


def gathered_f64(q, k_cache, v_cache, rows, layout, h):
    """q `[B,H,L,D]`, k/v `[B,H,S,D]` in float64, KV heads repeated per query head."""
    kc = to_bhsd(k_cache, layout)[rows].double()
    vc = to_bhsd(v_cache, layout)[rows].double()
    rep = h // kc.shape[1]
    return (q.double().transpose(1, 2), kc.repeat_interleave(rep, 1),
            vc.repeat_interleave(rep, 1))


def decode_oracle(q, k_cache, v_cache, lens, rows, scale, causal, layout):
    """SDPA math backend (float64, boolean mask) and an explicit float64 softmax.

    Returns `(o_sdpa, o_explicit, lse)`; masked positions are zeroed first (NaN there would
    otherwise reach the masked scores); rows with no visible key get o = 0, lse = -inf.
    """
    b, l_q, h, d = q.shape
    qq, kk, vv = gathered_f64(q, k_cache, v_cache, rows, layout, h)
    s = kk.shape[2]
    mask = visible_mask(lens, l_q, s, causal)
    keep = (torch.arange(s)[None, :] < torch.tensor(lens)[:, None])[:, None, :, None]
    kk = torch.where(keep, kk, torch.zeros((), dtype=kk.dtype))
    vv = torch.where(keep, vv, torch.zeros((), dtype=vv.dtype))
    any_vis = mask.any(-1, keepdim=True)  # [B,1,L,1]
    with sdpa_kernel(SDPBackend.MATH):
        o = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask,
                                                             scale=scale)
    o = torch.where(any_vis, o, torch.zeros((), dtype=o.dtype))
    scores = (qq @ kk.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, -1)  # -inf where nothing is visible
    p = torch.exp(scores - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    o2 = p @ vv
    return o.transpose(1, 2).contiguous(), o2.transpose(1, 2).contiguous(), lse


def flash_prefix(q, k_cache, v_cache, lens, rows, scale, causal, layout):
    """PyTorch's flash kernel (CUDA, dtype of q) on each row's sliced valid prefix.

    Calls `aten._scaled_dot_product_flash_attention`, which returns the log-sum-exp; its
    `is_causal` is flash-attention's lower-right aligned mask (the last query sees all keys).
    """
    b, l_q, h, d = q.shape
    outs, lses = [], []
    for bi in range(b):
        n = lens[bi]
        kc = to_bhsd(k_cache, layout)[rows[bi], :, :n]
        vc = to_bhsd(v_cache, layout)[rows[bi], :, :n]
        rep = h // kc.shape[0]
        qq = q[bi].transpose(0, 1)[None].cuda()
        kk = kc.repeat_interleave(rep, 0)[None].contiguous().cuda()
        vv = vc.repeat_interleave(rep, 0)[None].contiguous().cuda()
        res = torch.ops.aten._scaled_dot_product_flash_attention(
            qq, kk, vv, 0.0, causal and l_q > 1, False, scale=scale)
        outs.append(res[0][0].transpose(0, 1).cpu())
        lses.append(res[1][0].float().cpu())
    return torch.stack(outs), torch.stack(lses)


DECODE = [
    # name, seed, impl, B, B_cache, S, H, H_kv, D, L_q, lens, cache_batch_idx, layout, dtype,
    # causal, softmax_scale
    ("oracle_lq1_gqa4_d64_bshd_mixed_n", 301, "torch-f64", 4, 4, 256, 4, 1, 64, 1,
     [0, 1, 63, 256], None, "bshd", "bfloat16", True, None),
    ("oracle_lq7_gqa8_d80_bhsd_batch_idx", 302, "torch-f64", 3, 3, 256, 8, 1, 80, 7,
     [64, 65, 3], [2, 0, 1], "bhsd", "bfloat16", True, None),
    ("oracle_lq2_f32_gqa1_d64_batch_idx", 303, "torch-f64", 2, 2, 256, 1, 1, 64, 2,
     [256, 64], [1, 0], "bshd", "float32", True, None),
    ("oracle_lq2_noncausal_gqa4_d128_bhsd_scale", 304, "torch-f64", 2, 2, 256, 4, 1, 128, 2,
     [65, 1], None, "bhsd", "bfloat16", False, 0.1),
    ("oracle_lq7_f64_gqa2_d16_n0", 305, "torch-f64", 2, 3, 256, 2, 1, 16, 7,
     [0, 130], [2, 0], "bshd", "float64", True, None),
    ("flash_bf16_lq1_gqa8_d128_bshd", 311, "torch-sdpa-flash", 2, 2, 256, 8, 1, 128, 1,
     [64, 256], None, "bshd", "bfloat16", True, None),
    ("flash_bf16_lq7_gqa4_d80_bhsd_batch_idx", 312, "torch-sdpa-flash", 2, 3, 256, 4, 1, 80, 7,
     [7, 200], [2, 0], "bhsd", "bfloat16", True, None),
    ("flash_bf16_lq2_gqa1_d64_n_mixed", 313, "torch-sdpa-flash", 3, 3, 256, 1, 1, 64, 2,
     [2, 63, 65], None, "bshd", "bfloat16", True, None),
]


def decode_case(ctx, name, seed, impl, b, b_cache, s, h, h_kv, d, l_q, lens, idx, layout,
                dtype, causal, softmax_scale):
    g_ = gen(seed)
    q = randn(g_, b, l_q, h, d).to(DT[dtype])
    rows = idx if idx is not None else list(range(b))
    k_cache = poison(make_cache(g_, b_cache, s, h_kv, d, layout, dtype), lens, rows, layout)
    v_cache = poison(make_cache(g_, b_cache, s, h_kv, d, layout, dtype), lens, rows, layout)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    o_sdpa, o_expl, lse = decode_oracle(q, k_cache, v_cache, lens, rows, scale, causal, layout)
    lse_ref = lse  # [B, H, L_q]
    cross = [("SDPA math f64 vs explicit softmax f64", o_expl, o_sdpa, 1e-12)]
    if impl == "torch-f64":
        o, lse_out = o_sdpa, lse_ref.clone()
        thr = {"o": THRESHOLD["float64"], "lse": THRESHOLD["float64"]}
        src = provenance(impl, seed, "scaled_dot_product_attention (MATH backend, float64, "
                                     "boolean mask); lse = logsumexp of the masked scores", "cpu")
    else:
        o, lse_out = flash_prefix(q, k_cache, v_cache, lens, rows, scale, causal, layout)
        thr = {"o": THRESHOLD["half"], "lse": 1e-3}
        src = provenance(impl, seed, "aten._scaled_dot_product_flash_attention on each row's "
                                     "valid prefix", ctx.device_name)
    inputs = {"q": q, "k_cache": k_cache, "v_cache": v_cache,
              "cache_seqlens": torch.tensor(lens, dtype=torch.int32)}
    if idx is not None:
        inputs["cache_batch_idx"] = torch.tensor(idx, dtype=torch.int32)
    params = {"softmax_scale": softmax_scale, "causal": causal, "cache_layout": layout}
    desc = (f"{impl} {dtype} {layout} B={b} S={s} H={h} H_kv={h_kv} D={d} L_q={l_q} n={lens}"
            + (f" cache_batch_idx={idx}" if idx else "") + ("" if causal else " non-causal")
            + (f" scale={softmax_scale}" if softmax_scale else "") + ", NaN past the prefix")
    return Case(op="decode_attention", name=name, inputs=inputs, params=params,
                outputs={"o": o, "lse": lse_out}, oracle={"o": o_expl, "lse": lse_ref},
                threshold=thr, tolerance=thr, source=src, description=desc, cross=cross)


def _register_decode(row):
    name, seed, impl, *rest = row

    @case("decode_attention", name, needs_cuda=(impl != "torch-f64"))
    def build(ctx: Ctx):
        return decode_case(ctx, name, seed, impl, *rest)


for _row in DECODE:
    _register_decode(_row)
