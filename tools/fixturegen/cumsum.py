"""Cases of `conformance/spec/ops-cumsum.md`: `cumsum`, `chunk_local_cumsum`,
`chunk_global_cumsum`, `kda_gate`, `kda_gate_chunk_cumsum`.

Expected outputs come from `torch.cumsum` (CPU and CUDA) and FLA 0.6.0's Triton kernels (GPU),
plus float64 cases from the generator's transcription of the spec (`torch-f64-spec`), checked
against FLA's naive gate functions. Every output is checked against the float64 oracle:

    cumsum:              y[i] = sum_{j<=i} x[j]  (j >= i when reverse)
    chunk_local_cumsum:  o[t] = scale * sum of g over t's chunk up to t (from t when reverse)
    chunk_global_cumsum: the same with one chunk per sequence
    kda_gate:            y = -exp(A_log) softplus(g + dt_bias)
                         or  y = lower_bound sigmoid(exp(A_log) (g + dt_bias))
    kda_gate_chunk_cumsum = chunk_local_cumsum(kda_gate(...))
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .case import THRESHOLD, Case, gen, provenance, randn
from .registry import Ctx, case

RCP_LN2 = 1.4426950216
# Varlen lengths of the spec's test list (1, 15, 63, 64, 65, 1000 and a zero-length one).
VARLEN_LENS = [1, 15, 0, 63, 64, 65, 1000]
DT = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
      "float16": torch.float16}


def cu_from_lens(lens, dtype=torch.int32) -> torch.Tensor:
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=dtype)


def out_threshold(dtype: torch.dtype, fp32=1e-5) -> float:
    """Threshold for an output of `dtype` (the precision the candidate was rounded to)."""
    if dtype == torch.float64:
        return THRESHOLD["float64"]
    if dtype == torch.float32:
        return fp32
    return THRESHOLD["half"]


# ----------------------------------------------------------------------------- float64 oracles

def cumsum_f64(x: torch.Tensor, dim: int, reverse: bool) -> torch.Tensor:
    """Sequential float64 scan along `dim` (suffix sums when `reverse`)."""
    x = x.double()
    if reverse:
        return torch.flip(torch.cumsum(torch.flip(x, [dim]), dim), [dim])
    return torch.cumsum(x, dim)


def seq_ranges(b: int, t: int, cu_seqlens):
    """(batch row, bos, eos) of every sequence."""
    if cu_seqlens is None:
        return [(i, 0, t) for i in range(b)]
    cu = cu_seqlens.tolist()
    return [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]


def chunk_cumsum_f64(g, chunk_size, reverse, scale, cu_seqlens):
    """Float64 chunk-local scan over the time axis (dim 1); `chunk_size=None`: global."""
    g64 = g.double()
    o = torch.zeros_like(g64)
    for b, bos, eos in seq_ranges(g.shape[0], g.shape[1], cu_seqlens):
        step = chunk_size or max(eos - bos, 1)
        for s in range(bos, eos, step):
            e = min(s + step, eos)
            o[b, s:e] = cumsum_f64(g64[b, s:e], 0, reverse)
    if scale is not None:
        o = o * scale
    return o


def kda_gate_f64(g, A_log, dt_bias, lower_bound):
    """Float64 transcription of `naive_kda_gate` / `naive_kda_lowerbound_gate`."""
    h, k = g.shape[-2:]
    a = g.double()
    if dt_bias is not None:
        a = a + dt_bias.double().view(h, k)
    if lower_bound is None:
        return -A_log.double().exp().view(h, 1) * F.softplus(a)
    if A_log is not None:
        a = A_log.double().exp().view(h, 1) * a
    return lower_bound * torch.sigmoid(a)


def fla_naive_gate(g, A_log, dt_bias, lower_bound):
    """FLA's naive gate functions (they compute in float32 whatever the input dtype)."""
    from fla.ops.kda.gate import naive_kda_gate, naive_kda_lowerbound_gate

    if lower_bound is None:
        return naive_kda_gate(g, A_log, dt_bias)
    return naive_kda_lowerbound_gate(g, A_log, dt_bias, lower_bound)


# ----------------------------------------------------------------------------- cumsum

def torch_cumsum(x, dim, reverse, output_dtype, device):
    dt = DT[output_dtype] if output_dtype else None
    xd = x.to(device)
    if reverse:
        y = torch.flip(torch.cumsum(torch.flip(xd, [dim]), dim, dtype=dt), [dim])
    else:
        y = torch.cumsum(xd, dim, dtype=dt)
    return y.cpu()


def cumsum_case(ctx, name, seed, shape, dim, reverse=False, dtype="float32",
                output_dtype=None, where="cuda", special=False, x=None, desc=""):
    g = gen(seed)
    if x is None:
        x = randn(g, *shape)
        if special:
            # NaN / +Inf / -Inf planted in a few lanes: they propagate to the lane's later
            # positions (earlier ones when reverse) exactly as sequential summation does.
            flat = x.view(-1)
            idx = torch.randperm(flat.numel(), generator=g)[:6]
            flat[idx[:2]] = float("nan")
            flat[idx[2:4]] = float("inf")
            flat[idx[4:]] = float("-inf")
        x = x.to(DT[dtype])
    y = torch_cumsum(x, dim, reverse, output_dtype, where)
    ref = cumsum_f64(x, dim, reverse)
    thr = out_threshold(y.dtype)
    params = {"dim": dim, "reverse": reverse, "output_dtype": output_dtype}
    dev = ctx.device_name if where == "cuda" else "cpu"
    return Case(
        op="cumsum", name=name, inputs={"x": x}, params=params, outputs={"y": y},
        oracle={"y": ref}, threshold={"y": thr}, tolerance={"y": thr},
        source=provenance("torch", seed,
                          "torch.cumsum" + (" (flip for reverse)" if reverse else ""), dev),
        description=desc or f"torch.cumsum ({where}) {dtype} {list(x.shape)} dim={dim}"
        f"{' reverse' if reverse else ''} -> {y.dtype}".replace("torch.", ""))


def seed_layout(seed):
    """The seed problem's layout `[16,16,1024,64,64]` reduced to `[2,2,64,8,8]` (scan dim 2)."""
    return randn(gen(seed), 2, 2, 64, 8, 8)


CUMSUM = [
    # name, seed, shape, dim, reverse, dtype, output_dtype, where, special
    ("f32_1d_1000_cpu", 1, (1000,), 0, False, "float32", None, "cpu", False),
    ("f32_1d_1000_rev_cuda", 2, (1000,), 0, True, "float32", None, "cuda", False),
    ("f32_2d_33x32_dim0_cuda", 3, (33, 32), 0, False, "float32", None, "cuda", False),
    ("f32_2d_31x1000_dimneg1_rev_cuda", 4, (31, 1000), -1, True, "float32", None, "cuda", False),
    ("f32_3d_2x33x31_dim1_cpu", 5, (2, 33, 31), 1, False, "float32", None, "cpu", False),
    ("f64_3d_31x2x32_dim0_rev_cpu", 6, (31, 2, 32), 0, True, "float64", None, "cpu", False),
    ("f64_4d_2x31x32x3_dim2_cuda", 7, (2, 31, 32, 3), 2, False, "float64", None, "cuda", False),
    ("f32_4d_2x1x33x32_dim3_rev_cpu", 8, (2, 1, 33, 32), 3, True, "float32", None, "cpu", False),
    ("f32_5d_33x2x1x2x31_dim0_cuda", 9, (33, 2, 1, 2, 31), 0, False, "float32", None, "cuda",
     False),
    ("f32_5d_2x2x31x2x32_dim4_rev_cuda", 10, (2, 2, 31, 2, 32), 4, True, "float32", None,
     "cuda", False),
    ("f32_5d_2x33x2x31x2_dim3_cpu", 11, (2, 33, 2, 31, 2), 3, False, "float32", None, "cpu",
     False),
    ("bf16_3d_4x1000x2_dim1_cpu", 12, (4, 1000, 2), 1, False, "bfloat16", None, "cpu", False),
    ("bf16_to_f32_3d_4x1000x2_dim1_rev_cuda", 13, (4, 1000, 2), 1, True, "bfloat16", "float32",
     "cuda", False),
    ("f16_2d_32x33_dim1_cpu", 14, (32, 33), 1, False, "float16", None, "cpu", False),
    ("f32_to_f64_2d_2x1000_dim1_cuda", 15, (2, 1000), 1, False, "float32", "float64", "cuda",
     False),
    ("f32_len0_3x0x5_dim1_cpu", 16, (3, 0, 5), 1, False, "float32", None, "cpu", False),
    ("f32_len0_lanes_4x0_dim0_cuda", 17, (4, 0), 0, False, "float32", None, "cuda", False),
    ("f32_nan_inf_8x64_dim1_cpu", 18, (8, 64), 1, False, "float32", None, "cpu", True),
    ("f32_nan_inf_64x8_dim0_rev_cuda", 19, (64, 8), 0, True, "float32", None, "cuda", True),
]


def _register_cumsum(row):
    name, seed, shape, dim, reverse, dtype, odt, where, special = row

    @case("cumsum", name, needs_cuda=(where == "cuda"))
    def build(ctx: Ctx):
        return cumsum_case(ctx, name, seed, shape, dim, reverse, dtype, odt, where, special)


for _row in CUMSUM:
    _register_cumsum(_row)


def _register_seed(name, where, dtype):
    @case("cumsum", name, needs_cuda=(where == "cuda"))
    def build(ctx: Ctx):
        x = seed_layout(20).to(DT[dtype])
        return cumsum_case(ctx, name, 20, None, 2, False, dtype, None, where, x=x,
                           desc=f"seed layout [16,16,1024,64,64] reduced to [2,2,64,8,8], dim 2, "
                                f"{dtype}, torch.cumsum ({where})")


_register_seed("seed_layout_f32_cuda", "cuda", "float32")
_register_seed("seed_layout_f64_cpu", "cpu", "float64")


# ----------------------------------------------------------------------------- chunk cumsums

def draw_gate_input(g_, shape, kind):
    """`logsig`: realistic log-decays `logsigmoid(randn)`; `randn`: plain normal values."""
    x = randn(g_, *shape)
    return F.logsigmoid(x) if kind == "logsig" else x


def seq_scan_case(ctx, op, name, seed, b, t_or_lens, h, s, dtype, chunk_size=None,
                  reverse=False, scale=None, output_dtype="float32", cu_dtype=torch.int32,
                  impl="fla-triton"):
    """One `chunk_local_cumsum` (chunk_size set) or `chunk_global_cumsum` case."""
    g_ = gen(seed)
    if isinstance(t_or_lens, (list, tuple)):
        cu = cu_from_lens(t_or_lens, cu_dtype)
        t = int(cu[-1])
    else:
        cu, t = None, t_or_lens
    shape = (b, t, h) if s is None else (b, t, h, s)
    g = draw_gate_input(g_, shape, "logsig" if seed % 2 else "randn").to(DT[dtype])
    ref = chunk_cumsum_f64(g, chunk_size, reverse, scale, cu)
    if impl == "fla-triton":
        from fla.ops.utils.cumsum import chunk_global_cumsum, chunk_local_cumsum

        odt = DT[output_dtype] if output_dtype else None
        cud = cu.cuda() if cu is not None else None
        if op == "chunk_local_cumsum":
            o = chunk_local_cumsum(g.cuda(), chunk_size=chunk_size, reverse=reverse, scale=scale,
                                   cu_seqlens=cud, output_dtype=odt)
            fn = "fla.ops.utils.cumsum.chunk_local_cumsum"
        else:
            o = chunk_global_cumsum(g.cuda(), reverse=reverse, cu_seqlens=cud, scale=scale,
                                    output_dtype=odt)
            fn = "fla.ops.utils.cumsum.chunk_global_cumsum"
        o = o.cpu()
        src = provenance(impl, seed, fn, ctx.device_name)
    else:
        o = ref.clone()
        src = provenance(impl, seed, "chunk_cumsum_f64 (float64 transcription of the spec)",
                         "cpu")
    fp32_thr = 1e-6 if op == "chunk_local_cumsum" else 1e-5
    thr = out_threshold(o.dtype, fp32_thr)
    params = {"reverse": reverse, "scale": scale, "output_dtype": output_dtype}
    if chunk_size is not None:
        params = {"chunk_size": chunk_size, **params}
    inputs = {"g": g}
    if cu is not None:
        inputs["cu_seqlens"] = cu
    form = "scalar" if s is None else "vector"
    where = f"lens={list(t_or_lens)}" if cu is not None else f"B={b} T={t}"
    desc = (f"{impl} {form} {dtype} {where} H={h}" + (f" S={s}" if s else "")
            + (f" BT={chunk_size}" if chunk_size else "") + (" reverse" if reverse else "")
            + (" scale=RCP_LN2" if scale else "") + f" -> {output_dtype or dtype}")
    return Case(op=op, name=name, inputs=inputs, params=params, outputs={"o": o},
                oracle={"o": ref}, threshold={"o": thr}, tolerance={"o": thr}, source=src,
                description=desc)


LOCAL = [
    # name, seed, B, T or lens, H, S, dtype, chunk_size, reverse, scale, output_dtype, impl
    ("scalar_f32_b2_t150_bt64", 31, 2, 150, 3, None, "float32", 64, False, None, "float32",
     "fla-triton"),
    ("vector_bf16_b2_t100_bt32_rev", 32, 2, 100, 2, 16, "bfloat16", 32, True, None, "float32",
     "fla-triton"),
    ("vector_f32_varlen_bt64_rcp_ln2", 33, 1, VARLEN_LENS, 2, 8, "float32", 64, False, RCP_LN2,
     "float32", "fla-triton"),
    ("scalar_bf16_varlen_bt16_rev", 34, 1, VARLEN_LENS, 3, None, "bfloat16", 16, True, None,
     "float32", "fla-triton"),
    ("vector_bf16_t77_bt64_out_null", 35, 1, 77, 2, 32, "bfloat16", 64, False, RCP_LN2, None,
     "fla-triton"),
    ("scalar_f32_varlen_bt128_out_null_rev", 36, 1, VARLEN_LENS, 2, None, "float32", 128, True,
     RCP_LN2, None, "fla-triton"),
    ("vector_f64_varlen_bt32_rev_rcp_ln2", 37, 1, VARLEN_LENS, 1, 4, "float64", 32, True, RCP_LN2,
     None, "torch-f64-spec"),
]

GLOBAL = [
    ("scalar_f32_b2_t300", 41, 2, 300, 3, None, "float32", None, False, None, "float32",
     "fla-triton"),
    ("vector_bf16_varlen_rev_rcp_ln2", 42, 1, VARLEN_LENS, 2, 8, "bfloat16", None, True, RCP_LN2,
     "float32", "fla-triton"),
    ("scalar_f32_varlen_i64", 43, 1, VARLEN_LENS, 2, None, "float32", None, False, None,
     "float32", "fla-triton"),
    ("scalar_bf16_b3_t100_rev_out_null", 44, 3, 100, 2, None, "bfloat16", None, True, None, None,
     "fla-triton"),
    ("vector_f64_varlen_scale", 45, 1, VARLEN_LENS, 1, 3, "float64", None, False, 0.5, None,
     "torch-f64-spec"),
]


def _register_seq(op, row):
    name, seed, b, tl_, h, s, dtype, bt, rev, scale, odt, impl = row

    @case(op, name, needs_cuda=(impl == "fla-triton"))
    def build(ctx: Ctx):
        cu_dtype = torch.int64 if name.endswith("_i64") else torch.int32
        return seq_scan_case(ctx, op, name, seed, b, tl_, h, s, dtype, bt, rev, scale, odt,
                             cu_dtype, impl)


for _row in LOCAL:
    _register_seq("chunk_local_cumsum", _row)
for _row in GLOBAL:
    _register_seq("chunk_global_cumsum", _row)


@case("chunk_global_cumsum", "seed_identity_f32", needs_cuda=True)
def _seed_identity(ctx: Ctx):
    """`chunk_global_cumsum` on the view `[B*H, T, 1, D*D]` of the cumsum seed-layout tensor."""
    x = seed_layout(20)  # the same tensor as cumsum/seed_layout_f32_cuda
    g = x.reshape(4, 64, 1, 64).contiguous()
    from fla.ops.utils.cumsum import chunk_global_cumsum

    o = chunk_global_cumsum(g.cuda(), output_dtype=torch.float32).cpu()
    ref = chunk_cumsum_f64(g, None, False, None, None)
    ident = cumsum_f64(x, 2, False).reshape(4, 64, 1, 64)
    thr = THRESHOLD["float32"]
    return Case(op="chunk_global_cumsum", name="seed_identity_f32", inputs={"g": g},
                params={"reverse": False, "scale": None, "output_dtype": "float32"},
                outputs={"o": o}, oracle={"o": ref}, threshold={"o": thr}, tolerance={"o": thr},
                source=provenance("fla-triton", 20, "fla.ops.utils.cumsum.chunk_global_cumsum",
                                  ctx.device_name),
                description="fla-triton on the view [B*H,T,1,D*D] of the cumsum seed-layout "
                            "tensor (equals cumsum dim 2)",
                cross=[("cumsum(x, dim=2) identity", ident, ref, 1e-12)])


# ----------------------------------------------------------------------------- gates

def gate_inputs(seed, b, t, h, k, dtype, with_a, with_bias, probe=False, raw=False):
    """Raw gate input `g` (around 0, scale 3; with `probe`, exact values 19.9, 20, 20.1, -30
    planted), `A_log = randn(H)`, `dt_bias = randn(H*K)`."""
    g_ = gen(seed)
    g = randn(g_, b, t, h, k) * 3.0
    if probe:
        flat = g.view(-1)
        idx = torch.randperm(flat.numel(), generator=g_)[:40]
        vals = torch.tensor([19.9, 20.0, 20.1, -30.0, 25.0, -20.0, 15.0, 0.0])
        flat[idx] = vals.repeat(5)
    A_log = randn(g_, h) if with_a else None
    dt_bias = randn(g_, h * k) if with_bias else None
    dt = DT[dtype]
    return (g.to(dt), None if A_log is None else A_log.to(dt if raw else torch.float32),
            None if dt_bias is None else dt_bias.to(dt if raw else torch.float32))


GATES = [
    # name, seed, B, T, H, K, dtype, A_log, dt_bias, lower_bound, probe, impl
    ("softplus_bias_f32", 51, 2, 40, 3, 16, "float32", True, True, None, False, "fla-triton"),
    ("softplus_threshold_probe_f32", 52, 1, 64, 2, 24, "float32", True, False, None, True,
     "fla-triton"),
    ("softplus_bias_bf16_k64", 53, 1, 50, 2, 64, "bfloat16", True, True, None, True,
     "fla-triton"),
    ("lowerbound_alog_bias_f32", 54, 2, 33, 2, 32, "float32", True, True, -5.0, True,
     "fla-triton"),
    ("lowerbound_no_alog_bias_bf16", 55, 1, 70, 3, 16, "bfloat16", False, True, -3.0, False,
     "fla-triton"),
    ("lowerbound_no_alog_no_bias_f32", 56, 1, 64, 2, 8, "float32", False, False, -1.0, True,
     "fla-triton"),
    ("naive_softplus_f32", 57, 2, 20, 2, 16, "float32", True, True, None, True, "fla-naive"),
    ("naive_lowerbound_f32", 58, 2, 20, 2, 16, "float32", True, True, -5.0, True, "fla-naive"),
    ("f64_softplus_bias_probe", 59, 1, 30, 2, 24, "float64", True, True, None, True,
     "torch-f64-spec"),
    ("f64_lowerbound_no_alog", 60, 1, 30, 2, 16, "float64", False, True, -2.0, True,
     "torch-f64-spec"),
]


def kda_gate_case(ctx, name, seed, b, t, h, k, dtype, with_a, with_bias, lb, probe, impl):
    g, A_log, dt_bias = gate_inputs(seed, b, t, h, k, dtype, with_a, with_bias, probe,
                                    raw=(dtype == "float64"))
    ref = kda_gate_f64(g, A_log, dt_bias, lb)
    cross = []
    if impl == "fla-triton":
        from fla.ops.kda.gate import kda_gate_fwd

        y = kda_gate_fwd(g.cuda(), None if A_log is None else A_log.cuda(),
                         None if dt_bias is None else dt_bias.cuda(), lower_bound=lb,
                         output_dtype=torch.float32).cpu()
        src = provenance(impl, seed, "fla.ops.kda.gate.kda_gate_fwd", ctx.device_name)
    elif impl == "fla-naive":
        y = fla_naive_gate(g, A_log, dt_bias, lb)
        fn = "naive_kda_gate" if lb is None else "naive_kda_lowerbound_gate"
        src = provenance(impl, seed, f"fla.ops.kda.gate.{fn} (computes in float32)", "cpu")
    else:
        y = ref.clone()
        src = provenance(impl, seed, "kda_gate_f64 (float64 transcription of the naive gates)",
                         "cpu")
        cross.append(("float64 transcription vs FLA naive (fp32)", y,
                      fla_naive_gate(g, A_log, dt_bias, lb), THRESHOLD["float32"]))
    thr = out_threshold(y.dtype)
    inputs = {"g": g}
    if A_log is not None:
        inputs["A_log"] = A_log
    if dt_bias is not None:
        inputs["dt_bias"] = dt_bias
    form = "softplus" if lb is None else f"lower_bound={lb}"
    desc = (f"{impl} {form} {dtype} [B={b},T={t},HV={h},K={k}]"
            + ("" if A_log is not None else " no A_log") + (" dt_bias" if with_bias else "")
            + (" with 19.9/20/20.1/-30 probes" if probe else ""))
    return Case(op="kda_gate", name=name, inputs=inputs, params={"lower_bound": lb},
                outputs={"y": y}, oracle={"y": ref}, threshold={"y": thr},
                tolerance={"y": thr}, source=src, description=desc, cross=cross)


def _register_gate(row):
    name, seed, b, t, h, k, dtype, a, bias, lb, probe, impl = row

    @case("kda_gate", name, needs_cuda=(impl == "fla-triton"))
    def build(ctx: Ctx):
        return kda_gate_case(ctx, name, seed, b, t, h, k, dtype, a, bias, lb, probe, impl)


for _row in GATES:
    _register_gate(_row)


GATE_CUMSUM = [
    # name, seed, B, T or lens, H, K, dtype, A_log, dt_bias, lower_bound, BT, scale, reverse,
    # output_dtype, impl
    ("softplus_bias_b2_t100_bt64_rcp_ln2", 61, 2, 100, 2, 32, "float32", True, True, None, 64,
     RCP_LN2, False, "float32", "fla-triton"),
    ("softplus_varlen_bf16_bt32", 62, 1, VARLEN_LENS, 2, 16, "bfloat16", True, True, None, 32,
     RCP_LN2, False, "float32", "fla-triton"),
    ("lowerbound_no_alog_bias_bt16", 63, 1, 90, 2, 24, "float32", False, True, -5.0, 16,
     RCP_LN2, False, "float32", "fla-triton"),
    ("lowerbound_alog_varlen_bt64_no_scale", 64, 1, VARLEN_LENS, 1, 8, "float32", True, False,
     -5.0, 64, None, False, "float32", "fla-triton"),
    ("f64_softplus_varlen_bt16_reverse", 65, 1, VARLEN_LENS, 1, 4, "float64", True, True, None,
     16, RCP_LN2, True, None, "torch-f64-spec"),
]


def gate_cumsum_case(ctx, name, seed, b, tl_, h, k, dtype, with_a, with_bias, lb, bt, scale,
                     reverse, odt, impl):
    if isinstance(tl_, (list, tuple)):
        cu = cu_from_lens(tl_)
        t = int(cu[-1])
    else:
        cu, t = None, tl_
    g, A_log, dt_bias = gate_inputs(seed, b, t, h, k, dtype, with_a, with_bias, probe=False,
                                    raw=(dtype == "float64"))
    ref = chunk_cumsum_f64(kda_gate_f64(g, A_log, dt_bias, lb), bt, reverse, scale, cu)
    if impl == "fla-triton":
        from fla.ops.kda.gate import kda_gate_chunk_cumsum

        assert not reverse, "FLA 0.6.0 kda_gate_chunk_cumsum has no reverse"
        o = kda_gate_chunk_cumsum(
            g.cuda(), None if A_log is None else A_log.cuda(), chunk_size=bt, scale=scale,
            dt_bias=None if dt_bias is None else dt_bias.cuda(),
            cu_seqlens=None if cu is None else cu.cuda(),
            output_dtype=DT[odt] if odt else None, lower_bound=lb).cpu()
        src = provenance(impl, seed, "fla.ops.kda.gate.kda_gate_chunk_cumsum", ctx.device_name)
    else:
        o = ref.clone()
        src = provenance(impl, seed, "chunk_cumsum_f64(kda_gate_f64(...))", "cpu")
    thr = out_threshold(o.dtype)
    inputs = {"g": g}
    if A_log is not None:
        inputs["A_log"] = A_log
    if dt_bias is not None:
        inputs["dt_bias"] = dt_bias
    if cu is not None:
        inputs["cu_seqlens"] = cu
    params = {"chunk_size": bt, "scale": scale, "lower_bound": lb, "output_dtype": odt,
              "reverse": reverse}
    where = f"lens={list(tl_)}" if cu is not None else f"B={b} T={t}"
    desc = (f"{impl} {'softplus' if lb is None else f'lower_bound={lb}'} {dtype} {where} "
            f"HV={h} K={k} BT={bt}" + (" scale=RCP_LN2" if scale else "")
            + ("" if A_log is not None else " no A_log") + (" dt_bias" if with_bias else "")
            + (" reverse" if reverse else ""))
    return Case(op="kda_gate_chunk_cumsum", name=name, inputs=inputs, params=params,
                outputs={"o": o}, oracle={"o": ref}, threshold={"o": thr},
                tolerance={"o": thr}, source=src, description=desc)


def _register_gate_cumsum(row):
    name, *rest = row
    impl = rest[-1]

    @case("kda_gate_chunk_cumsum", name, needs_cuda=(impl == "fla-triton"))
    def build(ctx: Ctx):
        return gate_cumsum_case(ctx, name, *rest)


for _row in GATE_CUMSUM:
    _register_gate_cumsum(_row)
