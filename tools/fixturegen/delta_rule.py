"""Cases of `conformance/spec/ops-delta-rule.md` §10: `chunk_gated_delta_rule_fwd_h`,
`fwd_h_pre_scan`, `fwd_h_merge`, `chunk_gated_delta_rule_fwd_h_split`, `kda_intra`, `kda_fwd`,
`gdn_fwd`.

Inputs follow 10.2 (drawn on the CPU in float32 from the case seed): `q, k, v = randn` (q, k
L2-normalised unless `use_qk_l2norm_in_kernel`), `g = logsigmoid(randn) / n` with a fraction
`p` set to 0 (hard forget: 5% of tokens at -1000; `safe_gate`: clamped to [-5, 0]),
`beta = sigmoid(randn)`, `initial_state = randn`. The inputs of the state-recurrence ops
(`k, w, u, g/gk`) come from the intra stage run on such inputs: `G = chunk_local_cumsum(g,
scale=RCP_LN2)`, then KDA (`k = kg, w, u, gk = G`) or GDN (raw `k, w, u, g = G`). The intra
stage is the generator's float64 transcription (`delta_math.kda_intra`, the formulas FLA's
`chunk_kda_fwd_intra` / `chunk_gated_delta_rule_fwd_intra` implement) rounded to the case
dtype, so these inputs are reproducible on any machine; the `kda_intra` cases check that
transcription against FLA's kernel.

Expected outputs: FLA 0.6.0 Triton kernels (`fla-triton`, GPU) or the float64 transcriptions of
the spec (`torch-f64-spec`, cross-checked against FLA's naive recurrences at the fp32
threshold). Every FLA output is checked against the float64 value on the same inputs at the
spec's thresholds before it is written. FLA's intra-card split path is never used.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import delta_math as M
from .case import Case, gen, provenance, randn
from .registry import Ctx, case

RCP_LN2 = 1.4426950216  # FLA's fp32 constant (used for G, as FLA's chunk_local_cumsum does)
DT = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
      "float16": torch.float16}


def cls(dtype: str) -> str:
    return {"bfloat16": "half", "float16": "half"}.get(dtype, dtype)


def cu_tensor(cu):
    return None if cu is None else torch.tensor(cu, dtype=torch.int32)


def n_seqs(b, cu):
    return b if cu is None else len(cu) - 1


def cuda(x):
    return None if x is None else x.cuda()


def cpu(x):
    return None if x is None else x.cpu()


# ----------------------------------------------------------------------------- inputs (10.2)

def draw(seed, b, t, h, hv, kdim, vdim, *, n=1, p=0.0, hard_forget=False, safe=False,
         l2_in_kernel=False, gate_in_kernel=False, beta_sigmoid=False, scalar_gate=False,
         nseq=1, h0=False, svf=False, with_a_log=True, with_dt_bias=True, long_memory=False):
    """Realistic float32 inputs of one case (10.2); `long_memory`: g ~ U[-1e-3, 0] per step."""
    g_ = gen(seed)
    q = randn(g_, b, t, h, kdim)
    k = randn(g_, b, t, h, kdim)
    v = randn(g_, b, t, hv, vdim)
    if not l2_in_kernel:
        q, k = M.l2norm(q).float(), M.l2norm(k).float()
    gshape = (b, t, hv) if scalar_gate else (b, t, hv, kdim)
    out = {}
    if gate_in_kernel:
        g = randn(g_, *gshape)
        a_log, dt_bias = randn(g_, hv), randn(g_, hv * kdim)
        if with_a_log:
            out["A_log"] = a_log
        if with_dt_bias:
            out["dt_bias"] = dt_bias
    elif long_memory:
        g = -1e-3 * torch.rand(gshape, generator=g_)
    else:
        g = F.logsigmoid(randn(g_, *gshape)) / n
        if p:
            g[torch.rand(gshape, generator=g_) < p] = 0.0
        if hard_forget:
            g[torch.rand(b, t, generator=g_) < 0.05] = -1000.0
        if safe:
            g = g.clamp(-5.0, 0.0)
    beta = randn(g_, b, t, hv)
    if not beta_sigmoid:
        beta = torch.sigmoid(beta)
    out.update(q=q, k=k, v=v, g=g, beta=beta)
    if h0:
        shape = (nseq, hv, vdim, kdim) if svf else (nseq, hv, kdim, vdim)
        out["initial_state"] = randn(g_, *shape)
    return out


def recurrence_inputs(seed, b, t, h, hv, kdim, vdim, cu, bt, gates, dtype, n=1, h0=False,
                      svf=False):
    """`k, w, u, g/gk` of section 2 from the intra stage (10.2), cast to `dtype`.

    gates: "gk" (KDA: k = kg, gk = G), "g" (GDN: raw k, g = G), "gk+g" (KDA plus a scalar GDN
    gate drawn with n = 10), "g+gk" (GDN with raw GVA keys plus a per-key gate, n = 10).
    """
    scalar = gates.startswith("g") and not gates.startswith("gk")
    d = draw(seed, b, t, h, hv, kdim, vdim, n=n, scalar_gate=scalar, nseq=n_seqs(b, cu), h0=h0,
             svf=svf)
    cut = cu_tensor(cu)
    G = M.chunk_local_cumsum(d["g"], bt, cut, RCP_LN2)
    gb = G if not scalar else G[..., None].expand(*G.shape, kdim)
    w, u, kg, _, _ = M.kda_intra(d["q"], d["k"], d["v"], gb, d["beta"], None, cut, bt)
    dt = DT[dtype]
    res = {"k": (d["k"] if scalar else kg).to(dt), "w": w.to(dt), "u": u.to(dt)}
    if scalar:
        res["g"] = G.float()
    else:
        res["gk"] = G.float()
    if "+" in gates:
        shape2 = (*G.shape, kdim) if scalar else G.shape[:3]
        g2 = F.logsigmoid(randn(gen(seed + 1000), *shape2)) / 10
        extra = M.chunk_local_cumsum(g2, bt, cut, RCP_LN2).float()
        res["gk" if scalar else "g"] = extra
    if h0:
        res["initial_state"] = d["initial_state"]
    if dtype == "float64":
        res = {key: val.double() for key, val in res.items()}
    return res


def describe(c: dict, extra: str = "") -> str:
    where = f"cu={c['cu']}" if c.get("cu") else f"B={c.get('B', 1)} T={c['T']}"
    return (f"{c['impl']} {c['dtype']} {where} H={c['H']} HV={c['HV']} K={c['K']} V={c['V']}"
            + (f" BT={c['BT']}" if c.get("BT") else "") + (f" {extra}" if extra else ""))


# ----------------------------------------------------------------------------- fwd_h and split

FWD_H = [
    dict(name="kda_bf16_t77", seed=101, impl="fla-triton", dtype="bfloat16", T=77, H=2, HV=2,
         K=64, V=64, BT=64, gates="gk", h0=True, fs=True),
    dict(name="kda_fp16_varlen_bt32", seed=102, impl="fla-triton", dtype="float16",
         cu=[0, 15, 100, 300, 420], H=2, HV=2, K=32, V=32, BT=32, gates="gk", h0=True, fs=True),
    dict(name="gdn_bf16_gva", seed=103, impl="fla-triton", dtype="bfloat16", T=100, H=1, HV=4,
         K=64, V=64, BT=64, gates="g", h0=True, fs=True),
    dict(name="gdn_bf16_b2_bt16", seed=104, impl="fla-triton", dtype="bfloat16", B=2, T=90,
         H=2, HV=2, K=32, V=32, BT=16, gates="g", h0=False, fs=True),
    dict(name="both_fp32_k100_v60", seed=105, impl="fla-triton", dtype="float32", T=63, H=1,
         HV=1, K=100, V=60, BT=16, gates="gk+g", h0=True, fs=True),
    dict(name="zero_len_svf", seed=106, impl="fla-triton", dtype="bfloat16",
         cu=[0, 0, 64, 64, 130, 131], H=2, HV=2, K=32, V=32, BT=64, gates="gk", h0=True,
         fs=True, svf=True, save_new_value=False),
    dict(name="k256", seed=107, impl="fla-triton", dtype="bfloat16", T=65, H=1, HV=1, K=256,
         V=32, BT=64, gates="gk", h0=True, fs=True),
    dict(name="long_t1000", seed=108, impl="fla-triton", dtype="bfloat16", T=1000, H=1, HV=1,
         K=32, V=32, BT=64, gates="gk", n=10, h0=True, fs=True),
    dict(name="gva_both_f64", seed=109, impl="torch-f64-spec", dtype="float64", T=50, H=1,
         HV=2, K=60, V=40, BT=16, gates="g+gk", h0=True, fs=True),
]

SPLIT = [
    dict(name="gdn_bf16_bt16", seed=117, impl="fla-triton", dtype="bfloat16",
         cu=[0, 300, 310, 600], H=1, HV=1, K=32, V=32, BT=16, gates="g", h0=True, fs=True,
         pieces=[[3, 4, 8], [], [1, 5]]),
    dict(name="kda_bf16_bt32_every_chunk", seed=118, impl="fla-triton", dtype="bfloat16",
         cu=[0, 500, 501, 501, 632], H=1, HV=1, K=32, V=32, BT=32, gates="gk", h0=True,
         fs=True, svf=True, pieces=[[1] * 15, [], [], [2]]),
    dict(name="gva_f64", seed=119, impl="torch-f64-spec", dtype="float64", cu=[0, 200], H=1,
         HV=2, K=16, V=16, BT=16, gates="g+gk", h0=True, fs=True, pieces=[[1] * 12]),
]


def fwd_h_thresholds(dtype, split=False):
    c = cls(dtype)
    if c == "float64":
        return {"h": 1e-10, "v_new": 1e-10, "final_state": 1e-10}
    if split:
        t = 1e-2 if c == "half" else 5e-5
        return {"h": t, "v_new": t, "final_state": t}
    if c == "half":
        return {"h": 1e-2, "v_new": 1e-2, "final_state": 5e-3}
    return {"h": 1e-5, "v_new": 1e-5, "final_state": 1e-5}


def subseq_bounds(cu, bt, pieces):
    """`subseq_cu_seqlens` from per-sequence piece lengths in chunks (the rest is one piece)."""
    out = [0]
    for n in range(len(cu) - 1):
        bos, eos = cu[n], cu[n + 1]
        pos = bos
        for m in pieces[n]:
            pos += m * bt
            if pos < eos:
                out.append(pos)
        out.append(eos)
    return out


def fla_fwd_h(inp, c):
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h

    with torch.no_grad():
        h, v_new, fs = chunk_gated_delta_rule_fwd_h(
            k=cuda(inp["k"]), w=cuda(inp["w"]), u=cuda(inp["u"]), g=cuda(inp.get("g")),
            gk=cuda(inp.get("gk")), initial_state=cuda(inp.get("initial_state")),
            output_final_state=c.get("fs", False), chunk_size=c["BT"],
            save_new_value=c.get("save_new_value", True), state_v_first=c.get("svf", False),
            cu_seqlens=cuda(inp.get("cu_seqlens")))
    return cpu(h), cpu(v_new), cpu(fs)


def fwd_h_case(ctx, c, split=False):
    op = "chunk_gated_delta_rule_fwd_h_split" if split else "chunk_gated_delta_rule_fwd_h"
    b = c.get("B", 1)
    t = c["cu"][-1] if c.get("cu") else c["T"]
    inp = recurrence_inputs(c["seed"], b, t, c["H"], c["HV"], c["K"], c["V"], c.get("cu"),
                            c["BT"], c["gates"], c["dtype"], c.get("n", 1), c.get("h0", False),
                            c.get("svf", False))
    if c.get("cu"):
        inp["cu_seqlens"] = cu_tensor(c["cu"])
    svf = c.get("svf", False)
    rh, rv, rfs = M.fwd_h(inp["k"], inp["w"], inp["u"], inp.get("g"), inp.get("gk"),
                          inp.get("initial_state"), inp.get("cu_seqlens"), c["BT"], svf)
    ref = {"h": rh, "v_new": rv, "final_state": rfs}
    keep = ["h"] + (["v_new"] if c.get("save_new_value", True) else []) + (
        ["final_state"] if c.get("fs") else [])
    cross = []
    if split:
        sub = subseq_bounds(c["cu"], c["BT"], c["pieces"])
        inp["subseq_cu_seqlens"] = torch.tensor(sub, dtype=torch.int32)
        # the split algorithm (5.3) in float64 must reproduce the unsplit reference
        counts = []
        for n in range(len(c["cu"]) - 1):
            counts.append(sum(1 for j in range(len(sub) - 1)
                              if c["cu"][n] <= sub[j] and sub[j + 1] <= c["cu"][n + 1]
                              and not (sub[j] == sub[j + 1] and c["cu"][n] != c["cu"][n + 1])))
        offs = [0]
        for m in counts:
            offs.append(offs[-1] + m)
        assert offs[-1] == len(sub) - 1, (counts, sub)
        subt = torch.tensor(sub)
        hm = M.pre_scan(inp["k"], inp["w"], inp["u"], inp.get("g"), inp.get("gk"), subt, c["BT"])
        init, fs_m = M.merge(hm, offs, inp.get("initial_state"), svf)
        sh, sv, sfs = M.fwd_h(inp["k"], inp["w"], inp["u"], inp.get("g"), inp.get("gk"), init,
                              subt, c["BT"], svf)
        cross += [("f64 split composition h", rh, sh, 1e-10),
                  ("f64 split composition v_new", rv, sv, 1e-10),
                  ("f64 merge final_state", rfs, fs_m, 1e-10)]
    if c["impl"] == "fla-triton":
        h, v_new, fs = fla_fwd_h(inp, c)
        outs = {"h": h, "v_new": v_new, "final_state": fs}
        src = provenance("fla-triton", c["seed"],
                         "fla.ops.common.chunk_delta_h.chunk_gated_delta_rule_fwd_h"
                         + (" (unsplit: the split invariant)" if split else ""), ctx.device_name,
                         inputs="k, w, u, G from the float64 intra stage (delta_math), rounded "
                                "to the case dtype")
    else:
        outs = {key: val.clone() for key, val in ref.items()}
        src = provenance("torch-f64-spec", c["seed"], "delta_math.fwd_h", "cpu")
    outs = {key: outs[key] for key in keep}
    ref = {key: ref[key] for key in keep}
    thr = {key: val for key, val in fwd_h_thresholds(c["dtype"], split).items() if key in keep}
    params = {"chunk_size": c["BT"], "output_final_state": c.get("fs", False),
              "save_new_value": c.get("save_new_value", True), "state_v_first": svf}
    gates = {"gk": "gk (KDA)", "g": "g (GDN)", "gk+g": "gk and g", "g+gk": "g and gk"}[c["gates"]]
    extra = (gates + (", h0" if c.get("h0") else "") + (", fs" if c.get("fs") else "")
             + (", state_v_first" if svf else "")
             + (", no v_new" if not c.get("save_new_value", True) else "")
             + (f", pieces {c['pieces']}" if split else ""))
    return Case(op=op, name=c["name"], inputs=inp, params=params, outputs=outs, oracle=ref,
                threshold=thr, tolerance=thr, source=src, description=describe(c, extra),
                cross=cross)


# ----------------------------------------------------------------------------- pre-scan

PRE_SCAN = [
    dict(name="kda_bf16", seed=110, impl="fla-triton", dtype="bfloat16",
         cu=[0, 64, 128, 256, 300], H=2, HV=2, K=32, V=32, BT=64, gates="gk"),
    dict(name="gdn_bf16_gva_bt32", seed=111, impl="fla-triton", dtype="bfloat16",
         cu=[0, 32, 160, 200], H=1, HV=2, K=64, V=64, BT=32, gates="g"),
    dict(name="fp32_k100_v60_empty", seed=112, impl="fla-triton", dtype="float32",
         cu=[0, 16, 64, 120, 120], H=1, HV=1, K=100, V=60, BT=16, gates="gk"),
    dict(name="both_gates_f64", seed=113, impl="torch-f64-spec", dtype="float64",
         cu=[0, 48, 80], H=1, HV=1, K=32, V=32, BT=16, gates="gk+g"),
]


def pre_scan_case(ctx, c):
    t = c["cu"][-1]
    inp = recurrence_inputs(c["seed"], 1, t, c["H"], c["HV"], c["K"], c["V"], c["cu"], c["BT"],
                            c["gates"], c["dtype"])
    inp["cu_seqlens"] = cu_tensor(c["cu"])
    ref = M.pre_scan(inp["k"], inp["w"], inp["u"], inp.get("g"), inp.get("gk"),
                     inp["cu_seqlens"], c["BT"])
    vdim = c["V"]
    cl = cls(c["dtype"])
    tb, tm = {"half": (5e-3, 1e-2), "float32": (1e-5, 1e-5), "float64": (1e-10, 1e-10)}[cl]
    parts = {"hm.b": ((Ellipsis, slice(0, vdim)), tb), "hm.M": ((Ellipsis, slice(vdim, None)), tm)}
    # identity (3.6): M S0 + b equals fwd_h's final state from S0
    s0 = randn(gen(c["seed"] + 2000), len(c["cu"]) - 1, c["HV"], c["K"], vdim).double()
    _, _, fs = M.fwd_h(inp["k"], inp["w"], inp["u"], inp.get("g"), inp.get("gk"), s0,
                       inp["cu_seqlens"], c["BT"])
    cross = [("M S0 + b = fwd_h final_state (f64)", fs, ref[..., vdim:] @ s0 + ref[..., :vdim],
              1e-10)]
    if c["impl"] == "fla-triton":
        from fla.ops.common.intracard_cp import intracard_pre_scan

        with torch.no_grad():
            hm = intracard_pre_scan(
                k=cuda(inp["k"]), w=cuda(inp["w"]), u=cuda(inp["u"]), g=cuda(inp.get("g")),
                gk=cuda(inp.get("gk")), cu_seqlens=cuda(inp["cu_seqlens"]),
                num_subseqs=len(c["cu"]) - 1, chunk_size=c["BT"]).cpu()
        src = provenance("fla-triton", c["seed"],
                         "fla.ops.common.intracard_cp.intracard_pre_scan (chunk_cp_fwd_h, "
                         "multi_seqs=True)", ctx.device_name,
                         inputs="k, w, u, G from the float64 intra stage (delta_math)")
    else:
        hm = ref.clone()
        src = provenance("torch-f64-spec", c["seed"], "delta_math.pre_scan", "cpu")
    return Case(op="fwd_h_pre_scan", name=c["name"], inputs=inp,
                params={"chunk_size": c["BT"]}, outputs={"hm": hm}, oracle={"hm": ref},
                threshold={"hm": parts}, tolerance={"hm.b": tb, "hm.M": tm}, source=src,
                description=describe(c, c["gates"]), cross=cross)


# ----------------------------------------------------------------------------- merge

MERGE = [
    dict(name="chain32", seed=114, impl="fla-triton", dtype="float32", counts=[1, 4, 32], HV=1,
         K=32, V=32, h0=True, fs=False, svf=False),
    dict(name="svf_no_h0", seed=115, impl="fla-triton", dtype="float32", counts=[2, 1, 3, 6],
         HV=2, K=32, V=48, h0=False, fs=False, svf=True),
    dict(name="final_f64", seed=116, impl="torch-f64-spec", dtype="float64",
         counts=[3, 0, 1, 8], HV=1, K=32, V=32, h0=True, fs=True, svf=False),
]

MERGE_SUB_LEN, MERGE_BT = 32, 16


def merge_case(ctx, c):
    counts = c["counts"]
    nsub = sum(counts)
    cu = [MERGE_SUB_LEN * i for i in range(nsub + 1)]
    rec = recurrence_inputs(c["seed"], 1, cu[-1], c["HV"], c["HV"], c["K"], c["V"], cu,
                            MERGE_BT, "gk", "float64")
    hm = M.pre_scan(rec["k"], rec["w"], rec["u"], None, rec["gk"], torch.tensor(cu), MERGE_BT)
    hm = hm.to(DT[c["dtype"]])
    offs = [0]
    for m in counts:
        offs.append(offs[-1] + m)
    inp = {"hm": hm, "subseq_offsets": torch.tensor(offs, dtype=torch.int32)}
    svf = c["svf"]
    if c["h0"]:
        shape = ((len(counts), c["HV"], c["V"], c["K"]) if svf
                 else (len(counts), c["HV"], c["K"], c["V"]))
        inp["initial_state"] = randn(gen(c["seed"] + 3000), *shape).to(DT[c["dtype"]])
    r_init, r_fs = M.merge(hm, offs, inp.get("initial_state"), svf)
    ref = {"initial_states": r_init, "final_state": r_fs}
    keep = ["initial_states"] + (["final_state"] if c["fs"] else [])
    if c["impl"] == "fla-triton":
        outs = {"initial_states": fla_merge(hm, counts, offs, inp.get("initial_state"), svf,
                                            c)}
        src = provenance("fla-triton", c["seed"],
                         "fla.ops.common.intracard_cp.intracard_merge (every sequence split; "
                         "first pieces take initial_state or 0)", ctx.device_name,
                         inputs="hm = float64 pre-scan of realistic KDA inputs (32-token "
                                "sub-sequences, BT=16), rounded to fp32")
    else:
        outs = {key: ref[key].clone() for key in keep}
        src = provenance("torch-f64-spec", c["seed"], "delta_math.merge", "cpu")
    ref = {key: ref[key] for key in keep}
    t = {"float32": 2e-5, "float64": 1e-10}[c["dtype"]]
    thr = {key: t for key in keep}
    desc = (f"{c['impl']} {c['dtype']} counts={counts} HV={c['HV']} K={c['K']} V={c['V']}"
            + (", h0" if c["h0"] else ", no h0") + (", fs" if c["fs"] else "")
            + (", state_v_first" if svf else ""))
    return Case(op="fwd_h_merge", name=c["name"], inputs=inp,
                params={"state_v_first": svf, "output_final_state": c["fs"]}, outputs=outs,
                oracle=ref, threshold=thr, tolerance=thr, source=src, description=desc)


def fla_merge(hm, counts, offs, h0, svf, c):
    """FLA's `intracard_merge` with every sequence declared split (10.3)."""
    from fla.ops.common.intracard_cp import SplitSeqInfo, intracard_merge

    n = len(counts)
    init_offs = [0]
    for m in counts:
        init_offs.append(init_offs[-1] + max(m - 1, 0))
    info = SplitSeqInfo(split_seq_ids=list(range(n)), start_subseq_idx=offs[:-1],
                        num_subseqs=list(counts))
    with torch.no_grad():
        merged, num = intracard_merge(hm.cuda(), info, init_offs[-1], list(offs), init_offs,
                                      torch.device("cuda"), initial_state=cuda(h0),
                                      state_v_first=svf)
    merged = merged.cpu()
    shape = (c["HV"], c["V"], c["K"]) if svf else (c["HV"], c["K"], c["V"])
    out = torch.zeros(sum(counts), *shape, dtype=torch.float32)
    for i in range(n):
        if counts[i] == 0:
            continue
        out[offs[i]] = h0[i] if h0 is not None else 0.0
        out[offs[i] + 1:offs[i + 1]] = merged[init_offs[i]:init_offs[i + 1]]
    return out


# ----------------------------------------------------------------------------- kda_intra

INTRA = [
    dict(name="bf16_gva_bt64", seed=120, impl="fla-triton", dtype="bfloat16", T=100, H=1, HV=2,
         K=64, V=64, BT=64, n=1, p=0.5),
    dict(name="bf16_safe_gate_bt32", seed=121, impl="fla-triton", dtype="bfloat16", T=100, H=1,
         HV=2, K=64, V=64, BT=32, safe=True),
    dict(name="fp16_varlen_k60", seed=122, impl="fla-triton", dtype="float16",
         cu=[0, 15, 100, 200], H=1, HV=2, K=60, V=60, BT=32),
    dict(name="fp32_k100", seed=123, impl="fla-triton", dtype="float32", T=64, H=1, HV=1,
         K=100, V=100, BT=64),
]


def intra_case(ctx, c):
    b = c.get("B", 1)
    t = c["cu"][-1] if c.get("cu") else c["T"]
    cut = cu_tensor(c.get("cu"))
    d = draw(c["seed"], b, t, c["H"], c["HV"], c["K"], c["V"], n=c.get("n", 1),
             p=c.get("p", 0.0), safe=c.get("safe", False))
    dt = DT[c["dtype"]]
    G = M.chunk_local_cumsum(d["g"], c["BT"], cut, RCP_LN2).float()
    inp = {"q": d["q"].to(dt), "k": d["k"].to(dt), "v": d["v"].to(dt), "gk": G,
           "beta": d["beta"].to(dt)}
    if cut is not None:
        inp["cu_seqlens"] = cut
    w, u, kg, aqk, akk = M.kda_intra(inp["q"], inp["k"], inp["v"], G, inp["beta"], None, cut,
                                     c["BT"])
    ref = {"w": w, "u": u, "kg": kg, "Aqk": aqk, "Akk": akk}
    from fla.ops.kda.chunk_intra import chunk_kda_fwd_intra

    with torch.no_grad():
        fw, fu, _, fkg, faqk, fakk = chunk_kda_fwd_intra(
            q=cuda(inp["q"]), k=cuda(inp["k"]), v=cuda(inp["v"]), gk=cuda(G),
            beta=cuda(inp["beta"]), scale=c["K"] ** -0.5, cu_seqlens=cuda(cut),
            chunk_size=c["BT"], safe_gate=c.get("safe", False))
    faqk = torch.where(upper_mask(b, t, c["HV"], c["BT"], cut), faqk.cpu(),
                       torch.zeros((), dtype=faqk.dtype))
    outs = {"w": fw.cpu(), "u": fu.cpu(), "kg": fkg.cpu(), "Aqk": faqk, "Akk": fakk.cpu()}
    tv = {"half": 5e-3, "float32": 2e-3}[cls(c["dtype"])]
    thr = {key: tv for key in outs}
    src = provenance("fla-triton", c["seed"], "fla.ops.kda.chunk_intra.chunk_kda_fwd_intra "
                     "(Aqk entries j > r zeroed)", ctx.device_name)
    params = {"scale": None, "chunk_size": c["BT"], "safe_gate": c.get("safe", False)}
    extra = (f"g n={c.get('n', 1)} p={c.get('p', 0.0)}" + (" safe_gate" if c.get("safe") else ""))
    return Case(op="kda_intra", name=c["name"], inputs=inp, params=params, outputs=outs,
                oracle=ref, threshold=thr, tolerance=thr, source=src,
                description=describe(c, extra))


def upper_mask(b, t, hv, bt, cu):
    """`[B, T, HV, BT]` mask that keeps column `j <= r` (r = the token's row in its chunk)."""
    r = torch.zeros(b, t, dtype=torch.long)
    for bi, bos, eos in M.seq_ranges(b, t, cu):
        pos = torch.arange(eos - bos)
        r[bi, bos:eos] = pos % bt
    j = torch.arange(bt)
    return (j[None, None, None, :] <= r[:, :, None, None]).expand(b, t, hv, bt)


# ----------------------------------------------------------------------------- kda_fwd / gdn_fwd

KDA_FWD = [
    dict(name="bf16_b2_t63", seed=124, impl="fla-triton", dtype="bfloat16", B=2, T=63, H=2,
         HV=2, K=64, V=64, BT=64, h0=True, fs=True),
    dict(name="fp16_varlen_l2norm_hardforget", seed=125, impl="fla-triton", dtype="float16",
         cu=[0, 15, 100, 300, 412], H=2, HV=2, K=32, V=32, BT=64, l2=True, hard_forget=True,
         h0=True, fs=True),
    dict(name="bf16_gva_softplus_bt32", seed=126, impl="fla-triton", dtype="bfloat16", T=160,
         H=1, HV=4, K=32, V=32, BT=32, gate=True, h0=True, fs=True),
    dict(name="bf16_lowerbound_safe", seed=127, impl="fla-triton", dtype="bfloat16", T=130, H=2,
         HV=2, K=32, V=32, BT=64, gate=True, lower_bound=-5.0, a_log=False, safe=True,
         fs=True),
    dict(name="bf16_negeig_svf", seed=128, impl="fla-triton", dtype="bfloat16", T=100, H=2,
         HV=2, K=32, V=32, BT=64, beta_sigmoid=True, neg_eig=True, svf=True, h0=True, fs=True),
    dict(name="bf16_t1000_slow", seed=129, impl="fla-triton", dtype="bfloat16", T=1000, H=1,
         HV=1, K=32, V=32, BT=64, n=10, h0=True, fs=True),
    dict(name="fp32_k100_v60", seed=130, impl="fla-triton", dtype="float32", T=77, H=1, HV=1,
         K=100, V=60, BT=32, h0=True, fs=True),
    dict(name="naive_f64_gva", seed=131, impl="torch-f64-spec", dtype="float64", T=77, H=1,
         HV=2, K=60, V=40, h0=True, fs=True),
    dict(name="naive_f64_varlen_gate", seed=132, impl="torch-f64-spec", dtype="float64",
         cu=[0, 1, 63, 128, 135], H=1, HV=2, K=32, V=32, l2=True, gate=True, h0=True, fs=True),
    dict(name="bf16_long_memory_t2053", seed=140, impl="fla-triton", dtype="bfloat16", T=2053,
         H=1, HV=2, K=64, V=64, BT=64, long=True, h0=True, fs=True),
    dict(name="naive_f64_lowerbound", seed=133, impl="torch-f64-spec", dtype="float64", T=50,
         H=1, HV=1, K=32, V=32, BT=32, gate=True, lower_bound=-5.0, fs=True),
]

GDN_FWD = [
    dict(name="fp16_t75", seed=134, impl="fla-triton", dtype="float16", T=75, H=2, HV=2, K=64,
         V=64, BT=64, n=1, p=0.5, h0=True, fs=True),
    dict(name="bf16_gva_bt16_l2norm", seed=135, impl="fla-triton", dtype="bfloat16", T=100,
         H=1, HV=2, K=64, V=64, BT=16, l2=True, fs=True),
    dict(name="bf16_varlen_bt32_svf", seed=136, impl="fla-triton", dtype="bfloat16",
         cu=[0, 31, 96, 160], H=2, HV=2, K=32, V=32, BT=32, svf=True, h0=True, fs=True),
    dict(name="fp32_k100_v60", seed=137, impl="fla-triton", dtype="float32", T=63, H=1, HV=1,
         K=100, V=60, BT=32, h0=True, fs=True),
    dict(name="naive_f64_gva", seed=138, impl="torch-f64-spec", dtype="float64", T=77, H=1,
         HV=2, K=60, V=40, h0=True, fs=True),
    dict(name="bf16_long_memory_t2053", seed=141, impl="fla-triton", dtype="bfloat16", T=2053,
         H=1, HV=2, K=64, V=64, BT=64, long=True, h0=True, fs=True),
    dict(name="naive_f64_varlen", seed=139, impl="torch-f64-spec", dtype="float64",
         cu=[0, 15, 79, 80], H=1, HV=1, K=32, V=32, h0=True, fs=True),
]


def fwd_case(ctx, c, gdn: bool):
    op = "gdn_fwd" if gdn else "kda_fwd"
    b = c.get("B", 1)
    t = c["cu"][-1] if c.get("cu") else c["T"]
    cut = cu_tensor(c.get("cu"))
    svf = c.get("svf", False)
    d = draw(c["seed"], b, t, c["H"], c["HV"], c["K"], c["V"], n=c.get("n", 1),
             p=c.get("p", 0.0), hard_forget=c.get("hard_forget", False),
             long_memory=c.get("long", False),
             safe=c.get("safe", False), l2_in_kernel=c.get("l2", False),
             gate_in_kernel=c.get("gate", False), beta_sigmoid=c.get("beta_sigmoid", False),
             scalar_gate=gdn, nseq=n_seqs(b, c.get("cu")), h0=c.get("h0", False), svf=svf,
             with_a_log=c.get("a_log", True))
    dt = DT[c["dtype"]]
    f64 = c["dtype"] == "float64"
    inp = {"q": d["q"].to(dt), "k": d["k"].to(dt), "v": d["v"].to(dt),
           "g": d["g"].double() if f64 else d["g"].float(),
           "beta": d["beta"].double() if f64 else d["beta"].to(dt)}
    for key in ("A_log", "dt_bias"):
        if key in d:
            inp[key] = d[key].double() if f64 else d[key]
    if "initial_state" in d:
        inp["initial_state"] = d["initial_state"].double() if f64 else d["initial_state"]
    if cut is not None:
        inp["cu_seqlens"] = cut
    opts = dict(use_qk_l2norm_in_kernel=c.get("l2", False))
    if not gdn:
        opts.update(use_gate_in_kernel=c.get("gate", False), lower_bound=c.get("lower_bound"),
                    use_beta_sigmoid_in_kernel=c.get("beta_sigmoid", False),
                    allow_neg_eigval=c.get("neg_eig", False), safe_gate=c.get("safe", False))
    q, k, a, beta = M.kda_preprocess(
        inp["q"], inp["k"], inp["g"] if not gdn else inp["g"][..., None].expand(
            *inp["g"].shape, c["K"]), inp["beta"],
        use_qk_l2norm_in_kernel=opts["use_qk_l2norm_in_kernel"],
        use_gate_in_kernel=opts.get("use_gate_in_kernel", False), A_log=inp.get("A_log"),
        dt_bias=inp.get("dt_bias"), lower_bound=opts.get("lower_bound"),
        use_beta_sigmoid_in_kernel=opts.get("use_beta_sigmoid_in_kernel", False),
        allow_neg_eigval=opts.get("allow_neg_eigval", False))
    r_o, r_fs = M.kda_recurrent(q, k, inp["v"], a, beta, None, inp.get("initial_state"), cut,
                                svf)
    ref = {"o": r_o, "final_state": r_fs}
    keep = ["o"] + (["final_state"] if c.get("fs") else [])
    ref = {key: ref[key] for key in keep}
    cross = []
    params = {"scale": None, "output_final_state": c.get("fs", False), **opts,
              "state_v_first": svf}
    if c.get("BT"):
        params["chunk_size"] = c["BT"]
    if c["impl"] == "fla-triton":
        outs = fla_forward(inp, c, gdn, opts, svf)
        fn = ("fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule" if gdn
              else "fla.ops.kda.chunk.chunk_kda")
        src = provenance("fla-triton", c["seed"], fn, ctx.device_name)
    else:
        outs = {key: ref[key].clone() for key in keep}
        src = provenance("torch-f64-spec", c["seed"], "delta_math.kda_recurrent" +
                         (" (gate broadcast along K)" if gdn else ""), "cpu")
        n_o, n_fs = naive_reference(q, k, inp["v"], a, beta, inp.get("initial_state"), cut,
                                    gdn, svf)
        cross.append(("f64 transcription o vs FLA naive recurrence (fp32)", r_o, n_o, 1e-5))
        if c.get("fs"):
            cross.append(("f64 transcription final_state vs FLA naive (fp32)", r_fs, n_fs, 1e-5))
    cl = cls(c["dtype"])
    tv = {"half": 5e-3, "float32": 2e-3, "float64": 1e-10}[cl]
    if cl == "half" and c.get("long") and t >= 1024:  # "long" of conformance/spec/ops-delta-rule.md 6.8
        tv = 1e-2
    thr = {key: tv for key in keep}
    extra = ", ".join(x for x in [
        ("g ~ U[-1e-3, 0] (long memory)" if c.get("long")
         else f"g n={c.get('n', 1)} p={c.get('p', 0.0)}") if not c.get("gate") else "",
        "l2norm in kernel" if c.get("l2") else "", "hard forget" if c.get("hard_forget") else "",
        ("gate in kernel " + ("softplus" if c.get("lower_bound") is None
                              else f"lower_bound={c['lower_bound']}")
         + ("" if c.get("a_log", True) else " no A_log")) if c.get("gate") else "",
        "beta sigmoid in kernel" if c.get("beta_sigmoid") else "",
        "allow_neg_eigval" if c.get("neg_eig") else "", "safe_gate" if c.get("safe") else "",
        "state_v_first" if svf else "", "h0" if c.get("h0") else "",
        "fs" if c.get("fs") else ""] if x)
    return Case(op=op, name=c["name"], inputs=inp, params=params, outputs=outs, oracle=ref,
                threshold=thr, tolerance=thr, source=src, description=describe(c, extra),
                cross=cross)


def fla_forward(inp, c, gdn, opts, svf):
    kw = dict(q=cuda(inp["q"]), k=cuda(inp["k"]), v=cuda(inp["v"]), g=cuda(inp["g"]),
              beta=cuda(inp["beta"]), scale=None, initial_state=cuda(inp.get("initial_state")),
              output_final_state=c.get("fs", False), state_v_first=svf,
              cu_seqlens=cuda(inp.get("cu_seqlens")), chunk_size=c["BT"], **opts)
    with torch.no_grad():
        if gdn:
            from fla.ops.gated_delta_rule.chunk import chunk_gated_delta_rule

            o, fs = chunk_gated_delta_rule(**kw)
        else:
            from fla.ops.kda.chunk import chunk_kda

            if "A_log" in inp:
                kw["A_log"] = cuda(inp["A_log"])
            if "dt_bias" in inp:
                kw["dt_bias"] = cuda(inp["dt_bias"])
            o, fs = chunk_kda(**kw)
    outs = {"o": o.cpu()}
    if c.get("fs"):
        outs["final_state"] = fs.cpu()
    return outs


def naive_reference(q, k, v, a, beta, h0, cu, gdn, svf):
    """FLA's naive recurrences (fp32 inside) per sequence on the preprocessed inputs."""
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
    from fla.ops.kda.naive import naive_recurrent_kda

    bsz, t, h, kdim = q.shape
    hv, vdim = v.shape[2], v.shape[3]
    kh = M.kh_index(h, hv)
    h0k = M.key_first(h0, svf)
    o = torch.zeros(bsz, t, hv, vdim, dtype=torch.float32)
    fs = []
    for n, (b, bos, eos) in enumerate(M.seq_ranges(bsz, t, cu)):
        sl = slice(bos, eos)
        s0 = None if h0k is None else h0k[n:n + 1].float()
        if bos == eos:
            fs.append(s0[0] if s0 is not None else torch.zeros(hv, kdim, vdim))
            continue
        args = [x[b:b + 1, sl].float() for x in (q, k, v, a, beta)]
        if gdn:
            qq, kk = args[0][:, :, kh], args[1][:, :, kh]
            on, sn = naive_recurrent_gated_delta_rule(qq, kk, args[2], args[4], args[3][..., 0],
                                                      initial_state=s0, output_final_state=True)
        else:
            on, sn = naive_recurrent_kda(*args, initial_state=s0, output_final_state=True)
        o[b, sl] = on[0].float()
        fs.append(sn[0].float())
    return o, M.key_first(torch.stack(fs), svf)


# ----------------------------------------------------------------------------- registration

def _register(op, table, build):
    for c in table:
        def make(c=c):
            @case(op, c["name"], needs_cuda=(c["impl"] == "fla-triton"))
            def _build(ctx: Ctx):
                return build(ctx, c)
        make()


_register("chunk_gated_delta_rule_fwd_h", FWD_H, lambda ctx, c: fwd_h_case(ctx, c))
_register("fwd_h_pre_scan", PRE_SCAN, pre_scan_case)
_register("fwd_h_merge", MERGE, merge_case)
_register("chunk_gated_delta_rule_fwd_h_split", SPLIT,
          lambda ctx, c: fwd_h_case(ctx, c, split=True))
_register("kda_intra", INTRA, intra_case)
_register("kda_fwd", KDA_FWD, lambda ctx, c: fwd_case(ctx, c, gdn=False))
_register("gdn_fwd", GDN_FWD, lambda ctx, c: fwd_case(ctx, c, gdn=True))
