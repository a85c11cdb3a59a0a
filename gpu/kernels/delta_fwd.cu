// The fused recurrence and output of `kda_fwd` / `gdn_fwd` (conformance/spec/ops-delta-rule.md 6.5, 8.5):
// one CTA per (sequence, value head, block of BV state columns) carries the state S (K x BV,
// fp32 in mma accumulators) through the chunks and writes o directly; h and v_new never leave
// the chip. Inputs are the intra stage's per-token kg, w, qg (qg carries the scale), u, Aqk and
// the per-chunk decay lam = exp2(G_l) (kda_intra.cu). For every chunk c (n_c valid rows):
//
//   D = U_c - W_c S                    (rounded to T: FLA's v_new)
//   o = diag(qf_c) Qg_c S + Aqk_c D    (S rounded to T, as FLA's stored h; fp32 accumulation;
//                                      qf: fp32 row factors, the scale and GDN's exp2(G_r))
//   S <- diag(lam_c) S + Kg_c^T D
//
// Tensor cores (mma.sync m16n8k16, bf16/f16 operands, fp32 accumulation); the next chunk's
// tiles are loaded by cp.async into the second buffer while the current one computes.
//
// A CTA runs one piece of a sequence (conformance/spec/ops-delta-rule.md 5.9-5.10) as
// delta_fused_gdn does: with w = warm[piece, head] > 0 it starts w chunks before the piece from a
// zero state (from initial_state when that is the sequence's start), computing the state only
// there (no Qg S, Aqk D or stores); with w < 0 an earlier piece's CTA runs through it; the CTA
// that reaches the sequence's end writes the final state. One piece per sequence and no warm
// table: the serial run.


// Rows [0, nc) of a chunk tile into shared memory by cp.async, 16 bytes a copy: SEG segments of
// 8 elements a row (columns c8 < ncols read, the rest and rows nc..rows-1 zero-filled), global
// rows `gstride` elements apart from g, shared rows `srow` bytes apart from s. Thread tid takes
// segment tid % SEG of rows tid / SEG + j · (threads / SEG): its addresses advance by one add a
// copy (the chunk loops' loads were mostly index arithmetic: S12-2 profile).
template <typename T, int SEG>
__device__ __forceinline__ void copy_tile16(unsigned s, unsigned srow, const T* g, i64 gstride, int rows, int nc, int ncols) {
    constexpr int RSTEP = FWDH_THREADS / SEG;
    const int r0 = (int)threadIdx.x / SEG, c8 = ((int)threadIdx.x % SEG) * 8;
    const bool col_ok = c8 < ncols;
    const T* src = g + r0 * gstride + c8;
    const i64 step = RSTEP * gstride;
    unsigned dst = s + r0 * srow + c8 * (unsigned)sizeof(T);
    for (int r = r0; r < rows; r += RSTEP, src += step, dst += RSTEP * srow) {
        const bool ok = col_ok && r < nc;
        cp_async16(dst, ok ? src : g, ok ? 16 : 0);
    }
}

template <typename T, int KP, int BV> struct FusedSmem {
    static constexpr int KPITCH = KP + 8, VPITCH = BV + 8, APITCH = FWDH_BT + 8;
    static constexpr unsigned KROW = KPITCH * sizeof(T), VROW = VPITCH * sizeof(T), AROW = APITCH * sizeof(T);
    T kg[2][FWDH_BT][KPITCH];
    T w[2][FWDH_BT][KPITCH];
    T qg[2][FWDH_BT][KPITCH];
    T u[2][FWDH_BT][VPITCH];
    T aq[2][FWDH_BT][APITCH];
    float lam[2][KP];
    float qf[2][FWDH_BT];
    T s[KP][VPITCH];
    T d[FWDH_BT][VPITCH];
};

// Issues the loads of one chunk (nc rows from packed row row0, chunk index ci) into buffer b;
// rows >= nc and columns beyond K / the block are zero. Always commits one cp.async group.
template <typename T, int KP, int BV>
__device__ __forceinline__ void load_fused(const FusedArgs& a, FusedSmem<T, KP, BV>& sm, int b, i64 row0, int nc, i64 ci,
                                           i64 hv, i64 c0, int nb) {
    const int tid = threadIdx.x, bt = (int)a.bt;
    const i64 ks = a.HV * a.K, us = a.HV * a.V, as = a.HV * a.bt;
    const T* kp = reinterpret_cast<const T*>(a.kg) + row0 * ks + hv * a.K;
    const T* wp = reinterpret_cast<const T*>(a.w) + row0 * ks + hv * a.K;
    const T* qp = reinterpret_cast<const T*>(a.qg) + row0 * ks + hv * a.K;
    const T* up = reinterpret_cast<const T*>(a.u) + row0 * us + hv * a.V + c0;
    const T* ap = reinterpret_cast<const T*>(a.aqk) + row0 * as + hv * a.bt;
    using Sm = FusedSmem<T, KP, BV>;
    if (a.K % 8 == 0) {
        const int k = (int)a.K;
        copy_tile16<T, KP / 8>(smem_u32(&sm.kg[b][0][0]), Sm::KROW, kp, ks, bt, nc, k);
        copy_tile16<T, KP / 8>(smem_u32(&sm.w[b][0][0]), Sm::KROW, wp, ks, bt, nc, k);
        if (a.o != 0) copy_tile16<T, KP / 8>(smem_u32(&sm.qg[b][0][0]), Sm::KROW, qp, ks, bt, nc, k);
    } else {
        for (int i = tid; i < bt * KP; i += FWDH_THREADS) {
            const int r = i / KP, e = i % KP;
            const bool ok = r < nc && e < a.K;
            sm.kg[b][r][e] = ok ? kp[r * ks + e] : T{0};
            sm.w[b][r][e] = ok ? wp[r * ks + e] : T{0};
            if (a.o != 0) sm.qg[b][r][e] = ok ? qp[r * ks + e] : T{0};
        }
    }
    if (a.V % 8 == 0) {
        copy_tile16<T, BV / 8>(smem_u32(&sm.u[b][0][0]), Sm::VROW, up, us, bt, nc, nb);
    } else {
        for (int i = tid; i < bt * BV; i += FWDH_THREADS) {
            const int r = i / BV, e = i % BV;
            sm.u[b][r][e] = (r < nc && e < nb) ? up[r * us + e] : T{0};
        }
    }
    // bt is 16, 32 or 64: columns bt.. of the row are zero-filled (Aqk and qg only for o)
    if (a.o != 0) copy_tile16<T, FWDH_BT / 8>(smem_u32(&sm.aq[b][0][0]), Sm::AROW, ap, as, bt, nc, bt);
    const float* fp = reinterpret_cast<const float*>(a.qf) + row0 * a.HV + hv;
    for (int r = tid; r < bt; r += FWDH_THREADS) cp_async4(smem_u32(&sm.qf[b][r]), fp + (r < nc ? r * a.HV : 0), r < nc ? 4 : 0);
    const float* lp = reinterpret_cast<const float*>(a.lam) + (ci * a.HV + hv) * a.K;
    if (a.K % 4 == 0) {
        for (int i = tid; i < KP / 4; i += FWDH_THREADS) {
            const bool ok = i * 4 < a.K;
            cp_async16(smem_u32(&sm.lam[b][i * 4]), lp + (ok ? i * 4 : 0), ok ? 16 : 0);
        }
    } else {
        for (int i = tid; i < KP; i += FWDH_THREADS) sm.lam[b][i] = i < a.K ? lp[i] : 0.f;
    }
    cp_async_commit();
}

template <typename T, int KP, int BV>
__device__ __forceinline__ void delta_fused(const FusedArgs& a) {
    using Sm = FusedSmem<T, KP, BV>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Sm& sm = *reinterpret_cast<Sm*>(smem_raw);
    constexpr int NTN = BV / 8;                       // 8-column tiles
    constexpr int SU = (KP / 16) * NTN / FWDH_WARPS;  // state tiles per warp
    constexpr int TPM = SU < NTN ? SU : NTN;          // column tiles per key tile of a warp
    constexpr int MPW = SU / TPM;                     // key tiles per warp
    constexpr int DT = (FWDH_BT / 16) * NTN;          // chunk tiles (16 x 8) of D and o
    constexpr int DUMAX = DT / FWDH_WARPS > 0 ? DT / FWDH_WARPS : 1;
    constexpr unsigned KROW = Sm::KROW, VROW = Sm::VROW, AROW = Sm::AROW;
    constexpr unsigned KSTAGE = FWDH_BT * KROW, ASTAGE = FWDH_BT * AROW;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, t4 = lane & 3;

    const i64 c0 = (i64)blockIdx.y * BV;
    const int nb = (int)min((i64)BV, a.V - c0);
    PieceRun pr;
    if (!piece_run(a, pr)) return;
    const i64 hv = pr.hv, seq0 = pr.seq0, seqend = pr.seqend, n = pr.n, w = pr.w, row0 = pr.row0, end = pr.end;
    const int bt = (int)a.bt;
    const i64 len = end - row0;
    const i64 cbase = reinterpret_cast<const i64*>(a.seqs)[n * 3 + 2] + (row0 - seq0) / bt;  // lam row of row0
    const bool from_start = row0 == seq0, to_end = end == seqend;
    const i64 nchunks = (len + bt - 1) / bt;
    const bool pair_ok = (a.V % 2) == 0;
    const i64 os = a.HV * a.V;

    const unsigned w_s = smem_u32(&sm.w[0][0][0]), k_s = smem_u32(&sm.kg[0][0][0]), q_s = smem_u32(&sm.qg[0][0][0]);
    const unsigned a_s = smem_u32(&sm.aq[0][0][0]), s_s = smem_u32(&sm.s[0][0]), d_s = smem_u32(&sm.d[0][0]);
    const unsigned a1_lane = (lane & 15) * KROW + (lane >> 4) * 16;                        // W, Qg rows
    const unsigned a2_lane = ((lane & 7) + (lane >> 4) * 8) * KROW + ((lane >> 3) & 1) * 16;  // Kg^T
    const unsigned a3_lane = (lane & 15) * AROW + (lane >> 4) * 16;                        // Aqk rows
    const unsigned b_lane = (lane & 15) * VROW;                                            // S, D rows

    auto rows_of = [&](i64 c) { return (int)max((i64)0, min((i64)bt, len - c * bt)); };

    float s[SU][4];
#pragma unroll
    for (int j = 0; j < SU; ++j) {
        const int u = warp * SU + j, mt = u / NTN, nt = u % NTN;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = mt * 16 + gid + (e >> 1) * 8, c = nt * 8 + t4 * 2 + (e & 1);
            float v = 0.f;
            if (a.h0 != 0 && from_start && r < a.K && c < nb) {
                const i64 base = (n * a.HV + hv) * a.K * a.V;
                v = load_f(reinterpret_cast<const void*>(a.h0), a.h0_dtype, base + (a.v_first ? (c0 + c) * a.K + r : r * a.V + c0 + c));
            }
            s[j][e] = v;
        }
    }
    if (nchunks > 0) load_fused<T, KP, BV>(a, sm, 0, row0, rows_of(0), cbase, hv, c0, nb);

    for (i64 c = 0; c < nchunks; ++c) {
        const int buf = (int)(c & 1);
        const int nc = rows_of(c);
        // 1. the rounded state into shared memory
#pragma unroll
        for (int j = 0; j < SU; ++j) {
            const int u = warp * SU + j, mt = u / NTN, nt = u % NTN;
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
                const int r = mt * 16 + gid + h2 * 8, col = nt * 8 + t4 * 2;
                *reinterpret_cast<Vec<T, 2>*>(&sm.s[r][col]) = pack2<T>(s[j][2 * h2], s[j][2 * h2 + 1]);
            }
        }
        cp_async_wait_all();
        __syncthreads();  // chunk c's tiles and the rounded state are visible
        if (c + 1 < nchunks) load_fused<T, KP, BV>(a, sm, buf ^ 1, row0 + (c + 1) * bt, rows_of(c + 1), cbase + c + 1, hv, c0, nb);
        // 2. the decay of the state (registers; the products below read the rounded copy)
#pragma unroll
        for (int jm = 0; jm < MPW; ++jm) {
            const int mt = (warp * SU + jm * TPM) / NTN;
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
                const float f = sm.lam[buf][mt * 16 + gid + h2 * 8];
#pragma unroll
                for (int jn = 0; jn < TPM; ++jn) {
                    s[jm * TPM + jn][2 * h2] *= f;
                    s[jm * TPM + jn][2 * h2 + 1] *= f;
                }
            }
        }
        const bool out = c >= w && a.o != 0;  // a chunk of the piece itself with o asked (else: state only)
        // 3. W S and Qg S over this warp's chunk tiles (two accumulators each: even and odd key
        //    steps, so that the dependent chains are half as long)
        const int ntiles = (bt / 16) * NTN;
        float dacc[DUMAX][2][4], oacc[DUMAX][2][4];
#pragma unroll
        for (int j = 0; j < DUMAX; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) dacc[j][0][e] = dacc[j][1][e] = oacc[j][0][e] = oacc[j][1][e] = 0.f;
#pragma unroll
        for (int j = 0; j < DUMAX; ++j) {
            const int u = warp + j * FWDH_WARPS;
            if (u < ntiles) {
                const int mt = u / NTN, nt = u % NTN;
                const unsigned aw = w_s + buf * KSTAGE + a1_lane + mt * 16 * KROW;
                const unsigned aqq = q_s + buf * KSTAGE + a1_lane + mt * 16 * KROW;
                const unsigned bs = s_s + b_lane + nt * 16;
#pragma unroll
                for (int kk = 0; kk < KP / 16; ++kk) {
                    unsigned af[4], qf[4], bf[2];
                    ldsm_x2_t(bf, bs + kk * 16 * VROW);
                    ldsm_x4(af, aw + kk * 32);
                    ldsm_x4(qf, aqq + kk * 32);
                    Mma<T>::run(dacc[j][kk & 1], af, bf);
                    if (out) Mma<T>::run(oacc[j][kk & 1], qf, bf);
                }
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    dacc[j][0][e] += dacc[j][1][e];
                    oacc[j][0][e] += oacc[j][1][e];
                }
            }
        }
        // 4. D = U - W S, rounded into shared memory (zero beyond the valid rows)
#pragma unroll
        for (int j = 0; j < DUMAX; ++j) {
            const int u = warp + j * FWDH_WARPS;
            if (u < ntiles) {
                const int mt = u / NTN, nt = u % NTN;
#pragma unroll
                for (int h2 = 0; h2 < 2; ++h2) {
                    const int r = mt * 16 + gid + h2 * 8, col = nt * 8 + t4 * 2;
                    const Vec<T, 2> uu = *reinterpret_cast<const Vec<T, 2>*>(&sm.u[buf][r][col]);
                    const bool valid = r < nc;
                    const float d0 = valid ? widen(uu.v[0]) - dacc[j][0][2 * h2] : 0.f;
                    const float d1 = valid ? widen(uu.v[1]) - dacc[j][0][2 * h2 + 1] : 0.f;
                    *reinterpret_cast<Vec<T, 2>*>(&sm.d[r][col]) = pack2<T>(d0, d1);
                }
            }
        }
        __syncthreads();  // D is visible
        // 5. o = diag(qf) o + Aqk D (Aqk is lower triangular: key steps up to the tile's own
        //    rows), stored
        T* orow = reinterpret_cast<T*>(a.o) + ((row0 + c * bt) * a.HV + hv) * a.V + c0;
#pragma unroll
        for (int j = 0; j < DUMAX; ++j) {
            const int u = warp + j * FWDH_WARPS;
            if (u < ntiles && out) {
                const int mt = u / NTN, nt = u % NTN;
                const unsigned aa = a_s + buf * ASTAGE + a3_lane + mt * 16 * AROW;
#pragma unroll
                for (int e = 0; e < 4; ++e) oacc[j][0][e] *= sm.qf[buf][mt * 16 + gid + (e >> 1) * 8];
                for (int js = 0; js <= mt; ++js) {
                    unsigned af[4], bf[2];
                    ldsm_x4(af, aa + js * 32);
                    ldsm_x2_t(bf, d_s + b_lane + nt * 16 + js * 16 * VROW);
                    Mma<T>::run(oacc[j][0], af, bf);
                }
#pragma unroll
                for (int h2 = 0; h2 < 2; ++h2) {
                    const int r = mt * 16 + gid + h2 * 8, col = nt * 8 + t4 * 2;
                    if (r < nc) store_pair<T>(orow + r * os + col, col, nb, pair_ok, oacc[j][0][2 * h2], oacc[j][0][2 * h2 + 1]);
                }
            }
        }
        // 6. S += Kg^T D
        const unsigned kbuf = k_s + buf * KSTAGE + a2_lane;
#pragma unroll
        for (int ks = 0; ks < FWDH_BT / 16; ++ks) {
            if (ks * 16 < bt) {
#pragma unroll
                for (int jm = 0; jm < MPW; ++jm) {
                    const int mt = (warp * SU + jm * TPM) / NTN;
                    unsigned af[4];
                    ldsm_x4_t(af, kbuf + mt * 32 + ks * 16 * KROW);
#pragma unroll
                    for (int jn = 0; jn < TPM; ++jn) {
                        const int nt = (warp * SU + jm * TPM + jn) % NTN;
                        unsigned bf[2];
                        ldsm_x2_t(bf, d_s + b_lane + nt * 16 + ks * 16 * VROW);
                        Mma<T>::run(s[jm * TPM + jn], af, bf);
                    }
                }
            }
        }
        // the next step's barrier orders these reads before the buffers are overwritten
    }
    if (a.ht != 0 && to_end) {
        float* ht = reinterpret_cast<float*>(a.ht) + (n * a.HV + hv) * a.K * a.V;
#pragma unroll
        for (int j = 0; j < SU; ++j) {
            const int u = warp * SU + j, mt = u / NTN, nt = u % NTN;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = mt * 16 + gid + (e >> 1) * 8, col = nt * 8 + t4 * 2 + (e & 1);
                if (r < a.K && col < nb) ht[a.v_first ? (c0 + col) * a.K + r : r * a.V + c0 + col] = s[j][e];
            }
        }
    }
}

#define FUSED_KERNEL(T, TAG, KP, BV) \
    extern "C" __global__ void __launch_bounds__(FWDH_THREADS, 1) delta_fwd_mma_##TAG##_k##KP##_v##BV(const FusedArgs a) { \
        delta_fused<T, KP, BV>(a); \
    }
#define FUSED_KERNELS(T, TAG) \
    FUSED_KERNEL(T, TAG, 64, 16) FUSED_KERNEL(T, TAG, 64, 32) FUSED_KERNEL(T, TAG, 64, 64) \
    FUSED_KERNEL(T, TAG, 128, 16) FUSED_KERNEL(T, TAG, 128, 32) FUSED_KERNEL(T, TAG, 128, 64)

FUSED_KERNELS(bf16, bf16)
FUSED_KERNELS(f16, f16)

// ---------------------------------------------------------------------------------------------
// The lean fused GDN forward (scalar gate; conformance/spec/ops-delta-rule.md 8.5): the intra
// stage writes only Tb = Akk diag(β) (hi + lo in T), Aqk and the chunk-local cumulative gate G
// (log2 units, fp32); this kernel reads the raw (or, with l2norm, normalised) q, k and v. With
// e_r = exp2(G_r), for every chunk (n_c valid rows, l = n_c - 1):
//
//   W  = V - diag(e) K S                   (rounded to T; FLA's u - w S before its Akk product)
//   D  = Tb W = (Tb_hi + Tb_lo) W           (rounded to T: FLA's v_new)
//   o  = scale diag(e) Q S + Aqk D
//   S <- e_l S + Kᵀ D',  D' = diag(exp2(G_l - G_r)) D   (rounded to T)
//
// since Akk diag(β) (V - diag(e) K S) = u - w S for a scalar gate. Warp w computes the chunk
// tiles of row tile w / 2 and column tiles (w % 2) NTN / 2 .. of every product of the chunk
// (one A fragment per key step for all its columns); the state tiles as in delta_fused.
//
// A CTA runs one piece of a sequence (conformance/spec/ops-delta-rule.md 5.9-5.10): with
// w = warm[piece, head] > 0 it starts w chunks before the piece from a zero state (from
// initial_state when that is the sequence's start: then it is the exact prefix), computing the
// state only there; with w < 0 the piece is not warmable for this head and the CTA of an
// earlier piece runs through it; the final state is written by the CTA that reaches the
// sequence's end. Arguments: GdnFusedArgs (pieces.cuh).

template <typename T, int KP, int BV> struct GdnFusedSmem {
    static constexpr int KPITCH = KP + 8, VPITCH = BV + 8, APITCH = FWDH_BT + 8;
    static constexpr unsigned KROW = KPITCH * sizeof(T), VROW = VPITCH * sizeof(T), AROW = APITCH * sizeof(T);
    T k[2][FWDH_BT][KPITCH];
    T q[2][FWDH_BT][KPITCH];
    T v[2][FWDH_BT][VPITCH];
    T tbh[2][FWDH_BT][APITCH];
    T tbl[2][FWDH_BT][APITCH];
    T aq[2][FWDH_BT][APITCH];
    float g[2][FWDH_BT];
    T s[KP][VPITCH];
    T w[FWDH_BT][VPITCH];
    T d[FWDH_BT][VPITCH];
    T dl[FWDH_BT][VPITCH];  // D'
};

// Issues the loads of one chunk (nc rows from packed row row0) into buffer b; rows >= nc and
// columns beyond K / the block are zero. Always commits one cp.async group.
template <typename T, int KP, int BV>
__device__ __forceinline__ void load_gdn(const GdnFusedArgs& a, GdnFusedSmem<T, KP, BV>& sm, int b, i64 row0, int nc, i64 hv,
                                         i64 c0, int nb) {
    const int tid = threadIdx.x, bt = (int)a.bt;
    const i64 qh = hv / (a.HV / a.QH);
    const i64 ks = a.QH * a.K, vs = a.HV * a.V, as = a.HV * a.bt;
    const T* kp = reinterpret_cast<const T*>(a.k) + row0 * ks + qh * a.K;
    const T* qp = reinterpret_cast<const T*>(a.q) + row0 * ks + qh * a.K;
    const T* vp = reinterpret_cast<const T*>(a.v) + row0 * vs + hv * a.V + c0;
    const i64 aoff = row0 * as + hv * a.bt;
    const T* hp = reinterpret_cast<const T*>(a.tbh) + aoff;
    const T* lp = reinterpret_cast<const T*>(a.tbl) + aoff;
    const T* ap = reinterpret_cast<const T*>(a.aqk) + aoff;
    using Sm = GdnFusedSmem<T, KP, BV>;
    if (a.K % 8 == 0) {
        const int k = (int)a.K;
        copy_tile16<T, KP / 8>(smem_u32(&sm.k[b][0][0]), Sm::KROW, kp, ks, bt, nc, k);
        if (a.o != 0) copy_tile16<T, KP / 8>(smem_u32(&sm.q[b][0][0]), Sm::KROW, qp, ks, bt, nc, k);
    } else {
        for (int i = tid; i < bt * KP; i += FWDH_THREADS) {
            const int r = i / KP, e = i % KP;
            const bool ok = r < nc && e < a.K;
            sm.k[b][r][e] = ok ? kp[r * ks + e] : T{0};
            if (a.o != 0) sm.q[b][r][e] = ok ? qp[r * ks + e] : T{0};
        }
    }
    if (a.V % 8 == 0) {
        copy_tile16<T, BV / 8>(smem_u32(&sm.v[b][0][0]), Sm::VROW, vp, vs, bt, nc, nb);
    } else {
        for (int i = tid; i < bt * BV; i += FWDH_THREADS) {
            const int r = i / BV, e = i % BV;
            sm.v[b][r][e] = (r < nc && e < nb) ? vp[r * vs + e] : T{0};
        }
    }
    // bt is 16, 32 or 64: columns bt.. of the rows are zero-filled (Aqk and q only for o)
    copy_tile16<T, FWDH_BT / 8>(smem_u32(&sm.tbh[b][0][0]), Sm::AROW, hp, as, bt, nc, bt);
    copy_tile16<T, FWDH_BT / 8>(smem_u32(&sm.tbl[b][0][0]), Sm::AROW, lp, as, bt, nc, bt);
    if (a.o != 0) copy_tile16<T, FWDH_BT / 8>(smem_u32(&sm.aq[b][0][0]), Sm::AROW, ap, as, bt, nc, bt);
    const float* gp = reinterpret_cast<const float*>(a.g) + row0 * a.HV + hv;
    for (int r = tid; r < bt; r += FWDH_THREADS) cp_async4(smem_u32(&sm.g[b][r]), gp + (r < nc ? r * a.HV : 0), r < nc ? 4 : 0);
    cp_async_commit();
}

template <typename T, int KP, int BV>
__device__ __forceinline__ void delta_fused_gdn(const GdnFusedArgs& a) {
    using Sm = GdnFusedSmem<T, KP, BV>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Sm& sm = *reinterpret_cast<Sm*>(smem_raw);
    constexpr int NTN = BV / 8;                       // 8-column tiles
    constexpr int SU = (KP / 16) * NTN / FWDH_WARPS;  // state tiles per warp
    constexpr int TPM = SU < NTN ? SU : NTN;          // column tiles per key tile of a warp
    constexpr int MPW = SU / TPM;                     // key tiles per warp
    constexpr int TW = NTN / 2;                       // chunk column tiles per warp (1, 2, 4)
    constexpr unsigned KROW = Sm::KROW, VROW = Sm::VROW, AROW = Sm::AROW;
    constexpr unsigned KSTAGE = FWDH_BT * KROW, ASTAGE = FWDH_BT * AROW;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, t4 = lane & 3;
    const int mt = warp >> 1, nt0 = (warp & 1) * TW;  // this warp's chunk tiles

    const i64 c0 = (i64)blockIdx.y * BV;
    const int nb = (int)min((i64)BV, a.V - c0);
    PieceRun pr;
    if (!piece_run(a, pr)) return;
    const i64 hv = pr.hv, seq0 = pr.seq0, seqend = pr.seqend, n = pr.n, w = pr.w, row0 = pr.row0, end = pr.end;
    const int bt = (int)a.bt;
    const i64 len = end - row0;
    const bool from_start = row0 == seq0, to_end = end == seqend;
    const i64 nchunks = (len + bt - 1) / bt;
    const bool pair_ok = (a.V % 2) == 0;
    const i64 os = a.HV * a.V;
    const float scale = (float)a.scale;

    const unsigned k_s = smem_u32(&sm.k[0][0][0]), q_s = smem_u32(&sm.q[0][0][0]);
    const unsigned th_s = smem_u32(&sm.tbh[0][0][0]), tl_s = smem_u32(&sm.tbl[0][0][0]), a_s = smem_u32(&sm.aq[0][0][0]);
    const unsigned s_s = smem_u32(&sm.s[0][0]), w_s = smem_u32(&sm.w[0][0]), d_s = smem_u32(&sm.d[0][0]), dl_s = smem_u32(&sm.dl[0][0]);
    const unsigned a1_lane = (lane & 15) * KROW + (lane >> 4) * 16;                        // K, Q rows
    const unsigned a2_lane = ((lane & 7) + (lane >> 4) * 8) * KROW + ((lane >> 3) & 1) * 16;  // Kᵀ
    const unsigned a3_lane = (lane & 15) * AROW + (lane >> 4) * 16;                        // Tb, Aqk rows
    const unsigned b_lane = (lane & 15) * VROW + (TW > 1 ? (lane >> 4) * 16 : 0);          // S, W, D rows

    auto rows_of = [&](i64 c) { return (int)max((i64)0, min((i64)bt, len - c * bt)); };
    // B fragments of the warp's TW column tiles at key row kr of a [rows][VPITCH] tile
    auto load_b = [&](unsigned (&bf)[TW][2], unsigned base, int kr) {
        const unsigned addr = base + b_lane + kr * VROW + nt0 * 16;
        if constexpr (TW == 1) {
            ldsm_x2_t(bf[0], addr);
        } else {
#pragma unroll
            for (int p = 0; p < TW / 2; ++p) {
                unsigned r[4];
                ldsm_x4_t(r, addr + p * 32);
                bf[2 * p][0] = r[0];
                bf[2 * p][1] = r[1];
                bf[2 * p + 1][0] = r[2];
                bf[2 * p + 1][1] = r[3];
            }
        }
    };

    float s[SU][4];
#pragma unroll
    for (int j = 0; j < SU; ++j) {
        const int u = warp * SU + j, smt = u / NTN, snt = u % NTN;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = smt * 16 + gid + (e >> 1) * 8, c = snt * 8 + t4 * 2 + (e & 1);
            float v = 0.f;
            if (a.h0 != 0 && from_start && r < a.K && c < nb) {
                const i64 base = (n * a.HV + hv) * a.K * a.V;
                v = load_f(reinterpret_cast<const void*>(a.h0), a.h0_dtype, base + (a.v_first ? (c0 + c) * a.K + r : r * a.V + c0 + c));
            }
            s[j][e] = v;
        }
    }
    if (nchunks > 0) load_gdn<T, KP, BV>(a, sm, 0, row0, rows_of(0), hv, c0, nb);

    for (i64 c = 0; c < nchunks; ++c) {
        const int buf = (int)(c & 1);
        const int nc = rows_of(c);
        // 1. the rounded state into shared memory
#pragma unroll
        for (int j = 0; j < SU; ++j) {
            const int u = warp * SU + j, smt = u / NTN, snt = u % NTN;
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
                const int r = smt * 16 + gid + h2 * 8, col = snt * 8 + t4 * 2;
                *reinterpret_cast<Vec<T, 2>*>(&sm.s[r][col]) = pack2<T>(s[j][2 * h2], s[j][2 * h2 + 1]);
            }
        }
        cp_async_wait_all();
        __syncthreads();  // chunk c's tiles and the rounded state are visible
        if (c + 1 < nchunks) load_gdn<T, KP, BV>(a, sm, buf ^ 1, row0 + (c + 1) * bt, rows_of(c + 1), hv, c0, nb);
        const float gl = sm.g[buf][nc - 1];
        // 2. the decay of the state (registers; the products below read the rounded copy)
        const float lam = ex2_ftz(gl);
#pragma unroll
        for (int j = 0; j < SU; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[j][e] *= lam;
        const bool active = mt * 16 < bt;  // the warp's row tile exists in this chunk size
        const bool out = c >= w && a.o != 0;  // a chunk of the piece itself with o asked (else: state only)
        // the warp's rows: gate factors
        const int r0 = mt * 16 + gid, r1 = r0 + 8;
        const bool v0 = r0 < nc, v1 = r1 < nc;
        const float g0 = sm.g[buf][r0], g1 = sm.g[buf][r1];
        // 3. X = K S and O = Q S over the warp's tiles
        float xacc[TW][4], oacc[TW][4];
#pragma unroll
        for (int j = 0; j < TW; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) xacc[j][e] = oacc[j][e] = 0.f;
        if (active) {
            const unsigned ak = k_s + buf * KSTAGE + a1_lane + mt * 16 * KROW;
            const unsigned aq = q_s + buf * KSTAGE + a1_lane + mt * 16 * KROW;
#pragma unroll
            for (int kk = 0; kk < KP / 16; ++kk) {
                unsigned kf[4], qf[4], bf[TW][2];
                load_b(bf, s_s, kk * 16);
                ldsm_x4(kf, ak + kk * 32);
                ldsm_x4(qf, aq + kk * 32);
#pragma unroll
                for (int j = 0; j < TW; ++j) {
                    Mma<T>::run(xacc[j], kf, bf[j]);
                    if (out) Mma<T>::run(oacc[j], qf, bf[j]);
                }
            }
            // 4. W = V - diag(e) X, rounded into shared memory (zero beyond the valid rows)
            const float e0 = ex2_ftz(g0), e1 = ex2_ftz(g1);
#pragma unroll
            for (int j = 0; j < TW; ++j) {
                const int col = (nt0 + j) * 8 + t4 * 2;
                const Vec<T, 2> va = *reinterpret_cast<const Vec<T, 2>*>(&sm.v[buf][r0][col]);
                const Vec<T, 2> vb = *reinterpret_cast<const Vec<T, 2>*>(&sm.v[buf][r1][col]);
                *reinterpret_cast<Vec<T, 2>*>(&sm.w[r0][col]) =
                    pack2<T>(v0 ? widen(va.v[0]) - e0 * xacc[j][0] : 0.f, v0 ? widen(va.v[1]) - e0 * xacc[j][1] : 0.f);
                *reinterpret_cast<Vec<T, 2>*>(&sm.w[r1][col]) =
                    pack2<T>(v1 ? widen(vb.v[0]) - e1 * xacc[j][2] : 0.f, v1 ? widen(vb.v[1]) - e1 * xacc[j][3] : 0.f);
            }
        }
        __syncthreads();  // W is visible
        // 5. D = (Tb_hi + Tb_lo) W (lower triangular: key steps up to the tile's own rows);
        //    D and D' rounded into shared memory
        if (active) {
            float dacc[TW][4];
#pragma unroll
            for (int j = 0; j < TW; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) dacc[j][e] = 0.f;
            const unsigned ah = th_s + buf * ASTAGE + a3_lane + mt * 16 * AROW;
            const unsigned al = tl_s + buf * ASTAGE + a3_lane + mt * 16 * AROW;
            for (int js = 0; js <= mt; ++js) {
                unsigned hf[4], lf[4], bf[TW][2];
                load_b(bf, w_s, js * 16);
                ldsm_x4(hf, ah + js * 32);
                ldsm_x4(lf, al + js * 32);
#pragma unroll
                for (int j = 0; j < TW; ++j) {
                    Mma<T>::run(dacc[j], hf, bf[j]);
                    Mma<T>::run(dacc[j], lf, bf[j]);
                }
            }
            const float f0 = v0 ? ex2_ftz(gl - g0) : 0.f, f1 = v1 ? ex2_ftz(gl - g1) : 0.f;
#pragma unroll
            for (int j = 0; j < TW; ++j) {
                const int col = (nt0 + j) * 8 + t4 * 2;
                if (!v0) dacc[j][0] = dacc[j][1] = 0.f;
                if (!v1) dacc[j][2] = dacc[j][3] = 0.f;
                *reinterpret_cast<Vec<T, 2>*>(&sm.d[r0][col]) = pack2<T>(dacc[j][0], dacc[j][1]);
                *reinterpret_cast<Vec<T, 2>*>(&sm.d[r1][col]) = pack2<T>(dacc[j][2], dacc[j][3]);
                *reinterpret_cast<Vec<T, 2>*>(&sm.dl[r0][col]) = pack2<T>(f0 * dacc[j][0], f0 * dacc[j][1]);
                *reinterpret_cast<Vec<T, 2>*>(&sm.dl[r1][col]) = pack2<T>(f1 * dacc[j][2], f1 * dacc[j][3]);
            }
        }
        __syncthreads();  // D and D' are visible
        // 6. o = scale diag(e) O + Aqk D, stored
        if (active && out) {
            const float q0 = scale * ex2_ftz(g0), q1 = scale * ex2_ftz(g1);
#pragma unroll
            for (int j = 0; j < TW; ++j) {
                oacc[j][0] *= q0;
                oacc[j][1] *= q0;
                oacc[j][2] *= q1;
                oacc[j][3] *= q1;
            }
            const unsigned aa = a_s + buf * ASTAGE + a3_lane + mt * 16 * AROW;
            for (int js = 0; js <= mt; ++js) {
                unsigned af[4], bf[TW][2];
                load_b(bf, d_s, js * 16);
                ldsm_x4(af, aa + js * 32);
#pragma unroll
                for (int j = 0; j < TW; ++j) Mma<T>::run(oacc[j], af, bf[j]);
            }
            T* orow = reinterpret_cast<T*>(a.o) + ((row0 + c * bt) * a.HV + hv) * a.V + c0;
#pragma unroll
            for (int j = 0; j < TW; ++j) {
                const int col = (nt0 + j) * 8 + t4 * 2;
                if (v0) store_pair<T>(orow + r0 * os + col, col, nb, pair_ok, oacc[j][0], oacc[j][1]);
                if (v1) store_pair<T>(orow + r1 * os + col, col, nb, pair_ok, oacc[j][2], oacc[j][3]);
            }
        }
        // 7. S += Kᵀ D'
        const unsigned kbuf = k_s + buf * KSTAGE + a2_lane;
#pragma unroll
        for (int ks = 0; ks < FWDH_BT / 16; ++ks) {
            if (ks * 16 < bt) {
#pragma unroll
                for (int jm = 0; jm < MPW; ++jm) {
                    const int smt = (warp * SU + jm * TPM) / NTN;
                    unsigned af[4];
                    ldsm_x4_t(af, kbuf + smt * 32 + ks * 16 * KROW);
#pragma unroll
                    for (int jn = 0; jn < TPM; ++jn) {
                        const int snt = (warp * SU + jm * TPM + jn) % NTN;
                        unsigned bf[2];
                        ldsm_x2_t(bf, dl_s + (lane & 15) * VROW + snt * 16 + ks * 16 * VROW);
                        Mma<T>::run(s[jm * TPM + jn], af, bf);
                    }
                }
            }
        }
        // the next step's barrier orders these reads before the buffers are overwritten
    }
    if (a.ht != 0 && to_end) {
        float* ht = reinterpret_cast<float*>(a.ht) + (n * a.HV + hv) * a.K * a.V;
#pragma unroll
        for (int j = 0; j < SU; ++j) {
            const int u = warp * SU + j, smt = u / NTN, snt = u % NTN;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = smt * 16 + gid + (e >> 1) * 8, col = snt * 8 + t4 * 2 + (e & 1);
                if (r < a.K && col < nb) ht[a.v_first ? (c0 + col) * a.K + r : r * a.V + c0 + col] = s[j][e];
            }
        }
    }
}

// The warm-up policies (conformance/spec/ops-delta-rule.md 5.10), in two launches:
//
// 1. {gdn,kda}_warm_bounds: one CTA of WARM_THREADS per (piece p, window chunk j, value head):
//    the bound lam[p, j, hv] of chunk c0 - 1 - j of the piece's sequence (j < min(wmax, c0); c0:
//    the piece's first chunk in its sequence) as Σ over the chunk's tokens of a per-token term
//    λ_t (from `term`, with its magnitude μ_t), plus margin · Σ μ_t. A token is taken by a group
//    of WARM_THREADS / bt consecutive threads (keys i = sub, sub + group, … of it), whose
//    partials a fixed xor tree combines; the chunk's terms are then summed by warp 0 with the
//    token at lane t (t < 32) and 32 + t (bt = 64) in a fixed xor tree per warp, the two warps'
//    sums added in order: deterministic. Every CTA of every window runs at once (no early stop:
//    the walk below stops for free), so the cost is one pass over the windows' inputs however
//    few pieces there are. The chunks before c0 are whole (only a sequence's last chunk is
//    short). CTAs with no chunk (first pieces, j beyond the window) return at once.
// 2. warm_walk: one warp per (sequence, value head) of the table (the warp of its first piece),
//    a lane per piece: warm_choice over the piece's bounds; with a verdict tensor, also the
//    verdict of a split launched at a wider column block than the serial run (below).
// A bt outside {16, 32, 64} gets -1 (not warmable) for every piece.
#define WARM_THREADS 256

// The bound tensor's chunks per piece: min(wmax, 64) (the host keeps wmax <= 64).
__device__ __forceinline__ i64 warm_window(i64 wmax) { return min(wmax, (i64)64); }

__device__ __forceinline__ bool warm_bt_ok(i64 bt) { return bt == 16 || bt == 32 || bt == 64; }

// Sum of x over the aligned group of `group` (a power of two <= 16) consecutive lanes, by a xor
// tree: every lane of the group gets the same bits (each step adds commuted pairs).
__device__ __forceinline__ double group_sum(double x, int group) {
    for (int o = group >> 1; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

template <typename Term>
__device__ void warm_bounds(const Term& term, const i64* pieces, i64 bt, i64 wmax, i64 HV, double margin, double* lam) {
    __shared__ double tv[64], tm[64];
    const i64 win = warm_window(wmax);
    const i64 p = blockIdx.x / win, j = blockIdx.x % win, hv = blockIdx.y;
    if (!warm_bt_ok(bt)) return;
    const i64* pc = pieces + p * 5;
    const i64 seq0 = pc[2], c0 = (pc[0] - seq0) / bt;
    if (j >= min(win, c0)) return;
    const int group = WARM_THREADS / (int)bt, tok = threadIdx.x / group, sub = threadIdx.x % group;
    double v, m;
    term(seq0 + (c0 - 1 - j) * bt + tok, sub, group, v, m);
    if (sub == 0) {
        tv[tok] = v;
        tm[tok] = m;
    }
    __syncthreads();
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    double v0 = lane < bt ? tv[lane] : 0.0, m0 = lane < bt ? tm[lane] : 0.0;
    double v1 = bt == 64 ? tv[32 + lane] : 0.0, m1 = bt == 64 ? tm[32 + lane] : 0.0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        if (o < bt) {
            v0 += __shfl_xor_sync(0xffffffffu, v0, o);
            m0 += __shfl_xor_sync(0xffffffffu, m0, o);
            v1 += __shfl_xor_sync(0xffffffffu, v1, o);
            m1 += __shfl_xor_sync(0xffffffffu, m1, o);
        }
    }
    if (lane == 0) lam[(p * win + j) * HV + hv] = bt == 64 ? (v0 + v1) + margin * (m0 + m1) : v0 + margin * m0;
}

// The warm-up of a piece at chunk c0 of its sequence from the bounds lam[j · stride] of chunks
// c0 - 1 - j (j < min(c0, wmax)): the least w with lam[0] + .. + lam[w - 1] <= log_eps, else c0
// when c0 <= wmax (the warm-up reaches the sequence's start: exact), else -1 (not warmable); 0
// for a first piece. A NaN bound never passes.
__device__ __forceinline__ i64 warm_choice(const double* lam, i64 stride, i64 c0, i64 wmax, double log_eps) {
    if (c0 == 0) return 0;
    double acc = 0.0;
    for (i64 j = 0; j < min(c0, wmax); ++j) {
        acc += lam[j * stride];
        if (acc <= log_eps) return j + 1;
    }
    return c0 <= wmax ? c0 : -1;
}

// The warm-ups of every piece and value head from warm_bounds' lam ([P][min(wmax, 64)][HV]),
// into warm ([P][HV]). With gate != 0, also the verdict of a split launched at a wider column
// block than the serial run: per (sequence, value head) the longest chain of chunks one CTA of
// the split runs (its warm-up, its piece, and the pieces after it marked -1, in the table's
// order); gate = 1 (split) when that chain is at most max_chain (the chunks the wide kernel runs
// in the serial run's time), else 0. A sequence's pieces are contiguous in the table; its warp
// is the one of its first row there.
struct WalkArgs {
    u64 pieces, lam, warm, gate;
    i64 HV, bt, npieces, wmax, max_chain;
    double log_eps;
};

#define WALK_THREADS 128
extern "C" __global__ void __launch_bounds__(WALK_THREADS) warm_walk(const WalkArgs a) {
    const i64 wid = ((i64)blockIdx.x * WALK_THREADS + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (wid >= a.npieces * a.HV) return;
    const i64 p = wid / a.HV, hv = wid % a.HV;
    const i64* pc = reinterpret_cast<const i64*>(a.pieces);
    const i64 seq = pc[p * 5 + 4];
    if (p > 0 && pc[(p - 1) * 5 + 4] == seq) return;  // not the sequence's first row
    const i64 win = warm_window(a.wmax);
    const double* lam = reinterpret_cast<const double*>(a.lam);
    i64* warm = reinterpret_cast<i64*>(a.warm);
    i64 chain = 0, longest = 0;
    for (i64 q0 = p;; q0 += 32) {
        const i64 q = q0 + lane;
        const bool in = q < a.npieces && pc[q * 5 + 4] == seq;
        i64 w = 0, c = 0;
        if (in) {
            const i64 c0 = (pc[q * 5] - pc[q * 5 + 2]) / a.bt;
            w = warm_bt_ok(a.bt) ? warm_choice(lam + q * win * a.HV + hv, a.HV, c0, a.wmax, a.log_eps) : -1;
            warm[q * a.HV + hv] = w;
            c = (pc[q * 5 + 1] + a.bt - 1) / a.bt;
        }
        if (a.gate != 0) {
            for (int l = 0; l < 32; ++l) {
                const i64 wl = __shfl_sync(0xffffffffu, w, l), cl = __shfl_sync(0xffffffffu, c, l);
                if (__shfl_sync(0xffffffffu, (int)in, l)) {
                    chain = wl < 0 ? chain + cl : wl + cl;
                    longest = max(longest, chain);
                }
            }
        }
        if (!__all_sync(0xffffffffu, in)) break;
    }
    if (a.gate != 0 && lane == 0) reinterpret_cast<i64*>(a.gate)[seq * a.HV + hv] = longest <= a.max_chain ? 1 : 0;
}

// gdn_fwd's fused path: warm_bounds with the per-token term
//   λ_t = g_t + ln max(1, |1 - β_t ‖k_t‖²|)       (fp64; ‖k_t‖² bounded above and below: with
//                                                   l2norm [0.99, 1.01], the rounded unit keys,
//                                                   else the fp64 Σ k² (each thread of the token's
//                                                   group its keys in order, then group_sum)
//                                                   ± 1e-12 relative)
// and a margin of 1e-9 Σ|terms|; with warm_walk: warm = the least w <= wmax with
// Σ_{i<w} Λ_i <= log_eps (a truncation error below exp(log_eps) ‖S‖), or the piece's chunk
// offset when the warm-up reaches the sequence's start first (exact), else -1: not warmable
// (the previous piece runs through it). The first piece of a sequence gets 0.
struct WarmArgs {
    u64 pieces, g, beta, k, lam;
    i64 H, HV, K, bt, npieces, wmax, g_dtype, beta_dtype, l2norm;
};

template <typename T>
struct GdnTerm {
    const WarmArgs& a;
    i64 hv, kh;
    __device__ void operator()(i64 r, int sub, int group, double& v, double& m) const {
        double klo = 0.99, khi = 1.01;
        if (!a.l2norm) {
            const T* kp = reinterpret_cast<const T*>(a.k) + (r * a.H + kh) * a.K;
            double n2 = 0.0;
            for (i64 d = sub; d < a.K; d += group) n2 = fma((double)widen(kp[d]), (double)widen(kp[d]), n2);
            n2 = group_sum(n2, group);
            klo = n2 * (1.0 - 1e-12);
            khi = n2 * (1.0 + 1e-12);
        }
        const double g = load_f<double>(reinterpret_cast<const void*>(a.g), a.g_dtype, r * a.HV + hv);
        const double b = load_f<double>(reinterpret_cast<const void*>(a.beta), a.beta_dtype, r * a.HV + hv);
        const double t = log(fmax(1.0, fmax(fabs(1.0 - b * klo), fabs(1.0 - b * khi))));
        v = g + t;
        m = fabs(g) + t;
    }
};

template <typename T>
__device__ void gdn_warm_bounds(const WarmArgs& a) {
    const i64 hv = blockIdx.y;
    const GdnTerm<T> term{a, hv, hv / (a.HV / a.H)};
    warm_bounds(term, reinterpret_cast<const i64*>(a.pieces), a.bt, a.wmax, a.HV, 1e-9, reinterpret_cast<double*>(a.lam));
}

// kda_fwd's fused path (per-key gates): warm_bounds with the per-token term
//   λ_t = max_i y_{t,i} + ln max(1, |1 - β_t ‖k_t‖²|)
// with y the per-step natural-log decay the intra stage applies: g itself (gate_mode 1) or the
// KDA gate of g (gate.cuh, gate_mode 2: softplus or lower-bound form with A_log, dt_bias), here
// in fp64; β after the kernel's sigmoid (beta_mode 1, 2 · sigmoid for 2); ‖k‖² in [0.99, 1.01]
// for keys normalised in the kernel, else the raw keys' fp64 norm ± 1e-12 (summed as GdnTerm's).
// The gate of a head is monotone in a = g + dt_bias (y = -exp(A_log) softplus(a), or
// lb · sigmoid(exp(A_log) a): one sign per head), so max_i y_{t,i} is the larger of y at the
// least and at the greatest a of the token (exact min / max over its keys): two fp64 gates a
// token, not K. That is the same real number as the gate of every key; the fp64 library
// functions are monotone to within their last-place error (and softplus's switch to a at
// a > 20 moves it by < 1e-9 relative), far inside the margin. NaN: any a NaN, either end's y
// NaN, or exp(A_log) infinite (where an inner key could be NaN alone) make the token NaN.
// The state map of a token is (I - β k kᵀ) diag(exp(y_t)) and ‖diag(exp(y_t))‖₂ =
// exp(max_i y_{t,i}): the bound takes the largest decay per token. A per-chunk bound from the
// intra stage's lam = exp2(G_l) (max_i of the chunk's per-key cumulative gate) would not be
// one: the diagonal factors do not commute with the I - β k kᵀ between them, which move the
// state between keys (a key that decays at one step can receive the mass of a key that decays
// at the next), so Σ_t max_i y_{t,i} (larger) is the bound. Margin: 1e-5 Σ|terms| covers the
// intra stage's fp32 gate (multi-function unit exp2 / log2, relative error below 1e-6) and its
// fp32 chunk-local cumsum (at most 64 roundings of 2^-24 of Σ|y|); β is widened by 1e-6
// relative (its fp32 sigmoid). A NaN input makes the chunk's bound NaN (never warmable).
struct KdaWarmArgs {
    WarmArgs w;     // the inputs and geometry GDN's policy has too
    GateArgs gate;  // the in-kernel gate (gate_mode 2)
    i64 gate_mode, beta_mode;
};

// The KDA gate of a head (its constants from column c) at a = g + dt_bias, in fp64 (gate.cuh's
// fp64 formulas); nan when exp(A_log) is not finite.
template <int FORM> __device__ __forceinline__ double kda_gate64(const GateArgs& ga, i64 c, double a, bool& nan) {
    Gate<double, 1, FORM> gt;
    gt.init(ga, c);
    gt.bias[0] = 0.0;  // a includes dt_bias
    nan |= isinf(gt.coef);
    double v[1] = {a};
    gt.apply(v);
    return v[0];
}

template <typename T>
struct KdaTerm {
    const KdaWarmArgs& a;
    i64 hv, kh;
    __device__ void operator()(i64 r, int sub, int group, double& v, double& m) const {
        const double inf = __longlong_as_double(0x7ff0000000000000ll);
        const bool gated = a.gate_mode == 2, bias = gated && a.gate.dt_bias_dtype >= 0;
        double lo = inf, hi = -inf, n2 = 0.0;
        bool nan = false;
        for (i64 i = sub; i < a.w.K; i += group) {
            double y = load_f<double>(reinterpret_cast<const void*>(a.w.g), a.w.g_dtype, (r * a.w.HV + hv) * a.w.K + i);
            if (gated) {
                double b[1] = {0.0};
                if (bias) load_side(reinterpret_cast<const void*>(a.gate.dt_bias), (int)a.gate.dt_bias_dtype, hv * a.w.K + i, b);
                y += b[0];
            }
            nan |= y != y;
            lo = fmin(lo, y);
            hi = fmax(hi, y);
            if (!a.w.l2norm) {
                const double x = (double)widen(reinterpret_cast<const T*>(a.w.k)[(r * a.w.H + kh) * a.w.K + i]);
                n2 = fma(x, x, n2);
            }
        }
        for (int o = group >> 1; o > 0; o >>= 1) {
            lo = fmin(lo, __shfl_xor_sync(0xffffffffu, lo, o));
            hi = fmax(hi, __shfl_xor_sync(0xffffffffu, hi, o));
            nan |= __shfl_xor_sync(0xffffffffu, (int)nan, o) != 0;
        }
        if (!a.w.l2norm) n2 = group_sum(n2, group);
        double gmax = hi;
        if (gated) {
            const i64 c = hv * a.w.K;
            const bool lb = a.gate.has_lower_bound;
            const double ylo = lb ? kda_gate64<GATE_BOUNDED>(a.gate, c, lo, nan) : kda_gate64<GATE_SOFTPLUS>(a.gate, c, lo, nan);
            const double yhi = lb ? kda_gate64<GATE_BOUNDED>(a.gate, c, hi, nan) : kda_gate64<GATE_SOFTPLUS>(a.gate, c, hi, nan);
            nan |= ylo != ylo || yhi != yhi;
            gmax = fmax(ylo, yhi);
        }
        double b = load_f<double>(reinterpret_cast<const void*>(a.w.beta), a.w.beta_dtype, r * a.w.HV + hv);
        if (a.beta_mode != 0) b = (a.beta_mode == 2 ? 2.0 : 1.0) / (1.0 + exp(-b));
        const double blo = b * (1.0 - 1e-6), bhi = b * (1.0 + 1e-6);
        const double klo = a.w.l2norm ? 0.99 : n2 * (1.0 - 1e-12), khi = a.w.l2norm ? 1.01 : n2 * (1.0 + 1e-12);
        const double grow = fmax(fmax(1.0, fmax(fabs(1.0 - blo * klo), fabs(1.0 - blo * khi))),
                                 fmax(fabs(1.0 - bhi * klo), fabs(1.0 - bhi * khi)));
        const double t = log(grow);
        v = (nan || b != b) ? __longlong_as_double(0x7ff8000000000000ll) : gmax + t;
        m = fabs(gmax) + t;
    }
};

template <typename T>
__device__ void kda_warm_bounds(const KdaWarmArgs& a) {
    const i64 hv = blockIdx.y;
    const KdaTerm<T> term{a, hv, hv / (a.w.HV / a.w.H)};
    warm_bounds(term, reinterpret_cast<const i64*>(a.w.pieces), a.w.bt, a.w.wmax, a.w.HV, 1e-5, reinterpret_cast<double*>(a.w.lam));
}

extern "C" __global__ void __launch_bounds__(WARM_THREADS) kda_warm_bounds_bf16(const KdaWarmArgs a) { kda_warm_bounds<bf16>(a); }
extern "C" __global__ void __launch_bounds__(WARM_THREADS) kda_warm_bounds_f16(const KdaWarmArgs a) { kda_warm_bounds<f16>(a); }
extern "C" __global__ void __launch_bounds__(WARM_THREADS) gdn_warm_bounds_bf16(const WarmArgs a) { gdn_warm_bounds<bf16>(a); }
extern "C" __global__ void __launch_bounds__(WARM_THREADS) gdn_warm_bounds_f16(const WarmArgs a) { gdn_warm_bounds<f16>(a); }

#define GDN_KERNEL(T, TAG, KP, BV) \
    extern "C" __global__ void __launch_bounds__(FWDH_THREADS, 1) delta_fwd_gdn_##TAG##_k##KP##_v##BV(const GdnFusedArgs a) { \
        delta_fused_gdn<T, KP, BV>(a); \
    }
#define GDN_KERNELS(T, TAG) \
    GDN_KERNEL(T, TAG, 64, 16) GDN_KERNEL(T, TAG, 64, 32) GDN_KERNEL(T, TAG, 64, 64) \
    GDN_KERNEL(T, TAG, 128, 16) GDN_KERNEL(T, TAG, 128, 32) GDN_KERNEL(T, TAG, 128, 64)

GDN_KERNELS(bf16, bf16)
GDN_KERNELS(f16, f16)
