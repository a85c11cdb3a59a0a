// Softmax attention of a query group over per-row key ranges, shared by the NSA attention
// branches (`conformance/spec/ops-nsa.md` §3, §5, §7): KIND 0 compressed blocks
// (`nsa_compression_attention`), KIND 1 selected blocks (`nsa_selection_attention`), KIND 2 the
// causal sliding window (`nsa_fwd`). For a token t (position p in its sequence, which starts at
// token bos) and KV head h, the keys are a multiset of ranges of rows of k / v ([rows, H, K] /
// [rows, H, V]):
//   KIND 0: one range, compressed rows cmp[n] .. cmp[n] + C(p), C the visible count
//           (complete: min((p+1)/BS, TC_n); started: min(p/BS + 1, TC_n); all: TC_n);
//   KIND 1: a range per slot i < n_sel (block_counts[t, h], or S): idx = block_indices[t, h, i]
//           is valid iff 0 <= idx <= p / BS (idx * BS never computed for an invalid idx) and
//           gives tokens bos + idx*BS .. bos + min(idx*BS + BS, p + 1) - 1; duplicates count twice;
//   KIND 2: one range, tokens bos + max(0, p - w + 1) .. bos + p (exactly w keys once p >= w-1).
// For each query head hq = h*G + g: z_j = scale * q[t, hq] . k[j, h], lse = logsumexp z,
// o = sum_j exp(z_j - lse) v[j, h]; no key: o = 0, lse = empty_lse (-inf, or 0).
//
// attend_mma (bf16/f16, K = 16 KS, V = 16 VN; built: (K, V) in (32, 32), (32, 64), (64, 32),
// (64, 64), (128, 128)): a warp per (token, KV head), WPB warps of
// consecutive tokens of one head per block. The G query heads of the group are the M dimension
// of mma.sync m16n8k16 (fp32 accumulation), in m tiles of 16 heads (rows past G zero); for each
// m tile the keys stream in tiles of 16 rows, K and V staged in the warp's shared memory by
// cp.async (zero-filled past the range, double-buffered: the next tile loads while this one
// computes), read as fragments by ldmatrix (V transposed). Online softmax in fp32 (log2 domain),
// P rounded to the input dtype for P.V (as FLA does), o = acc / l rounded once, lse in fp32.
// With G <= 16 every K/V tile is loaded once per group.
//
// attend_fma (any float dtype, any K, V <= 256): a warp per (token, query head), keys in chunks
// of 32 (a lane per key: its full dot product), online softmax in Acc, lanes over V features.
//
// Limits (typed errors on the host): K <= 256, V <= 256.

struct AttendArgs {
    u64 q;        // const T* [rows, HQ, K]
    u64 k;        // const T* [krows, H, K]
    u64 v;        // const T* [krows, H, V]
    u64 cu;       // const i64* [nseq + 1] token offsets
    u64 cmp;      // const i64* [nseq + 1] compressed-row offsets (KIND 0)
    u64 idx;      // const int* or i64* [rows, H, S] (KIND 1)
    u64 counts;   // const int* [rows, H] (KIND 1; 0: all S slots)
    u64 o;        // T* [rows, HQ, V]
    u64 lse;      // float* [rows, HQ] (0: not written)
    i64 nseq;
    i64 rows;     // tokens
    i64 hq;
    i64 h;
    i64 kd;
    i64 vd;
    i64 bs;
    i64 s;        // slots per row (KIND 1)
    i64 idx64;    // block_indices are int64 (KIND 1)
    i64 mode;     // KIND 0: visibility (0 complete, 1 started, 2 all); KIND 2: the window w
    float empty_lse;
    float pad_;
    double scale;
};

__device__ __forceinline__ i64 att_seq_of(const i64* __restrict__ off, i64 n, i64 r) {
    i64 lo = 0, hi = n - 1;
    while (lo < hi) {
        const i64 mid = (lo + hi + 1) >> 1;
        if (off[mid] <= r) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// What a row (token t, KV head h) needs to enumerate its key ranges.
struct AttRow {
    i64 p;      // position in the sequence
    i64 bos;    // first token of the sequence
    i64 cbase;  // first compressed row of the sequence (KIND 0)
    i64 tc;     // compressed rows of the sequence (KIND 0)
    i64 nr;     // number of ranges
    i64 slot0;  // index of the row's first slot (KIND 1)
};

template <int KIND> __device__ __forceinline__ AttRow att_row(const AttendArgs& a, i64 t, i64 h) {
    AttRow r;
    const i64* cu = reinterpret_cast<const i64*>(a.cu);
    const i64 n = att_seq_of(cu, a.nseq, t);
    r.bos = cu[n];
    r.p = t - r.bos;
    r.cbase = r.tc = r.slot0 = 0;
    r.nr = 1;
    if (KIND == 0) {
        const i64* cmp = reinterpret_cast<const i64*>(a.cmp);
        r.cbase = cmp[n];
        r.tc = cmp[n + 1] - cmp[n];
    } else if (KIND == 1) {
        r.slot0 = (t * a.h + h) * a.s;
        r.nr = a.s;
        if (a.counts) r.nr = min(max((i64) reinterpret_cast<const int*>(a.counts)[t * a.h + h], (i64)0), a.s);
    }
    return r;
}

// Range i of a row: rows start .. start + len - 1 of k / v (len 0: an ignored slot).
template <int KIND>
__device__ __forceinline__ void att_range(const AttendArgs& a, const AttRow& r, i64 i, i64& start, i64& len) {
    if (KIND == 0) {
        const i64 vis = a.mode == 0 ? (r.p + 1) / a.bs : a.mode == 1 ? r.p / a.bs + 1 : r.tc;
        start = r.cbase;
        len = min(vis, r.tc);
    } else if (KIND == 1) {
        const i64 idx = a.idx64 ? reinterpret_cast<const i64*>(a.idx)[r.slot0 + i]
                                : (i64) reinterpret_cast<const int*>(a.idx)[r.slot0 + i];
        if (idx < 0 || idx > r.p / a.bs) {
            start = len = 0;
        } else {
            start = r.bos + idx * a.bs;
            len = min(a.bs, r.p + 1 - idx * a.bs);
        }
    } else {
        len = min(r.p + 1, a.mode);
        start = r.bos + r.p + 1 - len;
    }
}

template <typename Acc> __device__ __forceinline__ Acc att_ninf();
template <> __device__ __forceinline__ float att_ninf() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double att_ninf() { return __longlong_as_double(0xfff0000000000000ULL); }
__device__ __forceinline__ float att_exp(float x) { return expf(x); }
__device__ __forceinline__ double att_exp(double x) { return exp(x); }
__device__ __forceinline__ float att_log(float x) { return logf(x); }
__device__ __forceinline__ double att_log(double x) { return log(x); }

// ---------------------------------------------------------------- CUDA-core path (any dtype)

#define ATT_FMA_WARPS 8
#define ATT_FMA_VL 8  // V <= 32 * ATT_FMA_VL

template <typename T, typename Acc, int KIND>
__device__ __forceinline__ void attend_fma(const AttendArgs& a) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const i64 row = (i64)blockIdx.x * ATT_FMA_WARPS + w;  // t * HQ + hq
    if (row >= a.rows * a.hq) return;
    const i64 t = row / a.hq, hq = row % a.hq, G = a.hq / a.h, h = hq / G;
    Acc* qs = reinterpret_cast<Acc*>(smem) + (i64)w * a.kd;
    const T* q = reinterpret_cast<const T*>(a.q) + row * a.kd;
    for (i64 d = lane; d < a.kd; d += 32) qs[d] = (Acc)widen(q[d]);
    __syncwarp();
    const AttRow r = att_row<KIND>(a, t, h);
    const T* kb = reinterpret_cast<const T*>(a.k) + h * a.kd;
    const T* vb = reinterpret_cast<const T*>(a.v) + h * a.vd;
    const i64 ks = a.h * a.kd, vs = a.h * a.vd;
    const Acc scale = (Acc)a.scale, ninf = att_ninf<Acc>();
    Acc m = ninf, l = (Acc)0, o[ATT_FMA_VL];
#pragma unroll
    for (int f = 0; f < ATT_FMA_VL; ++f) o[f] = (Acc)0;
    for (i64 i = 0; i < r.nr; ++i) {
        i64 start, len;
        att_range<KIND>(a, r, i, start, len);
        for (i64 j0 = 0; j0 < len; j0 += 32) {
            const i64 j = j0 + lane;
            Acc z = ninf;
            if (j < len) {
                const T* kr = kb + (start + j) * ks;
                Acc dot = (Acc)0;
                for (i64 d = 0; d < a.kd; ++d) dot += qs[d] * (Acc)widen(kr[d]);
                z = dot * scale;
            }
            Acc cm = z;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) cm = max(cm, __shfl_xor_sync(0xffffffffu, cm, off));
            const Acc mn = max(m, cm);  // finite: the chunk has a key
            const Acc alpha = m == ninf ? (Acc)0 : att_exp(m - mn);
            const Acc pj = j < len ? att_exp(z - mn) : (Acc)0;
            l = l * alpha + warp_sum(pj);
            m = mn;
#pragma unroll
            for (int f = 0; f < ATT_FMA_VL; ++f) o[f] *= alpha;
            const int nin = (int)min((i64)32, len - j0);
            for (int jj = 0; jj < nin; ++jj) {
                const Acc pb = __shfl_sync(0xffffffffu, pj, jj);
                const T* vr = vb + (start + j0 + jj) * vs;
#pragma unroll
                for (int f = 0; f < ATT_FMA_VL; ++f) {
                    const i64 e = lane + 32 * f;
                    if (e < a.vd) o[f] += pb * (Acc)widen(vr[e]);
                }
            }
        }
    }
    const bool empty = l == (Acc)0;
    const Acc inv = empty ? (Acc)0 : (Acc)1 / l;
    T* out = reinterpret_cast<T*>(a.o) + row * a.vd;
#pragma unroll
    for (int f = 0; f < ATT_FMA_VL; ++f) {
        const i64 e = lane + 32 * f;
        if (e < a.vd) out[e] = Narrow<T>::from(o[f] * inv);
    }
    if (a.lse && lane == 0) reinterpret_cast<float*>(a.lse)[row] = empty ? a.empty_lse : (float)(m + att_log(l));
}

// ---------------------------------------------------------------- tensor-core path (bf16/f16)

#define ATT_MMA_WARPS 4
#define ATT_LOG2E 1.4426950408889634f
#define ATT_LN2 0.6931471805599453f

__device__ __forceinline__ unsigned att_smem(const void* p) {
    unsigned long long x;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(x) : "l"(p));
    return (unsigned)x;
}
// 16 bytes global -> shared (bytes 0: zero-filled). CA: through L1 (.ca), where the warps of one
// SM reading the same rows hit (the per-warp kernel: measured 1.49x on the selected branch of
// the benchmark, NOTES.md); else L2 only (.cg: the block-shared kernel reads each row once).
template <bool CA> __device__ __forceinline__ void att_cp16(unsigned dst, const void* src, int bytes) {
    if (CA) {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
    } else {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
    }
}
// The per-warp kernel's cache operator; -DATTN_NSA_CP_CA=0 (ATTN_NVRTC_OPTS) for .cg, to tune.
#ifndef ATTN_NSA_CP_CA
#define ATTN_NSA_CP_CA 1
#endif
__device__ __forceinline__ void att_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int P> __device__ __forceinline__ void att_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(P) : "memory"); }
__device__ __forceinline__ void att_ldsm(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void att_ldsm_t(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ float att_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

template <typename T> struct AttMma;
template <> struct AttMma<bf16> {
    __device__ __forceinline__ static void run(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    // {lo, hi} rounded to bf16, lo in the low half
    __device__ __forceinline__ static unsigned pack(float lo, float hi) {
        unsigned r;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
};
template <> struct AttMma<f16> {
    __device__ __forceinline__ static void run(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    __device__ __forceinline__ static unsigned pack(float lo, float hi) {
        unsigned r;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
};

// A position in a row's key tiles: range i, rows start .. start + len - 1, tile offset kb.
struct AttCursor {
    i64 i, start, len, kb;
};

// Moves to the next tile of 16 rows (skipping empty ranges); false past the last range.
template <int KIND>
__device__ __forceinline__ bool att_next(const AttendArgs& a, const AttRow& r, AttCursor& u) {
    u.kb += 16;
    while (u.kb >= u.len) {
        if (++u.i >= r.nr) return false;
        att_range<KIND>(a, r, u.i, u.start, u.len);
        u.kb = 0;
    }
    return true;
}

// cp.async of the 16 rows r0 .. r0 + 15 of a [rows, D] operand (row stride `stride`) into
// padded shared rows at shared address dst, rows n .. 15 zero-filled, by NT threads (thread
// `tid`): thread i copies the 16-byte column i % (D / 8) of rows i / (D / 8) + j * (8 NT / D).
template <typename T, int D, int NT, bool CA>
__device__ __forceinline__ void att_stage_rows(const T* __restrict__ base, i64 stride, i64 r0, i64 n, unsigned dst,
                                               int tid) {
    constexpr int C = D / 8, R = NT / C, DP = D + 8, PASSES = R >= 16 ? 1 : 16 / R;
    const int row0 = tid / C, col = (tid % C) * 8;
    const T* src0 = base + r0 * stride + col;
    const T* src = src0 + row0 * stride;
    const i64 step = R * stride;
    const unsigned d0 = dst + (unsigned)((row0 * DP + col) * sizeof(T));
#pragma unroll
    for (int i = 0; i < PASSES; ++i) {
        const int row = row0 + i * R;
        if (row >= 16) break;
        const bool ok = row < n;
        att_cp16<CA>(d0 + (unsigned)(i * R * DP * sizeof(T)), ok ? src + i * step : src0, ok ? 16 : 0);
    }
}

// One m tile (16 query heads of a group) of one warp: the Q fragments, the output accumulator
// (columns of V in n8 tiles), and the running max (log2 domain) and sum of rows group and
// group + 8.
template <int KS, int VN> struct AttState {
    unsigned qa[KS][4];
    float acc[2 * VN][4];
    float mx[2], ls[2];
};

// Loads the Q fragments of heads g0 = m0 + group and g0 + 8 of token row `qrow` (rows past G
// are zero) and clears the state.
template <typename T, int KS, int VN>
__device__ __forceinline__ void att_begin(AttState<KS, VN>& st, const T* __restrict__ qrow, i64 g0, i64 G, int quad) {
    constexpr int K = 16 * KS;
    const i64 g1 = g0 + 8;
    const T* q0 = qrow + g0 * K + quad * 2;
    const T* q1 = q0 + 8 * K;
#pragma unroll
    for (int s = 0; s < KS; ++s) {
        st.qa[s][0] = g0 < G ? *reinterpret_cast<const unsigned*>(q0 + s * 16) : 0u;
        st.qa[s][1] = g1 < G ? *reinterpret_cast<const unsigned*>(q1 + s * 16) : 0u;
        st.qa[s][2] = g0 < G ? *reinterpret_cast<const unsigned*>(q0 + s * 16 + 8) : 0u;
        st.qa[s][3] = g1 < G ? *reinterpret_cast<const unsigned*>(q1 + s * 16 + 8) : 0u;
    }
#pragma unroll
    for (int n = 0; n < 2 * VN; ++n) st.acc[n][0] = st.acc[n][1] = st.acc[n][2] = st.acc[n][3] = 0.f;
    st.mx[0] = st.mx[1] = att_ninf<float>();
    st.ls[0] = st.ls[1] = 0.f;
}

// One staged tile of 16 keys: columns lo .. hi - 1 of it are this warp's keys (at least one).
// kaddr / vaddr: this lane's ldmatrix row addresses in the tile's K and V rows.
template <typename T, int KS, int VN>
__device__ __forceinline__ void att_tile(AttState<KS, VN>& st, unsigned kaddr, unsigned vaddr, int lo, int hi, float sl2,
                                         int quad) {
    const float ninf = att_ninf<float>();
    // S = Q K^T: two n8 tiles of keys (0..7, 8..15)
    float sc[2][4];
#pragma unroll
    for (int n = 0; n < 2; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
#pragma unroll
    for (int s = 0; s < KS; ++s) {
        unsigned b[4];
        att_ldsm(b, kaddr + s * 32);
        AttMma<T>::run(sc[0], st.qa[s], b[0], b[1]);
        AttMma<T>::run(sc[1], st.qa[s], b[2], b[3]);
    }
    // online softmax of rows group (e = 0, 1) and group + 8 (e = 2, 3), log2 domain
    float tmax[2] = {ninf, ninf};
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int col = n * 8 + quad * 2 + (e & 1);
            sc[n][e] = col >= lo && col < hi ? sc[n][e] * sl2 : ninf;
            tmax[e >> 1] = max(tmax[e >> 1], sc[n][e]);
        }
    float alpha[2];
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        tmax[x] = max(tmax[x], __shfl_xor_sync(0xffffffffu, tmax[x], 1));
        tmax[x] = max(tmax[x], __shfl_xor_sync(0xffffffffu, tmax[x], 2));
        const float mn = max(st.mx[x], tmax[x]);  // finite: the tile has a key
        alpha[x] = att_ex2(st.mx[x] - mn);
        st.mx[x] = mn;
        st.ls[x] *= alpha[x];
    }
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            sc[n][e] = att_ex2(sc[n][e] - st.mx[e >> 1]);
            st.ls[e >> 1] += sc[n][e];
        }
    // the running max rarely moves once a few tiles are in: rescale only when it did
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int n = 0; n < 2 * VN; ++n) {
            st.acc[n][0] *= alpha[0];
            st.acc[n][1] *= alpha[0];
            st.acc[n][2] *= alpha[1];
            st.acc[n][3] *= alpha[1];
        }
    }
    // O += P V: P (16 heads x 16 keys) as the A fragment, V^T fragments by ldmatrix.trans
    const unsigned pa[4] = {AttMma<T>::pack(sc[0][0], sc[0][1]), AttMma<T>::pack(sc[0][2], sc[0][3]),
                            AttMma<T>::pack(sc[1][0], sc[1][1]), AttMma<T>::pack(sc[1][2], sc[1][3])};
#pragma unroll
    for (int j = 0; j < VN; ++j) {
        unsigned b[4];
        att_ldsm_t(b, vaddr + j * 32);
        AttMma<T>::run(st.acc[2 * j], pa, b[0], b[1]);
        AttMma<T>::run(st.acc[2 * j + 1], pa, b[2], b[3]);
    }
}

// o = acc / l (rounded once) and lse = ln-domain max + ln l for heads g0 and g0 + 8 (< G) of
// token t; no key: o = 0, lse = empty_lse.
template <typename T, int KS, int VN>
__device__ __forceinline__ void att_end(AttState<KS, VN>& st, const AttendArgs& a, i64 t, i64 h, i64 G, i64 g0,
                                        int quad) {
    constexpr int V = 16 * VN;
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        st.ls[x] += __shfl_xor_sync(0xffffffffu, st.ls[x], 1);
        st.ls[x] += __shfl_xor_sync(0xffffffffu, st.ls[x], 2);
    }
    T* o = reinterpret_cast<T*>(a.o) + (t * a.hq + h * G) * V + quad * 2;
    float* lse = reinterpret_cast<float*>(a.lse) + t * a.hq + h * G;
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        const i64 g = g0 + 8 * x;
        if (g >= G) continue;
        const bool empty = st.ls[x] == 0.f;
        const float inv = empty ? 0.f : 1.f / st.ls[x];
#pragma unroll
        for (int n = 0; n < 2 * VN; ++n) {
            Vec<T, 2> y;
            y.v[0] = Narrow<T>::from(st.acc[n][2 * x] * inv);
            y.v[1] = Narrow<T>::from(st.acc[n][2 * x + 1] * inv);
            *reinterpret_cast<Vec<T, 2>*>(o + g * V + n * 8) = y;
        }
        if (a.lse && quad == 0) lse[g] = empty ? a.empty_lse : (st.mx[x] + __log2f(st.ls[x])) * ATT_LN2;
    }
}

// This lane's ldmatrix row offsets (bytes) in a staged tile: K non-transposed (key, feature),
// V transposed.
template <typename T, int K, int V>
__device__ __forceinline__ void att_lane_rows(int lane, unsigned& koff, unsigned& voff) {
    const int mi = lane >> 3, rr = lane & 7;
    koff = (unsigned)(((rr + (mi >> 1) * 8) * (K + 8) + (mi & 1) * 8) * sizeof(T));
    voff = (unsigned)((16 * (K + 8) + (rr + (mi & 1) * 8) * (V + 8) + (mi >> 1) * 8) * sizeof(T));
}

// Per-warp kernel: each warp its own token, its own double-buffered stages.
template <typename T, int KS, int VN, int KIND>
__device__ __forceinline__ void attend_mma(const AttendArgs& a) {
    constexpr int K = 16 * KS, V = 16 * VN, KP = K + 8, VP = V + 8;
    constexpr unsigned STAGE = 16 * (KP + VP) * sizeof(T);  // bytes of one stage
    extern __shared__ __align__(16) unsigned char smem[];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int group = lane >> 2, quad = lane & 3;
    const i64 t = (i64)blockIdx.x * ATT_MMA_WARPS + w, h = blockIdx.y;
    if (t >= a.rows) return;
    const unsigned sm = att_smem(smem) + w * 2 * STAGE;
    const i64 G = a.hq / a.h;
    const AttRow r = att_row<KIND>(a, t, h);
    const T* kb = reinterpret_cast<const T*>(a.k) + h * K;
    const T* vb = reinterpret_cast<const T*>(a.v) + h * V;
    const i64 ks = a.h * K, vs = a.h * V;
    const float sl2 = (float)a.scale * ATT_LOG2E;
    unsigned koff, voff;
    att_lane_rows<T, K, V>(lane, koff, voff);
    const T* qrow = reinterpret_cast<const T*>(a.q) + (t * a.hq + h * G) * K;
    for (i64 m0 = 0; m0 < G; m0 += 16) {
        AttState<KS, VN> st;
        att_begin<T, KS, VN>(st, qrow, m0 + group, G, quad);
        AttCursor u{-1, 0, 0, -16};
        bool have = att_next<KIND>(a, r, u);
        if (have) {
            const i64 n = min((i64)16, u.len - u.kb);
            att_stage_rows<T, K, 32, ATTN_NSA_CP_CA>(kb, ks, u.start + u.kb, n, sm, lane);
            att_stage_rows<T, V, 32, ATTN_NSA_CP_CA>(vb, vs, u.start + u.kb, n, sm + 16 * KP * (unsigned)sizeof(T), lane);
        }
        att_commit();
        int stage = 0;
        while (have) {
            AttCursor nu = u;
            const bool next = att_next<KIND>(a, r, nu);
            if (next) {
                const unsigned nx = sm + (stage ^ 1) * STAGE;
                const i64 n = min((i64)16, nu.len - nu.kb);
                att_stage_rows<T, K, 32, ATTN_NSA_CP_CA>(kb, ks, nu.start + nu.kb, n, nx, lane);
                att_stage_rows<T, V, 32, ATTN_NSA_CP_CA>(vb, vs, nu.start + nu.kb, n, nx + 16 * KP * (unsigned)sizeof(T), lane);
            }
            att_commit();
            att_wait<1>();
            __syncwarp();
            const unsigned cur = sm + stage * STAGE;
            att_tile<T, KS, VN>(st, cur + koff, cur + voff, 0, (int)min((i64)16, u.len - u.kb), sl2, quad);
            __syncwarp();  // this stage is refilled two tiles on
            u = nu;
            have = next;
            stage ^= 1;
        }
        att_wait<0>();
        att_end<T, KS, VN>(st, a, t, h, G, m0 + group, quad);
    }
}

// One-range kinds (0: compressed blocks, 2: the window) with G <= 16: the ATT_MMA_WARPS
// consecutive tokens of a block read nearly the same rows, so the block stages the union of
// their ranges once (all its threads copy, double-buffered, a barrier per tile) and each warp
// takes the columns of its own range from every tile that holds some. The union is contiguous:
// sequences are packed in token order and both ends of a range never decrease with the token,
// so it runs from the first token's first row to the last token's last.
template <typename T, int KS, int VN, int KIND>
__device__ __forceinline__ void attend_mma_shared(const AttendArgs& a) {
    constexpr int K = 16 * KS, V = 16 * VN, KP = K + 8;
    constexpr int NT = ATT_MMA_WARPS * 32;
    constexpr unsigned STAGE = 16 * (KP + V + 8) * sizeof(T);
    extern __shared__ __align__(16) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int group = lane >> 2, quad = lane & 3;
    const i64 t0 = (i64)blockIdx.x * ATT_MMA_WARPS, h = blockIdx.y;
    const i64 tl = min(t0 + ATT_MMA_WARPS - 1, a.rows - 1), t = t0 + w;
    const bool live = t < a.rows;
    const i64 G = a.hq / a.h;
    i64 ustart, ulen, ulast, mine_start = 0, mine_len = 0;
    {
        const AttRow rf = att_row<KIND>(a, t0, h), rl = att_row<KIND>(a, tl, h);
        i64 s0, l0;
        att_range<KIND>(a, rf, 0, ustart, l0);
        att_range<KIND>(a, rl, 0, s0, ulast);
        ulen = s0 + ulast - ustart;
        if (live) att_range<KIND>(a, att_row<KIND>(a, t, h), 0, mine_start, mine_len);
    }
    const T* kb = reinterpret_cast<const T*>(a.k) + h * K;
    const T* vb = reinterpret_cast<const T*>(a.v) + h * V;
    const i64 ks = a.h * K, vs = a.h * V;
    const float sl2 = (float)a.scale * ATT_LOG2E;
    const unsigned sm = att_smem(smem);
    unsigned koff, voff;
    att_lane_rows<T, K, V>(lane, koff, voff);
    AttState<KS, VN> st;
    if (live) att_begin<T, KS, VN>(st, reinterpret_cast<const T*>(a.q) + (t * a.hq + h * G) * K, group, G, quad);
    // this warp's keys as offsets into the union
    const i64 lo = mine_start - ustart, hi = lo + mine_len;
    if (ulen > 0) {
        const i64 n = min((i64)16, ulen);
        att_stage_rows<T, K, NT, false>(kb, ks, ustart, n, sm, tid);
        att_stage_rows<T, V, NT, false>(vb, vs, ustart, n, sm + 16 * KP * (unsigned)sizeof(T), tid);
    }
    att_commit();
    int stage = 0;
    for (i64 kb0 = 0; kb0 < ulen; kb0 += 16) {
        if (kb0 + 16 < ulen) {
            const unsigned nx = sm + (stage ^ 1) * STAGE;
            const i64 n = min((i64)16, ulen - kb0 - 16);
            att_stage_rows<T, K, NT, false>(kb, ks, ustart + kb0 + 16, n, nx, tid);
            att_stage_rows<T, V, NT, false>(vb, vs, ustart + kb0 + 16, n, nx + 16 * KP * (unsigned)sizeof(T), tid);
        }
        att_commit();
        att_wait<1>();
        __syncthreads();
        const i64 clo = max(lo - kb0, (i64)0), chi = min(hi - kb0, (i64)16);
        if (live && clo < chi) {
            const unsigned cur = sm + stage * STAGE;
            att_tile<T, KS, VN>(st, cur + koff, cur + voff, (int)clo, (int)chi, sl2, quad);
        }
        __syncthreads();  // this stage is refilled two tiles on
        stage ^= 1;
    }
    att_wait<0>();
    if (live) att_end<T, KS, VN>(st, a, t, h, G, group, quad);
}

// Kernels of one KIND: NAME_mma_k{16 KS}_v{16 VN}_{bf16,f16} for the built (K, V), and
// NAME_{f32,f64,bf16,f16} on CUDA cores.
#define ATT_MMA_KERNEL(NAME, KIND, TIN, IN, KS, VN)                                                    \
    extern "C" __global__ void __launch_bounds__(ATT_MMA_WARPS * 32) NAME##_mma_k##KS##_v##VN##_##IN(const AttendArgs a) { \
        attend_mma<TIN, KS / 16, VN / 16, KIND>(a);                                                    \
    }
#define ATT_MMA_SHAPES(NAME, KIND, TIN, IN)                                                             \
    ATT_MMA_KERNEL(NAME, KIND, TIN, IN, 32, 32) ATT_MMA_KERNEL(NAME, KIND, TIN, IN, 32, 64)             \
    ATT_MMA_KERNEL(NAME, KIND, TIN, IN, 64, 32) ATT_MMA_KERNEL(NAME, KIND, TIN, IN, 64, 64)             \
    ATT_MMA_KERNEL(NAME, KIND, TIN, IN, 128, 128)
#define ATT_FMA_KERNEL(NAME, KIND, TIN, ACC, IN)                                                       \
    extern "C" __global__ void __launch_bounds__(ATT_FMA_WARPS * 32) NAME##_##IN(const AttendArgs a) { \
        attend_fma<TIN, ACC, KIND>(a);                                                                 \
    }
// NAME_mma_shared_k{16 KS}_v{16 VN}_{bf16,f16}: the block-shared variant of a one-range KIND.
#define ATT_SHARED_KERNEL(NAME, KIND, TIN, IN, KS, VN)                                               \
    extern "C" __global__ void __launch_bounds__(ATT_MMA_WARPS * 32) NAME##_mma_shared_k##KS##_v##VN##_##IN(const AttendArgs a) { \
        attend_mma_shared<TIN, KS / 16, VN / 16, KIND>(a);                                             \
    }
#define ATT_SHARED_SHAPES(NAME, KIND, TIN, IN)                                                          \
    ATT_SHARED_KERNEL(NAME, KIND, TIN, IN, 32, 32) ATT_SHARED_KERNEL(NAME, KIND, TIN, IN, 32, 64)       \
    ATT_SHARED_KERNEL(NAME, KIND, TIN, IN, 64, 32) ATT_SHARED_KERNEL(NAME, KIND, TIN, IN, 64, 64)       \
    ATT_SHARED_KERNEL(NAME, KIND, TIN, IN, 128, 128)
#define ATT_KERNELS(NAME, KIND)                                                                         \
    ATT_MMA_SHAPES(NAME, KIND, bf16, bf16) ATT_MMA_SHAPES(NAME, KIND, f16, f16)                         \
    ATT_FMA_KERNEL(NAME, KIND, float, float, f32) ATT_FMA_KERNEL(NAME, KIND, double, double, f64)       \
    ATT_FMA_KERNEL(NAME, KIND, bf16, float, bf16) ATT_FMA_KERNEL(NAME, KIND, f16, float, f16)
