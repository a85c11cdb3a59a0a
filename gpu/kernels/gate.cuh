// The KDA gate (spec ops-cumsum.md section 4), per element of g [B, T, HV, K] at column
// c = hv * K + k of the flattened [HV * K] row:
//   a = g + dt_bias[c]                      (a = g without dt_bias)
//   no lower_bound:  y = -exp(A_log[hv]) * softplus(a),  softplus(a) = a for a > 20, else log1p(exp(a))
//   lower_bound lb:  y = lb * sigmoid(exp(A_log[hv]) * a)   (lb * sigmoid(a) without A_log)
// computed in the accumulator type (fp32, or fp64 for fp64 data).

struct GateArgs {
    u64 a_log;            // const void*, dtype a_log_dtype
    u64 dt_bias;          // const void*, dtype dt_bias_dtype
    i64 a_log_dtype;      // -1: absent
    i64 dt_bias_dtype;    // -1: absent
    i64 has_lower_bound;
    double lower_bound;
    i64 head_dim;         // K
};

// fp32: the multi-function unit's exp2/log2 (as FLA's Triton kernels use), with log1p(e) taken
// as e - e^2/2 where 1 + e would lose e's digits; the softplus error stays below 3e-7 absolute.
// fp64: the precise library functions.
__device__ __forceinline__ float ex2_approx(float v) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
    return r;
}
__device__ __forceinline__ float lg2_approx(float v) {
    float r;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
    return r;
}
__device__ __forceinline__ float gexp(float v) { return ex2_approx(v * 1.4426950408889634f); }
__device__ __forceinline__ double gexp(double v) { return exp(v); }
__device__ __forceinline__ float gsoftplus(float a) {
    if (a > 20.0f) return a;
    const float e = gexp(a);
    return a < -8.0f ? e - 0.5f * e * e : lg2_approx(1.0f + e) * 0.6931471805599453f;
}
__device__ __forceinline__ double gsoftplus(double a) { return a > 20.0 ? a : log1p(exp(a)); }
__device__ __forceinline__ float gsigmoid(float z) { return __fdividef(1.0f, 1.0f + gexp(-z)); }
__device__ __forceinline__ double gsigmoid(double z) { return 1.0 / (1.0 + exp(-z)); }

template <typename Acc, int VEC> struct Gate {
    Acc bias[VEC];
    Acc coef[VEC];  // exp(A_log[hv]), or 1 without A_log
    Acc lb;
    bool bounded;

    __device__ __forceinline__ void init(const GateArgs& g, i64 c0) {
        bounded = g.has_lower_bound != 0;
        lb = (Acc)g.lower_bound;
        // head of column c0 + k, stepped along (VEC may span heads when K < VEC)
        i64 hv = div_fast(c0, g.head_dim);
        i64 r = c0 - hv * g.head_dim;
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            bias[k] = g.dt_bias_dtype >= 0 ? (Acc)load_any(reinterpret_cast<const void*>(g.dt_bias), (int)g.dt_bias_dtype, c0 + k) : Acc(0);
            coef[k] = g.a_log_dtype >= 0 ? gexp((Acc)load_any(reinterpret_cast<const void*>(g.a_log), (int)g.a_log_dtype, hv)) : Acc(1);
            if (++r == g.head_dim) {
                r = 0;
                ++hv;
            }
        }
    }

    __device__ __forceinline__ void apply(Acc (&v)[VEC]) const {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            const Acc a = v[k] + bias[k];
            v[k] = bounded ? lb * gsigmoid(coef[k] * a) : -coef[k] * gsoftplus(a);
        }
    }
};
