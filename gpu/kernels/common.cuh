// Shared device helpers: element types, widening/narrowing conversions, vector loads/stores and
// warp scans. Prepended to every kernel source by the host (NVRTC gets no include headers), so
// nothing here depends on the CUDA toolkit's headers.

// Minimum resident 256-thread blocks per multiprocessor asked of the register allocator
// (overridable with -DATTN_MIN_BLOCKS=N through ATTN_NVRTC_OPTS for tuning).
#ifndef ATTN_MIN_BLOCKS
#define ATTN_MIN_BLOCKS 3
#endif

typedef long long i64;
typedef unsigned long long u64;

// Raw 16-bit storage of the half-precision types; arithmetic is done after widening to fp32.
struct bf16 { unsigned short x; };
struct f16 { unsigned short x; };

// N elements of T, aligned as one access.
template <typename T, int N> struct alignas(sizeof(T) * N) Vec { T v[N]; };

// ---- widening (input element -> accumulator) ----
__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ double widen(double v) { return v; }
__device__ __forceinline__ float widen(bf16 v) { return __uint_as_float(((unsigned)v.x) << 16); }
__device__ __forceinline__ float widen(f16 v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.x));
    return f;
}

// Widens the N elements of a vector; bf16 pairs as one 32-bit word each (the low element by a
// shift, the high one by a mask: no extraction).
template <typename T, typename Acc, int N>
__device__ __forceinline__ void widen_vec(const Vec<T, N>& r, Acc (&acc)[N]) {
#pragma unroll
    for (int k = 0; k < N; ++k) acc[k] = (Acc)widen(r.v[k]);
}
template <int N> __device__ __forceinline__ void widen_vec(const Vec<bf16, N>& r, float (&acc)[N]) {
    if constexpr (N % 2 == 0) {
        const unsigned* w = reinterpret_cast<const unsigned*>(&r);
#pragma unroll
        for (int k = 0; k < N; k += 2) {
            acc[k] = __uint_as_float(w[k / 2] << 16);
            acc[k + 1] = __uint_as_float(w[k / 2] & 0xffff0000u);
        }
    } else {
#pragma unroll
        for (int k = 0; k < N; ++k) acc[k] = widen(r.v[k]);
    }
}

// ---- narrowing (accumulator -> output element), round to nearest even ----
template <typename T> struct Narrow;
template <> struct Narrow<float> {
    __device__ __forceinline__ static float from(float v) { return v; }
    __device__ __forceinline__ static float from(double v) { return (float)v; }
};
template <> struct Narrow<double> {
    __device__ __forceinline__ static double from(float v) { return (double)v; }
    __device__ __forceinline__ static double from(double v) { return v; }
};
template <> struct Narrow<bf16> {
    __device__ __forceinline__ static bf16 from(float v) {
        bf16 r;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.x) : "f"(v));
        return r;
    }
};
template <> struct Narrow<f16> {
    __device__ __forceinline__ static f16 from(float v) {
        f16 r;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.x) : "f"(v));
        return r;
    }
};

// ---- vectors of N elements, loaded/stored in pieces of at most 16 bytes ----
template <typename T> struct Piece { static constexpr int N = 16 / sizeof(T); };

// Loads N consecutive elements starting at p (p aligned to min(N * sizeof(T), 16) bytes) and
// widens them into acc[0..N).
template <typename T, typename Acc, int N>
__device__ __forceinline__ void load_vec(const T* __restrict__ p, Acc (&acc)[N]) {
    constexpr int P = N < Piece<T>::N ? N : Piece<T>::N;
#pragma unroll
    for (int k = 0; k < N; k += P) {
        const Vec<T, P> q = *reinterpret_cast<const Vec<T, P>*>(p + k);
        Acc w[P];
        widen_vec(q, w);
#pragma unroll
        for (int j = 0; j < P; ++j) acc[k + j] = w[j];
    }
}

// Stores q at p with the streaming hint (st.global.cs: evict first, for data not read again).
template <typename T, int P>
__device__ __forceinline__ void store_streaming(T* p, const Vec<T, P>& q) {
    const unsigned* w = reinterpret_cast<const unsigned*>(&q);
    if constexpr (sizeof(q) == 16) {
        asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");
    } else if constexpr (sizeof(q) == 8) {
        asm volatile("st.global.cs.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(w[0]), "r"(w[1]) : "memory");
    } else if constexpr (sizeof(q) == 4) {
        asm volatile("st.global.cs.u32 [%0], %1;" ::"l"(p), "r"(w[0]) : "memory");
    } else {
        asm volatile("st.global.cs.u16 [%0], %1;" ::"l"(p), "h"(*reinterpret_cast<const unsigned short*>(&q)) : "memory");
    }
}

// Narrows acc[0..N) to T and stores them at p (aligned like load_vec); STREAMING: with the
// streaming hint.
template <typename T, typename Acc, int N, bool STREAMING = false>
__device__ __forceinline__ void store_vec(T* __restrict__ p, const Acc (&acc)[N]) {
    constexpr int P = N < Piece<T>::N ? N : Piece<T>::N;
#pragma unroll
    for (int k = 0; k < N; k += P) {
        Vec<T, P> q;
#pragma unroll
        for (int j = 0; j < P; ++j) q.v[j] = Narrow<T>::from(acc[k + j]);
        if (STREAMING) {
            store_streaming(p + k, q);
        } else {
            *reinterpret_cast<Vec<T, P>*>(p + k) = q;
        }
    }
}

// a / b in 64 bits, out of line: the division is a long subroutine that div_fast's call sites
// almost never reach (S9: inlined, its copies were 12% of kda_intra_mma's 31.7k instructions).
__device__ __noinline__ i64 div_i64(i64 a, i64 b) { return a / b; }

// a / b for a >= 0, b > 0: one 32-bit division when both fit 31 bits, as they nearly always do.
__device__ __forceinline__ i64 div_fast(i64 a, i64 b) {
    return ((a | b) >> 31) == 0 ? (i64)((unsigned)a / (unsigned)b) : div_i64(a, b);
}

// Inclusive scan of v over the 32 lanes of a full warp, lane order (a fixed tree: deterministic).
template <typename Acc> __device__ __forceinline__ Acc warp_incl_scan(Acc v, int lane) {
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        Acc n = __shfl_up_sync(0xffffffffu, v, off);
        if (lane >= off) v += n;
    }
    return v;
}

// Sum of v over the 32 lanes of a full warp, the same fixed tree in every lane.
template <typename Acc> __device__ __forceinline__ Acc warp_sum(Acc v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// The (input, output, accumulator) dtype combinations every scan kernel is instantiated for:
// M(Tin, Tout, Acc, in_tag, out_tag). Half-precision inputs accumulate in fp32; anything
// touching fp64 accumulates in fp64.
#define FOR_SCAN_DTYPES(M)                    \
    M(float, float, float, f32, f32)          \
    M(float, double, double, f32, f64)        \
    M(double, double, double, f64, f64)       \
    M(double, float, double, f64, f32)        \
    M(bf16, bf16, float, bf16, bf16)          \
    M(bf16, float, float, bf16, f32)          \
    M(bf16, double, double, bf16, f64)        \
    M(f16, f16, float, f16, f16)              \
    M(f16, float, float, f16, f32)            \
    M(f16, double, double, f16, f64)

// Widest vector of T in one 16-byte access.
template <typename T> struct VMax { static constexpr int N = 16 / sizeof(T); };

// Shared-memory addresses and asynchronous copies global -> shared (cp.async, sm_80+).
__device__ __forceinline__ unsigned smem_u32(const void* p) {
    unsigned long long a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (unsigned)a;
}

// 16 bytes global -> shared address `dst`; `bytes` (0 or 16) of them read, the rest zero-filled.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async4(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// Waits until at most P cp.async groups are pending.
template <int P> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(P) : "memory");
}
