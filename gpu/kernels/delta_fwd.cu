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

struct FusedArgs {
    u64 kg, w, qg, qf, u, aqk, lam, h0;  // inputs (h0: 0 when absent)
    u64 seqs;                        // i64 [N][3]: first packed token row, length, first chunk index
    u64 o, ht;                       // outputs (ht: 0 when absent)
    i64 HV, K, V, bt;
    i64 h0_dtype, v_first;
};

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
    constexpr int KSEG = KP / 8;
    if (a.K % 8 == 0) {
        for (int i = tid; i < bt * KSEG; i += FWDH_THREADS) {
            const int r = i / KSEG, c8 = (i % KSEG) * 8;
            const bool ok = r < nc && c8 < a.K;
            const i64 off = ok ? r * ks + c8 : 0;
            cp_async16(smem_u32(&sm.kg[b][r][c8]), kp + off, ok ? 16 : 0);
            cp_async16(smem_u32(&sm.w[b][r][c8]), wp + off, ok ? 16 : 0);
            cp_async16(smem_u32(&sm.qg[b][r][c8]), qp + off, ok ? 16 : 0);
        }
    } else {
        for (int i = tid; i < bt * KP; i += FWDH_THREADS) {
            const int r = i / KP, e = i % KP;
            const bool ok = r < nc && e < a.K;
            sm.kg[b][r][e] = ok ? kp[r * ks + e] : T{0};
            sm.w[b][r][e] = ok ? wp[r * ks + e] : T{0};
            sm.qg[b][r][e] = ok ? qp[r * ks + e] : T{0};
        }
    }
    constexpr int VSEG = BV / 8;
    if (a.V % 8 == 0) {
        for (int i = tid; i < bt * VSEG; i += FWDH_THREADS) {
            const int r = i / VSEG, c8 = (i % VSEG) * 8;
            const bool ok = r < nc && c8 < nb;
            cp_async16(smem_u32(&sm.u[b][r][c8]), up + (ok ? r * us + c8 : 0), ok ? 16 : 0);
        }
    } else {
        for (int i = tid; i < bt * BV; i += FWDH_THREADS) {
            const int r = i / BV, e = i % BV;
            sm.u[b][r][e] = (r < nc && e < nb) ? up[r * us + e] : T{0};
        }
    }
    const int aseg = bt / 8;  // bt is 16, 32 or 64
    for (int i = tid; i < bt * aseg; i += FWDH_THREADS) {
        const int r = i / aseg, c8 = (i % aseg) * 8;
        const bool ok = r < nc;
        cp_async16(smem_u32(&sm.aq[b][r][c8]), ap + (ok ? r * as + c8 : 0), ok ? 16 : 0);
    }
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

    const i64 n = blockIdx.x / a.HV, hv = blockIdx.x % a.HV;
    const i64 c0 = (i64)blockIdx.y * BV;
    const int nb = (int)min((i64)BV, a.V - c0);
    const i64* seq = reinterpret_cast<const i64*>(a.seqs) + n * 3;
    const i64 row0 = seq[0], len = seq[1], cbase = seq[2];
    const int bt = (int)a.bt;
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
            if (a.h0 != 0 && r < a.K && c < nb) {
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
                    Mma<T>::run(oacc[j][kk & 1], qf, bf);
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
            if (u < ntiles) {
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
    if (a.ht != 0) {
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
