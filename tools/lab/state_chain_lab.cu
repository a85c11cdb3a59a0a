// state_chain_lab: a standalone harness (nvcc, no Rust) for the next fused-kernel design (the GDN
// study's S1a, tools/bench-results/s15_7_study_gdn_fused.md §4-5): the state recurrence of the
// delta-rule forward alone, one chain per (head, 64 state columns), against an f64 reference of
// the same rounding points, and timed per chunk step.
//
// Per head and chunk c (64 rows, K = V = 128; the inputs are the intra stage's,
// conformance/spec/ops-delta-rule.md §7.4, built here in f64 from random q-free inputs and rounded to bf16):
//
//   D  = bf16(U_c − W_c · bf16(S))          (v_new; fp32 accumulation)
//   S ← diag(lam_c) · S + Kg_cᵀ · D         (S fp32; lam_c = exp2(G_last) per key)
//
// The harness writes D for every chunk and the final state; both are compared with the reference
// (max |x − ref| / max |ref| per output), outputs NaN-poisoned first, every element checked.
// Kernels: `chain_fma` (the baseline: S in shared memory, fp32 FMAs; slow, obviously right) and
// `chain_wg1` (the candidate, below); add more beside them and to `kernels[]`.
//
// Build and run on the GPU machine (from the repository root):
//   nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -o /tmp/lab tools/lab/state_chain_lab.cu && /tmp/lab
// (`-arch=sm_90a` alone gave compute_90 PTX with nvcc 13.5 here, which has no wgmma)
// Options: /tmp/lab [check_heads check_tokens] (default 2 8192); timing shapes are fixed below.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

constexpr int BT = 64, KD = 128, VD = 128, BV = 64;
typedef __nv_bfloat16 bf16;

// Device layout, per head h and chunk c: W, U, Kg tiles [64][128] bf16 row-major at
// ((h · nchunks + c) · 64 · 128); lam [h][c][128] fp32; D [h][c][64][128] bf16; state [h][128][128] fp32.
struct ChainArgs {
    const bf16 *w, *u, *kg, *kgt;  // kgt: each Kg tile transposed, [128 keys][64 rows]
    const float* lam;
    bf16* d;
    float* state;
    int heads, nchunks;
};

// Baseline: one 256-thread CTA per (head, 64-column block); S (128 × 64 fp32) in shared memory.
__global__ void __launch_bounds__(256) chain_fma(ChainArgs a) {
    __shared__ float s[KD][BV];   // 32 KB
    __shared__ float dd[BT][BV];  // D (bf16-rounded, held as float): 16 KB
    const int h = blockIdx.x / (VD / BV), cb = blockIdx.x % (VD / BV), t = threadIdx.x;
    for (int e = t; e < KD * BV; e += 256) s[e / BV][e % BV] = 0.f;
    __syncthreads();
    for (int c = 0; c < a.nchunks; ++c) {
        const size_t tile = ((size_t)h * a.nchunks + c) * BT * KD;
        for (int e = t; e < BT * BV; e += 256) {
            const int r = e / BV, j = e % BV;
            float acc = 0.f;
            for (int k = 0; k < KD; ++k) acc += __bfloat162float(a.w[tile + r * KD + k]) * __bfloat162float(__float2bfloat16(s[k][j]));
            const bf16 dv = __float2bfloat16(__bfloat162float(a.u[tile + r * VD + cb * BV + j]) - acc);
            dd[r][j] = __bfloat162float(dv);
            a.d[tile + r * VD + cb * BV + j] = dv;
        }
        __syncthreads();
        const float* lam = a.lam + ((size_t)h * a.nchunks + c) * KD;
        for (int e = t; e < KD * BV; e += 256) {
            const int k = e / BV, j = e % BV;
            float acc = lam[k] * s[k][j];
            for (int r = 0; r < BT; ++r) acc += __bfloat162float(a.kg[tile + r * KD + k]) * dd[r][j];
            s[k][j] = acc;
        }
        __syncthreads();
    }
    for (int e = t; e < KD * BV; e += 256)
        a.state[((size_t)h * KD + e / BV) * VD + cb * BV + e % BV] = s[e / BV][e % BV];
}

// Candidate (S1a, first step; not yet run on a GPU): one warpgroup a CTA holds Sᵀ (64 state
// columns × 128 keys, fp32) as the accumulator of wgmma m64n128k16; every product reads its A
// operand from registers (RS) and its B operand from a 128-byte-swizzled tile that the whole
// warpgroup loads by cp.async one chunk ahead:
//   Dᵀ = Uᵀ − bf16(Sᵀ)·Wᵀ          8 × m64n64k16, A = bf16(Sᵀ) negated (imm-scale-a −1), B = W tile
//   Sᵀ ← Sᵀ·diag(lam) + bf16(Dᵀ)·Kg  4 × m64n128k16, A = bf16(Dᵀ), B = Kgᵀ tile
// Fragment of an m64nN f32 accumulator (thread t, warp w = t / 32, lane l): rows w·16 + l / 4 and
// + 8, columns 8j + 2(l % 4) + {0, 1}: d[4j .. 4j + 3] = (r, c), (r, c + 1), (r + 8, c), (r + 8, c + 1);
// n8 blocks 2k, 2k + 1 of an accumulator are the A fragment of its k-th k16 slice.
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&v);
}
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
// Shared-memory matrix descriptor: K-major, 128-byte swizzle (layout 1), rows 128 bytes apart,
// 8-row groups 1024 bytes apart (SBO); the tile starts 1024-byte aligned (base offset 0).
__device__ __forceinline__ unsigned long long desc_sw128(unsigned addr) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}
// Byte offset of element (row, col) of a tile of 128-byte rows under the 128-byte swizzle.
__device__ __forceinline__ unsigned sw128(int row, int col) {
    return row * 128 + ((((col * 2) >> 4) ^ (row & 7)) << 4) + ((col * 2) & 15);
}
__device__ __forceinline__ void cp16(unsigned dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
// One chunk's W (two 64-key halves, 8 KB each) and Kgᵀ (128 keys × 64 rows) tiles into `buf`.
__device__ __forceinline__ void wg_load(unsigned buf, const bf16* w, const bf16* kgt) {
    for (int e = threadIdx.x; e < BT * KD / 8; e += 128) {
        const int row = e / (KD / 8), col = (e % (KD / 8)) * 8;  // W: row = token, col = key
        cp16(buf + (col / 64) * 8192 + sw128(row, col % 64), w + row * KD + col);
        const int kr = e / (BT / 8), kc = (e % (BT / 8)) * 8;    // Kgᵀ: row = key, col = token
        cp16(buf + 16384 + sw128(kr, kc), kgt + kr * BT + kc);
    }
    asm volatile("cp.async.commit_group;");
}
__device__ __forceinline__ void wgmma_n64_rs_neg(float (&d)[32], const unsigned (&a)[4], unsigned long long b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
        "{%32,%33,%34,%35}, %36, 1, -1, 1, 0;"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
__device__ __forceinline__ void wgmma_n128_rs(float (&d)[64], const unsigned (&a)[4], unsigned long long b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
        "{%64,%65,%66,%67}, %68, 1, 1, 1, 0;"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
#define WG_FENCE() asm volatile("wgmma.fence.sync.aligned;" ::: "memory")
#define WG_COMMIT_WAIT() asm volatile("wgmma.commit_group.sync.aligned;\n\twgmma.wait_group.sync.aligned 0;" ::: "memory")

__global__ void __launch_bounds__(128) chain_wg1(ChainArgs a) {
    extern __shared__ __align__(1024) unsigned char smem[];  // 2 buffers × (W 16 KB + Kgᵀ 16 KB)
    const unsigned base = (smem_addr(smem) + 1023) & ~1023u;
    const int h = blockIdx.x / (VD / BV), cb = blockIdx.x % (VD / BV), t = threadIdx.x;
    const int w = t / 32, l = t % 32, r0 = w * 16 + l / 4, cq = 2 * (l % 4);
    float s[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) s[i] = 0.f;
    const size_t tiles = (size_t)h * a.nchunks;
    wg_load(base, a.w + tiles * BT * KD, a.kgt + tiles * BT * KD);
    for (int c = 0; c < a.nchunks; ++c) {
        const unsigned buf = base + (c & 1) * 32768;
        const size_t tile = (tiles + c) * BT * KD;
        if (c + 1 < a.nchunks) {
            wg_load(base + ((c + 1) & 1) * 32768, a.w + tile + BT * KD, a.kgt + tile + BT * KD);
            asm volatile("cp.async.wait_group 1;" ::: "memory");
        } else {
            asm volatile("cp.async.wait_group 0;" ::: "memory");
        }
        // each thread's copies made visible to the async proxy (wgmma), then everyone's
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        // Dᵀ starts as Uᵀ: row = state column r0 (+ 8), column = token 8j + cq (+ 1)
        float d[32];
        const bf16* u = a.u + tile + cb * BV;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int tok = 8 * j + cq;
            d[4 * j + 0] = __bfloat162float(u[tok * VD + r0]);
            d[4 * j + 1] = __bfloat162float(u[(tok + 1) * VD + r0]);
            d[4 * j + 2] = __bfloat162float(u[tok * VD + r0 + 8]);
            d[4 * j + 3] = __bfloat162float(u[(tok + 1) * VD + r0 + 8]);
        }
        unsigned sa[8][4];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            sa[k][0] = pack_bf16(s[8 * k + 0], s[8 * k + 1]);
            sa[k][1] = pack_bf16(s[8 * k + 2], s[8 * k + 3]);
            sa[k][2] = pack_bf16(s[8 * k + 4], s[8 * k + 5]);
            sa[k][3] = pack_bf16(s[8 * k + 6], s[8 * k + 7]);
        }
        WG_FENCE();
#pragma unroll
        for (int k = 0; k < 8; ++k) wgmma_n64_rs_neg(d, sa[k], desc_sw128(buf + (k / 4) * 8192 + (k % 4) * 32));
        WG_COMMIT_WAIT();
        // D rounded to bf16: stored (token-major, as v_new) and the A fragments of the update
        unsigned da[4][4];
        bf16* dout = a.d + tile + cb * BV;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int tok = 8 * j + cq;
            const __nv_bfloat162 p0 = __floats2bfloat162_rn(d[4 * j + 0], d[4 * j + 1]);
            const __nv_bfloat162 p1 = __floats2bfloat162_rn(d[4 * j + 2], d[4 * j + 3]);
            dout[tok * VD + r0] = p0.x;
            dout[(tok + 1) * VD + r0] = p0.y;
            dout[tok * VD + r0 + 8] = p1.x;
            dout[(tok + 1) * VD + r0 + 8] = p1.y;
            da[j / 2][(j % 2) * 2 + 0] = *reinterpret_cast<const unsigned*>(&p0);
            da[j / 2][(j % 2) * 2 + 1] = *reinterpret_cast<const unsigned*>(&p1);
        }
        const float* lam = a.lam + (tiles + c) * KD;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const float l0 = lam[8 * j + cq], l1 = lam[8 * j + cq + 1];
            s[4 * j + 0] *= l0;
            s[4 * j + 1] *= l1;
            s[4 * j + 2] *= l0;
            s[4 * j + 3] *= l1;
        }
        WG_FENCE();
#pragma unroll
        for (int k = 0; k < 4; ++k) wgmma_n128_rs(s, da[k], desc_sw128(buf + 16384 + k * 32));
        WG_COMMIT_WAIT();
        __syncthreads();  // every thread's products done before the buffer is refilled
    }
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const int key = 8 * j + cq;
        float* st = a.state + ((size_t)h * KD) * VD + cb * BV;
        st[key * VD + r0] = s[4 * j + 0];
        st[(key + 1) * VD + r0] = s[4 * j + 1];
        st[key * VD + r0 + 8] = s[4 * j + 2];
        st[(key + 1) * VD + r0 + 8] = s[4 * j + 3];
    }
}

struct Kernel {
    const char* name;
    void (*launch)(const ChainArgs&);
};
static void launch_fma(const ChainArgs& a) { chain_fma<<<a.heads * (VD / BV), 256>>>(a); }
static void launch_wg1(const ChainArgs& a) {
    const int smem = 2 * 32768 + 1024;  // two buffers, and room to align the first to 1024 bytes
    static bool opted = false;
    if (!opted) {
        CK(cudaFuncSetAttribute(chain_wg1, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        opted = true;
    }
    chain_wg1<<<a.heads * (VD / BV), 128, smem>>>(a);
}
static const Kernel kernels[] = {{"chain_fma", launch_fma}, {"chain_wg1", launch_wg1}};

static double rbf(double x) { return (double)__bfloat162float(__float2bfloat16((float)x)); }

// The intra outputs of `heads` heads × `nchunks` chunks (conformance/spec/ops-delta-rule.md §7.4
// in f64, rounded to bf16): k rows unit-norm, β ∈ [0.2, 0.8], v ~ U[−1, 1], per-key log-decay g ~ `regime`
// (0 strong: logsigmoid(randn); 1 long memory: U[−1e-3, 0]).
struct Inputs {
    std::vector<bf16> w, u, kg, kgt;  // kgt: each Kg tile transposed ([128 keys][64 rows])
    std::vector<float> lam;
};
static Inputs make_inputs(int heads, int nchunks, int regime, unsigned seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> nd;
    std::uniform_real_distribution<double> ud(0.0, 1.0);
    const size_t n = (size_t)heads * nchunks * BT * KD;
    Inputs in{std::vector<bf16>(n), std::vector<bf16>(n), std::vector<bf16>(n), std::vector<bf16>(n),
              std::vector<float>((size_t)heads * nchunks * KD)};
    std::vector<double> k(BT * KD), v(BT * VD), G(BT * KD), beta(BT), L(BT * BT), A(BT * BT);
    for (int hc = 0; hc < heads * nchunks; ++hc) {
        for (int r = 0; r < BT; ++r) {
            double nrm = 0;
            for (int d = 0; d < KD; ++d) nrm += (k[r * KD + d] = nd(rng)) * k[r * KD + d];
            for (int d = 0; d < KD; ++d) k[r * KD + d] = rbf(k[r * KD + d] / std::sqrt(nrm + 1e-6));
            for (int d = 0; d < VD; ++d) v[r * VD + d] = rbf(2 * ud(rng) - 1);
            beta[r] = 0.2 + 0.6 * ud(rng);
            for (int d = 0; d < KD; ++d) {
                const double g = regime == 0 ? -std::log1p(std::exp(-nd(rng))) : -1e-3 * ud(rng);
                G[r * KD + d] = (r ? G[(r - 1) * KD + d] : 0.0) + g / std::log(2.0);
            }
        }
        for (int r = 0; r < BT; ++r)
            for (int j = 0; j < BT; ++j) {
                double x = 0;
                if (j < r)
                    for (int d = 0; d < KD; ++d) x += k[r * KD + d] * k[j * KD + d] * std::exp2(G[r * KD + d] - G[j * KD + d]);
                L[r * BT + j] = j < r ? beta[r] * x : 0.0;
            }
        for (int col = 0; col < BT; ++col)  // A = (I + L)^-1 by forward substitution
            for (int r = 0; r < BT; ++r) {
                double x = r == col ? 1.0 : 0.0;
                for (int j = col; j < r; ++j) x -= L[r * BT + j] * A[j * BT + col];
                A[r * BT + col] = r < col ? 0.0 : x;
            }
        const size_t tile = (size_t)hc * BT * KD;
        for (int r = 0; r < BT; ++r) {
            for (int d = 0; d < KD; ++d) {
                double w = 0, u = 0;
                for (int j = 0; j <= r; ++j) {
                    w += A[r * BT + j] * beta[j] * k[j * KD + d] * std::exp2(G[j * KD + d]);
                    u += A[r * BT + j] * beta[j] * v[j * VD + d];
                }
                in.w[tile + r * KD + d] = __float2bfloat16((float)w);
                in.u[tile + r * VD + d] = __float2bfloat16((float)u);
                in.kg[tile + r * KD + d] = __float2bfloat16((float)(k[r * KD + d] * std::exp2(G[(BT - 1) * KD + d] - G[r * KD + d])));
                in.kgt[tile + d * BT + r] = in.kg[tile + r * KD + d];
            }
        }
        for (int d = 0; d < KD; ++d) in.lam[(size_t)hc * KD + d] = (float)std::exp2(G[(BT - 1) * KD + d]);
    }
    return in;
}

// The chain in f64 with the kernel's rounding points (bf16(S) in W·S, D rounded to bf16).
static void reference(const Inputs& in, int heads, int nchunks, std::vector<double>& d, std::vector<double>& st) {
    d.assign((size_t)heads * nchunks * BT * VD, 0.0);
    st.assign((size_t)heads * KD * VD, 0.0);
    std::vector<double> s(KD * VD), sh(KD * VD);
    for (int h = 0; h < heads; ++h) {
        std::fill(s.begin(), s.end(), 0.0);
        for (int c = 0; c < nchunks; ++c) {
            const size_t tile = ((size_t)h * nchunks + c) * BT * KD;
            for (int e = 0; e < KD * VD; ++e) sh[e] = rbf(s[e]);
            for (int r = 0; r < BT; ++r)
                for (int j = 0; j < VD; ++j) {
                    double acc = 0;
                    for (int k = 0; k < KD; ++k) acc += (double)__bfloat162float(in.w[tile + r * KD + k]) * sh[k * VD + j];
                    d[tile + r * VD + j] = rbf((double)__bfloat162float(in.u[tile + r * VD + j]) - acc);
                }
            const float* lam = &in.lam[((size_t)h * nchunks + c) * KD];
            for (int k = 0; k < KD; ++k)
                for (int j = 0; j < VD; ++j) {
                    double acc = lam[k] * s[k * VD + j];
                    for (int r = 0; r < BT; ++r) acc += (double)__bfloat162float(in.kg[tile + r * KD + k]) * d[tile + r * VD + j];
                    s[k * VD + j] = acc;
                }
        }
        std::copy(s.begin(), s.end(), st.begin() + (size_t)h * KD * VD);
    }
}

struct Dev {
    bf16 *w, *u, *kg, *kgt, *d;
    float *lam, *st;
    ChainArgs args(int heads, int nchunks) const { return {w, u, kg, kgt, lam, d, st, heads, nchunks}; }
};
static Dev upload(const Inputs& in, size_t state_elems) {
    Dev g{};
    const size_t n = in.w.size();
    CK(cudaMalloc(&g.w, n * 2));
    CK(cudaMalloc(&g.u, n * 2));
    CK(cudaMalloc(&g.kg, n * 2));
    CK(cudaMalloc(&g.kgt, n * 2));
    CK(cudaMalloc(&g.d, n * 2));
    CK(cudaMalloc(&g.lam, in.lam.size() * 4));
    CK(cudaMalloc(&g.st, state_elems * 4));
    CK(cudaMemcpy(g.w, in.w.data(), n * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g.u, in.u.data(), n * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g.kg, in.kg.data(), n * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g.kgt, in.kgt.data(), n * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g.lam, in.lam.data(), in.lam.size() * 4, cudaMemcpyHostToDevice));
    return g;
}
static void free_dev(Dev& g) { cudaFree(g.w); cudaFree(g.u); cudaFree(g.kg); cudaFree(g.kgt); cudaFree(g.d); cudaFree(g.lam); cudaFree(g.st); }

[[maybe_unused]] static double rel_err(const std::vector<double>& ref, const std::vector<double>& got, size_t& nans) {
    double num = 0, den = 0;
    nans = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        if (!std::isfinite(got[i])) { ++nans; continue; }
        num = std::fmax(num, std::fabs(got[i] - ref[i]));
        den = std::fmax(den, std::fabs(ref[i]));
    }
    return den > 0 ? num / den : num;
}

#ifdef LAB_HOST_ONLY
// A host check of the inputs and the reference (no GPU): magnitudes stay finite and bounded.
int main() {
    for (int regime = 0; regime < 2; ++regime) {
        Inputs in = make_inputs(1, 32, regime, 7);
        std::vector<double> d, st;
        reference(in, 1, 32, d, st);
        double md = 0, ms = 0, mw = 0;
        for (double x : d) md = std::fmax(md, std::fabs(x));
        for (double x : st) ms = std::fmax(ms, std::fabs(x));
        for (auto x : in.w) mw = std::fmax(mw, std::fabs((double)__bfloat162float(x)));
        printf("regime %d: max |W| %.3f, max |D| %.3f, max |S| %.3f\n", regime, mw, md, ms);
    }
    return 0;
}
#else
int main(int argc, char** argv) {
    const int ch = argc > 2 ? atoi(argv[1]) : 2, ct = argc > 2 ? atoi(argv[2]) : 8192;
    const int cn = ct / BT;
    int failures = 0;
    for (int regime = 0; regime < 2; ++regime) {
        Inputs in = make_inputs(ch, cn, regime, 7 + regime);
        std::vector<double> dref, sref;
        reference(in, ch, cn, dref, sref);
        for (const Kernel& k : kernels) {
            Dev g = upload(in, (size_t)ch * KD * VD);
            CK(cudaMemset(g.d, 0xff, in.w.size() * 2));  // NaN poison (bf16 0xffff)
            CK(cudaMemset(g.st, 0xff, (size_t)ch * KD * VD * 4));
            k.launch(g.args(ch, cn));
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            std::vector<bf16> dh(in.w.size());
            std::vector<float> sh((size_t)ch * KD * VD);
            CK(cudaMemcpy(dh.data(), g.d, dh.size() * 2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(sh.data(), g.st, sh.size() * 4, cudaMemcpyDeviceToHost));
            std::vector<double> dg(dh.size()), sg(sh.size());
            for (size_t i = 0; i < dh.size(); ++i) dg[i] = __bfloat162float(dh[i]);
            for (size_t i = 0; i < sh.size(); ++i) sg[i] = sh[i];
            size_t n1, n2;
            const double e1 = rel_err(dref, dg, n1), e2 = rel_err(sref, sg, n2);
            const double tol = ct > 8192 || regime == 1 ? 1e-2 : 5e-3;
            const bool ok = n1 == 0 && n2 == 0 && e1 <= tol && e2 <= tol;
            failures += !ok;
            printf("check %-12s %s %d x %d: D rel %.3e, final state rel %.3e, non-finite %zu / %zu (tol %.0e) %s\n", k.name,
                   regime ? "long  " : "strong", ch, ct, e1, e2, n1, n2, tol, ok ? "PASS" : "FAIL");
            free_dev(g);
        }
    }
    // timing: inputs are a pool of 64 chunk tiles per head repeated (values do not change the work)
    const int shapes[][2] = {{4, 131072}, {32, 65536}};
    for (auto& sh : shapes) {
        const int heads = sh[0], nchunks = sh[1] / BT, pool = 64;
        Inputs p = make_inputs(1, pool, 0, 99);
        const size_t n = (size_t)heads * nchunks * BT * KD;
        Inputs in{std::vector<bf16>(n), std::vector<bf16>(n), std::vector<bf16>(n), std::vector<bf16>(n),
                  std::vector<float>((size_t)heads * nchunks * KD)};
        for (size_t hc = 0; hc < (size_t)heads * nchunks; ++hc) {
            const size_t src = hc % pool;
            std::copy_n(&p.w[src * BT * KD], BT * KD, &in.w[hc * BT * KD]);
            std::copy_n(&p.u[src * BT * KD], BT * KD, &in.u[hc * BT * KD]);
            std::copy_n(&p.kg[src * BT * KD], BT * KD, &in.kg[hc * BT * KD]);
            std::copy_n(&p.kgt[src * BT * KD], BT * KD, &in.kgt[hc * BT * KD]);
            std::copy_n(&p.lam[src * KD], KD, &in.lam[hc * KD]);
        }
        for (const Kernel& k : kernels) {
            Dev g = upload(in, (size_t)heads * KD * VD);
            cudaEvent_t a, b;
            CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
            k.launch(g.args(heads, nchunks));  // warm
            CK(cudaDeviceSynchronize());
            const int iters = 5;
            CK(cudaEventRecord(a));
            for (int i = 0; i < iters; ++i) k.launch(g.args(heads, nchunks));
            CK(cudaEventRecord(b));
            CK(cudaEventSynchronize(b));
            float ms;
            CK(cudaEventElapsedTime(&ms, a, b));
            ms /= iters;
            // per chunk: W and Kg read by every column block, U read and D written once, lam per block
            const double bytes = (double)heads * nchunks * (2.0 * BT * KD * 2 * (VD / BV) + 2.0 * BT * VD * 2 + KD * 4.0 * (VD / BV));
            const int ctas = heads * (VD / BV);
            printf("time  %-12s H %d x %d: %.3f ms, %.2f us per chunk step (%d CTAs), %.0f GB/s\n", k.name, heads, sh[1], ms,
                   ms * 1e3 / nchunks, ctas, bytes / (ms * 1e-3) / 1e9);
            free_dev(g);
        }
    }
    return failures ? 1 : 0;
}
#endif
