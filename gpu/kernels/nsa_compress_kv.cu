// `nsa_compress_kv` (`conformance/spec/ops-nsa.md` §2): block means of k and v in one pass.
//
// The input rows are the packed tokens [rows_in, H*D] (fixed length B > 1 is the packing of B
// sequences of T tokens). A block of threads per compressed row r (every head): the sequence n
// owning r (binary search of cmp[0..N]), its block c = r - cmp[n], tokens t0 = cu[n] + c*BS ..
// t0 + n_c - 1 with n_c = min(BS, L_n - c*BS). The row [k (H*K) | v (H*V)] is split over the
// threads, VEC adjacent columns each (VEC divides H*K and H*V); each thread sums its columns
// over the n_c tokens in Acc (fp32, fp64 for fp64), UNR tokens loaded ahead, and writes the mean:
// narrowed to T, or (k_ws / v_ws: a projection of that side follows) unrounded into an Acc
// workspace.
// All offsets are 64-bit.

struct CompressArgs {
    u64 k;      // const T* [rows_in, ck]
    u64 v;      // const T* [rows_in, cv] (unused when cv == 0)
    u64 k_out;  // T* [rows, ck], or Acc* when k_ws
    u64 v_out;  // T* [rows, cv], or Acc* when v_ws
    u64 cu;     // const i64* [nseq + 1]: token offsets of the sequences
    u64 cmp;    // const i64* [nseq + 1]: compressed-row offsets of the sequences
    i64 nseq;
    i64 ck;     // H * K
    i64 cv;     // H * V, 0 without v
    i64 bs;     // block_size
    i64 rows;   // compressed rows in all
    i64 k_ws;   // k_out is the Acc workspace
    i64 v_ws;   // v_out is the Acc workspace
};

#define COMPRESS_UNR 8

// The sequence owning compressed row r: the last n with cmp[n] <= r (zero-length sequences own
// no row, so ties resolve to the sequence that has rows).
__device__ __forceinline__ i64 owner_of(const i64* __restrict__ cmp, i64 nseq, i64 r) {
    i64 lo = 0, hi = nseq - 1;
    while (lo < hi) {
        const i64 mid = (lo + hi + 1) >> 1;
        if (cmp[mid] <= r) lo = mid; else hi = mid - 1;
    }
    return lo;
}

template <typename T, typename Acc, int VEC>
__device__ __forceinline__ void pool_columns(const T* __restrict__ x, u64 y, bool ws, i64 stride,
                                             i64 t0, i64 nc, i64 col, i64 r) {
    Acc acc[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[j] = (Acc)0;
    const T* p = x + t0 * stride + col;
    i64 t = 0;
    for (; t + COMPRESS_UNR <= nc; t += COMPRESS_UNR) {
        Vec<T, VEC> raw[COMPRESS_UNR];
#pragma unroll
        for (int u = 0; u < COMPRESS_UNR; ++u)
            raw[u] = *reinterpret_cast<const Vec<T, VEC>*>(p + (t + u) * stride);
#pragma unroll
        for (int u = 0; u < COMPRESS_UNR; ++u) {
            Acc w[VEC];
            widen_vec(raw[u], w);
#pragma unroll
            for (int j = 0; j < VEC; ++j) acc[j] += w[j];
        }
    }
    for (; t < nc; ++t) {
        Acc w[VEC];
        widen_vec(*reinterpret_cast<const Vec<T, VEC>*>(p + t * stride), w);
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[j] += w[j];
    }
    const Acc inv = (Acc)1 / (Acc)nc;
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[j] *= inv;
    if (ws) {
        store_vec<Acc, Acc, VEC, true>(reinterpret_cast<Acc*>(y) + r * stride + col, acc);
    } else {
        store_vec<T, Acc, VEC, true>(reinterpret_cast<T*>(y) + r * stride + col, acc);
    }
}

template <typename T, typename Acc, int VEC>
__device__ __forceinline__ void compress_row(const CompressArgs& a) {
    const i64 r = blockIdx.x;
    const i64 col = ((i64)blockIdx.y * blockDim.x + threadIdx.x) * VEC;
    if (col >= a.ck + a.cv) return;
    const i64* cu = reinterpret_cast<const i64*>(a.cu);
    const i64* cmp = reinterpret_cast<const i64*>(a.cmp);
    const i64 n = owner_of(cmp, a.nseq, r);
    const i64 c = r - cmp[n];
    const i64 len = cu[n + 1] - cu[n];
    const i64 t0 = cu[n] + c * a.bs;
    const i64 nc = min(a.bs, len - c * a.bs);
    if (col < a.ck) {
        pool_columns<T, Acc, VEC>(reinterpret_cast<const T*>(a.k), a.k_out, a.k_ws, a.ck, t0, nc, col, r);
    } else {
        pool_columns<T, Acc, VEC>(reinterpret_cast<const T*>(a.v), a.v_out, a.v_ws, a.cv, t0, nc, col - a.ck, r);
    }
}

#define COMPRESS_KERNEL(TIN, ACC, IN, V)                                                              \
    extern "C" __global__ void __launch_bounds__(256) nsa_compress_kv_v##V##_##IN(const CompressArgs a) { \
        compress_row<TIN, ACC, (V <= VMax<TIN>::N ? V : 1)>(a);                                       \
    }
#define COMPRESS_KERNELS(TIN, ACC, IN) \
    COMPRESS_KERNEL(TIN, ACC, IN, 1)   \
    COMPRESS_KERNEL(TIN, ACC, IN, 2)   \
    COMPRESS_KERNEL(TIN, ACC, IN, 4)   \
    COMPRESS_KERNEL(TIN, ACC, IN, 8)

COMPRESS_KERNELS(float, float, f32)
COMPRESS_KERNELS(double, double, f64)
COMPRESS_KERNELS(bf16, float, bf16)
COMPRESS_KERNELS(f16, float, f16)

// ---- the projection: out[r, h, e] = sum_d pooled[r, h, d] * w[h, d, e] ----
//
// pooled is the Acc workspace [rows, H, D]; w [H, D, D] has been widened to Acc ([H, D, D]).
// A block of PROJ_THREADS threads per (PROJ_ROWS rows, head h): the rows' pooled vectors in
// shared memory, each thread a set of output columns e, accumulating over d in Acc; w is read
// once per block (coalesced over e). Output narrowed to T.
#define PROJ_ROWS 8
#define PROJ_THREADS 128

struct ProjectArgs {
    u64 pooled;  // const Acc* [rows, H, D]
    u64 w;       // const Acc* [H, D, D]
    u64 out;     // T* [rows, H, D]
    i64 rows;
    i64 heads;
    i64 d;       // D <= 256 (the host checks)
};

template <typename T, typename Acc>
__device__ __forceinline__ void project_rows(const ProjectArgs& a) {
    __shared__ Acc xs[PROJ_ROWS][256];
    const i64 r0 = (i64)blockIdx.x * PROJ_ROWS;
    const i64 h = blockIdx.y;
    const i64 d = a.d;
    const Acc* pooled = reinterpret_cast<const Acc*>(a.pooled);
    const Acc* w = reinterpret_cast<const Acc*>(a.w) + h * d * d;
    T* out = reinterpret_cast<T*>(a.out);
    for (int i = threadIdx.x; i < PROJ_ROWS * d; i += PROJ_THREADS) {
        const int rr = i / (int)d, dd = i % (int)d;
        const i64 r = r0 + rr;
        xs[rr][dd] = r < a.rows ? pooled[(r * a.heads + h) * d + dd] : (Acc)0;
    }
    __syncthreads();
    for (i64 e = threadIdx.x; e < d; e += PROJ_THREADS) {
        Acc acc[PROJ_ROWS];
#pragma unroll
        for (int rr = 0; rr < PROJ_ROWS; ++rr) acc[rr] = (Acc)0;
        for (i64 dd = 0; dd < d; ++dd) {
            const Acc wv = w[dd * d + e];
#pragma unroll
            for (int rr = 0; rr < PROJ_ROWS; ++rr) acc[rr] += xs[rr][dd] * wv;
        }
#pragma unroll
        for (int rr = 0; rr < PROJ_ROWS; ++rr) {
            const i64 r = r0 + rr;
            if (r < a.rows) out[(r * a.heads + h) * d + e] = Narrow<T>::from(acc[rr]);
        }
    }
}

#define PROJECT_KERNEL(TIN, ACC, IN) \
    extern "C" __global__ void __launch_bounds__(PROJ_THREADS) nsa_compress_project_##IN(const ProjectArgs a) { \
        project_rows<TIN, ACC>(a); \
    }
PROJECT_KERNEL(float, float, f32)
PROJECT_KERNEL(double, double, f64)
PROJECT_KERNEL(bf16, float, bf16)
PROJECT_KERNEL(f16, float, f16)
