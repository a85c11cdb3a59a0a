// `kv_cache_update` (`conformance/spec/ops-decode.md` §1): cache[r, n + l, hk, :] = new[b, l, hk,
// :] for r = cache_batch_idx[b], n = cache_seqlens[b], 0 <= l < L_new (both caches), bit for bit.
// Every other position is untouched. A row with n < 0, n + L_new > S, r out of range or r
// repeated is skipped and raises its DECODE_BAD_* bit in `flag`.
//
// Grid: x covers the L_new * H_kv * D elements of one batch row in pieces of VB bytes (VB
// divides D * element size), y the batch rows. The elements are copied as raw bytes, so one
// kernel per piece width serves every dtype.

struct UpdateArgs {
    u64 k_cache;   // element type of size `esize`
    u64 v_cache;
    u64 k;         // [B, L_new, H_kv, D]
    u64 v;
    u64 seqlens;   // const int* [B]
    u64 batch_idx; // const int* [B] or 0
    u64 flag;      // unsigned*
    i64 l_new, h_kv, d, s, b_cache;
    i64 stride_b, stride_h, stride_s; // cache strides, elements
    i64 esize;     // bytes per element
};

template <int VB> struct Piece16 { typedef Vec<unsigned, 4> T; };
template <> struct Piece16<8> { typedef Vec<unsigned, 2> T; };
template <> struct Piece16<4> { typedef unsigned T; };
template <> struct Piece16<2> { typedef unsigned short T; };

template <int VB> __device__ __forceinline__ void update_rows(const UpdateArgs& a) {
    typedef typename Piece16<VB>::T P;
    const i64 b = blockIdx.y;
    i64 n, row;
    const unsigned bad = decode_row(reinterpret_cast<const int*>(a.seqlens), reinterpret_cast<const int*>(a.batch_idx),
                                    b, a.l_new, a.s, a.b_cache, n, row);
    if (bad) {
        if (blockIdx.x == 0 && threadIdx.x == 0) atomicOr(reinterpret_cast<unsigned*>(a.flag), bad);
        return;
    }
    const i64 per_d = a.d * a.esize / VB;              // pieces per (l, hk) vector
    const i64 pieces = a.l_new * a.h_kv * per_d;
    for (i64 p = (i64)blockIdx.x * blockDim.x + threadIdx.x; p < pieces; p += (i64)gridDim.x * blockDim.x) {
        const i64 v = p / per_d, c = p - v * per_d;    // v = l * H_kv + hk
        const i64 l = v / a.h_kv, hk = v - l * a.h_kv;
        const i64 src = (b * pieces + p);               // [B, L_new, H_kv, D] in pieces
        const i64 dst = (row * a.stride_b + hk * a.stride_h + (n + l) * a.stride_s) * a.esize / VB + c;
        reinterpret_cast<P*>(a.k_cache)[dst] = reinterpret_cast<const P*>(a.k)[src];
        reinterpret_cast<P*>(a.v_cache)[dst] = reinterpret_cast<const P*>(a.v)[src];
    }
}

extern "C" __global__ void __launch_bounds__(256) kv_cache_update_b16(const UpdateArgs a) { update_rows<16>(a); }
extern "C" __global__ void __launch_bounds__(256) kv_cache_update_b8(const UpdateArgs a) { update_rows<8>(a); }
extern "C" __global__ void __launch_bounds__(256) kv_cache_update_b4(const UpdateArgs a) { update_rows<4>(a); }
extern "C" __global__ void __launch_bounds__(256) kv_cache_update_b2(const UpdateArgs a) { update_rows<2>(a); }
