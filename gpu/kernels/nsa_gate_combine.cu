// `nsa_gate_combine` (`conformance/spec/ops-nsa.md` §6): o = g0*o_cmp + g1*o_slc + g2*o_swa per row
// (b, t, hq), in Acc, narrowed once; gates [rows, 3] float32 (the spec's dtype), as applied.
//
// Gates by form: W (FORM 0): logit_c = sum_d q[d] * W[hq, c, d] (W widened to Acc beforehand),
// g_c = sigmoid(logit_c) in an overflow-safe form; G (FORM 1): the given g_* widened (any float
// dtype, one value per row); U (FORM 2): 1/3.
// A warp per row, grid-striding over rows; each lane owns VEC adjacent features (VEC divides K
// and V), all of a row's loads issued before the first use.

struct CombineArgs {
    u64 o_cmp, o_slc, o_swa;  // const T* [rows, V]
    u64 q;                    // const T* [rows, K] (W form)
    u64 w;                    // const Acc* [HQ, 3, K] (W form, widened)
    u64 g_cmp, g_slc, g_swa;  // const (g_dtype)* [rows] (G form)
    u64 o;                    // T* [rows, V]
    u64 gates;                // float* [rows, 3]
    i64 rows;                 // B * T * HQ
    i64 hq;
    i64 k;
    i64 v;
    i64 g_dtype;              // dtype code of g_* (params.rs dtype_code)
};

template <typename Acc> __device__ __forceinline__ Acc sigmoid_safe(Acc x) {
    // exp of a non-positive argument only: never overflows, a large |x| saturates to 0 or 1
    if (x >= (Acc)0) return (Acc)1 / ((Acc)1 + exp(-x));
    const Acc e = exp(x);
    return e / ((Acc)1 + e);
}

template <typename Acc> __device__ __forceinline__ Acc load_code(u64 p, i64 code, i64 i) {
    switch (code) {
        case 0: return (Acc)reinterpret_cast<const double*>(p)[i];
        case 1: return (Acc)reinterpret_cast<const float*>(p)[i];
        case 2: return (Acc)widen(reinterpret_cast<const bf16*>(p)[i]);
        default: return (Acc)widen(reinterpret_cast<const f16*>(p)[i]);
    }
}

template <typename T, typename Acc, int VEC, int FORM>
__device__ __forceinline__ void combine_rows(const CombineArgs& a) {
    const int lane = threadIdx.x & 31;
    const i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const i64 nwarps = ((i64)gridDim.x * blockDim.x) >> 5;
    const T* oc = reinterpret_cast<const T*>(a.o_cmp);
    const T* os = reinterpret_cast<const T*>(a.o_slc);
    const T* ow = reinterpret_cast<const T*>(a.o_swa);
    T* out = reinterpret_cast<T*>(a.o);
    float* gates = reinterpret_cast<float*>(a.gates);
    for (i64 r = warp; r < a.rows; r += nwarps) {
        Acc g[3];
        if (FORM == 0) {
            const T* q = reinterpret_cast<const T*>(a.q) + r * a.k;
            const Acc* w = reinterpret_cast<const Acc*>(a.w) + (r % a.hq) * 3 * a.k;
            Acc l[3] = {(Acc)0, (Acc)0, (Acc)0};
            for (i64 d = (i64)lane * VEC; d < a.k; d += 32 * VEC) {
                Acc qv[VEC];
                load_vec<T, Acc, VEC>(q + d, qv);
#pragma unroll
                for (int c = 0; c < 3; ++c)
#pragma unroll
                    for (int j = 0; j < VEC; ++j) l[c] += qv[j] * w[c * a.k + d + j];
            }
#pragma unroll
            for (int c = 0; c < 3; ++c) g[c] = sigmoid_safe(warp_sum(l[c]));
        } else if (FORM == 1) {
            g[0] = load_code<Acc>(a.g_cmp, a.g_dtype, r);
            g[1] = load_code<Acc>(a.g_slc, a.g_dtype, r);
            g[2] = load_code<Acc>(a.g_swa, a.g_dtype, r);
        } else {
            g[0] = g[1] = g[2] = (Acc)1 / (Acc)3;
        }
        for (i64 e = (i64)lane * VEC; e < a.v; e += 32 * VEC) {
            Acc x0[VEC], x1[VEC], x2[VEC];
            load_vec<T, Acc, VEC>(oc + r * a.v + e, x0);
            load_vec<T, Acc, VEC>(os + r * a.v + e, x1);
            load_vec<T, Acc, VEC>(ow + r * a.v + e, x2);
            Acc y[VEC];
#pragma unroll
            for (int j = 0; j < VEC; ++j) y[j] = g[0] * x0[j] + g[1] * x1[j] + g[2] * x2[j];
            store_vec<T, Acc, VEC, true>(out + r * a.v + e, y);
        }
        if (lane < 3) gates[r * 3 + lane] = (float)g[lane];
    }
}

#define COMBINE_KERNEL(TIN, ACC, IN, V, F)                                                            \
    extern "C" __global__ void __launch_bounds__(256) nsa_gate_combine_f##F##_v##V##_##IN(const CombineArgs a) { \
        combine_rows<TIN, ACC, (V <= VMax<TIN>::N ? V : 1), F>(a);                                     \
    }
#define COMBINE_FORMS(TIN, ACC, IN, V) \
    COMBINE_KERNEL(TIN, ACC, IN, V, 0) COMBINE_KERNEL(TIN, ACC, IN, V, 1) COMBINE_KERNEL(TIN, ACC, IN, V, 2)
#define COMBINE_KERNELS(TIN, ACC, IN) \
    COMBINE_FORMS(TIN, ACC, IN, 1) COMBINE_FORMS(TIN, ACC, IN, 2) COMBINE_FORMS(TIN, ACC, IN, 4) COMBINE_FORMS(TIN, ACC, IN, 8)

COMBINE_KERNELS(float, float, f32)
COMBINE_KERNELS(double, double, f64)
COMBINE_KERNELS(bf16, float, bf16)
COMBINE_KERNELS(f16, float, f16)
