// `kda_gate` (spec ops-cumsum.md section 4): y = gate(g) elementwise (gate.cuh), y in fp32.
// One thread per VEC adjacent elements of the flattened g, grid-stride; `vec` needs HV * K to be
// a multiple of 16 / sizeof(Tin).

struct GateElemArgs {
    u64 x;       // const Tin*
    u64 y;       // float*
    i64 n;       // number of elements
    i64 cols;    // HV * K
    GateArgs gate;
};

template <typename Tin, typename Acc, int VEC>
__device__ __forceinline__ void gate_elementwise(const GateElemArgs& a) {
    const i64 nv = a.n / VEC;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < nv; i += stride) {
        const i64 e0 = i * VEC;
        Acc v[VEC];
        load_vec<Tin, Acc, VEC>(reinterpret_cast<const Tin*>(a.x) + e0, v);
        Gate<Acc, VEC> g;
        g.init(a.gate, e0 % a.cols);
        g.apply(v);
        store_vec<float, Acc, VEC>(reinterpret_cast<float*>(a.y) + e0, v);
    }
}

#define GATE_KERNELS(TIN, ACC, IN)                                                                \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) kda_gate_vec_##IN(const GateElemArgs a) {   \
        gate_elementwise<TIN, ACC, VMax<TIN>::N>(a);                                              \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MIN_BLOCKS) kda_gate_scalar_##IN(const GateElemArgs a) { \
        gate_elementwise<TIN, ACC, 1>(a);                                                         \
    }

GATE_KERNELS(float, float, f32)
GATE_KERNELS(double, double, f64)
GATE_KERNELS(bf16, float, bf16)
GATE_KERNELS(f16, float, f16)
