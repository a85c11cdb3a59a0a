// kda_intra_pipe: the intra-chunk stage of the KDA forward (the fused path's, and the staged
// exact fallback's) as a persistent, prefetching kernel (design:
// tools/bench-results/s15_6_study_kda_intra.md §3). The case it serves: bf16, K = V = 128,
// chunk 64, g fp32: the per-step natural-log decay (gate_mode 1) or the input of the in-kernel
// KDA gate (gate_mode 2, gate.cuh; with safe_gate its lower-bound form, without it either form),
// with safe_gate (kda_intra_pipe_bf16: every block of P3 on tensor cores) or without
// (kda_intra_pipe_fma_bf16: P3's diagonal blocks by FMAs, pipe_diag_fma). Outputs: w, u, kg
// (always gated), qg, Aqk, qf; lam where the call passes it (the fused path; the staged path
// passes none); G per token through gout where passed (context parallelism's first half; the
// staged path's gate tiles); no Akk. Every output has the layout and the rounding points of
// kda_intra_mma_fast_bf16 (kda_intra.cu), whose math it computes, per item = (chunk, value
// head), with G the chunk-local cumulative gate in log2 units:
//
//   q̂, k̂ = q, k / sqrt(Σ_d x_d² + 1e-6) rounded to bf16 (with l2norm)
//   kg_r = k̂_r . exp2(G_l - G_r),  qg_r = q̂_r . exp2(G_r),  lam = exp2(G_l),  qf_r = scale
//   Aqk = scale (Q̂ K̂ᵀ ⊙ exp2(G_r - G_j))_{j<=r},  L = β (K̂ K̂ᵀ ⊙ exp2(G_r - G_j))_{j<r}   (P3)
//   xw_r = bf16(β_r k̂_r . exp2(G_r)),  βv_r = bf16(β_r v_r)        (the operands of w and u)
//   Akk = (I + L)^-1 (P4, intra_solve_tc: today's solve),  w = Akk xw,  u = Akk βv   (P5)
//
// Grid: a fixed number of CTAs (2 per multiprocessor), CTA b taking items b, b + grid, ...
// ordered head-fastest. 256 threads, 107264 bytes of shared memory (2 CTAs per SM):
//   QX  16 KB  q -> q̂ -> the Aqk staging -> xw    then q of the next item
//   KV  16 KB  k -> k̂ -> v -> βv                  then k of the next item
//   G   33 KB  g -> G (fp32, rows padded to 528 B) then g of the next item
//   F   18 KB  L (fp32, 64 x 68) -> X = (I + L)^-1 as hi + lo bf16 (2 x 8 KB)
//   S   21.5 KB  the gate's segment totals; the products' partial sums; X (fp32, 64 x 68) and
//              the solve's tmp (48 x 24); the per-warp staging of w, u (2 KB a warp)
// The solve's pitches 68 and 24 keep intra_solve_tc's fragment loads free of bank conflicts (A)
// or 2-way (B) (intra_solve.cuh).
//   small      β
// bf16 tiles are 64 rows of 256 bytes whose 16-byte chunks are XOR-swizzled by row (chunk c of
// row r at c ^ (r & 7)) so that ldmatrix of 8 rows hits 8 distinct bank groups.
// cp.async groups, in commit order: {g(n)}, {q(n), k(n)} before the loop; per item n after the
// elementwise work {v(n)}, {g(n+1)}, then after the products {q(n+1), k(n+1)}. Item n starts
// with wait_group 1 (g landed: gate + cumsum), then wait_group 0 (q, k: the norms). Rows >= n_c
// arrive zero-filled (src-size 0); every factor of such rows is selected to 0 and they are not
// stored; their G is G of row n_c - 1 (their gate is selected to 0 before the cumsum), as today.

#define PIPE_THREADS 256
#define PIPE_BT 64
#define PIPE_K 128
#define PIPE_GP 132  // G row pitch in floats (528 bytes)
#define PIPE_RCP_LN2 1.4426950408889634
#define PIPE_LP 68  // L, X row pitch in floats
#define PIPE_TP 24  // the solve's tmp row pitch in floats

// Shared-memory map (bytes).
#define PIPE_QX 0
#define PIPE_KV 16384
#define PIPE_G 32768
#define PIPE_F (PIPE_G + PIPE_BT * PIPE_GP * 4)
#define PIPE_S (PIPE_F + 18432)
#define PIPE_SMALL (PIPE_S + PIPE_BT * PIPE_LP * 4 + 48 * PIPE_TP * 4)
#define PIPE_SMEM (PIPE_SMALL + PIPE_BT * 4)
static_assert(PIPE_SMEM == 107264, "the host's SMEM (gpu/src/delta/intra_pipe.rs)");
static_assert(PIPE_BT * PIPE_LP * 4 <= PIPE_S - PIPE_F, "L fits F");
static_assert(PIPE_S % 16 == 0, "X in 16-byte pieces");

// The kernel's argument: the intra call and its number of items (chunks x value heads).
struct PipeArgs {
    IntraArgs a;
    i64 items;
};

// One item's geometry: 64-bit bases once per item, 32-bit offsets inside it.
struct PipeItem {
    i64 row0;  // first packed token row
    int nc;    // valid rows
    i64 cidx;  // global chunk index
    int hv, kh;
};

__device__ __forceinline__ PipeItem pipe_item(const IntraArgs& a, int item) {
    const int chunk = item / (int)a.HV;
    const i64* ch = reinterpret_cast<const i64*>(a.chunks) + (i64)chunk * 3;
    PipeItem it;
    it.row0 = ch[0];
    it.nc = (int)ch[1];
    it.cidx = ch[2];
    it.hv = item - chunk * (int)a.HV;
    it.kh = it.hv / (int)(a.HV / a.H);
    return it;
}

// Byte offset of 16-byte chunk c of row r of a swizzled bf16 tile.
__device__ __forceinline__ unsigned pipe_tile(int r, int c) { return (unsigned)(r * 256 + ((c ^ (r & 7)) << 4)); }

// cp.async of a 64 x 256-byte bf16 tile (rows >= nc zero-filled) from src (row stride rs
// bytes): thread = chunk tid % 16 of rows tid / 16 + 16 u (one swizzle for its four rows).
__device__ __forceinline__ void pipe_copy_tile(unsigned dst, const char* src, i64 rs, int nc) {
    const int r0 = threadIdx.x >> 4, c = threadIdx.x & 15;
    dst += pipe_tile(r0, c);
    src += c * 16;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        const int r = r0 + 16 * u;
        const bool ok = r < nc;
        cp_async16(dst + u * 16 * 256, ok ? src + r * rs : src, ok ? 16 : 0);
    }
}

// cp.async of the item's fp32 gate input g (64 x 512 bytes) into G (pitch 528 bytes).
__device__ __forceinline__ void pipe_copy_g(const IntraArgs& a, const PipeItem& it, unsigned G) {
    const char* src = reinterpret_cast<const char*>(a.g) + ((it.row0 * a.HV + it.hv) * PIPE_K) * 4;
    const i64 rs = a.HV * PIPE_K * 4;
    const int r0 = threadIdx.x >> 5, c = threadIdx.x & 31;
    G += r0 * (PIPE_GP * 4) + c * 16;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
        const int r = r0 + 8 * u;
        const bool ok = r < it.nc;
        cp_async16(G + u * 8 * (PIPE_GP * 4), ok ? src + r * rs + c * 16 : src, ok ? 16 : 0);
    }
}

__device__ __forceinline__ void pipe_copy_qk(const IntraArgs& a, const PipeItem& it, unsigned qx, unsigned kv) {
    const i64 off = ((it.row0 * a.H + it.kh) * PIPE_K) * 2, rs = a.H * PIPE_K * 2;
    pipe_copy_tile(qx, reinterpret_cast<const char*>(a.q) + off, rs, it.nc);
    pipe_copy_tile(kv, reinterpret_cast<const char*>(a.k) + off, rs, it.nc);
}

__device__ __forceinline__ void pipe_copy_v(const IntraArgs& a, const PipeItem& it, unsigned kv) {
    const i64 off = ((it.row0 * a.HV + it.hv) * PIPE_K) * 2, rs = a.HV * PIPE_K * 2;
    pipe_copy_tile(kv, reinterpret_cast<const char*>(a.v) + off, rs, it.nc);
}

// The 8 elements of a 16-byte chunk of bf16, widened.
__device__ __forceinline__ void pipe_widen8(const uint4& w, float (&x)[8]) {
    const unsigned u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        x[2 * k] = __uint_as_float(u[k] << 16);
        x[2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
    }
}

// 8 values rounded to bf16 (round to nearest even) in a 16-byte chunk.
__device__ __forceinline__ uint4 pipe_narrow8(const float (&x)[8]) {
    unsigned u[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(u[k]) : "f"(x[2 * k + 1]), "f"(x[2 * k]));
    return make_uint4(u[0], u[1], u[2], u[3]);
}

__device__ __forceinline__ uint4 lds128(unsigned addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}
__device__ __forceinline__ void sts128(unsigned addr, const uint4& v) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
}
__device__ __forceinline__ void lds_f8(unsigned addr, float (&x)[8]) {
    const uint4 a = lds128(addr), b = lds128(addr + 16);
    x[0] = __uint_as_float(a.x), x[1] = __uint_as_float(a.y), x[2] = __uint_as_float(a.z), x[3] = __uint_as_float(a.w);
    x[4] = __uint_as_float(b.x), x[5] = __uint_as_float(b.y), x[6] = __uint_as_float(b.z), x[7] = __uint_as_float(b.w);
}
__device__ __forceinline__ void stg128(char* p, const uint4& v) { *reinterpret_cast<uint4*>(p) = v; }

// P1, the gate (gate_mode 2 in form FORM: the lower-bound form, which safe_gate with the gate in
// the kernel requires (spec 6.3), or without safe_gate also the softplus form; gate_mode 1: g is
// the per-step decay itself) and its chunk-local
// cumsum, in place in G: thread = columns 2p, 2p + 1 (p = tid % 64) of rows 16 s .. 16 s + 15
// (s = tid / 64), in registers. The order of today's kernel for either mode (bit-equal G): each
// 16-row segment summed from 0 in row order, then the totals of the segments before it added in
// order (through S), then the sum times 1 / ln 2.
template <int FORM>
__device__ __forceinline__ void pipe_gate(const IntraArgs& a, const PipeItem& it, unsigned G, float* tot) {
    const int p = threadIdx.x & 63, s = threadIdx.x >> 6, d = 2 * p;
    const bool in_kernel = a.gate_mode == 2;
    Gate<float, 2, FORM> gate;
    if (in_kernel) gate.init(a.gate, (i64)it.hv * PIPE_K + d);
    float x[16][2];
    float run[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const int r = 16 * s + i;
        float v[2];
        asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v[0]), "=f"(v[1]) : "r"(G + (r * PIPE_GP + d) * 4));
        if (in_kernel) gate.apply(v);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            run[e] += r < it.nc ? v[e] : 0.f;
            x[i][e] = run[e];
        }
    }
    tot[s * PIPE_K + d] = run[0];
    tot[s * PIPE_K + d + 1] = run[1];
    __syncthreads();
    float off[2] = {0.f, 0.f};
    for (int t = 0; t < s; ++t) {
        off[0] += tot[t * PIPE_K + d];
        off[1] += tot[t * PIPE_K + d + 1];
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const int r = 16 * s + i;
        const float g0 = (x[i][0] + off[0]) * (float)PIPE_RCP_LN2, g1 = (x[i][1] + off[1]) * (float)PIPE_RCP_LN2;
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(G + (r * PIPE_GP + d) * 4), "f"(g0), "f"(g1));
    }
}

// P1, the rows: 4 lanes per row r = tid / 4, lane `part` holding chunks part + 4 u (u = 0..3)
// of q and k in registers; the sums of squares in today's order (chunk by chunk, element by
// element, then over the 4 lanes), q̂, k̂ rounded to bf16 back in place; β (sigmoid per
// beta_mode) into the small region.
__device__ __forceinline__ void pipe_rows(const IntraArgs& a, const PipeItem& it, unsigned qx, unsigned kv, float* beta) {
    const int r = threadIdx.x >> 2, part = threadIdx.x & 3;
    uint4 q[4], k[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        q[u] = lds128(qx + pipe_tile(r, part + 4 * u));
        k[u] = lds128(kv + pipe_tile(r, part + 4 * u));
    }
    float sq = 0.f, sk = 0.f;
    if (a.l2norm && r < it.nc) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            float x[8], y[8];
            pipe_widen8(q[u], x);
            pipe_widen8(k[u], y);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                sq = fmaf(x[e], x[e], sq);
                sk = fmaf(y[e], y[e], sk);
            }
        }
    }
    sq += __shfl_xor_sync(0xffffffffu, sq, 1);
    sq += __shfl_xor_sync(0xffffffffu, sq, 2);
    sk += __shfl_xor_sync(0xffffffffu, sk, 1);
    sk += __shfl_xor_sync(0xffffffffu, sk, 2);
    const float iq = a.l2norm ? 1.f / sqrtf(sq + 1e-6f) : 1.f;
    const float ik = a.l2norm ? 1.f / sqrtf(sk + 1e-6f) : 1.f;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        float x[8], y[8];
        pipe_widen8(q[u], x);
        pipe_widen8(k[u], y);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            x[e] *= iq;
            y[e] *= ik;
        }
        sts128(qx + pipe_tile(r, part + 4 * u), pipe_narrow8(x));
        sts128(kv + pipe_tile(r, part + 4 * u), pipe_narrow8(y));
    }
    if (part == 0) {
        float b = 0.f;
        if (r < it.nc) {
            b = load_f<float>(reinterpret_cast<const void*>(a.beta), a.beta_dtype, (it.row0 + r) * a.HV + it.hv);
            if (a.beta_mode != 0) b = (float)a.beta_mode / (1.f + expf(-b));
        }
        beta[r] = b;
    }
}

// P2: kg, qg (whole 256-byte rows, 16 bytes a lane), lam (where asked for) and qf, and with gout G per token
// (fp32, two 16-byte stores a lane: today's values and layout). Thread: chunk c = tid % 16
// (columns 8c .. 8c + 7) of rows tid / 16 + 16 i.
__device__ __forceinline__ void pipe_gated(const IntraArgs& a, const PipeItem& it, unsigned qx, unsigned kv, unsigned G) {
    const int c = threadIdx.x & 15, r0 = threadIdx.x >> 4, l = it.nc - 1;
    const i64 base = ((it.row0 * a.HV + it.hv) * PIPE_K) * 2 + c * 16, rs = a.HV * PIPE_K * 2;
    char* kgp = reinterpret_cast<char*>(a.kg) + base;
    char* qgp = reinterpret_cast<char*>(a.qg) + base;
    float gl[8];
    lds_f8(G + (l * PIPE_GP + 8 * c) * 4, gl);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = r0 + 16 * i;
        if (r >= it.nc) break;
        float q[8], k[8], g[8];
        pipe_widen8(lds128(qx + pipe_tile(r, c)), q);
        pipe_widen8(lds128(kv + pipe_tile(r, c)), k);
        lds_f8(G + (r * PIPE_GP + 8 * c) * 4, g);
        if (a.gout != 0) {
            // G per token (fp32, [rows][HV][K]): columns 8c .. 8c + 7 of row r
            char* gp = reinterpret_cast<char*>(a.gout) + ((it.row0 + r) * a.HV + it.hv) * (PIPE_K * 4) + c * 32;
            stg128(gp, make_uint4(__float_as_uint(g[0]), __float_as_uint(g[1]), __float_as_uint(g[2]), __float_as_uint(g[3])));
            stg128(gp + 16, make_uint4(__float_as_uint(g[4]), __float_as_uint(g[5]), __float_as_uint(g[6]), __float_as_uint(g[7])));
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            k[e] *= ex2_ftz(gl[e] - g[e]);
            q[e] *= ex2_ftz(g[e]);
        }
        stg128(kgp + r * rs, pipe_narrow8(k));
        stg128(qgp + r * rs, pipe_narrow8(q));
    }
    const int t = threadIdx.x;
    if (t < PIPE_K) {
        // lam only where the call asks for it (the fused path; the staged path's exact
        // fallback passes none): a is in param space, so the branch is uniform
        if (a.lam != 0) {
            float g;
            asm volatile("ld.shared.f32 %0, [%1];" : "=f"(g) : "r"(G + (l * PIPE_GP + t) * 4));
            reinterpret_cast<float*>(a.lam)[(it.cidx * a.HV + it.hv) * PIPE_K + t] = ex2_ftz(g);
        }
    } else if (t - PIPE_K < it.nc) {
        reinterpret_cast<float*>(a.qf)[(it.row0 + t - PIPE_K) * a.HV + it.hv] = (float)a.scale;
    }
}

// P3, the products of Aqk and L in 16 x 16 blocks (i, j), j <= i, with m = 16 i:
//   exp2(G_r - G_j) = exp2(G_r - G_m) exp2(G_m - G_j)      (r in block i, j in block j)
// so Aqk_ij = scale qe kfᵀ, L_ij = β ke kfᵀ of A_i = (q̂, k̂) . exp2(G_r - G_m) (<= 1) and
// kf_j = k̂_j . exp2(G_m - G_j) (<= 1 off the diagonal; on it, under safe_gate, <= 2^109, which
// bf16's exponent holds), each held as hi + lo of bf16 and multiplied as hi.hi + hi.lo + lo.hi
// (today's operands and products, formed here in registers from ldmatrix fragments and G in
// the fragment layout). Rows >= n_c: every factor selected to 0. Warp w: pair w / 2 owns the
// blocks {30, 31, 32}, {20, 21, 22}, {33, 00} or {10, 11}; half w % 2 the keys [64 h, 64 h + 64).
// Without safe_gate (SAFE false) the diagonal blocks' kf is unbounded (any gate: a step's decay
// may be large); they are the FMAs of pipe_diag_fma, and the pairs own the six blocks below the
// diagonal as {30, 31}, {20, 21}, {32} and {10}.

// Blocks of warp pair `pair`.
template <bool SAFE> __device__ __forceinline__ int pipe_nb(int pair) { return SAFE ? (pair < 2 ? 3 : 2) : (pair < 2 ? 2 : 1); }
// Block b of warp pair `pair`: row block i, column block j.
template <bool SAFE> __device__ __forceinline__ int pipe_bi(int pair, int b) {
    if (!SAFE) return pair == 0 || pair == 2 ? 3 : pair == 1 ? 2 : 1;
    return pair == 0 ? 3 : pair == 1 ? 2 : pair == 2 ? (b == 0 ? 3 : 0) : 1;
}
template <bool SAFE> __device__ __forceinline__ int pipe_bj(int pair, int b) {
    if (!SAFE) return pair < 2 ? b : pair == 2 ? 2 : 0;
    return pair == 2 ? (b == 0 ? 3 : 0) : b;
}
// Slot of block b of pair `pair` among the 10 (SAFE) or 6 blocks (the partial sums' place in S).
template <bool SAFE> __device__ __forceinline__ int pipe_slot(int pair, int b) {
    if (!SAFE) return pair < 2 ? 2 * pair + b : pair + 2;
    return pair < 2 ? 3 * pair + b : 2 * pair + 2 + b;
}

__device__ __forceinline__ void pipe_ldsm_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void pipe_ldsm_x4_t(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ float lds_f(unsigned addr) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(addr));
    return v;
}
__device__ __forceinline__ void sts_f(unsigned addr, float v) { asm volatile("st.shared.f32 [%0], %1;" ::"r"(addr), "f"(v)); }
__device__ __forceinline__ float2 lds_f2(unsigned addr) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr));
    return v;
}

// x (a pair of values in one register of fragment layout) times f, split into hi + lo bf16 pairs.
__device__ __forceinline__ void pipe_split(unsigned x, float f0, float f1, unsigned& hi, unsigned& lo) {
    const float a = __uint_as_float(x << 16) * f0, b = __uint_as_float(x & 0xffff0000u) * f1;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(hi) : "f"(b), "f"(a));
    const float ah = __uint_as_float(hi << 16), bh = __uint_as_float(hi & 0xffff0000u);
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(lo) : "f"(b - bh), "f"(a - ah));
}

__device__ __forceinline__ void pipe_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The A operands of row block i at keys k0 .. k0 + 15: qe, ke as hi + lo fragments.
__device__ __forceinline__ void pipe_a_operands(int i, int k0, int nc, unsigned qx, unsigned kv, unsigned G, unsigned (&qh)[4],
                                                unsigned (&ql)[4], unsigned (&kh)[4], unsigned (&kl)[4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, m = 16 * i;
    const unsigned at = pipe_tile(m + (lane & 15), (k0 >> 3) + (lane >> 4));
    unsigned q[4], k[4];
    pipe_ldsm_x4(q, qx + at);
    pipe_ldsm_x4(k, kv + at);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        // register e: row m + g + 8 (e & 1), keys c, c + 1 with c = k0 + 2 t + 8 (e >> 1)
        const int r = m + g + 8 * (e & 1), c = k0 + 2 * t + 8 * (e >> 1);
        const float2 gr = lds_f2(G + (r * PIPE_GP + c) * 4), gm = lds_f2(G + (m * PIPE_GP + c) * 4);
        const bool ok = r < nc;
        const float f0 = ok ? ex2_ftz(gr.x - gm.x) : 0.f, f1 = ok ? ex2_ftz(gr.y - gm.y) : 0.f;
        pipe_split(q[e], f0, f1, qh[e], ql[e]);
        pipe_split(k[e], f0, f1, kh[e], kl[e]);
    }
}

// The raw k̂ fragments of column block j at keys k0 .. k0 + 15 for the B operand: register
// 2 n + h holds key row 16 j + 8 n + g, keys c, c + 1 with c = k0 + 2 t + 8 h.
__device__ __forceinline__ void pipe_b_raw(int j, int k0, unsigned kv, unsigned (&k)[4]) {
    const int lane = threadIdx.x & 31;
    pipe_ldsm_x4(k, kv + pipe_tile(16 * j + (lane & 7) + ((lane >> 4) << 3), (k0 >> 3) + ((lane >> 3) & 1)));
}

// 8-column tile n of the B operand of block (i, j): kf = k̂_j . exp2(G_m - G_j) as hi + lo.
__device__ __forceinline__ void pipe_b_operand(int i, int j, int n, int k0, int nc, unsigned G, const unsigned (&k)[4], unsigned (&bh)[2],
                                               unsigned (&bl)[2]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, m = 16 * i;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = 16 * j + 8 * n + g, c = k0 + 2 * t + 8 * h;
        const float2 gr = lds_f2(G + (r * PIPE_GP + c) * 4), gm = lds_f2(G + (m * PIPE_GP + c) * 4);
        const bool ok = r < nc && m < nc;
        const float f0 = ok ? ex2_ftz(gm.x - gr.x) : 0.f, f1 = ok ? ex2_ftz(gm.y - gr.y) : 0.f;
        pipe_split(k[2 * n + h], f0, f1, bh[h], bl[h]);
    }
}

// Without safe_gate, the four diagonal blocks (j <= r in one block, m = 16 b) as today's kernel
// takes them: FMAs with exp2(G_r - G_j) as the running product of the steps
// exp2(G_s - G_{s-1}) (s = j + 1 .. r, each <= 1 for any decay) on q̂, k̂ widened to fp32:
//   Aqk_rj = scale Σ_d q̂_rd e_rd,  L_rj = β_r Σ_d k̂_rd e_rd,  e_jd = k̂_jd,  e_rd = e_(r-1)d step_rd.
// The steps of every row but the blocks' first (fp32, 64 x 128: 32 KB over F and S, 16-byte
// units u of row r at u ^ (u / 8 % 2) so that the 8 key groups of a block read 8 distinct bank
// groups), then warp w takes the columns j = w and 15 - w (17 rows between them, r >= j: the
// loop's bounds are the warp's, so nothing is selected), lane = block db = lane / 8 and the
// 16 keys of chunks kq, kq + 8 (kq = lane % 8); the 32 sums of a column (Aqk, L of its 16 rows)
// reduced over the 8 key groups by halving (each lane keeps 4: tensor kq / 4, rows
// 4 (kq % 4) .. + 3). L goes to its place in F (j < r, rows < n_c; else 0), Aqk (scaled, j <= r,
// rows < n_c; else 0) to fp32 blocks [db][r][j] (pitch 17) in S after the six products' partial
// sums, which pipe_products<false> moves into the Aqk staging once q̂ is dead.
#define PIPE_STEPS_BYTES (PIPE_BT * PIPE_K * 4)
#define PIPE_HOLD_OFF (6 * 2048)  // the held Aqk blocks' offset in S: after the six slots
static_assert(PIPE_F + PIPE_STEPS_BYTES <= PIPE_SMALL, "the steps fit F and S");
static_assert(PIPE_S + PIPE_HOLD_OFF + 4 * 16 * 17 * 4 <= PIPE_SMALL, "the held Aqk blocks fit S");

__device__ __forceinline__ unsigned pipe_step_at(int r, int u) { return (unsigned)(r * 512 + ((u ^ ((u >> 3) & 1)) << 4)); }
__device__ __forceinline__ float4 lds_f4(unsigned addr) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr));
    return v;
}
__device__ __forceinline__ void sts_f4(unsigned addr, float x, float y, float z, float w) {
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(x), "f"(y), "f"(z), "f"(w));
}

// The diagonal blocks without safe_gate (see above): steps at `steps` (F, S), L into `L`, Aqk
// into `hold`. Two barriers: after the steps, and after their last read.
__device__ __forceinline__ void pipe_diag_fma(const IntraArgs& a, const PipeItem& it, unsigned qx, unsigned kv, unsigned G, unsigned steps,
                                              unsigned L, unsigned hold, unsigned beta) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nc = it.nc;
    {
        // the steps: thread = unit `lane` (keys 4 lane .. + 3) of rows 8 warp .. + 7 (a block's
        // first row has none)
        const int r0 = 8 * warp;
        float4 prev = make_float4(0.f, 0.f, 0.f, 0.f);
        if (warp & 1) prev = lds_f4(G + ((r0 - 1) * PIPE_GP + 4 * lane) * 4);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int r = r0 + i;
            const float4 cur = lds_f4(G + (r * PIPE_GP + 4 * lane) * 4);
            if (i > 0 || (warp & 1))
                sts_f4(steps + pipe_step_at(r, lane), ex2_ftz(cur.x - prev.x), ex2_ftz(cur.y - prev.y), ex2_ftz(cur.z - prev.z),
                       ex2_ftz(cur.w - prev.w));
            prev = cur;
        }
    }
    __syncthreads();
    const int db = lane >> 3, kq = lane & 7;
    const bool b2 = (kq & 4) != 0, b1 = (kq & 2) != 0, b0 = (kq & 1) != 0;
    // the lane's step units 16 h + 2 kq + p of row 16 db + r at sp[p] + 512 r + 256 h
    // (pipe_step_at: u / 8 % 2 = kq / 4 flips bit 0), and its q̂, k̂ chunks kq + 8 h at
    // qk + 256 r + 128 h + ((kq ^ r % 8) << 4) (pipe_tile: 16 db % 8 = 0)
    const unsigned sp[2] = {steps + db * 8192 + ((2 * kq + (kq >> 2)) << 4), steps + db * 8192 + ((2 * kq + (1 ^ (kq >> 2))) << 4)};
    const unsigned qk = (unsigned)(db * 4096);
    float res0[4], res1[4];
#pragma unroll 1
    for (int s = 0; s < 2; ++s) {
        const int j = s == 0 ? warp : 15 - warp;
        float e[2][8], v[32];  // v: Aqk of rows 0..15, then L of rows 0..15
#pragma unroll
        for (int x = 0; x < 16; ++x) (&e[0][0])[x] = 0.f;
#pragma unroll
        for (int x = 0; x < 32; ++x) v[x] = 0.f;
#pragma unroll
        for (int r = 0; r < 16; ++r) {
            if (r < j) continue;  // the warp's bound
            float q[2][8], k[2][8];
            const unsigned at = qk + 256 * r + ((kq ^ (r & 7)) << 4);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                pipe_widen8(lds128(qx + at + 128 * h), q[h]);
                pipe_widen8(lds128(kv + at + 128 * h), k[h]);
            }
            if (r == j) {
#pragma unroll
                for (int x = 0; x < 16; ++x) (&e[0][0])[x] = (&k[0][0])[x];
            } else {
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int p = 0; p < 2; ++p) {
                        const float4 st = lds_f4(sp[p] + 512 * r + 256 * h);
                        e[h][4 * p] *= st.x, e[h][4 * p + 1] *= st.y, e[h][4 * p + 2] *= st.z, e[h][4 * p + 3] *= st.w;
                    }
#pragma unroll
                for (int x = 0; x < 16; ++x) v[16 + r] = fmaf((&k[0][0])[x], (&e[0][0])[x], v[16 + r]);
            }
#pragma unroll
            for (int x = 0; x < 16; ++x) v[r] = fmaf((&q[0][0])[x], (&e[0][0])[x], v[r]);
        }
        // the sums over the 8 key groups, halving: xor 4 keeps the tensor kq / 4, xor 2 the rows'
        // half kq / 2 % 2, xor 1 their quarter kq % 2
#pragma unroll
        for (int x = 0; x < 16; ++x) {
            const float send = b2 ? v[x] : v[x + 16], keep = b2 ? v[x + 16] : v[x];
            v[x] = keep + __shfl_xor_sync(0xffffffffu, send, 4);
        }
#pragma unroll
        for (int x = 0; x < 8; ++x) {
            const float send = b1 ? v[x] : v[x + 8], keep = b1 ? v[x + 8] : v[x];
            v[x] = keep + __shfl_xor_sync(0xffffffffu, send, 2);
        }
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            const float send = b0 ? v[x] : v[x + 4], keep = b0 ? v[x + 4] : v[x];
            v[x] = keep + __shfl_xor_sync(0xffffffffu, send, 1);
            if (s == 0)
                res0[x] = v[x];
            else
                res1[x] = v[x];
        }
    }
    __syncthreads();  // the steps read (L and the held blocks overwrite them)
    const float scale = (float)a.scale;
#pragma unroll
    for (int s = 0; s < 2; ++s) {
        const int j = s == 0 ? warp : 15 - warp, J = 16 * db + j;
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            const int r = 4 * (kq & 3) + x, R = 16 * db + r;
            const float v = s == 0 ? res0[x] : res1[x];
            if (!b2)
                sts_f(hold + ((16 * db + r) * 17 + j) * 4, R < nc && j <= r ? scale * v : 0.f);
            else
                sts_f(L + (R * PIPE_LP + J) * 4, R < nc && j < r ? lds_f(beta + R * 4) * v : 0.f);
        }
    }
}

// P3 (see above): Aqk (bf16, final) into the rows < n_c of a.aqk, L (fp32, rows < n_c, j < r;
// the rest of the lower blocks 0) into the 64 x 68 matrix at F. Uses S for the partial sums
// of the upper key halves and the first 8 KB of QX (q̂ is dead) to stage Aqk. Without safe_gate
// the diagonal blocks first (pipe_diag_fma: F and S for the steps, L's diagonal blocks in F,
// Aqk's held in S until the staging). Ends with a barrier.
template <bool SAFE>
__device__ __forceinline__ void pipe_products(const IntraArgs& a, const PipeItem& it, unsigned qx, unsigned kv, unsigned G, unsigned part,
                                              unsigned L, unsigned beta) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int pair = warp >> 1, half = warp & 1, nb = pipe_nb<SAFE>(pair), nc = it.nc;
    constexpr int NB = SAFE ? 3 : 2;  // the most blocks a pair owns
    if (!SAFE) pipe_diag_fma(a, it, qx, kv, G, L, L, part + PIPE_HOLD_OFF, beta);
    float acc[NB][2][2][4];  // [block][Aqk, L][8-column tile][fragment]
#pragma unroll
    for (int i = 0; i < NB * 16; ++i) (&acc[0][0][0][0])[i] = 0.f;
#pragma unroll 1
    for (int ks = 0; ks < 4; ++ks) {
        const int k0 = 64 * half + 16 * ks;
        unsigned qh[4], ql[4], kh[4], kl[4];
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            if (b >= nb) break;
            const int i = pipe_bi<SAFE>(pair, b), j = pipe_bj<SAFE>(pair, b);
            if (b == 0 || (SAFE && pair == 2)) pipe_a_operands(i, k0, nc, qx, kv, G, qh, ql, kh, kl);
            unsigned kr[4];
            pipe_b_raw(j, k0, kv, kr);
#pragma unroll
            for (int n = 0; n < 2; ++n) {
                unsigned bh[2], bl[2];
                pipe_b_operand(i, j, n, k0, nc, G, kr, bh, bl);
                pipe_mma(acc[b][0][n], qh, bh[0], bh[1]);  // hi . hi
                pipe_mma(acc[b][1][n], kh, bh[0], bh[1]);
                pipe_mma(acc[b][0][n], qh, bl[0], bl[1]);  // hi . lo
                pipe_mma(acc[b][1][n], kh, bl[0], bl[1]);
                pipe_mma(acc[b][0][n], ql, bh[0], bh[1]);  // lo . hi
                pipe_mma(acc[b][1][n], kl, bh[0], bh[1]);
            }
        }
    }
    // the upper half's partial sums through S ([slot][16 values][lane])
    if (half == 1) {
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            if (b >= nb) break;
#pragma unroll
            for (int e = 0; e < 16; ++e) sts_f(part + ((pipe_slot<SAFE>(pair, b) * 16 + e) * 32 + lane) * 4, (&acc[b][0][0][0])[e]);
        }
    }
    __syncthreads();
    if (half == 1) {
        // the Aqk staging's blocks above the diagonal: 0 (16-byte chunk c of row r: block c / 2)
        // the four upper-half warps (1, 3, 5, 7) as threads 0..127
        for (int x = (warp >> 1) * 32 + lane; x < PIPE_BT * 8; x += 128) {
            const int r = x >> 3, c = x & 7;
            if ((c >> 1) > (r >> 4)) sts128(qx + r * 128 + ((c ^ (r & 7)) << 4), make_uint4(0, 0, 0, 0));
        }
        if (!SAFE) {
            // the held diagonal blocks of Aqk into the staging: thread x = 0..127 the 8 columns
            // 8 h .. + 7 (h = x % 2) of row r = x / 2 % 16 of block db = x / 32
            const int x = (warp >> 1) * 32 + lane, db = x >> 5, r = (x >> 1) & 15, h = x & 1, R = 16 * db + r, c = 2 * db + h;
            float v[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = lds_f(part + PIPE_HOLD_OFF + ((16 * db + r) * 17 + 8 * h + e) * 4);
            sts128(qx + R * 128 + ((c ^ (R & 7)) << 4), pipe_narrow8(v));
        }
    } else {
        const float scale = (float)a.scale;
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            if (b >= nb) break;
            const int i = pipe_bi<SAFE>(pair, b), j = pipe_bj<SAFE>(pair, b);
#pragma unroll
            for (int e = 0; e < 16; ++e) (&acc[b][0][0][0])[e] += lds_f(part + ((pipe_slot<SAFE>(pair, b) * 16 + e) * 32 + lane) * 4);
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int R = 16 * i + g + 8 * h, J = 16 * j + 8 * n + 2 * t;
                    float va[2], vl[2];
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const bool in = R < nc && J + e <= R;
                        va[e] = in ? scale * acc[b][0][n][2 * h + e] : 0.f;
                        vl[e] = in && J + e < R ? lds_f(beta + R * 4) * acc[b][1][n][2 * h + e] : 0.f;
                        sts_f(L + (R * PIPE_LP + J + e) * 4, vl[e]);
                    }
                    unsigned w;
                    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(va[1]), "f"(va[0]));
                    const int c = J >> 3;
                    asm volatile("st.shared.u32 [%0], %1;" ::"r"(qx + R * 128 + ((c ^ (R & 7)) << 4) + (J & 7) * 2), "r"(w));
                }
        }
    }
    __syncthreads();
    // Aqk: rows < n_c, 128 bytes each (8 lanes a row)
    const int c = threadIdx.x & 7, r0 = threadIdx.x >> 3;
    char* ap = reinterpret_cast<char*>(a.aqk) + ((it.row0 * a.HV + it.hv) * PIPE_BT) * 2 + c * 16;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = r0 + 32 * i;
        if (r < nc) stg128(ap + (i64)r * a.HV * PIPE_BT * 2, lds128(qx + r * 128 + ((c ^ (r & 7)) << 4)));
    }
    __syncthreads();
}

// xw_r = bf16(β_r k̂_r . exp2(G_r)) into QX (q̂'s place; 0 for rows >= n_c), thread mapping of
// pipe_gated.
__device__ __forceinline__ void pipe_xw(const PipeItem& it, unsigned qx, unsigned kv, unsigned G, const float* beta) {
    const int c = threadIdx.x & 15, r0 = threadIdx.x >> 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = r0 + 16 * i;
        float k[8], g[8];
        pipe_widen8(lds128(kv + pipe_tile(r, c)), k);
        lds_f8(G + (r * PIPE_GP + 8 * c) * 4, g);
        const float b = beta[r];
#pragma unroll
        for (int e = 0; e < 8; ++e) k[e] = r < it.nc ? b * k[e] * ex2_ftz(g[e]) : 0.f;
        sts128(qx + pipe_tile(r, c), pipe_narrow8(k));
    }
}

// βv_r = bf16(β_r v_r) in place in KV (rows >= n_c arrived as 0), thread mapping of pipe_gated.
__device__ __forceinline__ void pipe_bv(unsigned kv, const float* beta) {
    const int c = threadIdx.x & 15, r0 = threadIdx.x >> 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = r0 + 16 * i;
        float v[8];
        pipe_widen8(lds128(kv + pipe_tile(r, c)), v);
        const float b = beta[r];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = b * v[e];
        sts128(kv + pipe_tile(r, c), pipe_narrow8(v));
    }
}

// Byte offset of 16-byte chunk c of row r of a swizzled 64 x 64 bf16 tile (X hi, X lo, the
// Aqk staging: 128-byte rows).
__device__ __forceinline__ unsigned pipe_tile64(int r, int c) { return (unsigned)(r * 128 + ((c ^ (r & 7)) << 4)); }

// P4, after the solve (X = (I + L)^-1 = Akk, fp32 64 x 68): X as hi + lo bf16 tiles (today's
// split: hi = bf16(x), lo = bf16(x - hi)). Thread: row tid / 4, columns 16 (tid % 4) .. + 15,
// read in 16-byte pieces.
__device__ __forceinline__ void pipe_split_x(const float* X, unsigned xh, unsigned xl) {
    const int r = threadIdx.x >> 2, c0 = 2 * (threadIdx.x & 3);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        unsigned hi[4], lo[4];
        const float4 p0 = *reinterpret_cast<const float4*>(X + r * PIPE_LP + 8 * (c0 + h));
        const float4 p1 = *reinterpret_cast<const float4*>(X + r * PIPE_LP + 8 * (c0 + h) + 4);
        const float xs[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float x0 = xs[2 * e], x1 = xs[2 * e + 1];
            asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(hi[e]) : "f"(x1), "f"(x0));
            const float h0 = __uint_as_float(hi[e] << 16), h1 = __uint_as_float(hi[e] & 0xffff0000u);
            asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(lo[e]) : "f"(x1 - h1), "f"(x0 - h0));
        }
        sts128(xh + pipe_tile64(r, c0 + h), make_uint4(hi[0], hi[1], hi[2], hi[3]));
        sts128(xl + pipe_tile64(r, c0 + h), make_uint4(lo[0], lo[1], lo[2], lo[3]));
    }
}

// P5: w = Akk xw, u = Akk βv (Akk = X_hi + X_lo, the products X_hi B + X_lo B as today's), only
// the lower 16 x 16 blocks. Warp w: the 32 columns 32 (w % 4) .. + 31 of row tiles {3, 0} (warps
// 0-3) or {2, 1} (warps 4-7), five blocks each, both outputs. Each 16 x 32 result goes through
// the warp's 2 KB of S (16-byte chunks swizzled by row) to whole 64-byte row pieces in global
// memory; rows >= n_c are not stored.
__device__ __forceinline__ void pipe_wu(const IntraArgs& a, const PipeItem& it, unsigned xh, unsigned xl, unsigned qx, unsigned kv,
                                        unsigned stage) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3, qc = warp & 3;
    const i64 base = ((it.row0 * a.HV + it.hv) * PIPE_K) * 2 + 64 * qc, rs = a.HV * PIPE_K * 2;
    const unsigned st = stage + warp * 2048;
#pragma unroll 1
    for (int p = 0; p < 2; ++p) {
        const int rt = warp < 4 ? (p == 0 ? 3 : 0) : (p == 0 ? 2 : 1);
#pragma unroll
        for (int o = 0; o < 2; ++o) {
            const unsigned src = o == 0 ? qx : kv;
            float acc[4][4];
#pragma unroll
            for (int i = 0; i < 16; ++i) (&acc[0][0])[i] = 0.f;
#pragma unroll 1
            for (int js = 0; js <= rt; ++js) {
                unsigned ah[4], al[4];
                const unsigned at = pipe_tile64(16 * rt + (lane & 15), 2 * js + (lane >> 4));
                pipe_ldsm_x4(ah, xh + at);
                pipe_ldsm_x4(al, xl + at);
#pragma unroll
                for (int n2 = 0; n2 < 2; ++n2) {
                    unsigned b[4];
                    pipe_ldsm_x4_t(b, src + pipe_tile(16 * js + (lane & 15), 4 * qc + 2 * n2 + (lane >> 4)));
                    pipe_mma(acc[2 * n2], ah, b[0], b[1]);
                    pipe_mma(acc[2 * n2], al, b[0], b[1]);
                    pipe_mma(acc[2 * n2 + 1], ah, b[2], b[3]);
                    pipe_mma(acc[2 * n2 + 1], al, b[2], b[3]);
                }
            }
            // the 16 x 32 result, bf16, into the staging (row r: 64 bytes, chunk n at n ^ (r / 2 % 4))
#pragma unroll
            for (int n = 0; n < 4; ++n)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = g + 8 * h;
                    unsigned w;
                    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(acc[n][2 * h + 1]), "f"(acc[n][2 * h]));
                    asm volatile("st.shared.u32 [%0], %1;" ::"r"(st + r * 64 + ((n ^ ((r >> 1) & 3)) << 4) + 4 * t), "r"(w));
                }
            __syncwarp();
            char* dst = reinterpret_cast<char*>(o == 0 ? a.w : a.u) + base;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = (lane >> 2) + 8 * h, c = lane & 3, row = 16 * rt + r;
                const uint4 v = lds128(st + r * 64 + ((c ^ ((r >> 1) & 3)) << 4));
                if (row < it.nc) stg128(dst + row * rs + 16 * c, v);
            }
            __syncwarp();
        }
    }
}

template <bool SAFE>
__device__ void kda_intra_pipe(const PipeArgs& pa) {
    const IntraArgs& a = pa.a;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const unsigned sb = smem_u32(smem_raw);
    const unsigned qx = sb + PIPE_QX, kv = sb + PIPE_KV, G = sb + PIPE_G;
    float* tot = reinterpret_cast<float*>(smem_raw + PIPE_S);
    float* L = reinterpret_cast<float*>(smem_raw + PIPE_F);
    float* X = tot;                                  // P4: X (64 x 68), then tmp (48 x 24)
    const unsigned xh = sb + PIPE_F, xl = xh + 8192;  // P4, P5: X as hi + lo bf16 (L is dead)
    float* beta = reinterpret_cast<float*>(smem_raw + PIPE_SMALL);
    const int stride = gridDim.x, items = (int)pa.items;
    int item = blockIdx.x;
    if (item >= items) return;
    {
        const PipeItem it = pipe_item(a, item);
        pipe_copy_g(a, it, G);
        cp_async_commit();
        pipe_copy_qk(a, it, qx, kv);
        cp_async_commit();
    }
    for (; item < items; item += stride) {
        const int next = item + stride;  // the host keeps items + grid < 2^31
        const bool more = next < items;
        // the item's geometry, read again from the (cached) chunk table before P5 rather than
        // held in registers through the solve
        const PipeItem it = pipe_item(a, item);
        // P1: gate + cumsum (g landed), then the norms (q, k landed)
        cp_async_wait<1>();
        __syncthreads();
        if (SAFE || a.gate_mode != 2 || a.gate.has_lower_bound)
            pipe_gate<GATE_BOUNDED>(a, it, G, tot);
        else
            pipe_gate<GATE_SOFTPLUS>(a, it, G, tot);
        cp_async_wait<0>();
        __syncthreads();
        pipe_rows(a, it, qx, kv, beta);
        __syncthreads();
        // P2 (no barrier: P3 only reads q̂, k̂, G too)
        pipe_gated(a, it, qx, kv, G);
        // P3
        pipe_products<SAFE>(a, it, qx, kv, G, sb + PIPE_S, sb + PIPE_F, sb + PIPE_SMALL);
        pipe_xw(it, qx, kv, G, beta);
        __syncthreads();
        // v of this item, g of the next (k̂ and G are dead)
        pipe_copy_v(a, it, kv);
        cp_async_commit();
        if (more) pipe_copy_g(a, pipe_item(a, next), G);
        cp_async_commit();
        // P4: X = (I + L)^-1 (L in F; X, tmp in S), then X as hi + lo into F
        intra_solve_tc(reinterpret_cast<float (*)[PIPE_LP]>(L), reinterpret_cast<float (*)[PIPE_LP]>(X),
                       reinterpret_cast<float (*)[PIPE_TP]>(X + PIPE_BT * PIPE_LP));
        pipe_split_x(X, xh, xl);
        // P5: βv (v landed), then w, u
        cp_async_wait<1>();
        __syncthreads();
        pipe_bv(kv, beta);
        __syncthreads();
        pipe_wu(a, pipe_item(a, item), xh, xl, qx, kv, sb + PIPE_S);
        __syncthreads();
        // q, k of the next item
        if (more) pipe_copy_qk(a, pipe_item(a, next), qx, kv);
        cp_async_commit();
    }
    cp_async_wait<0>();
}

#ifndef KDA_INTRA_PIPE_MIN_BLOCKS
#define KDA_INTRA_PIPE_MIN_BLOCKS 2
#endif

// With safe_gate: every block on tensor cores.
extern "C" __global__ void __launch_bounds__(PIPE_THREADS, KDA_INTRA_PIPE_MIN_BLOCKS) kda_intra_pipe_bf16(const PipeArgs pa) {
    kda_intra_pipe<true>(pa);
}

// Without safe_gate: the diagonal blocks by FMAs (pipe_diag_fma), the gate in the kernel in
// either form.
extern "C" __global__ void __launch_bounds__(PIPE_THREADS, KDA_INTRA_PIPE_MIN_BLOCKS) kda_intra_pipe_fma_bf16(const PipeArgs pa) {
    kda_intra_pipe<false>(pa);
}
