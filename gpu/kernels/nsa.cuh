// Shared by the NSA modules (`conformance/spec/ops-nsa.md`): weights of any float dtype widened to
// the accumulator type once per call, so the hot kernels read one type.

// ---- widening a weight of any float dtype to Acc (the projection's w, the gate's W) ----
struct WidenArgs {
    u64 x;      // const (dtype code) *
    u64 y;      // Acc*
    i64 n;
    i64 dtype;  // 0 f64, 1 f32, 2 bf16, 3 f16 (params.rs dtype_code)
};

template <typename Acc>
__device__ __forceinline__ void widen_any(const WidenArgs& a) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= a.n) return;
    Acc v;
    switch (a.dtype) {
        case 0: v = (Acc)reinterpret_cast<const double*>(a.x)[i]; break;
        case 1: v = (Acc)reinterpret_cast<const float*>(a.x)[i]; break;
        case 2: v = (Acc)widen(reinterpret_cast<const bf16*>(a.x)[i]); break;
        default: v = (Acc)widen(reinterpret_cast<const f16*>(a.x)[i]); break;
    }
    reinterpret_cast<Acc*>(a.y)[i] = v;
}
extern "C" __global__ void nsa_widen_f32(const WidenArgs a) { widen_any<float>(a); }
extern "C" __global__ void nsa_widen_f64(const WidenArgs a) { widen_any<double>(a); }
