"""Cases of `conformance/spec/ops-nsa.md` §10: the six native-sparse-attention ops.

`fla-triton` / `fla-naive` cases run FLA 0.6.0 (`mean_pooling`, `parallel_nsa_compression`,
`naive_nsa_compression`, `parallel_nsa_topk`, `naive_nsa_topk`, `parallel_nsa_fwd`,
`naive_nsa_selection`, `parallel_nsa`, `naive_nsa`); `mslk-formula-torch` cases are the float64
transcription `nsa_math.py` rounded once to the case dtype. Every case is checked against that
transcription (its float64 oracle) before it is written; selections must equal it as sets, and
margin-checked cases (§10) retry seeds until every row's gap is at least 1e-3.

Shapes are the §10 table's, scaled down (T halved or K = 16 / 8 where the table has 32 / 16) to
keep the NSA set under the issue's 4 MB; each case's description gives its shape.

Upstream behaviour the generator works around (written in each case's `note`):
- `naive_nsa_topk` with `cu_seqlens` and a `block_counts` tensor asserts
  `block_counts.shape == (1, L_n, H)` for every sequence (FLA 0.6.0 bug for N > 1): the varlen
  case calls it once per sequence on that sequence's slices;
- `parallel_nsa_topk` returns `S' = next_power_of_two(S)` slots and ignores per-token counts:
  the first `S` slots are kept and slots `>= n_sel` set to `-1` (§4.1);
- `flash-attn` is absent on the device machine: the window branch of `naive_nsa` /
  `parallel_nsa` is a PyTorch stand-in of `flash_attn_func` / `flash_attn_varlen_func` (causal,
  keys `t - left .. t`, default `softmax_scale = K ** -0.5`, fp32 softmax, output in the input
  dtype); `source.swa = "torch-standin"`.
"""

from __future__ import annotations

import torch

from . import nsa_math as M
from .case import THRESHOLD, Case, RefusedCase, gen, provenance
from .registry import Ctx, case

DT = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
TRIES = 200
MARGIN = 1e-3


def thr(dtype: str) -> float:
    return {"float64": THRESHOLD["float64"], "float32": THRESHOLD["float32"]}.get(dtype,
                                                                              THRESHOLD["half"])


def uni(g, shape, lo=-5.0, hi=5.0):
    return torch.rand(*shape, generator=g, dtype=torch.float64) * (hi - lo) + lo


def nrm(g, shape, std=1.0):
    return torch.randn(*shape, generator=g, dtype=torch.float64) * std


def cu_t(cu, device, dtype=torch.int32):
    return None if cu is None else torch.tensor(cu, dtype=dtype, device=device)


def on(ctx: Ctx, x):
    return x.to(ctx.device)


def f32(x):
    return x.detach().to("cpu", torch.float32)


def host(x):
    return x.detach().to("cpu")


def counts_tensor(g, b, t, h, lo, hi):
    return torch.randint(lo, hi + 1, (b, t, h), generator=g, dtype=torch.int64)


def note_join(*parts):
    return " ".join(p for p in parts if p) or None


# ------------------------------------------------------------------- window stand-in (§10)

def _swa(q, k, v, left):
    """Causal window of keys `t - left .. t` for one sequence `[T, H, D]`; default scale."""
    t, hq, kd = q.shape
    g = hq // k.shape[1]
    kk = k.repeat_interleave(g, dim=1).float()
    vv = v.repeat_interleave(g, dim=1).float()
    z = torch.einsum("thd,shd->hts", q.float(), kk) * kd ** -0.5
    i = torch.arange(t, device=q.device)
    allow = (i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - left)
    p = torch.softmax(z.masked_fill(~allow, float("-inf")), dim=-1)
    return torch.einsum("hts,shd->thd", p, vv).to(q.dtype)


def swa_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
             **_):
    assert causal and softmax_scale is None and window_size[1] == 0
    return torch.stack([_swa(q[b], k[b], v[b], window_size[0]) for b in range(q.shape[0])])


def swa_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                    dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), **_):
    assert causal and softmax_scale is None and window_size[1] == 0
    cu = cu_seqlens_q.tolist()
    return torch.cat([_swa(q[a:e], k[a:e], v[a:e], window_size[0])
                      for a, e in zip(cu[:-1], cu[1:])])


def patch_swa() -> dict:
    """Installs the stand-in where flash-attn is missing; returns the `source` extras."""
    import fla.ops.nsa.naive as naive
    import fla.ops.nsa.parallel as parallel
    try:
        import flash_attn  # noqa: F401
        return {}
    except ImportError:
        for m in (naive, parallel):
            m.flash_attn_func = swa_func
            m.flash_attn_varlen_func = swa_varlen_func
        return {"swa": "torch-standin"}


# -------------------------------------------------------------------------- nsa_compress_kv

def compress_case(ctx, name, seed, impl, dtype, shape, bs, partial="mean_of_valid", cu=None,
                  with_v=True, wk=False, wv=False, vdim=None, desc=""):
    g = gen(seed)
    b, t, h, kd = shape
    dt = DT[dtype]
    k = nrm(g, shape).to(dt)
    v = nrm(g, (b, t, h, vdim or kd)).to(dt) if with_v else None
    w_k = (nrm(g, (h, kd, kd)) / kd ** 0.5).to(dt) if wk else None
    w_v = (nrm(g, (h, v.shape[3], v.shape[3])) / v.shape[3] ** 0.5).to(dt) if wv else None
    oracle = {"k_cmp": M.compress_kv(k, bs, partial, cu, w_k)}
    if v is not None:
        oracle["v_cmp"] = M.compress_kv(v, bs, partial, cu, w_v)
    if impl == "fla-triton":
        from fla.ops.utils.pooling import mean_pooling
        with torch.no_grad():
            outs = {"k_cmp": host(mean_pooling(on(ctx, k), bs, cu_t(cu, ctx.device)))}
            if v is not None:
                outs["v_cmp"] = host(mean_pooling(on(ctx, v), bs, cu_t(cu, ctx.device)))
        src = provenance(impl, seed, "fla.ops.utils.pooling.mean_pooling (k, then v)",
                         ctx.device_name)
    else:
        outs = {n: x.to(dt) for n, x in oracle.items()}
        src = provenance(impl, seed, "tools/fixturegen/nsa_math.py compress_kv (float64, "
                                     "rounded once)", "cpu")
    inputs = {"k": k}
    for n, x in (("v", v), ("w_k", w_k), ("w_v", w_v)):
        if x is not None:
            inputs[n] = x
    if cu is not None:
        inputs["cu_seqlens"] = torch.tensor(cu, dtype=torch.int32)
    params = {"block_size": bs}
    if partial != "mean_of_valid":
        params["partial_block"] = partial
    return Case(op="nsa_compress_kv", name=name, inputs=inputs, params=params, outputs=outs,
                oracle=oracle, threshold={n: thr(dtype) for n in outs}, source=src,
                description=f"{impl} {dtype} k {list(shape)} BS {bs} {partial}: {desc}")


COMPRESS = [
    ("fla_f32_partial", 1, "fla-triton", "float32", (2, 100, 2, 16), 32, {},
     "partial tail of 4 divided by 4"),
    ("fla_bf16_T1000", 2, "fla-triton", "bfloat16", (1, 1000, 2, 16), 64, {},
     "tail of 40 divided by 40"),
    ("fla_f32_short", 3, "fla-triton", "float32", (1, 20, 2, 16), 32, {},
     "L < BS: one block of 20"),
    ("fla_f32_varlen", 4, "fla-triton", "float32", (1, 200, 2, 16), 32,
     {"cu": [0, 15, 15, 80, 200]}, "varlen with a zero-length and a short sequence"),
    ("fla_f32_k_only", 5, "fla-triton", "float32", (2, 64, 2, 24), 16, {"with_v": False},
     "k only, L % BS == 0"),
    ("mslk_drop_f32", 6, "mslk-formula-torch", "float32", (2, 100, 2, 16), 32,
     {"partial": "drop"}, "tail dropped"),
    ("mslk_drop_proj_bf16", 7, "mslk-formula-torch", "bfloat16", (1, 128, 2, 64), 64,
     {"partial": "drop", "wk": True, "wv": True}, "projections w_k and w_v"),
    ("mslk_drop_wk_only_f64", 8, "mslk-formula-torch", "float64", (1, 128, 2, 16), 32,
     {"partial": "drop", "wk": True}, "w_k only"),
    ("mslk_drop_varlen_f32", 9, "mslk-formula-torch", "float32", (1, 164, 2, 16), 32,
     {"partial": "drop", "cu": [0, 15, 100, 164]}, "varlen drop, a sequence shorter than BS"),
    ("mean_of_valid_f64", 10, "mslk-formula-torch", "float64", (1, 100, 2, 16), 32, {},
     "exact float64 oracle of mean_of_valid"),
]


def _register_compress(row):
    name, seed, impl, dtype, shape, bs, kw, desc = row

    @case("nsa_compress_kv", name, needs_cuda=impl.startswith("fla"))
    def build(ctx: Ctx):
        return compress_case(ctx, name, seed, impl, dtype, shape, bs, desc=desc, **kw)


for _r in COMPRESS:
    _register_compress(_r)


# ---------------------------------------------------------------- nsa_compression_attention

def cmp_attn_case(ctx, name, seed, impl, dtype, qshape, h, bs, vdim=None, cu=None, scale=None,
                  visibility="complete", partial="mean_of_valid", empty_lse="-inf", desc=""):
    g = gen(seed)
    b, t, hq, kd = qshape
    dt = DT[dtype]
    _, tc, _, rows = M.layout(b, t, cu, bs, partial)
    ob = 1 if cu is not None else b
    q = nrm(g, qshape).to(dt)
    kc = nrm(g, (ob, rows, h, kd)).to(dt)
    vc = nrm(g, (ob, rows, h, vdim or kd)).to(dt)
    sc = kd ** -0.5 if scale is None else scale
    o_ref, lse_ref = M.compression_attention(q, kc, vc, bs, sc, visibility, partial, cu, empty_lse)
    if impl == "fla-naive":
        from fla.ops.nsa.naive import naive_nsa_compression
        with torch.no_grad():
            o, lse = naive_nsa_compression(on(ctx, q), on(ctx, kc), on(ctx, vc), bs, sc,
                                           cu_t(cu, ctx.device))
        fn = "fla.ops.nsa.naive.naive_nsa_compression"
    elif impl == "fla-triton":
        from fla.ops.nsa.compression import parallel_nsa_compression
        with torch.no_grad():
            o, lse = parallel_nsa_compression(on(ctx, q), on(ctx, kc), on(ctx, vc), t, bs, sc,
                                              cu_t(cu, ctx.device))
        fn = "fla.ops.nsa.compression.parallel_nsa_compression (TK = T)"
    else:
        o, lse = o_ref.to(dt), lse_ref
        fn = "tools/fixturegen/nsa_math.py compression_attention (float64)"
    outs = {"o": host(o), "lse": f32(lse)}
    inputs = {"q": q, "k_cmp": kc, "v_cmp": vc}
    if cu is not None:
        inputs["cu_seqlens"] = torch.tensor(cu, dtype=torch.int32)
    params = {"block_size": bs, "scale": scale}
    for key, val, default in (("visibility", visibility, "complete"),
                              ("partial_block", partial, "mean_of_valid"),
                              ("empty_lse", empty_lse, "-inf")):
        if val != default:
            params[key] = val
    return Case(op="nsa_compression_attention", name=name, inputs=inputs, params=params,
                outputs=outs, oracle={"o": o_ref, "lse": lse_ref},
                threshold={"o": thr(dtype), "lse": thr(dtype)},
                source=provenance(impl, seed, fn, ctx.device_name if impl.startswith("fla")
                                  else "cpu"),
                description=f"{impl} {dtype} q {list(qshape)} H {h} BS {bs} {visibility}: {desc}")


CMP_ATTN = [
    ("naive_f32_g1", 11, "fla-naive", "float32", (2, 100, 2, 16), 2, 16,
     {"scale": 0.1}, "G = 1, first 15 rows of each sequence empty"),
    ("naive_f32_g4_varlen", 12, "fla-naive", "float32", (1, 200, 4, 16), 1, 16,
     {"vdim": 24, "cu": [0, 15, 100, 180, 200]}, "G = 4, K != V, varlen with a short sequence"),
    ("triton_f32_g16", 13, "fla-triton", "float32", (1, 64, 16, 16), 1, 16,
     {"empty_lse": "zero"}, "G = 16, Triton lse 0 on empty rows"),
    ("triton_bf16_g16_varlen", 14, "fla-triton", "bfloat16", (1, 128, 16, 16), 1, 32,
     {"cu": [0, 7, 60, 128], "empty_lse": "zero"}, "bf16 varlen, a sequence shorter than BS"),
    ("mslk_started_f32", 15, "mslk-formula-torch", "float32", (1, 128, 4, 16), 2, 32,
     {"partial": "drop", "visibility": "started"}, "MSLK causal: blocks visible once started"),
    ("mslk_all_f32", 16, "mslk-formula-torch", "float32", (1, 128, 4, 16), 2, 32,
     {"partial": "drop", "visibility": "all"}, "MSLK non-causal"),
]


def _register_cmp_attn(row):
    name, seed, impl, dtype, qshape, h, bs, kw, desc = row

    @case("nsa_compression_attention", name, needs_cuda=impl.startswith("fla"))
    def build(ctx: Ctx):
        return cmp_attn_case(ctx, name, seed, impl, dtype, qshape, h, bs, desc=desc, **kw)


for _r in CMP_ATTN:
    _register_cmp_attn(_r)


# ------------------------------------------------------------------------ nsa_select_blocks

def triton_rows(idx, s, counts):
    """§4.1 mapping of `parallel_nsa_topk`'s `[B, T, H, S']`: keep `S` slots, `-1` past the
    row's quota."""
    idx = host(idx).to(torch.int64)[..., :s].clone()
    if not isinstance(counts, int):
        slot = torch.arange(s)
        idx[slot.view(1, 1, 1, s) >= counts.unsqueeze(-1)] = -1
    return idx


def select_fla_upstream(ctx, impl, q, kc, counts, bs, scale, cu, t):
    if impl == "fla-naive":
        from fla.ops.nsa.naive import naive_nsa_topk
        if cu is None or isinstance(counts, int):
            with torch.no_grad():
                return host(naive_nsa_topk(q, kc, counts, bs, scale, cu_t(cu, "cpu"))), ""
        # FLA 0.6.0 bug: varlen + tensor counts asserts the shape per sequence; one call each
        _, tc, base, _ = M.layout(1, t, cu, bs, "mean_of_valid")
        s = int(counts.max())
        parts = []
        for n in range(len(cu) - 1):
            a, e = cu[n], cu[n + 1]
            with torch.no_grad():
                r = naive_nsa_topk(q[:, a:e], kc[:, base[n]:base[n] + tc[n]], counts[:, a:e], bs,
                                   scale, None)
            parts.append(torch.nn.functional.pad(r, (0, s - r.shape[-1]), value=-1))
        return torch.cat(parts, 1), ("naive_nsa_topk called once per sequence (FLA 0.6.0 "
                                     "asserts block_counts.shape == (1, L_n, H) with cu_seqlens)")
    from fla.ops.nsa.parallel import parallel_nsa_topk
    s = counts if isinstance(counts, int) else int(counts.max())
    bc = counts if isinstance(counts, int) else on(ctx, counts)
    with torch.no_grad():
        raw = parallel_nsa_topk(on(ctx, q), on(ctx, kc), t, None, bc, bs, scale,
                                cu_t(cu, ctx.device))
    return triton_rows(raw, s, counts), ("parallel_nsa_topk's S' slots mapped to S, slots past "
                                         "n_sel set to -1 (spec 4.1)")


def select_case(ctx, name, seed, impl, dtype, qshape, h, bs, mode="fla", s=16, counts=None,
                cu=None, scale=None, qt=256, causal=True, margin=True, desc=""):
    b, t, hq, kd = qshape
    dt = DT[dtype]
    sc = kd ** -0.5 if scale is None else scale
    used, why = None, ""
    for attempt in range(TRIES if margin else 1):
        g = gen(seed + attempt)
        q = uni(g, qshape).to(dt)
        k = uni(g, (b, t, h, kd))
        partial = "mean_of_valid" if mode == "fla" else "drop"
        kc = M.compress_kv(k, bs, partial, cu).to(dt)
        cnt = counts_tensor(g, b, t, h, *counts) if counts else s
        if mode == "fla":
            ref, scores = M.select_fla(q, kc, cnt, bs, sc, cu)
            gap = M.fla_margin(ref, scores, cnt)
        else:
            ref, scores = M.select_tile(q, kc, s, bs, sc, qt, causal, cu)
            gap = M.tile_margin(ref, scores)
        if margin and gap < MARGIN:
            continue
        if impl.startswith("fla"):
            up, why = select_fla_upstream(ctx, impl, q, kc, cnt, bs, sc, cu, t)
            if not M.same_sets(up, ref):
                if margin:
                    continue
                raise RefusedCase(f"nsa_select_blocks/{name}: upstream selection differs")
            out = up.to(torch.int32)
        else:
            out = ref.to(torch.int32)
        used = seed + attempt
        break
    if used is None:
        raise RefusedCase(f"nsa_select_blocks/{name}: no seed in {seed}..{seed + TRIES - 1} "
                          f"passes the margin check")
    inputs = {"q": q, "k_cmp": kc}
    params = {"block_size": bs, "scale": scale}
    if mode != "fla":
        params.update({"mode": mode, "q_tile_size": qt, "block_counts": s})
        if not causal:
            params["causal"] = False
    elif counts:
        inputs["block_counts"] = cnt.to(torch.int32)
    else:
        params["block_counts"] = s
    if cu is not None:
        inputs["cu_seqlens"] = torch.tensor(cu, dtype=torch.int32)
    fn = {"fla-naive": "fla.ops.nsa.naive.naive_nsa_topk (on the CPU, in the input dtype)",
          "fla-triton": "fla.ops.nsa.parallel.parallel_nsa_topk (lse = None)"}.get(
        impl, "tools/fixturegen/nsa_math.py select_tile (float64)")
    dev = ctx.device_name if impl == "fla-triton" else "cpu"
    src = provenance(impl, used, fn, dev, margin=MARGIN if margin else None)
    note = note_join(why, f"rows equal the float64 selection as sets; margin {MARGIN:g} "
                          f"(seed {used})" if margin else "")
    return Case(op="nsa_select_blocks", name=name, inputs=inputs, params=params,
                outputs={"block_indices": out}, oracle={"block_indices": out},
                threshold={"block_indices": None}, source=src, note=note,
                description=f"{impl} {dtype} {mode} q {list(qshape)} H {h} BS {bs}: {desc}")


SELECT = [
    ("naive_f64_g2_S6", 21, "fla-naive", "float64", (1, 128, 4, 8), 2, 16,
     {"s": 6, "scale": 0.1}, "G = 2, S = 6 (not a power of two)"),
    ("naive_f64_varlen_counts", 22, "fla-naive", "float64", (1, 150, 4, 8), 2, 16,
     {"counts": (3, 8), "cu": [0, 15, 75, 150]}, "per-token quotas 3..=8, varlen"),
    ("naive_f64_g1_short", 23, "fla-naive", "float64", (1, 40, 1, 8), 1, 16,
     {"s": 4, "margin": False}, "G = 1, every row below the cut (all candidates, then -1)"),
    ("triton_f32_g16_S4", 24, "fla-triton", "float32", (1, 96, 16, 16), 1, 16, {"s": 4},
     "G = 16, Triton sums instead of averaging"),
    ("triton_f32_g16_varlen_counts", 25, "fla-triton", "float32", (1, 96, 16, 16), 1, 16,
     {"counts": (3, 8), "cu": [0, 40, 96]}, "per-token quotas 3..=8, varlen"),
    ("mslk_causal_f64", 26, "mslk-formula-torch", "float64", (1, 256, 4, 8), 2, 16,
     {"mode": "mslk_tile_mean", "qt": 64, "s": 6}, "tile 0 duplicates block 0"),
    ("mslk_noncausal_f64", 27, "mslk-formula-torch", "float64", (1, 256, 4, 8), 2, 16,
     {"mode": "mslk_tile_mean", "qt": 64, "s": 6, "causal": False}, "non-causal"),
    ("mslk_varlen_f64", 28, "mslk-formula-torch", "float64", (1, 256, 4, 8), 2, 16,
     {"mode": "mslk_tile_mean", "qt": 64, "s": 10, "cu": [0, 64, 256]},
     "sequence 0 has 4 blocks < S_m = 10 (phantom entries)"),
    ("mslk_qt_lt_bs_f64", 29, "mslk-formula-torch", "float64", (1, 320, 2, 8), 1, 128,
     {"mode": "mslk_tile_mean", "qt": 64, "s": 1}, "qt < BS, tail of 64 dropped"),
]


def _register_select(row):
    name, seed, impl, dtype, qshape, h, bs, kw, desc = row

    @case("nsa_select_blocks", name, needs_cuda=(impl == "fla-triton"))
    def build(ctx: Ctx):
        return select_case(ctx, name, seed, impl, dtype, qshape, h, bs, desc=desc, **kw)


for _r in SELECT:
    _register_select(_r)


# ------------------------------------------------------------------ nsa_selection_attention

def random_indices(g, b, t, h, s, bs, cu, dup=False):
    """Random permutations of past blocks (slot 0 always valid), padded with -1 and T."""
    idx = torch.full((b, t, h, s), -1, dtype=torch.int64)
    for bb, bos, eos in M.seqs(b, t, cu):
        for tt in range(bos, eos):
            past = (tt - bos) // bs + 1
            for hh in range(h):
                perm = torch.randperm(past, generator=g)[:s]
                idx[bb, tt, hh, :len(perm)] = perm
                for sl in range(1, s):
                    r = int(torch.randint(0, 6, (1,), generator=g))
                    if r == 0:
                        idx[bb, tt, hh, sl] = t  # out of range
                    elif r == 1 and dup:
                        idx[bb, tt, hh, sl] = idx[bb, tt, hh, 0]  # counted twice
    return idx


def sel_attn_case(ctx, name, seed, impl, dtype, qshape, h, bs, s, vdim=None, cu=None,
                  counts=None, dup=False, desc=""):
    g = gen(seed)
    b, t, hq, kd = qshape
    dt = DT[dtype]
    q = nrm(g, qshape).to(dt)
    k = nrm(g, (b, t, h, kd)).to(dt)
    v = nrm(g, (b, t, h, vdim or kd)).to(dt)
    idx = random_indices(g, b, t, h, s, bs, cu, dup)
    cnt = counts_tensor(g, b, t, h, *counts) if counts else None
    sc = kd ** -0.5
    o_ref, lse_ref = M.selection_attention(q, k, v, idx, bs, sc, cu, cnt)
    if impl == "fla-naive":
        from fla.ops.nsa.naive import naive_nsa_selection
        with torch.no_grad():
            o = naive_nsa_selection(on(ctx, q), on(ctx, k), on(ctx, v), on(ctx, idx), bs, sc,
                                    cu_t(cu, ctx.device))
        outs, oracle = {"o": host(o)}, {"o": o_ref}
        fn = "fla.ops.nsa.naive.naive_nsa_selection"
    else:
        from fla.ops.nsa.parallel import parallel_nsa_fwd
        from fla.ops.utils import prepare_token_indices
        cuq = cu_t(cu, ctx.device)
        tok = prepare_token_indices(cuq) if cu is not None else None
        bc = on(ctx, cnt.to(torch.int32)) if cnt is not None else s
        with torch.no_grad():
            o, lse = parallel_nsa_fwd(on(ctx, q), on(ctx, k), on(ctx, v),
                                      on(ctx, idx.to(torch.int32)), bc, bs, sc, cuq, cuq, tok)
        outs, oracle = {"o": host(o), "lse": f32(lse)}, {"o": o_ref, "lse": lse_ref}
        fn = "fla.ops.nsa.parallel.parallel_nsa_fwd"
    inputs = {"q": q, "k": k, "v": v,
              "block_indices": idx if impl == "fla-naive" else idx.to(torch.int32)}
    if cnt is not None:
        inputs["block_counts"] = cnt.to(torch.int32)
    if cu is not None:
        inputs["cu_seqlens"] = torch.tensor(cu, dtype=torch.int32)
    return Case(op="nsa_selection_attention", name=name, inputs=inputs,
                params={"block_size": bs, "scale": None}, outputs=outs, oracle=oracle,
                threshold={n: thr(dtype) for n in outs},
                source=provenance(impl, seed, fn, ctx.device_name),
                description=f"{impl} {dtype} q {list(qshape)} H {h} BS {bs} S {s}: {desc}")


SEL_ATTN = [
    ("naive_f32_g1_random", 31, "fla-naive", "float32", (1, 128, 2, 16), 2, 16, 4, {},
     "random past blocks padded with -1 and T"),
    ("naive_f32_g4_varlen", 32, "fla-naive", "float32", (1, 200, 4, 16), 1, 16, 5,
     {"vdim": 24, "cu": [0, 37, 128, 200]}, "G = 4, K != V, varlen, partial blocks"),
    ("naive_f32_duplicates", 33, "fla-naive", "float32", (1, 96, 2, 16), 1, 16, 3,
     {"dup": True}, "repeated blocks counted twice"),
    ("triton_f32_g16_counts", 34, "fla-triton", "float32", (1, 64, 16, 16), 1, 16, 4,
     {"counts": (1, 4)}, "per-token quotas 1..=4"),
    ("triton_bf16_g16_varlen", 35, "fla-triton", "bfloat16", (1, 128, 16, 16), 1, 32, 4,
     {"cu": [0, 15, 60, 128]}, "bf16 varlen"),
]


def _register_sel_attn(row):
    name, seed, impl, dtype, qshape, h, bs, s, kw, desc = row

    @case("nsa_selection_attention", name, needs_cuda=True)
    def build(ctx: Ctx):
        return sel_attn_case(ctx, name, seed, impl, dtype, qshape, h, bs, s, desc=desc, **kw)


for _r in SEL_ATTN:
    _register_sel_attn(_r)


# ------------------------------------------------------------------------- nsa_gate_combine

def gate_case(ctx, name, seed, dtype, shape, form, wscale=1.0, desc=""):
    g = gen(seed)
    b, t, hq, d = shape
    dt = DT[dtype]
    o3 = [nrm(g, shape).to(dt) for _ in range(3)]
    inputs = {"o_cmp": o3[0], "o_slc": o3[1], "o_swa": o3[2]}
    q = w = gg = None
    if form == "w":
        q = nrm(g, shape).to(dt)
        w = (nrm(g, (hq, 3, d)) * wscale / d ** 0.5).to(dt)
        inputs.update({"q": q, "gate_proj_weight": w})
    elif form == "g":
        gg = [uni(g, (b, t, hq), 0.0, 1.0).to(dt) for _ in range(3)]
        inputs.update({"g_cmp": gg[0], "g_slc": gg[1], "g_swa": gg[2]})
    o, gates = M.gate_combine(*o3, q=q, weight=w, g=gg)
    if form == "w" and wscale > 1:
        logits = torch.einsum("bthd,hcd->bthc", q.double(), w.double())
        if not bool((logits.abs() > 100).any()):
            raise RefusedCase(f"nsa_gate_combine/{name}: no saturated logit")
    return Case(op="nsa_gate_combine", name=name, inputs=inputs, params={},
                outputs={"o": o.to(dt), "gates": gates.to(torch.float32)},
                oracle={"o": o, "gates": gates},
                threshold={"o": thr(dtype), "gates": THRESHOLD["float32"]},
                source=provenance("mslk-formula-torch", seed, "tools/fixturegen/nsa_math.py "
                                  "gate_combine (float64, rounded once)", "cpu"),
                description=f"mslk-formula-torch {dtype} {form.upper()} form {list(shape)}: {desc}")


GATES = [
    ("w_form_bf16", 41, "bfloat16", (1, 64, 4, 32), "w", {}, "sigmoid(q W), W [4, 3, 32]"),
    ("w_form_f64_saturated", 42, "float64", (1, 32, 2, 16), "w", {"wscale": 60.0},
     "W scaled so that some |logit| > 100"),
    ("g_form_f32", 43, "float32", (1, 64, 4, 32), "g", {}, "given gates U(0, 1)"),
    ("ungated_bf16", 44, "bfloat16", (1, 64, 4, 32), "u", {}, "1/3 each, one rounding"),
]


def _register_gate(row):
    name, seed, dtype, shape, form, kw, desc = row

    @case("nsa_gate_combine", name)
    def build(ctx: Ctx):
        return gate_case(ctx, name, seed, dtype, shape, form, desc=desc, **kw)


for _r in GATES:
    _register_gate(_r)


# ---------------------------------------------------------------------------------- nsa_fwd

def fwd_case(ctx, name, seed, impl, dtype, qshape, bs, s, window=0, gates="cs", cu=None,
             counts=None, scale=None, given=False, margin=True, desc=""):
    b, t, hq, kd = qshape
    h = 1
    dt = DT[dtype]
    sc = kd ** -0.5 if scale is None else scale
    extra = patch_swa() if window > 0 else {}
    used, why = None, ""
    for attempt in range(TRIES if margin else 1):
        g = gen(seed + attempt)
        q = uni(g, qshape).to(dt)
        k = uni(g, (b, t, h, kd)).to(dt)
        v = nrm(g, (b, t, h, kd)).to(dt)
        gs = {n: uni(g, (b, t, hq), 0.0, 1.0).to(dt) if c in gates else None
              for n, c in (("g_cmp", "c"), ("g_slc", "s"), ("g_swa", "w"))}
        cnt = counts_tensor(g, b, t, h, *counts) if counts else s
        kc = M.compress_kv(k, bs, "mean_of_valid", cu)
        ref_idx, scores = M.select_fla(q, kc, cnt, bs, sc, cu)
        if margin and M.fla_margin(ref_idx, scores, cnt) < MARGIN:
            continue
        used = seed + attempt
        break
    if used is None:
        raise RefusedCase(f"nsa_fwd/{name}: no seed passes the margin check")
    bi_in = ref_idx if given else None
    o_ref, _, _ = M.fwd(q, k, v, gs["g_cmp"], gs["g_slc"], gs["g_swa"], bi_in, cnt, bs, window,
                        sc, cu)
    dev = {n: (on(ctx, x) if x is not None else None) for n, x in gs.items()}
    bc = on(ctx, cnt) if counts else s
    cuq = cu_t(cu, ctx.device)
    out_idx = None
    with torch.no_grad():
        if impl == "fla-naive":
            from fla.ops.nsa.naive import naive_nsa
            o, up = naive_nsa(on(ctx, q), on(ctx, k), on(ctx, v), dev["g_cmp"], dev["g_slc"],
                              dev["g_swa"], on(ctx, bi_in) if given else None, bc, bs, window,
                              sc, cuq, return_block_indices=True)
            if not given:
                out_idx = host(up)
            fn = "fla.ops.nsa.naive.naive_nsa (return_block_indices)"
        else:
            from fla.ops.nsa.parallel import parallel_nsa
            o = parallel_nsa(on(ctx, q), on(ctx, k), on(ctx, v), dev["g_cmp"], dev["g_slc"],
                             dev["g_swa"], on(ctx, bi_in.to(torch.int32)) if given else None, bc,
                             bs, window, sc, cuq)
            fn = "fla.ops.nsa.parallel.parallel_nsa"
            if not given and gs["g_cmp"] is not None:
                # the selection parallel_nsa made inside: same kernels on the same inputs
                from fla.ops.nsa.compression import parallel_nsa_compression
                from fla.ops.nsa.parallel import parallel_nsa_topk
                from fla.ops.utils.pooling import mean_pooling
                kcd = mean_pooling(on(ctx, k), bs, cuq)
                vcd = mean_pooling(on(ctx, v), bs, cuq)
                _, lse_c = parallel_nsa_compression(on(ctx, q), kcd, vcd, t, bs, sc, cuq)
                raw = parallel_nsa_topk(on(ctx, q), kcd, t, lse_c, bc, bs, sc, cuq)
                out_idx = triton_rows(raw, s if not counts else int(cnt.max()),
                                      cnt if counts else s)
                why = ("out.block_indices: parallel_nsa_topk rerun on parallel_nsa's own k_cmp "
                       "and lse, S' slots mapped to S (spec 4.1)")
                fn += " + parallel_nsa_topk"
    outs = {"o": host(o)}
    if out_idx is not None:
        if not M.same_sets(out_idx.to(torch.int64), ref_idx):
            raise RefusedCase(f"nsa_fwd/{name}: upstream selection differs from the float64 one")
        outs["block_indices"] = out_idx.to(torch.int32)
    inputs = {"q": q, "k": k, "v": v}
    inputs.update({n: x for n, x in gs.items() if x is not None})
    if given:
        inputs["block_indices"] = ref_idx.to(torch.int32)
    if counts:
        inputs["block_counts"] = cnt.to(torch.int32)
    if cu is not None:
        inputs["cu_seqlens"] = torch.tensor(cu, dtype=torch.int32)
    params = {"block_size": bs, "scale": scale}
    if not counts:
        params["block_counts"] = s
    if window:
        params["window_size"] = window
    oracle = {"o": o_ref}
    if "block_indices" in outs:
        oracle["block_indices"] = outs["block_indices"]
    src = provenance(impl, used, fn, ctx.device_name, **extra)
    if margin:
        src["margin"] = MARGIN
    note = note_join(why, "given block_indices: the float64 selection on these inputs"
                     if given else "")
    return Case(op="nsa_fwd", name=name, inputs=inputs, params=params, outputs=outs,
                oracle=oracle, threshold={"o": thr(dtype), "block_indices": None}
                if "block_indices" in outs else {"o": thr(dtype)}, source=src, note=note,
                description=f"{impl} {dtype} q {list(qshape)} H 1 BS {bs} S {s} w {window}: "
                            f"{desc}")


FWD = [
    ("triton_f32_g16_S4", 51, "fla-triton", "float32", (1, 80, 16, 16), 16, 4,
     {"scale": 0.1}, "computed selection, g_cmp and g_slc"),
    ("triton_f32_g16_window", 52, "fla-triton", "float32", (1, 80, 16, 16), 16, 4,
     {"scale": 0.1, "window": 32, "gates": "csw"}, "plus the window branch"),
    ("triton_f32_varlen_counts", 53, "fla-triton", "float32", (1, 100, 16, 16), 16, 4,
     {"cu": [0, 15, 60, 100], "counts": (3, 4), "window": 16, "gates": "csw"},
     "varlen, per-token quotas 3..=4"),
    ("triton_bf16_given_idx", 54, "fla-triton", "bfloat16", (1, 128, 16, 16), 32, 4,
     {"given": True, "window": 64, "gates": "csw", "margin": False},
     "bf16, block_indices given (the float64 selection), all gates"),
    ("triton_bf16_g32_given_idx", 55, "fla-triton", "bfloat16", (1, 64, 32, 16), 16, 8,
     {"given": True, "gates": "", "margin": False}, "G = 32, given indices, no gates"),
    ("naive_f32_S6", 56, "fla-naive", "float32", (1, 80, 16, 16), 16, 6, {},
     "S = 6 (not a power of two), g_cmp and g_slc"),
    ("naive_f32_slc_only", 57, "fla-naive", "float32", (1, 64, 16, 16), 16, 4,
     {"given": True, "gates": "", "margin": False}, "given indices, ungated o_slc"),
]


def _register_fwd(row):
    name, seed, impl, dtype, qshape, bs, s, kw, desc = row

    @case("nsa_fwd", name, needs_cuda=True)
    def build(ctx: Ctx):
        return fwd_case(ctx, name, seed, impl, dtype, qshape, bs, s, desc=desc, **kw)


for _r in FWD:
    _register_fwd(_r)
