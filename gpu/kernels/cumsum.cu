// `cumsum` (spec ops-cumsum.md section 1): y[.., i, ..] = sum_{j <= i} x[.., j, ..] along one
// axis (j >= i when reverse). The host picks one kernel per call from the plan
// (outer, len, inner):
//   inner == 1, many short rows   -> cumsum_rows_*      (rows.cuh, one warp per row)
//   inner == 1, long rows         -> cumsum_lookback_*  (rows.cuh, single-pass look-back)
//   inner > 1 (middle/outermost)  -> cumsum_strided_*   (strided.cuh, a thread per VEC lanes)
// `vec` kernels use 16-byte accesses and need len (rows) or inner (strided) to be a multiple of
// 16 / sizeof(Tin); `scalar` kernels have no such condition.

#define CUMSUM_KERNELS(TIN, TOUT, ACC, IN, OUT)                                                   \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) cumsum_rows_vec_##IN##_##OUT(const RowArgs a) {     \
        rows_warp<TIN, TOUT, ACC, VMax<TIN>::N>(a);                                               \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) cumsum_rows_scalar_##IN##_##OUT(const RowArgs a) {  \
        rows_warp<TIN, TOUT, ACC, 1>(a);                                                          \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) cumsum_lookback_vec_##IN##_##OUT(const RowArgs a) { \
        rows_lookback<TIN, TOUT, ACC, VMax<TIN>::N>(a);                                           \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) cumsum_lookback_scalar_##IN##_##OUT(const RowArgs a) { \
        rows_lookback<TIN, TOUT, ACC, 1>(a);                                                      \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) cumsum_strided_vec_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, VMax<TIN>::N, false>(a);                                     \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) cumsum_strided_half_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, VHalf<TIN>::N, false>(a);                                     \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) cumsum_strided_scalar_##IN##_##OUT(const StridedArgs a) { \
        strided_scan<TIN, TOUT, ACC, 1, false>(a);                                                \
    }

FOR_SCAN_DTYPES(CUMSUM_KERNELS)
