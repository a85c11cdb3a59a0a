// The lean fused GDN forward on Hopper (sm_90a; conformance/spec/ops-delta-rule.md 8.5): the same
// recurrence, rounding points and pieces as delta_fused_gdn (delta_fwd.cu), as a warp-specialised
// kernel (design and lab: tools/bench-results/s15_7_study_gdn_fused.md, tools/lab/gdn_wg_lab.cu).
// Chunk size 64, K = 128, bf16, 64 state columns a CTA. With e_r = exp2(G_r), f_r = exp2(G_l - G_r)
// (0 beyond n_c), λ = exp2(G_l), l = n_c - 1, for every chunk:
//
//   Ŝᵀ = bf16(Sᵀ)
//   Xᵀ = Ŝᵀ Kᵀ,  Oᵀ = Ŝᵀ Qᵀ                      wgmma m64n64k16, A from registers (RS)
//   Wᵀ = bf16(Vᵀ - Xᵀ diag(e))                   (FLA's u - w S before its Akk product)
//   Dᵀ = Wᵀ Tb_hiᵀ + Wᵀ Tb_loᵀ,  D̂ = bf16(D)     (FLA's v_new)
//   Oᵀ = Oᵀ diag(scale e) + D̂ᵀ Aqkᵀ             (block lower triangle of Aqk only: m64n16k16)
//   Sᵀ = λ Sᵀ + bf16(Dᵀ diag(f)) K               wgmma m64n128k16, B = the k tile read N-major
//
// One CTA of 256 threads per (piece, value head, 64 state columns), the column block fastest in
// blockIdx.x so that a head's column blocks run together and share k, q, Tb, Aqk through L2.
// Warpgroup 0: warp 0 is the producer (TMA 2-D boxes of 64 x 64 bf16 with the 128-byte swizzle
// into an NST-stage ring guarded by full / empty mbarriers, and the per-token gate factors; a
// sequence's partial last chunk by plain zero-filled loads, since TMA would read the next
// sequence's rows); its other warps leave. Warpgroup 1 holds Sᵀ (64 dv x 128 dk, fp32) as its
// m64n128 accumulator through the piece and writes o through stmatrix and TMA stores.
// `setmaxnreg` moves registers from warpgroup 0 to warpgroup 1. Pieces, warm-ups (state only),
// initial_state and the final state as delta_fused_gdn (pieces.cuh).

#define WG_BT 64
#define WG_NST 2

// TMA descriptors (CUtensorMap: 128 opaque bytes, 64-byte aligned), built on the host.
struct __align__(64) TMap {
    u64 opaque[16];
};
// The kernel's parameter: the tensor maps of q, k ([rows][QH K]), v, o ([rows][HV V]), Tb hi,
// Tb lo and Aqk ([rows][HV 64]), boxes of 64 x 64, then the lean kernel's arguments.
struct GdnWgArgs {
    TMap q, k, v, tbh, tbl, aqk, o;
    GdnFusedArgs a;
};

__device__ __forceinline__ unsigned wg_pack(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ float wg_lo(unsigned u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float wg_hi(unsigned u) { return __uint_as_float(u & 0xffff0000u); }
// Byte offset of 16-byte piece `piece` of row `row` in a tile of 128-byte rows under the 128-byte
// swizzle (TMA SWIZZLE_128B and wgmma layout type 1 agree; tiles 1024-byte aligned).
__device__ __forceinline__ unsigned sw128(int row, int piece) { return row * 128 + ((piece ^ (row & 7)) << 4); }

// wgmma shared-memory descriptors with the 128-byte swizzle (layout type 1), as two 32-bit halves
// so that a k step is one add to the low half (start address >> 4 in bits 0-13).
// K-major: 128-byte rows, 8-row groups 1024 bytes apart (SBO 64). MN-major (B with N contiguous):
// the two 64-key boxes of the k tile LBO = 8192 bytes apart, 8-row K groups SBO = 1024 bytes apart.
#define WG_DESC_HI (64u | (1u << 30))
__device__ __forceinline__ unsigned desc_k(unsigned addr) { return ((addr >> 4) & 0x3FFF) | (1u << 16); }
__device__ __forceinline__ unsigned desc_mn(unsigned addr) { return ((addr >> 4) & 0x3FFF) | (512u << 16); }
__device__ __forceinline__ u64 mkdesc(unsigned lo) { return ((u64)WG_DESC_HI << 32) | lo; }

#define WG_FENCE() asm volatile("wgmma.fence.sync.aligned;" ::: "memory")
#define WG_COMMIT() asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory")
#define WG_WAIT(n) asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(n) : "memory")

#define WG_ACC8(d, o, m) m(d[o + 0]), m(d[o + 1]), m(d[o + 2]), m(d[o + 3]), m(d[o + 4]), m(d[o + 5]), m(d[o + 6]), m(d[o + 7])
#define WG_ACC32(d, m) WG_ACC8(d, 0, m), WG_ACC8(d, 8, m), WG_ACC8(d, 16, m), WG_ACC8(d, 24, m)
#define WG_FOUT(x) "=f"(x)
#define WG_FIO(x) "+f"(x)
#define WG_R32 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"

// d (m64n64, f32) = A (registers) B (descriptor) [+ d]; ZERO: scale-d = 0 (the product overwrites d).
template <bool ZERO>
__device__ __forceinline__ void wgmma_n64(float (&d)[32], const unsigned (&a)[4], u64 b) {
    if constexpr (ZERO) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_R32 ", {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}"
            : WG_ACC32(d, WG_FOUT)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
    } else {
        asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_R32 ", {%32,%33,%34,%35}, %36, 1, 1, 1, 0;"
                     : WG_ACC32(d, WG_FIO)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
    }
}
// Columns [16 J, 16 J + 16) of an m64n64 accumulator d += A B (m64n16k16; B's rows are those columns).
template <int J>
__device__ __forceinline__ void wgmma_n16(float (&d)[32], const unsigned (&a)[4], u64 b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, 1, 1, 1, 0;"
                 : WG_ACC8(d, 8 * J, WG_FIO)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
// Sᵀ (m64n128, f32) += A (registers) B (descriptor, N-major: imm-trans-b 1).
__device__ __forceinline__ void wgmma_n128_t(float (&d)[64], const unsigned (&a)[4], u64 b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
        "{%64,%65,%66,%67}, %68, 1, 1, 1, 1;"
        : WG_ACC32(d, WG_FIO), WG_ACC8(d, 32, WG_FIO), WG_ACC8(d, 40, WG_FIO), WG_ACC8(d, 48, WG_FIO), WG_ACC8(d, 56, WG_FIO)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

__device__ __forceinline__ void stsm_x4_t(unsigned addr, unsigned r0, unsigned r1, unsigned r2, unsigned r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};" ::"r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory"); }
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n.reg .pred P1;\nWAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
        "@!P1 bra WAIT_%=;\n}" ::"r"(bar),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void tma_load(unsigned dst, const TMap* map, int x, int y, unsigned bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
                 "l"(map), "r"(x), "r"(y), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void tma_store(const TMap* map, int x, int y, unsigned src) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(map), "r"(x), "r"(y), "r"(src)
                 : "memory");
}
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Shared memory from a 1024-byte aligned base: NST stages of eight 8 KB tiles (k0, k1 = keys
// 0-63 and 64-127; q0, q1; v; Tb hi; Tb lo; Aqk: [64 tokens][64] bf16, swizzled), two o staging
// tiles (8 KB), the stages' gate factors (e[64], f[64], λ), the full / empty mbarriers: with the
// alignment slack, 149568 bytes (GDN_WG_SMEM in gpu/src/delta/wg.rs).
struct WgLayout {
    static constexpr unsigned TILE = 8192, STAGE = 8 * TILE, FAC = (2 * WG_BT + 4) * 4;
    __device__ static constexpr unsigned stage(int s) { return s * STAGE; }
    __device__ static constexpr unsigned ostage(int b) { return WG_NST * STAGE + b * TILE; }
    __device__ static constexpr unsigned fac(int s) { return WG_NST * STAGE + 2 * TILE + s * FAC; }
    __device__ static constexpr unsigned bars() { return fac(WG_NST); }
};
enum { T_K0, T_K1, T_Q0, T_Q1, T_V, T_TBH, T_TBL, T_AQK };

// o is computed in every chunk (warm-up chunks too, unstored: no branch around the wgmma
// pipeline) and stored from the piece's first chunk.
extern "C" __global__ void __launch_bounds__(256, 1) delta_fwd_gdn_wg_bf16(const __grid_constant__ GdnWgArgs p) {
    const GdnFusedArgs& a = p.a;
    using L = WgLayout;
    extern __shared__ unsigned char smem_raw[];
    const unsigned base = (smem_u32(smem_raw) + 1023) & ~1023u;
    unsigned char* gbase = smem_raw + (base - smem_u32(smem_raw));
    const unsigned bars = base + L::bars();
    auto full = [&](int s) { return bars + s * 8; };
    auto empty = [&](int s) { return bars + WG_NST * 8 + s * 8; };

    // 32-bit indices from here (rows < 2^31: TMA coordinates are 32-bit too)
    const int ncb = (int)(a.V / 64);
    const int cb = (int)(blockIdx.x % ncb), c0 = cb * 64;
    PieceRun pr;
    if (!piece_run_at(a, blockIdx.x / ncb, pr)) return;
    const int hv = (int)pr.hv, row0 = (int)pr.row0, len = (int)(pr.end - pr.row0), warm = (int)pr.w;
    const bool from_start = pr.row0 == pr.seq0, to_end = pr.end == pr.seqend;
    const int nchunks = (len + WG_BT - 1) / WG_BT;
    const int qh = hv / (int)(a.HV / a.QH);
    const i64 sbase = (pr.n * a.HV + hv) * a.K * a.V;  // the state of (sequence, value head)
    auto rows_of = [&](int c) { return min(WG_BT, len - c * WG_BT); };

    if (threadIdx.x == 0) {
        for (int s = 0; s < WG_NST; ++s) {
            mbar_init(full(s), 32);  // the producer's 32 lanes (and the TMA bytes)
            mbar_init(empty(s), 4);  // one arrival per consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (threadIdx.x < 128) {
        // ---------------------------------- producer ----------------------------------
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (threadIdx.x >= 32) return;
        const int lane = threadIdx.x;
        const float* gp = reinterpret_cast<const float*>(a.g);
        float gr[2], gl = 0.f;
        auto load_g = [&](int c) {
            const i64 r0 = row0 + c * WG_BT;
            const int nc = rows_of(c);
            gl = gp[(r0 + nc - 1) * a.HV + hv];
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
                const int r = lane + 32 * h2;
                gr[h2] = r < nc ? gp[(r0 + r) * a.HV + hv] : 0.f;
            }
        };
        if (nchunks > 0) load_g(0);
        for (int c = 0; c < nchunks; ++c) {
            const int s = c % WG_NST;
            mbar_wait(empty(s), ((c / WG_NST) & 1) ^ 1);
            const int r0 = row0 + c * WG_BT;
            const int nc = rows_of(c);
            const unsigned st = base + L::stage(s);
            if (nc == WG_BT) {
                if (lane == 0) {
                    mbar_expect_tx(full(s), 8 * L::TILE);
                    tma_load(st + T_K0 * L::TILE, &p.k, qh * (int)a.K, r0, full(s));
                    tma_load(st + T_K1 * L::TILE, &p.k, qh * (int)a.K + 64, r0, full(s));
                    tma_load(st + T_V * L::TILE, &p.v, hv * (int)a.V + c0, r0, full(s));
                    tma_load(st + T_TBH * L::TILE, &p.tbh, hv * WG_BT, r0, full(s));
                    tma_load(st + T_TBL * L::TILE, &p.tbl, hv * WG_BT, r0, full(s));
                    tma_load(st + T_Q0 * L::TILE, &p.q, qh * (int)a.K, r0, full(s));
                    tma_load(st + T_Q1 * L::TILE, &p.q, qh * (int)a.K + 64, r0, full(s));
                    tma_load(st + T_AQK * L::TILE, &p.aqk, hv * WG_BT, r0, full(s));
                }
            } else {
                // the sequence's partial last chunk: 16-byte loads, rows >= nc zero, swizzled
                const bf16* kb = reinterpret_cast<const bf16*>(a.k);
                const bf16* qb = reinterpret_cast<const bf16*>(a.q);
                const bf16* vb = reinterpret_cast<const bf16*>(a.v);
                const bf16* hb = reinterpret_cast<const bf16*>(a.tbh);
                const bf16* lb = reinterpret_cast<const bf16*>(a.tbl);
                const bf16* ab = reinterpret_cast<const bf16*>(a.aqk);
                for (int i = lane; i < 8 * WG_BT * 8; i += 32) {
                    const int t = i / (WG_BT * 8), r = (i / 8) % WG_BT, pc = i % 8;
                    const int tile = (0x73265410 >> (4 * t)) & 15;  // k0 k1 v tbh tbl, then q0 q1 aqk
                    uint4 val = make_uint4(0, 0, 0, 0);
                    if (r < nc) {
                        const i64 row = (i64)r0 + r;
                        const i64 kq = (row * a.QH + qh) * a.K, tb = (row * a.HV + hv) * WG_BT;
                        const bf16* src = tile == T_K0    ? kb + kq
                                          : tile == T_K1  ? kb + kq + 64
                                          : tile == T_Q0  ? qb + kq
                                          : tile == T_Q1  ? qb + kq + 64
                                          : tile == T_V   ? vb + (row * a.HV + hv) * a.V + c0
                                          : tile == T_TBH ? hb + tb
                                          : tile == T_TBL ? lb + tb
                                                          : ab + tb;
                        val = *reinterpret_cast<const uint4*>(src + pc * 8);
                    }
                    *reinterpret_cast<uint4*>(gbase + L::stage(s) + tile * L::TILE + sw128(r, pc)) = val;
                }
                fence_async_smem();  // the generic-proxy writes before the consumers' wgmma reads
            }
            float* fac = reinterpret_cast<float*>(gbase + L::fac(s));
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
                const int r = lane + 32 * h2;
                const bool ok = r < nc;
                fac[r] = ok ? ex2_ftz(gr[h2]) : 0.f;
                fac[WG_BT + r] = ok ? ex2_ftz(gl - gr[h2]) : 0.f;
            }
            if (lane == 0) fac[2 * WG_BT] = ex2_ftz(gl);
            mbar_arrive(full(s));
            if (c + 1 < nchunks) load_g(c + 1);
        }
        return;
    }

    // ---------------------------------- consumer ----------------------------------
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int t = threadIdx.x - 128, w = t >> 5, l = t & 31;
    const int cq = 2 * (l & 3);
    const float scale = (float)a.scale;
    // Fragment of an m64nN f32 accumulator (warp w, lane l): rows 16w + l/4 (+8) (state columns
    // dv), columns 8j + cq (+1) (dk for Sᵀ, tokens for Xᵀ, Oᵀ, Dᵀ): d[4j + 0..3] = (r, c),
    // (r, c+1), (r+8, c), (r+8, c+1).
    const int dv0 = 16 * w + (l >> 2);
    float s[64];
    const bool h0 = a.h0 != 0 && from_start;
    // element (dk, dv) of a state in memory: dk rs + dv cs (state_v_first: Sᵀ)
    const int rs = a.v_first ? 1 : (int)a.V, cs = a.v_first ? (int)a.K : 1;
    const int soff = (cq * rs) + (c0 + dv0) * cs;
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            s[4 * j + e] = h0 ? load_f(reinterpret_cast<const void*>(a.h0), a.h0_dtype, sbase + soff + (8 * j + (e & 1)) * rs + 8 * (e >> 1) * cs) : 0.f;
    // ldmatrix / stmatrix addressing: lane l serves row l % 8 of 8x8 matrix l / 8
    const int mi = l >> 3, mr = l & 7;

    for (int c = 0; c < nchunks; ++c) {
        const int stg = c % WG_NST;
        const unsigned st = base + L::stage(stg);
        const int nc = rows_of(c);
        const float* fac = reinterpret_cast<const float*>(gbase + L::fac(stg));
        const unsigned dk = desc_k(st), dmn = desc_mn(st);
        mbar_wait(full(stg), (c / WG_NST) & 1);

        // Ŝᵀ as the A fragments of 8 k16 slices (dk)
        unsigned sa[8][4];
#pragma unroll
        for (int k = 0; k < 8; ++k)
#pragma unroll
            for (int m = 0; m < 4; ++m) sa[k][m] = wg_pack(s[8 * k + 2 * m], s[8 * k + 2 * m + 1]);
        // Xᵀ = Ŝᵀ Kᵀ, then Oᵀ = Ŝᵀ Qᵀ (k step kk: keys 16 kk.., tile kk / 4, +32 bytes a step in it)
        float x[32], o[32];
        WG_FENCE();
        wgmma_n64<true>(x, sa[0], mkdesc(dk));
#pragma unroll
        for (int kk = 1; kk < 8; ++kk) wgmma_n64<false>(x, sa[kk], mkdesc(dk + ((kk / 4) * L::TILE + (kk % 4) * 32) / 16));
        wgmma_n64<true>(o, sa[0], mkdesc(dk + T_Q0 * L::TILE / 16));
#pragma unroll
        for (int kk = 1; kk < 8; ++kk) wgmma_n64<false>(o, sa[kk], mkdesc(dk + ((T_Q0 + kk / 4) * L::TILE + (kk % 4) * 32) / 16));
        WG_COMMIT();
        // beside them: Vᵀ fragments (vr[j][half] = V[8j + cq .. + 1][dv0 + 8 half]) and e
        unsigned vr[8][2];
#pragma unroll
        for (int j = 0; j < 8; j += 2) {
            unsigned r[4];
            ldsm_x4_t(r, st + T_V * L::TILE + sw128(8 * (j + (mi >> 1)) + mr, 2 * w + (mi & 1)));
            vr[j][0] = r[0];
            vr[j][1] = r[1];
            vr[j + 1][0] = r[2];
            vr[j + 1][1] = r[3];
        }
        WG_WAIT(0);  // Xᵀ and Oᵀ (Ŝᵀ's registers free again)
        float2 e[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) e[j] = *reinterpret_cast<const float2*>(fac + 8 * j + cq);

        // Wᵀ = bf16(Vᵀ - Xᵀ diag(e)) as the A fragments of 4 k16 slices (tokens)
        unsigned wa[4][4];
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
                const float w0 = fmaf(-e[j].x, x[4 * j + 2 * h2], wg_lo(vr[j][h2]));
                const float w1 = fmaf(-e[j].y, x[4 * j + 2 * h2 + 1], wg_hi(vr[j][h2]));
                wa[j / 2][(j % 2) * 2 + h2] = wg_pack(w0, w1);
            }
        // Dᵀ = Wᵀ Tb_hiᵀ + Wᵀ Tb_loᵀ
        float d[32];
        WG_FENCE();
        wgmma_n64<true>(d, wa[0], mkdesc(dk + T_TBH * L::TILE / 16));
#pragma unroll
        for (int kk = 1; kk < 4; ++kk) wgmma_n64<false>(d, wa[kk], mkdesc(dk + (T_TBH * L::TILE + kk * 32) / 16));
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wgmma_n64<false>(d, wa[kk], mkdesc(dk + (T_TBL * L::TILE + kk * 32) / 16));
        WG_COMMIT();
        float2 f[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) f[j] = *reinterpret_cast<const float2*>(fac + WG_BT + 8 * j + cq);
        const float lam = fac[2 * WG_BT];
        WG_WAIT(0);

        // D̂ᵀ and D̂′ᵀ = bf16(Dᵀ diag(f)) as A fragments
        unsigned dh[4][4], da[4][4];
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
                const float d0 = d[4 * j + 2 * h2], d1 = d[4 * j + 2 * h2 + 1];
                dh[j / 2][(j % 2) * 2 + h2] = wg_pack(d0, d1);
                da[j / 2][(j % 2) * 2 + h2] = wg_pack(d0 * f[j].x, d1 * f[j].y);
            }
        // Oᵀ = Oᵀ diag(scale e) + D̂ᵀ Aqkᵀ: output tokens 16 J.. take key steps kk <= J (Aqk is
        // not written above its diagonal 16 x 16 blocks; zero above the diagonal inside them)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float2 ej = *reinterpret_cast<const float2*>(fac + 8 * j + cq);
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
                o[4 * j + 2 * h2] *= scale * ej.x;
                o[4 * j + 2 * h2 + 1] *= scale * ej.y;
            }
        }
        const unsigned aq = dk + T_AQK * L::TILE / 16;
        WG_FENCE();
        wgmma_n16<0>(o, dh[0], mkdesc(aq));
        wgmma_n16<1>(o, dh[0], mkdesc(aq + 2048 / 16));
        wgmma_n16<1>(o, dh[1], mkdesc(aq + (2048 + 32) / 16));
#pragma unroll
        for (int kk = 0; kk < 3; ++kk) wgmma_n16<2>(o, dh[kk], mkdesc(aq + (4096 + kk * 32) / 16));
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wgmma_n16<3>(o, dh[kk], mkdesc(aq + (6144 + kk * 32) / 16));
        WG_COMMIT();
        // Sᵀ = λ Sᵀ + D̂′ᵀ K (k step kk: tokens 16 kk.., +2048 bytes)
#pragma unroll
        for (int i = 0; i < 64; ++i) s[i] *= lam;
        WG_FENCE();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wgmma_n128_t(s, da[kk], mkdesc(dmn + kk * 2048 / 16));
        WG_COMMIT();
        WG_WAIT(1);  // Oᵀ is done; the update runs on
        if (c >= warm) {
            // o through the staging tile ([token][dv], stmatrix.trans) and a TMA store
            const unsigned ob = base + L::ostage(c & 1);
#pragma unroll
            for (int j = 0; j < 8; j += 2) {
                const int tok = 8 * (j + (mi >> 1)) + mr;
                stsm_x4_t(ob + sw128(tok, 2 * w + (mi & 1)), wg_pack(o[4 * j], o[4 * j + 1]), wg_pack(o[4 * j + 2], o[4 * j + 3]),
                          wg_pack(o[4 * j + 4], o[4 * j + 5]), wg_pack(o[4 * j + 6], o[4 * j + 7]));
            }
            fence_async_smem();
            if (t == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // the previous store has read its tile
            asm volatile("bar.sync 1, 128;" ::: "memory");
            const int r0 = row0 + c * WG_BT;
            if (nc == WG_BT) {
                if (t == 0) {
                    tma_store(&p.o, hv * (int)a.V + c0, r0, ob);
                    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
                }
            } else {
                bf16* op = reinterpret_cast<bf16*>(a.o);
                for (int i = t; i < nc * 8; i += 128) {
                    const int r = i / 8, pc = i % 8;
                    *reinterpret_cast<uint4*>(op + ((i64)(r0 + r) * a.HV + hv) * a.V + c0 + pc * 8) =
                        *reinterpret_cast<const uint4*>(gbase + L::ostage(c & 1) + sw128(r, pc));
                }
            }
        }
        WG_WAIT(0);
        if (l == 0) mbar_arrive(empty(stg));  // the stage's tiles are no longer read
    }
    if (a.ht != 0 && to_end) {
        float* ht = reinterpret_cast<float*>(a.ht) + sbase + soff;
#pragma unroll
        for (int j = 0; j < 16; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) ht[(8 * j + (e & 1)) * rs + 8 * (e >> 1) * cs] = s[4 * j + e];
    }
    if (t == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
