// `kda_gate_chunk_cumsum` (`conformance/spec/ops-cumsum.md` §5): chunk_local_cumsum(kda_gate(g)) in
// one pass. The strided chunk scan of chunk_local_cumsum with the gate (gate.cuh) applied to each
// element as it is loaded: the gate values live only in registers.

#define GATE_SCAN_KERNELS(TIN, TOUT, ACC, IN, OUT)                                                \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) kda_gate_chunk_cumsum_v1_##IN##_##OUT(const StridedArgs a) { \
        GATE_DISPATCH(a, (strided_scan<TIN, TOUT, ACC, 1, FORM>(a))) \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) kda_gate_chunk_cumsum_v2_##IN##_##OUT(const StridedArgs a) { \
        GATE_DISPATCH(a, (strided_scan<TIN, TOUT, ACC, (2 <= VMax<TIN>::N ? 2 : 1), FORM>(a))) \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) kda_gate_chunk_cumsum_v4_##IN##_##OUT(const StridedArgs a) { \
        GATE_DISPATCH(a, (strided_scan<TIN, TOUT, ACC, (4 <= VMax<TIN>::N ? 4 : 1), FORM>(a))) \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) kda_gate_chunk_cumsum_v8_##IN##_##OUT(const StridedArgs a) { \
        GATE_DISPATCH(a, (strided_scan<TIN, TOUT, ACC, (8 <= VMax<TIN>::N ? 8 : 1), FORM>(a))) \
    }

FOR_SCAN_DTYPES(GATE_SCAN_KERNELS)

// Tiles (tile.cuh), at least ATTN_TILE_MIN_BLOCKS blocks per multiprocessor; W lanes per thread,
// at most 8 input bytes per row and thread (tile.rs), so W is 1, 2 or 4.
#define GATE_TILE_KERNEL(W, TIN, TOUT, ACC, IN, OUT) \
    extern "C" __global__ void __launch_bounds__(256, ATTN_TILE_MIN_BLOCKS) kda_gate_chunk_cumsum_tile_v##W##_##IN##_##OUT(const StridedArgs a) { \
        GATE_DISPATCH(a, (tile_scan<TIN, TOUT, ACC, (W <= VMax<TIN>::N ? W : 1), FORM>(a))) \
    }
#define GATE_TILE_KERNELS(TIN, TOUT, ACC, IN, OUT) \
    GATE_TILE_KERNEL(1, TIN, TOUT, ACC, IN, OUT) GATE_TILE_KERNEL(2, TIN, TOUT, ACC, IN, OUT) GATE_TILE_KERNEL(4, TIN, TOUT, ACC, IN, OUT)

FOR_SCAN_DTYPES(GATE_TILE_KERNELS)
