// `chunk_global_cumsum` (`conformance/spec/ops-cumsum.md` §3): o[t] = scale * (sum of g over the
// sequence's tokens up to t) (from t to its end when reverse), carried in the accumulator over the
// whole sequence. g [B, T, H(, S)] is a strided scan over rows t with H * S lanes; a job is one
// sequence.

#define SEQ_KERNELS(TIN, TOUT, ACC, IN, OUT)                                                      \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) chunk_global_cumsum_sums_v1_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, 1, GATE_NONE, MODE_SUMS>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) chunk_global_cumsum_sums_v2_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, (2 <= VMax<TIN>::N ? 2 : 1), GATE_NONE, MODE_SUMS>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) chunk_global_cumsum_sums_v4_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, (4 <= VMax<TIN>::N ? 4 : 1), GATE_NONE, MODE_SUMS>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) chunk_global_cumsum_sums_v8_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, (8 <= VMax<TIN>::N ? 8 : 1), GATE_NONE, MODE_SUMS>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) chunk_global_cumsum_carry_v1_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, 1, GATE_NONE, MODE_CARRY>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) chunk_global_cumsum_carry_v2_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, (2 <= VMax<TIN>::N ? 2 : 1), GATE_NONE, MODE_CARRY>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) chunk_global_cumsum_carry_v4_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, (4 <= VMax<TIN>::N ? 4 : 1), GATE_NONE, MODE_CARRY>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) chunk_global_cumsum_carry_v8_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, (8 <= VMax<TIN>::N ? 8 : 1), GATE_NONE, MODE_CARRY>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) chunk_global_cumsum_v1_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, 1, GATE_NONE>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) chunk_global_cumsum_v2_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, (2 <= VMax<TIN>::N ? 2 : 1), GATE_NONE>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) chunk_global_cumsum_v4_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, (4 <= VMax<TIN>::N ? 4 : 1), GATE_NONE>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) chunk_global_cumsum_v8_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, (8 <= VMax<TIN>::N ? 8 : 1), GATE_NONE>(a); \
    }

FOR_SCAN_DTYPES(SEQ_KERNELS)
