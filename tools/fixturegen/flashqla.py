"""`gdn_fwd` cases computed by FlashQLA 0.1.3 (`flash_qla.chunk_gated_delta_rule`, TileLang
Hopper kernels), beside FLA's (`delta_rule.py`); `conformance/spec/anchors.md` says how it is
installed on the GPU machine (`tools/flashqla/README.md`: three device calls).

FlashQLA takes bf16/fp16 `q, k, v` with `K = V = 128` and runs chunks of 64 on Hopper. Each case
is called as users call it (`auto_cp=True`, the default, under `torch.no_grad()`, so its
inference regime), `initial_state` and the final state in float32, `g` float32, `beta` in the
input dtype. Gate regimes (natural-log `g`, GDN's scalar gate per value head):

- strong: `logsigmoid(randn)` (about −0.8 per token);
- trained: `−exp(A_log) · softplus(0.5 randn + dt_bias)` with Mamba's initialisation
  (`A_log = ln U[1, 16]` per head, `dt = exp(U[ln 1e-3, ln 1e-1])`, `dt_bias = dt + ln(−expm1(−dt))`);
- long: `U[−1e-3, 0]` (the state remembers thousands of tokens).

The intra-card split (FlashQLA's "intra CP"): it is only considered for `B = 1` (dense or
varlen) and `auto_cp=True`; its calibrated decision (`cp/autocp`, sm90 coefficients, 132 SMs)
splits one head of one sequence only from about 8192 tokens (two heads: 8192, four: 16384). The
`split_*` cases pass `force_intra_cp=True` (FlashQLA's switch that bypasses the decision, for
"tests and profiling") on sequences of 1024-2048 tokens, which then run in pieces of
`max_local_chunks = 4` chunks (256 tokens): per piece a warm-up from zero over the last chunks
whose cumulative gate reaches −10, or, where it never does (long memory), the exact transition
summaries, then the corrected initial states and the fused kernel. The pieces FlashQLA used, and
whether its own decision would have split, are recorded in each case's `source.split`.

A case whose outputs disagree with the float64 oracle is still written (`keep_failing`), with
the refusal in its `known_failure` metadata: the fixture then shows the failure, and the test
suite requires it to keep failing (`conformance/tests/fixtures_manifest.rs`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import delta_math as M
from .case import Case, gen, provenance, randn
from .registry import Ctx, case

IMPL = "flashqla"
K = V = 128
CHUNK = 64

CASES = [
    dict(name="flashqla_strong_varlen", seed=301, gate="strong", cu=[0, 100, 300, 557]),
    dict(name="flashqla_trained_varlen", seed=302, gate="trained", cu=[0, 64, 250, 421]),
    dict(name="flashqla_long_memory", seed=303, gate="long", cu=[0, 500]),
    dict(name="flashqla_split_strong_t2048", seed=304, gate="strong", T=2048, force=True),
    dict(name="flashqla_split_trained_t1024", seed=305, gate="trained", cu=[0, 1024],
         force=True),
    dict(name="flashqla_split_long_memory", seed=306, gate="long", cu=[0, 37, 1061],
         force=True),
]


def gates(g_, t, hv, regime):
    """Natural-log GDN gates `[1, t, hv]` of `regime` (float32)."""
    if regime == "strong":
        return F.logsigmoid(randn(g_, 1, t, hv))
    if regime == "long":
        return -1e-3 * torch.rand(1, t, hv, generator=g_)
    assert regime == "trained"
    a_log = torch.log(1.0 + 15.0 * torch.rand(hv, generator=g_, dtype=torch.float64))
    lo, hi = math.log(1e-3), math.log(1e-1)
    dt = torch.exp(lo + (hi - lo) * torch.rand(1, t, hv, generator=g_, dtype=torch.float64))
    bias = dt + torch.log(-torch.expm1(-dt))
    x = 0.5 * torch.randn(1, t, hv, generator=g_, dtype=torch.float64) + bias
    return (-torch.exp(a_log) * F.softplus(x)).float()


def split_info(fq, k, v, cu, force):
    """How FlashQLA partitions this call: its own decision and the pieces it ran."""
    from flash_qla.ops.gated_delta_rule import chunk as qc

    def ctx(force_):
        return qc._auto_intra_cp_context(k, v, cu, qc.CHUNK_SIZE, True, False,
                                         force_intra_cp=force_)

    own = ctx(False)
    used = ctx(force)
    info = {"auto_cp": True, "force_intra_cp": force, "decision_splits": bool(own.is_intra),
            "split": bool(used.is_intra)}
    if used.is_intra:
        info["pieces_cu_seqlens"] = [int(x) for x in used.intra_cp_cu_seqlens.tolist()]
    return info


def build(ctx: Ctx, c: dict) -> Case:
    import flash_qla

    cu = c.get("cu")
    t = cu[-1] if cu else c["T"]
    h = hv = 1
    g_ = gen(c["seed"])
    q = M.l2norm(randn(g_, 1, t, h, K)).float()
    k = M.l2norm(randn(g_, 1, t, h, K)).float()
    v = randn(g_, 1, t, hv, V)
    g = gates(g_, t, hv, c["gate"])
    beta = torch.sigmoid(randn(g_, 1, t, hv))
    nseq = len(cu) - 1 if cu else 1
    h0 = randn(g_, nseq, hv, K, V)
    dt = torch.bfloat16
    inp = {"q": q.to(dt), "k": k.to(dt), "v": v.to(dt), "g": g.float(), "beta": beta.to(dt),
           "initial_state": h0}
    cut = torch.tensor(cu, dtype=torch.int32) if cu else None
    if cut is not None:
        inp["cu_seqlens"] = cut

    dev = {key: val.cuda() for key, val in inp.items()}
    force = c.get("force", False)
    with torch.no_grad():
        o, fs = flash_qla.chunk_gated_delta_rule(
            dev["q"], dev["k"], dev["v"], dev["g"], dev["beta"], scale=None,
            initial_state=dev["initial_state"], output_final_state=True,
            cu_seqlens=dev.get("cu_seqlens"), auto_cp=True, force_intra_cp=force)
        torch.cuda.synchronize()
        split = split_info(flash_qla, dev["k"], dev["v"], dev.get("cu_seqlens"), force)
    if force and not split["split"]:
        raise RuntimeError(f"{c['name']}: FlashQLA did not split although forced: {split}")
    outs = {"o": o.cpu(), "final_state": fs.float().cpu()}

    # the float64 oracle: the 6.4 recurrence with the scalar gate broadcast along K (8.5)
    qq, kk, a, bb = M.kda_preprocess(inp["q"], inp["k"], inp["g"][..., None].expand(
        *inp["g"].shape, K), inp["beta"])
    r_o, r_fs = M.kda_recurrent(qq, kk, inp["v"], a, bb, None, h0, cut, False)
    ref = {"o": r_o, "final_state": r_fs}
    thr = {"o": 5e-3, "final_state": 5e-3}

    import tilelang

    src = provenance(IMPL, c["seed"], "flash_qla.chunk_gated_delta_rule", ctx.device_name,
                     version=f"flash-qla {flash_qla.__version__}",
                     tilelang=getattr(tilelang, "__version__", "?"), split=split)
    params = {"scale": None, "output_final_state": True, "use_qk_l2norm_in_kernel": False,
              "state_v_first": False, "chunk_size": CHUNK}
    where = f"cu={cu}" if cu else f"B=1 T={t}"
    how = (f"auto_cp forced to split ({len(split.get('pieces_cu_seqlens', [0])) - 1} pieces)"
           if force else "auto_cp (no split)")
    desc = (f"{IMPL} bfloat16 {where} H=1 HV=1 K={K} V={V} gate {c['gate']}, {how}, h0, fs")
    return Case(op="gdn_fwd", name=c["name"], inputs=inp, params=params, outputs=outs,
                oracle=ref, threshold=thr, tolerance=thr, source=src, description=desc,
                keep_failing=True)


for _c in CASES:
    def _make(c=_c):
        @case("gdn_fwd", c["name"], needs_cuda=True, needs_module="flash_qla")
        def _build(ctx: Ctx):
            return build(ctx, c)
    _make()
