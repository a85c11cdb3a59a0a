// `cumsum` (`conformance/spec/ops-cumsum.md` §1): y[.., i, ..] = sum_{j <= i} x[.., j, ..] along
// one axis (j >= i when reverse). The host picks one kernel per call from the plan
// (outer, len, inner):
//   inner == 1, many short rows   -> cumsum_rows_*      (rows.cuh, one warp per row)
//   inner == 1, long rows         -> cumsum_lookback_*  (rows.cuh, single-pass look-back)
//   inner > 1 (middle/outermost)  -> cumsum_strided_v{W}_* (strided.cuh, a thread per W lanes)
// `vec` row kernels use 16-byte accesses and need len to be a multiple of 16 / sizeof(Tin);
// `scalar` ones have no such condition. A strided width W (at most 16 / sizeof(Tin)) must divide
// inner.

#define CUMSUM_KERNELS(TIN, TOUT, ACC, IN, OUT)                                                   \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) cumsum_strided_sums_v1_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, 1, GATE_NONE, MODE_SUMS>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) cumsum_strided_sums_v2_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, (2 <= VMax<TIN>::N ? 2 : 1), GATE_NONE, MODE_SUMS>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) cumsum_strided_sums_v4_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, (4 <= VMax<TIN>::N ? 4 : 1), GATE_NONE, MODE_SUMS>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) cumsum_strided_sums_v8_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, (8 <= VMax<TIN>::N ? 8 : 1), GATE_NONE, MODE_SUMS>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) cumsum_strided_carry_v1_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, 1, GATE_NONE, MODE_CARRY>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) cumsum_strided_carry_v2_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, (2 <= VMax<TIN>::N ? 2 : 1), GATE_NONE, MODE_CARRY>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) cumsum_strided_carry_v4_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, (4 <= VMax<TIN>::N ? 4 : 1), GATE_NONE, MODE_CARRY>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) cumsum_strided_carry_v8_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, (8 <= VMax<TIN>::N ? 8 : 1), GATE_NONE, MODE_CARRY>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) cumsum_strided_v1_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, 1, GATE_NONE>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) cumsum_strided_v2_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, (2 <= VMax<TIN>::N ? 2 : 1), GATE_NONE>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) cumsum_strided_v4_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, (4 <= VMax<TIN>::N ? 4 : 1), GATE_NONE>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) cumsum_strided_v8_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, (8 <= VMax<TIN>::N ? 8 : 1), GATE_NONE>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) cumsum_rows_vec_##IN##_##OUT(const RowArgs a) {     \
        rows_warp<TIN, TOUT, ACC, VMax<TIN>::N>(a);                                               \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) cumsum_rows_scalar_##IN##_##OUT(const RowArgs a) {  \
        rows_warp<TIN, TOUT, ACC, 1>(a);                                                          \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(256, ATTN_LB_MIN_BLOCKS) cumsum_lookback_vec_##IN##_##OUT(const RowArgs a) { \
        rows_lookback<TIN, TOUT, ACC, VMax<TIN>::N>(a);                                           \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(256, ATTN_LB_MIN_BLOCKS) cumsum_lookback_scalar_##IN##_##OUT(const RowArgs a) { \
        rows_lookback<TIN, TOUT, ACC, 1>(a);                                                      \
    }

FOR_SCAN_DTYPES(CUMSUM_KERNELS)
