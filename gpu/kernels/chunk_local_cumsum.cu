// `chunk_local_cumsum` (`conformance/spec/ops-cumsum.md` §2): within each chunk of chunk_size
// tokens of each sequence, o[t] = scale * (sum of g over the chunk's tokens up to t) (from t to the
// chunk's end when reverse). g [B, T, H(, S)] is a strided scan over rows t with H * S lanes; a job
// is one chunk.

#define SEQ_KERNELS(TIN, TOUT, ACC, IN, OUT)                                                      \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) chunk_local_cumsum_v1_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, 1, GATE_NONE>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) chunk_local_cumsum_v2_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, (2 <= VMax<TIN>::N ? 2 : 1), GATE_NONE>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) chunk_local_cumsum_v4_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, (4 <= VMax<TIN>::N ? 4 : 1), GATE_NONE>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) chunk_local_cumsum_v8_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, (8 <= VMax<TIN>::N ? 8 : 1), GATE_NONE>(a); \
    }

FOR_SCAN_DTYPES(SEQ_KERNELS)

// Tiles (tile.cuh), at least ATTN_TILE_MIN_BLOCKS blocks per multiprocessor; W lanes per thread,
// at most 8 input bytes per row and thread (tile.rs), so W is 1, 2 or 4.
#define TILE_KERNEL(W, TIN, TOUT, ACC, IN, OUT) \
    extern "C" __global__ void __launch_bounds__(256, ATTN_TILE_MIN_BLOCKS) chunk_local_cumsum_tile_v##W##_##IN##_##OUT(const StridedArgs a) { \
        tile_scan<TIN, TOUT, ACC, (W <= VMax<TIN>::N ? W : 1), GATE_NONE>(a); \
    }
#define TILE_KERNELS(TIN, TOUT, ACC, IN, OUT) \
    TILE_KERNEL(1, TIN, TOUT, ACC, IN, OUT) TILE_KERNEL(2, TIN, TOUT, ACC, IN, OUT) TILE_KERNEL(4, TIN, TOUT, ACC, IN, OUT)

FOR_SCAN_DTYPES(TILE_KERNELS)
