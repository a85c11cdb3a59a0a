"""Float64 transcriptions of `conformance/spec/ops-delta-rule.md` (source `torch-f64-spec`).

Notation of the spec: sequences `(b, bos, eos)`, chunks of `BT` rows restarting at every
sequence start, value head `hv` reading key head `kh(hv) = hv // (HV // H)`, gates `G` as
chunk-local cumulative sums in log2 units (`exp2`), states `S` key-first `K x V`.

- `fwd_h` (2.4):  h[c] = S;  D = U_c - W_c S;  S <- gamma diag(lambda) S + sum_r k_r (a_r D_r)^T
- `pre_scan` (3.1): A_c = gamma diag(lambda) - Kt_c^T W_c, M = A_{m-1}...A_0, b = fwd_h from 0
- `merge` (4.4):  X <- M_j X + b_j along the sub-sequences of each sequence
- `kda_intra` (7.4): Aqk, L, Akk = (I + L)^-1, w, u, kg
- `kda_recurrent` (6.4) / GDN (8.4, the gate broadcast along K):
      S <- diag(exp(a_t)) S;  delta = beta_t (v_t - S^T k_t);  S <- S + k_t delta^T;
      o_t = scale S^T q_t
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

RCP_LN2_EXACT = 1.0 / math.log(2.0)


def kh_index(h: int, hv: int) -> torch.Tensor:
    return torch.arange(hv) // (hv // h)


def seq_ranges(b: int, t: int, cu):
    """(batch row, bos, eos) of every sequence."""
    if cu is None:
        return [(i, 0, t) for i in range(b)]
    c = [int(x) for x in cu]
    return [(0, c[n], c[n + 1]) for n in range(len(c) - 1)]


def chunk_ranges(bos: int, eos: int, bt: int):
    return [(s, min(s + bt, eos)) for s in range(bos, eos, bt)]


def total_chunks(b, t, cu, bt):
    """`NT` of the `h` layout: per batch row without varlen, all chunks with it."""
    if cu is None:
        return -(-t // bt)
    return sum(len(chunk_ranges(s, e, bt)) for _, s, e in seq_ranges(b, t, cu))


def key_first(x, svf):
    return x.transpose(-1, -2) if (x is not None and svf) else x


def chunk_local_cumsum(g, bt, cu, scale):
    """`chunk_local_cumsum` along dim 1 in float64."""
    g = g.double()
    o = torch.zeros_like(g)
    for b, bos, eos in seq_ranges(g.shape[0], g.shape[1], cu):
        for s, e in chunk_ranges(bos, eos, bt):
            o[b, s:e] = torch.cumsum(g[b, s:e], 0)
    return o * scale if scale is not None else o


def _chunk_step_factors(g, gk, b, s, e, hv, kdim):
    """(decay [HV,K], a [n,HV]) of one chunk: gamma*lambda and exp2(G_l - G_r)."""
    n = e - s
    decay = torch.ones(hv, kdim, dtype=torch.float64)
    a = torch.ones(n, hv, dtype=torch.float64)
    if g is not None:
        gc = g[b, s:e].double()
        decay = decay * torch.exp2(gc[-1])[:, None]
        a = torch.exp2(gc[-1][None, :] - gc)
    if gk is not None:
        decay = decay * torch.exp2(gk[b, e - 1].double())
    return decay, a


def fwd_h(k, w, u, g=None, gk=None, initial_state=None, cu=None, bt=64, state_v_first=False):
    """`chunk_gated_delta_rule_fwd_h` (section 2.4): returns `(h, v_new, final_state)`."""
    k, w, u = k.double(), w.double(), u.double()
    bsz, t, h, kdim = k.shape
    hv, vdim = u.shape[2], u.shape[3]
    kh = kh_index(h, hv)
    seqs = seq_ranges(bsz, t, cu)
    nt = total_chunks(bsz, t, cu, bt)
    hout = torch.zeros(bsz if cu is None else 1, nt, hv, kdim, vdim, dtype=torch.float64)
    v_new = torch.zeros_like(u)
    fs = torch.zeros(len(seqs), hv, kdim, vdim, dtype=torch.float64)
    h0 = key_first(initial_state, state_v_first)
    ci = 0
    for n, (b, bos, eos) in enumerate(seqs):
        S = h0[n].double().clone() if h0 is not None else torch.zeros(hv, kdim, vdim,
                                                                      dtype=torch.float64)
        for c, (s, e) in enumerate(chunk_ranges(bos, eos, bt)):
            hout[b, c if cu is None else ci] = S
            ci += 1
            kc = k[b, s:e][:, kh]
            d = u[b, s:e] - torch.einsum("rhk,hkv->rhv", w[b, s:e], S)
            v_new[b, s:e] = d
            decay, a = _chunk_step_factors(g, gk, b, s, e, hv, kdim)
            S = decay[:, :, None] * S + torch.einsum("rhk,rhv->hkv", kc, a[..., None] * d)
        fs[n] = S
    return key_first(hout, state_v_first), v_new, key_first(fs, state_v_first)


def pre_scan(k, w, u, g=None, gk=None, cu=None, bt=64):
    """`fwd_h_pre_scan` (section 3): `hm [S, HV, K, V + K]` = (b | M) per (sub-)sequence."""
    k, w, u = k.double(), w.double(), u.double()
    bsz, t, h, kdim = k.shape
    hv, vdim = u.shape[2], u.shape[3]
    kh = kh_index(h, hv)
    seqs = seq_ranges(bsz, t, cu)
    hm = torch.zeros(len(seqs), hv, kdim, vdim + kdim, dtype=torch.float64)
    eye = torch.eye(kdim, dtype=torch.float64).expand(hv, kdim, kdim)
    for n, (b, bos, eos) in enumerate(seqs):
        M = eye.clone()
        bst = torch.zeros(hv, kdim, vdim, dtype=torch.float64)
        for s, e in chunk_ranges(bos, eos, bt):
            kc = k[b, s:e][:, kh]
            decay, a = _chunk_step_factors(g, gk, b, s, e, hv, kdim)
            kt = kc * a[..., None]
            A = torch.diag_embed(decay) - torch.einsum("rhk,rhj->hkj", kt, w[b, s:e])
            M = A @ M
            d = u[b, s:e] - torch.einsum("rhk,hkv->rhv", w[b, s:e], bst)
            bst = decay[:, :, None] * bst + torch.einsum("rhk,rhv->hkv", kt, d)
        hm[n, :, :, :vdim] = bst
        hm[n, :, :, vdim:] = M
    return hm


def merge(hm, subseq_offsets, initial_state=None, state_v_first=False):
    """`fwd_h_merge` (section 4.4): `(initial_states, final_state)`."""
    hm = hm.double()
    nsub, hv, kdim, vk = hm.shape
    vdim = vk - kdim
    offs = [int(x) for x in subseq_offsets]
    h0 = key_first(initial_state, state_v_first)
    inits = torch.zeros(nsub, hv, kdim, vdim, dtype=torch.float64)
    fs = torch.zeros(len(offs) - 1, hv, kdim, vdim, dtype=torch.float64)
    for n in range(len(offs) - 1):
        X = h0[n].double().clone() if h0 is not None else torch.zeros(hv, kdim, vdim,
                                                                      dtype=torch.float64)
        for j in range(offs[n], offs[n + 1]):
            inits[j] = X
            X = hm[j, :, :, vdim:] @ X + hm[j, :, :, :vdim]
        fs[n] = X
    return key_first(inits, state_v_first), key_first(fs, state_v_first)


def kda_intra(q, k, v, gk, beta, scale=None, cu=None, bt=64):
    """`kda_intra` (section 7.4): `(w, u, kg, Aqk, Akk)`; entries `j > r` of Aqk/Akk are 0."""
    q, k, v, G, beta = q.double(), k.double(), v.double(), gk.double(), beta.double()
    bsz, t, h, kdim = k.shape
    hv, vdim = v.shape[2], v.shape[3]
    kh = kh_index(h, hv)
    if scale is None:
        scale = kdim ** -0.5
    w = torch.zeros(bsz, t, hv, kdim, dtype=torch.float64)
    kg = torch.zeros_like(w)
    u = torch.zeros(bsz, t, hv, vdim, dtype=torch.float64)
    Aqk = torch.zeros(bsz, t, hv, bt, dtype=torch.float64)
    Akk = torch.zeros_like(Aqk)
    for b, bos, eos in seq_ranges(bsz, t, cu):
        for s, e in chunk_ranges(bos, eos, bt):
            n = e - s
            qc = q[b, s:e][:, kh].permute(1, 0, 2)  # [HV, n, K]
            kc = k[b, s:e][:, kh].permute(1, 0, 2)
            gc = G[b, s:e].permute(1, 0, 2)
            bc = beta[b, s:e].permute(1, 0)  # [HV, n]
            vc = v[b, s:e].permute(1, 0, 2)
            tril = torch.ones(n, n, dtype=torch.bool).tril()
            diff = gc[:, :, None, :] - gc[:, None, :, :]  # [HV, r, j, K]
            diff = torch.where(tril[None, :, :, None], diff, torch.tensor(-math.inf,
                                                                           dtype=torch.float64))
            E = torch.exp2(diff)
            aqk = scale * torch.einsum("hrk,hjk,hrjk->hrj", qc, kc, E)
            L = bc[:, :, None] * torch.einsum("hrk,hjk,hrjk->hrj", kc, kc, E)
            L = L * torch.ones(n, n, dtype=torch.float64).tril(-1)
            akk = torch.linalg.inv(torch.eye(n, dtype=torch.float64) + L)
            akk = akk * tril  # exactly lower triangular
            wc = akk @ (bc[..., None] * kc * torch.exp2(gc))
            uc = akk @ (bc[..., None] * vc)
            kgc = kc * torch.exp2(gc[:, -1:, :] - gc)
            w[b, s:e] = wc.permute(1, 0, 2)
            u[b, s:e] = uc.permute(1, 0, 2)
            kg[b, s:e] = kgc.permute(1, 0, 2)
            Aqk[b, s:e, :, :n] = aqk.permute(1, 0, 2)
            Akk[b, s:e, :, :n] = akk.permute(1, 0, 2)
    return w, u, kg, Aqk, Akk


def l2norm(x):
    """`x / sqrt(sum x^2 + 1e-6)` along the last dim (eps inside the root)."""
    x = x.double()
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def kda_gate(g, A_log, dt_bias, lower_bound):
    """`kda_gate` of `conformance/spec/ops-cumsum.md` §4 in float64."""
    hv, kdim = g.shape[-2:]
    a = g.double()
    if dt_bias is not None:
        a = a + dt_bias.double().view(hv, kdim)
    if lower_bound is None:
        return -A_log.double().exp().view(hv, 1) * F.softplus(a)
    if A_log is not None:
        a = A_log.double().exp().view(hv, 1) * a
    return lower_bound * torch.sigmoid(a)


def kda_preprocess(q, k, g, beta, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                   A_log=None, dt_bias=None, lower_bound=None, use_beta_sigmoid_in_kernel=False,
                   allow_neg_eigval=False):
    """Section 6.4 steps 1-3: `(q, k, a, beta)` in float64."""
    q, k = q.double(), k.double()
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    beta = beta.double()
    if use_beta_sigmoid_in_kernel:
        beta = torch.sigmoid(beta) * (2.0 if allow_neg_eigval else 1.0)
    a = kda_gate(g, A_log, dt_bias, lower_bound) if use_gate_in_kernel else g.double()
    return q, k, a, beta


def kda_recurrent(q, k, v, a, beta, scale=None, initial_state=None, cu=None,
                  state_v_first=False):
    """Section 6.4 recurrence on preprocessed inputs (`a` natural-log decays `[B,T,HV,K]`):
    returns `(o, final_state)` in float64."""
    q, k, v, a, beta = q.double(), k.double(), v.double(), a.double(), beta.double()
    bsz, t, h, kdim = q.shape
    hv, vdim = v.shape[2], v.shape[3]
    kh = kh_index(h, hv)
    if scale is None:
        scale = kdim ** -0.5
    seqs = seq_ranges(bsz, t, cu)
    o = torch.zeros(bsz, t, hv, vdim, dtype=torch.float64)
    fs = torch.zeros(len(seqs), hv, kdim, vdim, dtype=torch.float64)
    h0 = key_first(initial_state, state_v_first)
    for n, (b, bos, eos) in enumerate(seqs):
        S = h0[n].double().clone() if h0 is not None else torch.zeros(hv, kdim, vdim,
                                                                      dtype=torch.float64)
        for i in range(bos, eos):
            qt, kt = q[b, i][kh], k[b, i][kh]
            S = torch.exp(a[b, i])[:, :, None] * S
            delta = beta[b, i][:, None] * (v[b, i] - torch.einsum("hkv,hk->hv", S, kt))
            S = S + kt[:, :, None] * delta[:, None, :]
            o[b, i] = scale * torch.einsum("hkv,hk->hv", S, qt)
        fs[n] = S
    return o, key_first(fs, state_v_first)
