// The chunked gated delta-rule state recurrence (`conformance/spec/ops-delta-rule.md` §2 and §3),
// shared by `chunk_gated_delta_rule_fwd_h` and `fwd_h_pre_scan`.
//
// One CTA (grid x: sequence * HV + value head, grid y: column block) runs one (sequence, value
// head, block of BV state columns) over the whole sequence;
// the state S (K x BV of the K x cols state) stays on chip. For every chunk c (n_c valid rows):
//
//   h[c] = S;   D = U_c - W_c S  (v_new);   S <- exp2(G_l) diag(exp2(Gk_l)) S + K_c^T (a . D)
//   a_r = exp2(G_l - G_r) for r < n_c (selected to 0 beyond), l = n_c - 1
//
// Pre-scan (PRESCAN): the augmented state X = [b | M] (K x (V + K)) starts at [0 | I] and the
// value columns beyond V are zero; only the exit state is written (into hm, pitch V + K). Columns
// are independent, so a block holds either b columns or M columns.
//
// Two kernels:
//  * fwd_h_mma<T, KP, BV> (bf16/f16): both products on tensor cores (mma.sync m16n8k16, fp32
//    accumulation), S in mma accumulator registers, the next chunk's k/w/u/gates loaded by
//    cp.async into a second buffer while the current chunk computes. Rounding points of spec
//    2.5: S rounded to T for W.S (and for h), a.D rounded to T for K^T.(a.D). With `split`
//    (pre-scan M columns) both operands are carried as hi + lo pairs of T (about fp32 accuracy).
//  * fwd_h_fma (fp32): the same recurrence with IEEE fp32 FMAs, S in shared memory.

struct FwdHArgs {
    u64 k, w, u, g, gk, h0;   // inputs (g, gk, h0: 0 when absent)
    u64 seqs;                 // i64 [N][3]: first token row (in B*T rows), length, first h chunk
    u64 h, v_new, ht;         // outputs (h, v_new: 0 when absent; ht: final state / hm, 0 absent)
    i64 H, HV, K, V;          // key heads, value heads, key dim, value dim
    i64 cols;                 // state columns: V (fwd_h) or V + K (pre-scan)
    i64 bt;                   // chunk size
    i64 g_dtype, gk_dtype, h0_dtype;  // dtype codes (0 f64, 1 f32, 2 bf16, 3 f16)
    i64 v_first;              // states in memory are S^T
    i64 nb_b;                 // column blocks of the first V columns (pre-scan: then K columns)
    i64 split;                // pre-scan: hi/lo operands for the M columns (mma kernel)
    u64 warm;                 // i64 [N] or 0: per row, see row_warmup
};

// The warm-up of row n (`conformance/spec/ops-delta-rule.md` §5.9): w > 0 moves the row's first
// token back by w chunks (the caller keeps them inside the row's sequence), and those w chunks
// update the state only (no h, no v_new); w < 0 skips the row (the block writes nothing: a
// pre-scan summary nobody reads); 0 (or no table) runs the row as given.
__device__ __forceinline__ i64 row_warmup(const FwdHArgs& a, i64 n) {
    return a.warm != 0 ? reinterpret_cast<const i64*>(a.warm)[n] : 0;
}

// Loads element i of a float tensor whose dtype is a run-time code, as Acc (fp32 or fp64).
template <typename Acc = float>
__device__ __forceinline__ Acc load_f(const void* p, i64 dtype, i64 i) {
    switch (dtype) {
        case 0: return (Acc)reinterpret_cast<const double*>(p)[i];
        case 1: return (Acc)reinterpret_cast<const float*>(p)[i];
        case 2: return (Acc)widen(reinterpret_cast<const bf16*>(p)[i]);
        default: return (Acc)widen(reinterpret_cast<const f16*>(p)[i]);
    }
}

// 2^x in the accumulator's precision.
__device__ __forceinline__ float ex2(float x) { return exp2f(x); }
__device__ __forceinline__ double ex2(double x) { return exp2(x); }

// The state columns [c0, c_end) of column block bx (pre-scan: b blocks first, then M blocks).
struct ColBlock {
    i64 c0, c_end;
    bool m_cols;  // pre-scan M columns (state columns >= V)
    __device__ __forceinline__ ColBlock(const FwdHArgs& a, i64 bx, int bv) {
        if (bx < a.nb_b) {
            c0 = bx * bv;
            c_end = min(c0 + bv, a.V);
            m_cols = false;
        } else {
            c0 = a.V + (bx - a.nb_b) * bv;
            c_end = min(c0 + bv, a.cols);
            m_cols = true;
        }
    }
};

// The value of the incoming state at (row i, state column c).
template <bool PRESCAN, typename Acc = float>
__device__ __forceinline__ Acc initial_value(const FwdHArgs& a, i64 n, i64 hv, i64 i, i64 c) {
    if (PRESCAN) return (c >= a.V && c - a.V == i) ? Acc(1) : Acc(0);
    if (a.h0 == 0) return Acc(0);
    const i64 base = (n * a.HV + hv) * a.K * a.V;
    return load_f<Acc>(reinterpret_cast<const void*>(a.h0), a.h0_dtype, base + (a.v_first ? c * a.K + i : i * a.V + c));
}

// Writes the exit state value v at (row i, state column c).
template <bool PRESCAN, typename Acc = float>
__device__ __forceinline__ void store_final(const FwdHArgs& a, i64 n, i64 hv, i64 i, i64 c, Acc v) {
    Acc* ht = reinterpret_cast<Acc*>(a.ht);
    const i64 base = (n * a.HV + hv) * a.K * a.cols;
    if (PRESCAN || !a.v_first) ht[base + i * a.cols + c] = v;
    else ht[base + c * a.K + i] = v;
}

// ---------------------------------------------------------------------------------------------
// Tensor-core kernel (bf16 / f16).

#define FWDH_WARPS 8
#define FWDH_THREADS (FWDH_WARPS * 32)
#define FWDH_BT 64  // the largest chunk; smaller chunks use the first rows of every tile

// 2^x by the multi-function unit (results below 2^-126 flushed to zero): the gate factors of
// the tensor-core kernel, without exp2f's subnormal scaling.
__device__ __forceinline__ float ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Fragment loads from shared addresses (bytes).
__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2_t(unsigned (&r)[2], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

template <typename T> struct Mma;
template <> struct Mma<bf16> {
    __device__ __forceinline__ static void run(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};
template <> struct Mma<f16> {
    __device__ __forceinline__ static void run(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

// Shared-memory layout of the mma kernel (element pitches padded by 8 against bank conflicts).
// STAGES chunk buffers: the loads of chunk c + STAGES - 1 are issued while chunk c computes
// (two for 256 keys, for the 227 KiB of shared memory).
template <typename T, int KP, int BV> struct MmaSmem {
    static constexpr int KPITCH = KP + 8;
    static constexpr int VPITCH = BV + 8;
    static constexpr int STAGES = KP >= 256 ? 2 : 3;
    static constexpr unsigned KROW = KPITCH * sizeof(T);  // bytes per row of k / w
    static constexpr unsigned VROW = VPITCH * sizeof(T);  // bytes per row of u / s / d
    T k[STAGES][FWDH_BT][KPITCH];
    T w[STAGES][FWDH_BT][KPITCH];
    T u[STAGES][FWDH_BT][VPITCH];
    float g[STAGES][FWDH_BT];
    float gk[STAGES][KP];
    T s_hi[KP][VPITCH];
    T s_lo[KP][VPITCH];
    T d_hi[FWDH_BT][VPITCH];
    T d_lo[FWDH_BT][VPITCH];
};

// Issues the loads of one chunk (rows [row0, row0 + nc) of the packed token axis) into buffer
// `buf`: k (key head kh), w, u (the block's value columns) and the gates, zero-filled beyond the
// valid rows / columns. Every thread copies fixed 16-byte pieces (a column and every
// THREADS / pieces-per-row-th row) through cp.async when K (for k, w) or V (for u) is a multiple
// of 8; otherwise element by element. Always commits one cp.async group (empty when nc = 0).
template <typename T, int KP, int BV, bool PRESCAN>
__device__ __forceinline__ void load_chunk_mma(const FwdHArgs& a, MmaSmem<T, KP, BV>& sm, int buf, i64 row0, int nc,
                                               i64 kh, i64 hv, const ColBlock& cb) {
    using Sm = MmaSmem<T, KP, BV>;
    if (nc > 0) {
        const int tid = threadIdx.x;
        const int bt = (int)a.bt;
        const i64 ks = a.H * a.K, ws = a.HV * a.K, us = a.HV * a.V;  // row strides
        const T* kp = reinterpret_cast<const T*>(a.k) + row0 * ks + kh * a.K;
        const T* wp = reinterpret_cast<const T*>(a.w) + row0 * ws + hv * a.K;
        const T* up = reinterpret_cast<const T*>(a.u) + row0 * us + hv * a.V + cb.c0;
        constexpr int KSEG = KP / 8, KRS = FWDH_THREADS / KSEG;  // pieces per row, rows per pass
        if ((a.K % 8) == 0) {
            const int r0 = tid / KSEG, c8 = (tid % KSEG) * 8;
            const bool col_ok = c8 < a.K;
            const unsigned kd = smem_u32(&sm.k[buf][r0][c8]), wd = smem_u32(&sm.w[buf][r0][c8]);
            const T* ksrc = kp + r0 * ks + c8;
            const T* wsrc = wp + r0 * ws + c8;
#pragma unroll
            for (int p = 0; p < FWDH_BT / KRS; ++p) {
                const int r = r0 + p * KRS;
                if (r < bt) {
                    const int bytes = (r < nc && col_ok) ? 16 : 0;
                    cp_async16(kd + p * KRS * Sm::KROW, bytes ? ksrc + p * KRS * ks : kp, bytes);
                    cp_async16(wd + p * KRS * Sm::KROW, bytes ? wsrc + p * KRS * ws : wp, bytes);
                }
            }
        } else {
            for (int i = tid; i < bt * KSEG; i += FWDH_THREADS) {
                const int r = i / KSEG, c8 = (i % KSEG) * 8;
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    const bool ok = r < nc && c8 + e < a.K;
                    sm.k[buf][r][c8 + e] = ok ? kp[r * ks + c8 + e] : T{0};
                    sm.w[buf][r][c8 + e] = ok ? wp[r * ws + c8 + e] : T{0};
                }
            }
        }
        constexpr int VSEG = BV / 8, VRS = FWDH_THREADS / VSEG;
        const int nb = (int)(cb.c_end - cb.c0);
        if ((a.V % 8) == 0 || cb.m_cols) {
            const int r0 = tid / VSEG, c8 = (tid % VSEG) * 8;
            const bool col_ok = c8 < nb && !cb.m_cols;  // u exists only for columns < V
            const unsigned ud = smem_u32(&sm.u[buf][r0][c8]);
            const T* usrc = up + r0 * us + c8;
#pragma unroll
            for (int p = 0; p < (FWDH_BT + VRS - 1) / VRS; ++p) {
                const int r = r0 + p * VRS;
                if (r < bt) {
                    const int bytes = (r < nc && col_ok) ? 16 : 0;
                    cp_async16(ud + p * VRS * Sm::VROW, bytes ? usrc + p * VRS * us : up, bytes);
                }
            }
        } else {
            for (int i = tid; i < bt * VSEG; i += FWDH_THREADS) {
                const int r = i / VSEG, c8 = (i % VSEG) * 8;
#pragma unroll
                for (int e = 0; e < 8; ++e) sm.u[buf][r][c8 + e] = (r < nc && c8 + e < nb) ? up[r * us + c8 + e] : T{0};
            }
        }
        if (a.g != 0) {
            for (int r = tid; r < bt; r += FWDH_THREADS) {
                const i64 gi = (row0 + r) * a.HV + hv;
                if (a.g_dtype == 1) {
                    const float* gp = reinterpret_cast<const float*>(a.g);
                    cp_async4(smem_u32(&sm.g[buf][r]), r < nc ? gp + gi : gp, r < nc ? 4 : 0);
                } else {
                    sm.g[buf][r] = r < nc ? load_f(reinterpret_cast<const void*>(a.g), a.g_dtype, gi) : 0.f;
                }
            }
        }
        if (a.gk != 0) {
            const i64 gb = ((row0 + nc - 1) * a.HV + hv) * a.K;
            for (int i = tid; i < KP; i += FWDH_THREADS) {
                if (a.gk_dtype == 1) {
                    const float* gp = reinterpret_cast<const float*>(a.gk);
                    cp_async4(smem_u32(&sm.gk[buf][i]), i < a.K ? gp + gb + i : gp, i < a.K ? 4 : 0);
                } else {
                    sm.gk[buf][i] = i < a.K ? load_f(reinterpret_cast<const void*>(a.gk), a.gk_dtype, gb + i) : 0.f;
                }
            }
        }
    }
    cp_async_commit();
}

// Stores the rounded state of s_hi (K x block columns) as h row `hc`.
template <typename T, int KP, int BV>
__device__ __forceinline__ void store_h(const FwdHArgs& a, const MmaSmem<T, KP, BV>& sm, i64 hc, i64 hv, const ColBlock& cb) {
    T* hp = reinterpret_cast<T*>(a.h) + (hc * a.HV + hv) * a.K * a.V;
    const int tid = threadIdx.x;
    const int nb = (int)(cb.c_end - cb.c0);
    if (!a.v_first) {
        if (a.V % 8 == 0) {
            constexpr int VSEG = BV / 8, VRS = FWDH_THREADS / VSEG;
            const int r0 = tid / VSEG, c8 = (tid % VSEG) * 8;
            if (c8 < nb) {
                T* dst = hp + r0 * a.V + cb.c0 + c8;
#pragma unroll
                for (int p = 0; p < (KP + VRS - 1) / VRS; ++p) {
                    const int r = r0 + p * VRS;
                    if (r < a.K) {
                        *reinterpret_cast<Vec<T, 8>*>(dst + p * VRS * a.V) = *reinterpret_cast<const Vec<T, 8>*>(&sm.s_hi[r][c8]);
                    }
                }
            }
        } else {
            for (int i = tid; i < a.K * nb; i += FWDH_THREADS) {
                const int r = i / nb, c = i % nb;
                hp[r * a.V + cb.c0 + c] = sm.s_hi[r][c];
            }
        }
    } else {
        if (a.K % 8 == 0) {
            const int KSEG = (int)(a.K / 8);
            for (int i = tid; i < nb * KSEG; i += FWDH_THREADS) {
                const int c = i / KSEG, r8 = (i % KSEG) * 8;
                Vec<T, 8> q;
#pragma unroll
                for (int e = 0; e < 8; ++e) q.v[e] = sm.s_hi[r8 + e][c];
                *reinterpret_cast<Vec<T, 8>*>(hp + (cb.c0 + c) * a.K + r8) = q;
            }
        } else {
            for (int i = tid; i < a.K * nb; i += FWDH_THREADS) {
                const int c = i / (int)a.K, r = i % (int)a.K;
                hp[(cb.c0 + c) * a.K + r] = sm.s_hi[r][c];
            }
        }
    }
}

// Stores a pair of adjacent v_new values (columns col, col + 1 of the block) of one row.
template <typename T>
__device__ __forceinline__ void store_pair(T* p, int col, int nb, bool pair_ok, float d0, float d1) {
    if (pair_ok && col + 1 < nb) {
        Vec<T, 2> q;
        q.v[0] = Narrow<T>::from(d0);
        q.v[1] = Narrow<T>::from(d1);
        *reinterpret_cast<Vec<T, 2>*>(p) = q;
    } else {
        if (col < nb) p[0] = Narrow<T>::from(d0);
        if (col + 1 < nb) p[1] = Narrow<T>::from(d1);
    }
}

// Two values of T in one 32-bit word (for shared-memory stores of a fragment's column pair).
template <typename T>
__device__ __forceinline__ Vec<T, 2> pack2(float x0, float x1) {
    Vec<T, 2> q;
    q.v[0] = Narrow<T>::from(x0);
    q.v[1] = Narrow<T>::from(x1);
    return q;
}

// The whole recurrence of one CTA. Warp w owns the state tiles (16 x 8 each) w*SU .. w*SU+SU-1
// of the KP x BV block, row-major over (16-row key tile, 8-column tile): MPW key tiles of TPM
// column tiles each, and the chunk tiles (16 x 8) of D numbered w, w + 8, ... Fragment
// addresses are per-thread bases fixed for the whole sequence plus compile-time offsets.
//
// Fast path (`fast`: chunk 64, K = KP, V a multiple of 8, a full block of BV columns, fp32 or
// absent gates): the copies of every full chunk go through per-thread source pointers and
// shared addresses fixed for the sequence (one add per chunk), h through fixed 16-byte pieces,
// and the full chunks run a step with every row-validity test removed at compile time; the
// last, partial chunk and every other call take the general step.
template <typename T, int KP, int BV, bool PRESCAN>
__device__ __forceinline__ void fwd_h_mma(const FwdHArgs& a) {
    using Sm = MmaSmem<T, KP, BV>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Sm& sm = *reinterpret_cast<Sm*>(smem_raw);
    constexpr int NTN = BV / 8;                       // 8-column tiles
    constexpr int SU = (KP / 16) * NTN / FWDH_WARPS;  // state tiles per warp
    constexpr int TPM = SU < NTN ? SU : NTN;          // column tiles per key tile of a warp
    constexpr int MPW = SU / TPM;                     // key tiles per warp
    constexpr int DUMAX = (FWDH_BT / 16) * NTN / FWDH_WARPS > 0 ? (FWDH_BT / 16) * NTN / FWDH_WARPS : 1;
    constexpr int ST = Sm::STAGES;
    constexpr unsigned KROW = Sm::KROW, VROW = Sm::VROW, KSTAGE = FWDH_BT * KROW, USTAGE = FWDH_BT * VROW;
    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, t4 = lane & 3;

    const i64 n = blockIdx.x / a.HV, hv = blockIdx.x % a.HV;
    const i64 kh = hv / (a.HV / a.H);
    const ColBlock cb(a, blockIdx.y, BV);
    const i64* seq = reinterpret_cast<const i64*>(a.seqs) + n * 3;
    const int bt = (int)a.bt;
    // leading state-only chunks; h row of chunk c: hbase + c (never below the sequence's first
    // h row: a warm-up stays inside its sequence)
    const i64 wc = row_warmup(a, n);
    if (wc < 0) return;
    const i64 row0 = seq[0] - wc * bt, len = seq[1] + wc * bt, hbase = seq[2] - wc;
    const i64 nchunks = (len + bt - 1) / bt;
    const bool split = PRESCAN && a.split && cb.m_cols;
    const int nb = (int)(cb.c_end - cb.c0);
    const bool pair_ok = (a.V % 2) == 0;
    const i64 vs = a.HV * a.V;  // v_new row stride
    const bool fast = bt == FWDH_BT && a.K == KP && (a.V % 8) == 0 && nb == BV && (a.g == 0 || a.g_dtype == 1) &&
                      (a.gk == 0 || a.gk_dtype == 1);
    const bool has_u = !(PRESCAN && cb.m_cols);

    // per-thread fragment address bases (bytes in shared memory)
    const unsigned w_s = smem_u32(&sm.w[0][0][0]), k_s = smem_u32(&sm.k[0][0][0]);
    const unsigned shi_s = smem_u32(&sm.s_hi[0][0]), slo_s = smem_u32(&sm.s_lo[0][0]);
    const unsigned dhi_s = smem_u32(&sm.d_hi[0][0]), dlo_s = smem_u32(&sm.d_lo[0][0]);
    const unsigned a1_lane = (lane & 15) * KROW + (lane >> 4) * 16;                        // W rows
    const unsigned a2_lane = ((lane & 7) + (lane >> 4) * 8) * KROW + ((lane >> 3) & 1) * 16;  // K^T
    const unsigned b_lane = (lane & 15) * VROW;                                            // S, D rows

    // fast-path copy pieces: k / w 16-byte piece (kr0 + p * KRS, kc8), u piece (vr0 + p * VRS,
    // vc8), fixed for the sequence; the sources of the next chunk to load (kn, wn, un, gn, gkn)
    // advance by one chunk per fast load (the full chunks are a prefix of the sequence)
    constexpr int KSEG = KP / 8, KRS = FWDH_THREADS / KSEG, KPASS = FWDH_BT / KRS;
    constexpr int VSEG = BV / 8, VRS = FWDH_THREADS / VSEG, VPASS = (FWDH_BT + VRS - 1) / VRS;
    constexpr int HPASS = (KP + VRS - 1) / VRS;
    const int kr0 = tid / KSEG, kc8 = (tid % KSEG) * 8;
    const int vr0 = tid / VSEG, vc8 = (tid % VSEG) * 8;
    const i64 ks = a.H * a.K, ws = a.HV * a.K, us = a.HV * a.V;
    const T* kn = reinterpret_cast<const T*>(a.k) + (row0 + kr0) * ks + kh * a.K + kc8;
    const T* wn = reinterpret_cast<const T*>(a.w) + (row0 + kr0) * ws + hv * a.K + kc8;
    const T* un = reinterpret_cast<const T*>(a.u) + (row0 + vr0) * us + hv * a.V + cb.c0 + vc8;
    const float* gn = reinterpret_cast<const float*>(a.g) + (row0 + tid) * a.HV + hv;
    const float* gkn = reinterpret_cast<const float*>(a.gk) + ((row0 + FWDH_BT - 1) * a.HV + hv) * a.K + tid * 4;
    const i64 kpass = KRS * ks, wpass = KRS * ws, upass = VRS * us;  // elements between passes
    const unsigned kd = k_s + kr0 * KROW + kc8 * sizeof(T), wd = w_s + kr0 * KROW + kc8 * sizeof(T);
    const unsigned ud = smem_u32(&sm.u[0][0][0]) + vr0 * VROW + vc8 * sizeof(T);
    const unsigned gd = smem_u32(&sm.g[0][0]) + tid * 4, gkd = smem_u32(&sm.gk[0][0]) + tid * 16;
    const bool g_piece = a.g != 0 && tid < FWDH_BT, gk_piece = a.gk != 0 && tid < KP / 4;
    // the loads of the next chunk (a full one) into buffer b
    auto load_fast = [&](int b) {
#pragma unroll
        for (int p = 0; p < KPASS; ++p) {
            cp_async16(kd + b * KSTAGE + p * KRS * KROW, kn + p * kpass, 16);
            cp_async16(wd + b * KSTAGE + p * KRS * KROW, wn + p * wpass, 16);
        }
        if (has_u) {
#pragma unroll
            for (int p = 0; p < VPASS; ++p) {
                if (vr0 + p * VRS < FWDH_BT) cp_async16(ud + b * USTAGE + p * VRS * VROW, un + p * upass, 16);
            }
        }
        if (g_piece) cp_async4(gd + b * (FWDH_BT * 4), gn, 4);
        if (gk_piece) cp_async16(gkd + b * (KP * 4), gkn, 16);
        cp_async_commit();
    };
    auto chunk_rows = [&](i64 c) { return (int)max((i64)0, min((i64)bt, len - c * bt)); };
    // the loads of chunk cn (the next one) into buffer b
    auto load = [&](int b, i64 cn) {
        if (fast && (cn + 1) * FWDH_BT <= len) {
            load_fast(b);
            kn += FWDH_BT * ks, wn += FWDH_BT * ws, un += FWDH_BT * us, gn += FWDH_BT * a.HV, gkn += FWDH_BT * ws;
        } else {
            load_chunk_mma<T, KP, BV, PRESCAN>(a, sm, b, row0 + cn * bt, chunk_rows(cn), kh, hv, cb);
        }
    };
    // h rows of chunk c from s_hi: fixed 16-byte pieces on the fast path (key-first states)
    const bool fast_h = !PRESCAN && a.h != 0 && fast && !a.v_first;
    T* hq = fast_h ? reinterpret_cast<T*>(a.h) + (hbase * a.HV + hv) * a.K * a.V + vr0 * a.V + cb.c0 + vc8 : nullptr;
    const i64 hstep = a.HV * a.K * a.V;
    // v_new rows of the current chunk (advanced by one chunk per step)
    T* vrow = !PRESCAN && a.v_new != 0 ? reinterpret_cast<T*>(a.v_new) + (row0 * a.HV + hv) * a.V + cb.c0 : nullptr;

    // the state tiles, from the incoming state
    float s[SU][4];
#pragma unroll
    for (int j = 0; j < SU; ++j) {
        const int u = warp * SU + j, mt = u / NTN, nt = u % NTN;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = mt * 16 + gid + (e >> 1) * 8, c = nt * 8 + t4 * 2 + (e & 1);
            s[j][e] = (r < a.K && c < nb) ? initial_value<PRESCAN>(a, n, hv, r, cb.c0 + c) : 0.f;
        }
    }
    if (fast && !has_u) {  // pre-scan M columns: u is zero (the fast loads skip it)
        for (int i = tid; i < ST * FWDH_BT * VSEG; i += FWDH_THREADS) {
            *reinterpret_cast<Vec<T, 8>*>(&sm.u[i / (FWDH_BT * VSEG)][(i / VSEG) % FWDH_BT][(i % VSEG) * 8]) = Vec<T, 8>{};
        }
    }
#pragma unroll
    for (int p = 0; p < ST - 1; ++p) load(p, p);

    // One chunk step (FULL: a full 64-row chunk of the fast path).
    // (inlined at its two calls, FULL a constant at each)
    auto step = [&](const bool FULL, i64 c, int buf) {
        const int nc = FULL ? FWDH_BT : chunk_rows(c);
        const int btc = FULL ? FWDH_BT : bt;
        const bool emit = c >= wc;  // a warm-up chunk writes neither h nor v_new
        // 1. the rounded state (hi, and lo when split) into shared memory
#pragma unroll
        for (int j = 0; j < SU; ++j) {
            const int u = warp * SU + j, mt = u / NTN, nt = u % NTN;
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
                const int r = mt * 16 + gid + h2 * 8, col = nt * 8 + t4 * 2;
                const Vec<T, 2> hi = pack2<T>(s[j][2 * h2], s[j][2 * h2 + 1]);
                *reinterpret_cast<Vec<T, 2>*>(&sm.s_hi[r][col]) = hi;
                if (split) {
                    *reinterpret_cast<Vec<T, 2>*>(&sm.s_lo[r][col]) =
                        pack2<T>(s[j][2 * h2] - widen(hi.v[0]), s[j][2 * h2 + 1] - widen(hi.v[1]));
                }
            }
        }
        cp_async_wait<ST - 2>();  // chunk c's group is complete (later chunks may be in flight)
        __syncthreads();          // ... for every thread, and the rounded state is visible
        // 2. (issued after W S, whose products are then in flight) chunk c + ST - 1's loads go
        //    out while this one computes (its buffer: c - 1's), and h is stored
        auto loads_and_h = [&]() {
            load(buf == 0 ? ST - 1 : buf - 1, c + ST - 1);
            if (!emit) {
                // a warm-up chunk stores no h
            } else if (fast_h) {
                T* hc = hq + c * hstep;
#pragma unroll
                for (int p = 0; p < HPASS; ++p) {
                    const int r = vr0 + p * VRS;
                    if (r < KP) *reinterpret_cast<Vec<T, 8>*>(hc + p * VRS * a.V) = *reinterpret_cast<const Vec<T, 8>*>(&sm.s_hi[r][vc8]);
                }
            } else if (!PRESCAN && a.h != 0) {
                store_h<T, KP, BV>(a, sm, hbase + c, hv, cb);
            }
        };

        const int ntiles_d = (btc / 16) * NTN;
        // 3. off the products' path (issued before them, done while they are in flight): the
        //    decay of the state (scalar and per-key gates at the chunk's last row), and u and
        //    the row factors a_r of this warp's D tiles
        const float* gs = sm.g[buf];
        const float g_last = a.g != 0 ? gs[nc - 1] : 0.f;
        const float gamma = a.g != 0 ? ex2_ftz(g_last) : 1.f;
#pragma unroll
        for (int jm = 0; jm < MPW; ++jm) {
            const int mt = (warp * SU + jm * TPM) / NTN;
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
                const int r = mt * 16 + gid + h2 * 8;
                const float f = a.gk != 0 ? gamma * ex2_ftz(sm.gk[buf][r]) : gamma;
#pragma unroll
                for (int jn = 0; jn < TPM; ++jn) {
                    s[jm * TPM + jn][2 * h2] *= f;
                    s[jm * TPM + jn][2 * h2 + 1] *= f;
                }
            }
        }
        Vec<T, 2> uu[DUMAX][2];
        float fa[DUMAX][2];
#pragma unroll
        for (int j = 0; j < DUMAX; ++j) {
            const int u = warp + j * FWDH_WARPS;
            if (u < ntiles_d) {
                const int mt = u / NTN, nt = u % NTN;
#pragma unroll
                for (int h2 = 0; h2 < 2; ++h2) {
                    const int r = mt * 16 + gid + h2 * 8, col = nt * 8 + t4 * 2;
                    uu[j][h2] = *reinterpret_cast<const Vec<T, 2>*>(&sm.u[buf][r][col]);
                    fa[j][h2] = (FULL || r < nc) ? (a.g != 0 ? ex2_ftz(g_last - gs[r]) : 1.f) : 0.f;
                }
            }
        }
        // 4. D = U - W S_T over the chunk's 16 x 8 tiles (two accumulators per tile: even and
        //    odd key steps, so that the dependent chains are half as long)
        const unsigned wbuf = w_s + buf * KSTAGE + a1_lane;
        float dacc[DUMAX][2][4];
#pragma unroll
        for (int j = 0; j < DUMAX; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) dacc[j][0][e] = dacc[j][1][e] = 0.f;
#pragma unroll
        for (int j = 0; j < DUMAX; ++j) {
            const int u = warp + j * FWDH_WARPS;
            if (u < ntiles_d) {
                const int mt = u / NTN, nt = u % NTN;
                const unsigned aw = wbuf + mt * 16 * KROW;
                const unsigned bs = shi_s + b_lane + nt * 16, bl = slo_s + b_lane + nt * 16;
#pragma unroll
                for (int kk = 0; kk < KP / 16; ++kk) {
                    unsigned af[4], bf[2];
                    ldsm_x4(af, aw + kk * 32);
                    ldsm_x2_t(bf, bs + kk * 16 * VROW);
                    Mma<T>::run(dacc[j][kk & 1], af, bf);
                    if (split) {
                        ldsm_x2_t(bf, bl + kk * 16 * VROW);
                        Mma<T>::run(dacc[j][kk & 1], af, bf);
                    }
                }
            }
        }
        loads_and_h();
        // 5. v_new, and a . D rounded into shared memory
#pragma unroll
        for (int j = 0; j < DUMAX; ++j) {
            const int u = warp + j * FWDH_WARPS;
            if (u < ntiles_d) {
                const int mt = u / NTN, nt = u % NTN;
#pragma unroll
                for (int h2 = 0; h2 < 2; ++h2) {
                    const int r = mt * 16 + gid + h2 * 8, col = nt * 8 + t4 * 2;
                    const bool valid = FULL || r < nc;
                    const float d0 = widen(uu[j][h2].v[0]) - (dacc[j][0][2 * h2] + dacc[j][1][2 * h2]);
                    const float d1 = widen(uu[j][h2].v[1]) - (dacc[j][0][2 * h2 + 1] + dacc[j][1][2 * h2 + 1]);
                    if (vrow != nullptr && valid && emit) {
                        if (FULL) *reinterpret_cast<Vec<T, 2>*>(vrow + r * vs + col) = pack2<T>(d0, d1);
                        else store_pair<T>(vrow + r * vs + col, col, nb, pair_ok, d0, d1);
                    }
                    const float ad0 = valid ? fa[j][h2] * d0 : 0.f, ad1 = valid ? fa[j][h2] * d1 : 0.f;
                    const Vec<T, 2> hi = pack2<T>(ad0, ad1);
                    *reinterpret_cast<Vec<T, 2>*>(&sm.d_hi[r][col]) = hi;
                    if (split) {
                        *reinterpret_cast<Vec<T, 2>*>(&sm.d_lo[r][col]) = pack2<T>(ad0 - widen(hi.v[0]), ad1 - widen(hi.v[1]));
                    }
                }
            }
        }
        __syncthreads();  // a . D is visible
        // 6. S += K^T (a . D): per key step, one key fragment for TPM independent tiles
        const unsigned kbuf = k_s + buf * KSTAGE + a2_lane;
#pragma unroll
        for (int ks = 0; ks < FWDH_BT / 16; ++ks) {
            if (ks * 16 < btc) {
#pragma unroll
                for (int jm = 0; jm < MPW; ++jm) {
                    const int mt = (warp * SU + jm * TPM) / NTN;
                    unsigned af[4];
                    ldsm_x4_t(af, kbuf + mt * 32 + ks * 16 * KROW);
#pragma unroll
                    for (int jn = 0; jn < TPM; ++jn) {
                        const int nt = (warp * SU + jm * TPM + jn) % NTN;
                        unsigned bf[2];
                        ldsm_x2_t(bf, dhi_s + b_lane + nt * 16 + ks * 16 * VROW);
                        Mma<T>::run(s[jm * TPM + jn], af, bf);
                        if (split) {
                            ldsm_x2_t(bf, dlo_s + b_lane + nt * 16 + ks * 16 * VROW);
                            Mma<T>::run(s[jm * TPM + jn], af, bf);
                        }
                    }
                }
            }
        }
        // the next step's first barrier orders these reads of buffer `buf`, d_hi and s_hi before
        // they are overwritten
    };

    const i64 nfull = fast ? len / FWDH_BT : 0;
    int buf = 0;
    i64 c = 0;
    for (; c < nfull; ++c) {
        step(true, c, buf);
        buf = buf + 1 == ST ? 0 : buf + 1;
        if (vrow != nullptr) vrow += bt * vs;
    }
    for (; c < nchunks; ++c) {
        step(false, c, buf);
        buf = buf + 1 == ST ? 0 : buf + 1;
        if (vrow != nullptr) vrow += bt * vs;
    }
    cp_async_wait_all();
    if (a.ht != 0) {
#pragma unroll
        for (int j = 0; j < SU; ++j) {
            const int u = warp * SU + j, mt = u / NTN, nt = u % NTN;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = mt * 16 + gid + (e >> 1) * 8, col = nt * 8 + t4 * 2 + (e & 1);
                if (r < a.K && col < nb) store_final<PRESCAN>(a, n, hv, r, cb.c0 + col, s[j][e]);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// FMA kernel (IEEE fp32 for fp32 inputs, fp64 for fp64 inputs: T = Acc): 256 threads, FMA_BV
// state columns, S in shared memory, keys in tiles of FMA_KT rows.

#define FMA_BV 32
#define FMA_KT 32

template <typename Acc> struct FmaSmem {
    Acc s[256][FMA_BV + 1];
    Acc d[FWDH_BT][FMA_BV + 1];
    Acc tile[FWDH_BT][FMA_KT + 1];
    Acc g[FWDH_BT];
    Acc gk[256];
};

template <typename Acc, bool PRESCAN>
__device__ __forceinline__ void fwd_h_fma(const FwdHArgs& a) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    FmaSmem<Acc>& sm = *reinterpret_cast<FmaSmem<Acc>*>(smem_raw);
    const int tid = threadIdx.x;
    const int j = tid % FMA_BV, q0 = tid / FMA_BV;  // column, first row of this thread
    constexpr int RSTEP = FWDH_THREADS / FMA_BV;    // 8
    const i64 n = blockIdx.x / a.HV, hv = blockIdx.x % a.HV;
    const i64 kh = hv / (a.HV / a.H);
    const ColBlock cb(a, blockIdx.y, FMA_BV);
    const i64* seq = reinterpret_cast<const i64*>(a.seqs) + n * 3;
    const int bt = (int)a.bt, K = (int)a.K;
    const i64 wc = row_warmup(a, n);  // leading state-only chunks (h row of chunk c: hbase + c)
    if (wc < 0) return;
    const i64 row0 = seq[0] - wc * bt, len = seq[1] + wc * bt, hbase = seq[2] - wc;
    const i64 nchunks = (len + bt - 1) / bt;
    const bool col_ok = cb.c0 + j < cb.c_end;
    const Acc* kp = reinterpret_cast<const Acc*>(a.k);
    const Acc* wp = reinterpret_cast<const Acc*>(a.w);
    const Acc* up = reinterpret_cast<const Acc*>(a.u);
    const Acc zero = Acc(0);

    for (int r = q0; r < K; r += RSTEP) sm.s[r][j] = col_ok ? initial_value<PRESCAN, Acc>(a, n, hv, r, cb.c0 + j) : zero;
    __syncthreads();
    for (i64 c = 0; c < nchunks; ++c) {
        const int nc = (int)min((i64)bt, len - c * bt);
        const i64 rc = row0 + c * bt;
        const bool emit = c >= wc;  // a warm-up chunk writes neither h nor v_new
        if (!PRESCAN && a.h != 0 && col_ok && emit) {
            Acc* hp = reinterpret_cast<Acc*>(a.h) + ((hbase + c) * a.HV + hv) * a.K * a.V;
            for (int r = q0; r < K; r += RSTEP) {
                hp[a.v_first ? (cb.c0 + j) * a.K + r : r * a.V + cb.c0 + j] = sm.s[r][j];
            }
        }
        for (int r = tid; r < bt; r += FWDH_THREADS) {
            sm.g[r] = (a.g != 0 && r < nc) ? load_f<Acc>(reinterpret_cast<const void*>(a.g), a.g_dtype, (rc + r) * a.HV + hv) : zero;
        }
        for (int i = tid; i < K; i += FWDH_THREADS) {
            sm.gk[i] = a.gk != 0 ? load_f<Acc>(reinterpret_cast<const void*>(a.gk), a.gk_dtype, ((rc + nc - 1) * a.HV + hv) * a.K + i) : zero;
        }
        // D = U - W S: this thread's rows q0, q0 + 8, ... of column j
        Acc d[FWDH_BT / RSTEP];
#pragma unroll
        for (int q = 0; q < FWDH_BT / RSTEP; ++q) {
            const int r = q0 + q * RSTEP;
            d[q] = (r < nc && col_ok && !cb.m_cols) ? up[(rc + r) * a.HV * a.V + hv * a.V + cb.c0 + j] : zero;
        }
        for (int k0 = 0; k0 < K; k0 += FMA_KT) {
            __syncthreads();
            for (int i = tid; i < bt * FMA_KT; i += FWDH_THREADS) {
                const int r = i / FMA_KT, kk = i % FMA_KT;
                sm.tile[r][kk] = (r < nc && k0 + kk < K) ? wp[((rc + r) * a.HV + hv) * a.K + k0 + kk] : zero;
            }
            __syncthreads();
            const int kn = min(FMA_KT, K - k0);
#pragma unroll
            for (int q = 0; q < FWDH_BT / RSTEP; ++q) {
                const int r = q0 + q * RSTEP;
                if (r < bt) {
                    Acc acc = zero;
                    for (int kk = 0; kk < kn; ++kk) acc = fma(sm.tile[r][kk], sm.s[k0 + kk][j], acc);
                    d[q] -= acc;
                }
            }
        }
        const Acc g_last = a.g != 0 ? sm.g[nc - 1] : zero;
#pragma unroll
        for (int q = 0; q < FWDH_BT / RSTEP; ++q) {
            const int r = q0 + q * RSTEP;
            if (r < bt) {
                if (!PRESCAN && a.v_new != 0 && r < nc && col_ok && emit) {
                    reinterpret_cast<Acc*>(a.v_new)[((rc + r) * a.HV + hv) * a.V + cb.c0 + j] = d[q];
                }
                const Acc f = r < nc ? (a.g != 0 ? ex2(g_last - sm.g[r]) : Acc(1)) : zero;
                sm.d[r][j] = r < nc ? f * d[q] : zero;
            }
        }
        const Acc gamma = a.g != 0 ? ex2(g_last) : Acc(1);
        for (int k0 = 0; k0 < K; k0 += FMA_KT) {
            __syncthreads();
            for (int i = tid; i < bt * FMA_KT; i += FWDH_THREADS) {
                const int r = i / FMA_KT, kk = i % FMA_KT;
                sm.tile[r][kk] = (r < nc && k0 + kk < K) ? kp[((rc + r) * a.H + kh) * a.K + k0 + kk] : zero;
            }
            __syncthreads();
            for (int kk = q0; kk < FMA_KT && k0 + kk < K; kk += RSTEP) {
                const int r = k0 + kk;
                const Acc lam = a.gk != 0 ? ex2(sm.gk[r]) : Acc(1);
                Acc acc = sm.s[r][j] * (gamma * lam);
                for (int t = 0; t < bt; ++t) acc = fma(sm.tile[t][kk], sm.d[t][j], acc);
                sm.s[r][j] = acc;
            }
        }
        __syncthreads();
    }
    if (a.ht != 0 && col_ok) {
        for (int r = q0; r < K; r += RSTEP) store_final<PRESCAN, Acc>(a, n, hv, r, cb.c0 + j, sm.s[r][j]);
    }
}

// Kernel entry points of one op (PRESCAN false: fwd_h; true: pre-scan), named
// `<op>_mma_<dtype>_k<KP>_v<BV>` and `<op>_fma_<f32|f64>`.
#define FWDH_MMA_KERNEL(OP, PRE, T, TAG, KP, BV) \
    extern "C" __global__ void __launch_bounds__(FWDH_THREADS, 1) OP##_mma_##TAG##_k##KP##_v##BV(const FwdHArgs a) { \
        fwd_h_mma<T, KP, BV, PRE>(a); \
    }
#define FWDH_MMA_KERNELS_T(OP, PRE, T, TAG) \
    FWDH_MMA_KERNEL(OP, PRE, T, TAG, 64, 16) FWDH_MMA_KERNEL(OP, PRE, T, TAG, 64, 32) FWDH_MMA_KERNEL(OP, PRE, T, TAG, 64, 64) \
    FWDH_MMA_KERNEL(OP, PRE, T, TAG, 128, 16) FWDH_MMA_KERNEL(OP, PRE, T, TAG, 128, 32) FWDH_MMA_KERNEL(OP, PRE, T, TAG, 128, 64) \
    FWDH_MMA_KERNEL(OP, PRE, T, TAG, 256, 16) FWDH_MMA_KERNEL(OP, PRE, T, TAG, 256, 32)
#define FWDH_KERNELS(OP, PRE) \
    FWDH_MMA_KERNELS_T(OP, PRE, bf16, bf16) \
    FWDH_MMA_KERNELS_T(OP, PRE, f16, f16) \
    extern "C" __global__ void __launch_bounds__(FWDH_THREADS, 1) OP##_fma_f32(const FwdHArgs a) { fwd_h_fma<float, PRE>(a); } \
    extern "C" __global__ void __launch_bounds__(FWDH_THREADS, 1) OP##_fma_f64(const FwdHArgs a) { fwd_h_fma<double, PRE>(a); }
