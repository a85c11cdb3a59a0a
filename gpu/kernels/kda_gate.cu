// `kda_gate` (`conformance/spec/ops-cumsum.md` §4): y = gate(g) elementwise (gate.cuh), y in fp32.
// `v{W}`: W elements per thread; W must divide K.

struct GateElemArgs {
    u64 x;       // const Tin*
    u64 y;       // float*
    i64 rows;    // B * T
    i64 cols;    // HV * K
    GateArgs gate;
};

// 2-D grid: x covers the columns (VEC per thread), y the rows, GATE_ROWS rows per thread, all
// loaded at once. Blocks are short-lived (one pass of GATE_ROWS rows, the gate constants
// computed once for them), so the GPU drains evenly at the end; y strides on only when the rows
// outnumber the grid's limit.
#define GATE_ROWS 4

template <typename Tin, typename Acc, int VEC, int FORM>
__device__ __forceinline__ void gate_elementwise(const GateElemArgs& a) {
    const i64 c0 = ((i64)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (c0 >= a.cols) return;
    Gate<Acc, VEC, FORM> g;
    g.init(a.gate, c0);
    const Tin* __restrict__ x = reinterpret_cast<const Tin*>(a.x) + c0;
    float* __restrict__ y = reinterpret_cast<float*>(a.y) + c0;
    for (i64 r = blockIdx.y; r < a.rows; r += (i64)gridDim.y * GATE_ROWS) {
        Vec<Tin, VEC> raw[GATE_ROWS];
#pragma unroll
        for (int u = 0; u < GATE_ROWS; ++u) {
            const i64 ru = r + (i64)u * gridDim.y;
            if (ru < a.rows) raw[u] = *reinterpret_cast<const Vec<Tin, VEC>*>(x + ru * a.cols);
        }
#pragma unroll
        for (int u = 0; u < GATE_ROWS; ++u) {
            const i64 ru = r + (i64)u * gridDim.y;
            if (ru < a.rows) {
                Acc v[VEC];
                widen_vec(raw[u], v);
                g.apply(v);
                store_vec<float, Acc, VEC>(y + ru * a.cols, v);
            }
        }
    }
}

#define GATE_KERNELS(TIN, ACC, IN) \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) kda_gate_v1_##IN(const GateElemArgs a) { \
        GATE_DISPATCH(a, (gate_elementwise<TIN, ACC, 1, FORM>(a))) \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) kda_gate_v2_##IN(const GateElemArgs a) { \
        GATE_DISPATCH(a, (gate_elementwise<TIN, ACC, (2 <= VMax<TIN>::N ? 2 : 1), FORM>(a))) \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) kda_gate_v4_##IN(const GateElemArgs a) { \
        GATE_DISPATCH(a, (gate_elementwise<TIN, ACC, (4 <= VMax<TIN>::N ? 4 : 1), FORM>(a))) \
    } \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) kda_gate_v8_##IN(const GateElemArgs a) { \
        GATE_DISPATCH(a, (gate_elementwise<TIN, ACC, (8 <= VMax<TIN>::N ? 8 : 1), FORM>(a))) \
    }

GATE_KERNELS(float, float, f32)
GATE_KERNELS(double, double, f64)
GATE_KERNELS(bf16, float, bf16)
GATE_KERNELS(f16, float, f16)
