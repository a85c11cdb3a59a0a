// `read_stream`: the read ceiling of the decode benchmark (issue 26). Reads n 16-byte words once
// and reduces them to one 32-bit word: x = XOR over every word of its four lanes, merged into
// *out with atomicXor (so nothing can be skipped). Each thread keeps U independent 16-byte loads
// in flight (read-only path, no L1 allocation), grid-stride, consecutive threads on consecutive
// words; the host picks U and the grid.
template <int U> __device__ __forceinline__ void read_stream(const uint4* __restrict__ p, u64 n, unsigned* out) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned x = 0;
    for (; i + (U - 1) * stride < n; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                         : "l"(p + i + u * stride));
        }
#pragma unroll
        for (int u = 0; u < U; ++u) x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n; i += stride) {
        const uint4 v = p[i];
        x ^= v.x ^ v.y ^ v.z ^ v.w;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x ^= __shfl_xor_sync(0xffffffffu, x, off);
    if ((threadIdx.x & 31) == 0) atomicXor(out, x);
}

struct ReadArgs {
    u64 p;   // const uint4* [n]
    u64 n;   // 16-byte words
    u64 out; // unsigned*
};

#define READ_STREAM(U)                                                                                   \
    extern "C" __global__ void __launch_bounds__(256) read_stream_u##U(const ReadArgs a) {               \
        read_stream<U>(reinterpret_cast<const uint4*>(a.p), a.n, reinterpret_cast<unsigned*>(a.out)); \
    }
READ_STREAM(4)
READ_STREAM(8)
READ_STREAM(16)
