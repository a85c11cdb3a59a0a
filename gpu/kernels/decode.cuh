// Decoding against a static KV cache (`conformance/spec/ops-decode.md`): shared pieces of
// `kv_cache_update` and `decode_attention`.
//
// Caches are addressed by strides (elements): cache row r, KV head hk, position j, feature d is
// at r * stride_b + hk * stride_h + j * stride_s + d, which covers both layouts
// (bshd: stride_s = H_kv * D, stride_h = D; bhsd: stride_h = S * D, stride_s = D).
//
// `cache_seqlens` and `cache_batch_idx` (int32) are read from device memory, so that a launch
// never depends on them from the host (one captured CUDA graph serves every step). A row whose
// values are out of range cannot be refused from the host without a synchronisation: the
// kernels skip it and raise a bit of the device flag word `flag` (DECODE_BAD_*), which the host
// API reads when asked.

#define DECODE_BAD_SEQLENS 1u   // cache_seqlens[b] < 0, or past S (with the new tokens)
#define DECODE_BAD_INDEX 2u     // cache_batch_idx[b] outside 0 .. B_cache
#define DECODE_REPEATED_INDEX 4u // cache_batch_idx[b] equal to an earlier row's

// Cache row of batch row b and its validity bits (0: valid). `n_end` is the end of the row's
// valid prefix after this step (cache_seqlens[b] + L_new), which must lie in 0 ..= S. Every
// thread of the block calls it (the repeated-index check is a block-wide vote over the rows
// before b, so the first of two equal rows wins and the second is refused).
__device__ __forceinline__ unsigned decode_row(const int* __restrict__ seqlens, const int* __restrict__ batch_idx,
                                               i64 b, i64 l_new, i64 s, i64 b_cache, i64& n_old, i64& row) {
    n_old = seqlens[b];
    row = batch_idx ? (i64)batch_idx[b] : b;
    unsigned bad = 0;
    if (n_old < 0 || n_old + l_new > s) bad |= DECODE_BAD_SEQLENS;
    if (row < 0 || row >= b_cache) bad |= DECODE_BAD_INDEX;
    if (batch_idx) { // uniform: the barrier is reached by every thread or none
        int dup = 0;
        for (i64 e = threadIdx.x; e < b; e += blockDim.x) dup |= (i64)batch_idx[e] == row;
        if (__syncthreads_or(dup)) bad |= DECODE_REPEATED_INDEX;
    }
    return bad;
}

// Raw 16-byte (or narrower) loads of data read once: no L1 allocation, read-only path.
template <typename T, int W> __device__ __forceinline__ Vec<T, W> load_stream(const T* p) {
    Vec<T, W> r;
    if constexpr (sizeof(r) == 16) {
        unsigned* w = reinterpret_cast<unsigned*>(&r);
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p));
    } else {
        r = *reinterpret_cast<const Vec<T, W>*>(p);
    }
    return r;
}

// Loads of data written by other blocks of the same launch: through L2 only.
__device__ __forceinline__ float load_cg(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float fast_log2(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// The accumulator of an element type: fp32, fp64 for fp64.
template <typename T> struct AccOf { typedef float type; };
template <> struct AccOf<double> { typedef double type; };
__device__ __forceinline__ float acc_exp2(float x) { return fast_exp2(x); }
__device__ __forceinline__ double acc_exp2(double x) { return exp2(x); }
__device__ __forceinline__ float acc_log2(float x) { return fast_log2(x); }
__device__ __forceinline__ double acc_log2(double x) { return log2(x); }
__device__ __forceinline__ float acc_max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double acc_max(double a, double b) { return fmax(a, b); }
__device__ __forceinline__ double load_cg(const double* p) {
    double v;
    asm volatile("ld.global.cg.f64 %0, [%1];" : "=d"(v) : "l"(p));
    return v;
}

#define DECODE_NAN __int_as_float(0x7fffffff)
#define DECODE_NEG_INF __int_as_float(0xff800000)
#define DECODE_LN2 0.6931471805599453
