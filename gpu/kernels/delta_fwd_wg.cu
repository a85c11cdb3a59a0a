// The fused delta-rule forwards on Hopper (sm_90a; conformance/spec/ops-delta-rule.md 6.5, 8.5):
// the recurrences, rounding points and pieces of delta_fused / delta_fused_gdn (delta_fwd.cu), as
// warp-specialised kernels (design: tools/bench-results/s15_7_study_gdn_fused.md; the lab
// gdn_wg_lab.cu, since removed: tools/lab/README.md keeps its results and git range). Chunk size
// 64, K = 128, bf16, 64 state columns a CTA; Ŝᵀ = bf16(Sᵀ). The same pieces also run
// chunk_gated_delta_rule_fwd_h alone (chunk_gated_delta_rule_fwd_h_wg_bf16, at the end of this file).
//
// GDN (delta_fwd_gdn_wg_bf16, the lean inputs q, k, v, Tb hi + lo, Aqk, G): with e_r = exp2(G_r),
// f_r = exp2(G_l - G_r) (0 beyond n_c), λ = exp2(G_l), l = n_c - 1, for every chunk:
//   Xᵀ = Ŝᵀ Kᵀ,  Oᵀ = Ŝᵀ Qᵀ                      wgmma m64n64k16, A from registers (RS)
//   Wᵀ = bf16(Vᵀ - Xᵀ diag(e))                   (FLA's u - w S before its Akk product)
//   Dᵀ = Wᵀ Tb_hiᵀ + Wᵀ Tb_loᵀ,  D̂ = bf16(D)     (FLA's v_new)
//   Oᵀ = Oᵀ diag(scale e) + D̂ᵀ Aqkᵀ             (block lower triangle of Aqk only: m64n16k16)
//   Sᵀ = λ Sᵀ + bf16(Dᵀ diag(f)) K               wgmma m64n128k16, B = the k tile read N-major
// With use_qk_l2norm_in_kernel, q and k are the raw inputs and rq, rk the reciprocals of their
// norms (the intra stage's `rqk`), folded into the per-token factors (e·rk for W, f·rk for D′,
// scale·e·rq for O), so the normalised q, k never go to HBM (their fp32 factors round less than
// FLA's bf16 q̂, k̂); else rq = rk = 1.
// KDA (delta_fwd_kda_wg_bf16, the intra stage's w, u, kg, qg, qf, Aqk and lam = exp2(G_l) per
// chunk and key):
//   Xᵀ = Ŝᵀ Wᵀ,  Oᵀ = Ŝᵀ Qgᵀ
//   D̂ᵀ = bf16(Uᵀ - Xᵀ)                           (v_new)
//   Oᵀ = Oᵀ diag(qf) + D̂ᵀ Aqkᵀ
//   Sᵀ = Sᵀ diag(lam) + D̂ᵀ Kg                    (B = the kg tile read N-major)
//
// One CTA of 256 threads per (piece, value head, 64 state columns), the column block fastest in
// blockIdx.x so that a head's column blocks run together and share their tiles through L2.
// Warpgroup 0: warp 0 is the producer (TMA 2-D boxes of 64 x 64 bf16 with the 128-byte swizzle
// into an NST-stage ring guarded by full / empty mbarriers, and the per-token and per-key factors;
// a sequence's partial last chunk by plain zero-filled loads, since TMA would read the next
// sequence's rows); its other warps leave. Warpgroup 1 holds Sᵀ (64 dv x 128 dk, fp32) as its
// m64n128 accumulator through the piece and writes o through stmatrix and TMA stores.
// `setmaxnreg` moves registers from warpgroup 0 to warpgroup 1. Pieces, warm-ups (state only),
// initial_state and the final state as in delta_fwd.cu (pieces.cuh).

#define WG_BT 64
#define WG_NST 2

// TMA descriptors (CUtensorMap: 128 opaque bytes, 64-byte aligned), built on the host.
struct __align__(64) TMap {
    u64 opaque[16];
};
// The kernels' parameters: the tensor maps of the tiles (boxes of 64 x 64), then the arguments of
// delta_fwd.cu's kernel of the same kind. GDN: q, k ([rows][QH K]), v, o ([rows][HV V]), Tb hi,
// Tb lo, Aqk ([rows][HV 64]). KDA: w, qg, kg ([rows][HV K]), u, o ([rows][HV V]), Aqk.
struct GdnWgArgs {
    TMap q, k, v, tbh, tbl, aqk, o;
    GdnFusedArgs a;
};
struct KdaWgArgs {
    TMap w, qg, kg, u, aqk, o;
    FusedArgs a;
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
__device__ __forceinline__ void stsm_x4(unsigned addr, unsigned r0, unsigned r1, unsigned r2, unsigned r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};" ::"r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
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

// Shared memory from a 1024-byte aligned base: NST stages of eight 8 KB tiles ([64 tokens][64]
// bf16, swizzled: the X operand's two key boxes, the O operand's two, v / u, two more (GDN: Tb hi,
// Tb lo; KDA: kg's two key boxes), Aqk), two o staging tiles (8 KB), the stages' factors, the full /
// empty mbarriers: with the alignment slack, 151104 bytes (WG_SMEM in gpu/src/delta/wg.rs).
// Factors of a stage (fp32): GDN e[64], f[64], λ, 3 pad, then both kinds the O row factor [64]
// (GDN scale·e, KDA qf) and KDA lam[128].
struct WgLayout {
    static constexpr unsigned TILE = 8192, STAGE = 8 * TILE;
    static constexpr int F_E = 0, F_F = WG_BT, F_LAM1 = 2 * WG_BT, F_O = 2 * WG_BT + 4, F_LAM = 3 * WG_BT + 4;
    static constexpr unsigned FAC = (F_LAM + 128) * 4;
    __device__ static constexpr unsigned stage(int s) { return s * STAGE; }
    __device__ static constexpr unsigned ostage(int b) { return WG_NST * STAGE + b * TILE; }
    __device__ static constexpr unsigned fac(int s) { return WG_NST * STAGE + 2 * TILE + s * FAC; }
    __device__ static constexpr unsigned bars() { return fac(WG_NST); }
};
enum { T_X0, T_X1, T_O0, T_O1, T_V, T_5, T_6, T_AQK };

// The run of a CTA: its column block, piece rows and chunks (32-bit rows: TMA coordinates are 32-bit).
struct WgRun {
    int c0, hv, row0, len, warm, nchunks;
    bool from_start, to_end;
    i64 n, seq0;
    i64 sbase;  // the state of (sequence, value head)
    __device__ int rows_of(int c) const { return min(WG_BT, len - c * WG_BT); }
};
template <typename A>
__device__ __forceinline__ bool wg_run(const A& a, WgRun& r) {
    const int ncb = (int)(a.V / 64);
    r.c0 = (int)(blockIdx.x % ncb) * 64;
    PieceRun pr;
    if (!piece_run_at(a, blockIdx.x / ncb, pr)) return false;
    r.hv = (int)pr.hv;
    r.row0 = (int)pr.row0;
    r.len = (int)(pr.end - pr.row0);
    r.warm = (int)pr.w;
    r.nchunks = (r.len + WG_BT - 1) / WG_BT;
    r.from_start = pr.row0 == pr.seq0;
    r.to_end = pr.end == pr.seqend;
    r.n = pr.n;
    r.seq0 = pr.seq0;
    r.sbase = (pr.n * a.HV + r.hv) * a.K * a.V;
    return true;
}

// The partial last chunk of a sequence into stage st: 16-byte loads, rows >= nc zero, swizzled;
// src(t, row) is tile t's row `row` (32 lanes of the producer warp).
// MASK: the tiles to load (the others are left as they are).
template <unsigned MASK = 0xffu, typename F>
__device__ __forceinline__ void wg_load_partial(unsigned char* st, int nc, int lane, F src) {
    for (int i = lane; i < 8 * WG_BT * 8; i += 32) {
        const int t = i / (WG_BT * 8), r = (i / 8) % WG_BT, pc = i % 8;
        if (!((MASK >> t) & 1u)) continue;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (r < nc) val = *reinterpret_cast<const uint4*>(src(t, r) + pc * 8);
        *reinterpret_cast<uint4*>(st + t * WgLayout::TILE + sw128(r, pc)) = val;
    }
    fence_async_smem();  // the generic-proxy writes before the consumers' wgmma reads
}

// Accumulator fragments (warp w, lane l of the consumer warpgroup): rows 16w + l/4 (+8) (state
// columns dv), columns 8j + cq (+1), cq = 2 (l % 4) (dk for Sᵀ, tokens for Xᵀ, Oᵀ, Dᵀ):
// d[4j + 0..3] = (r, c), (r, c+1), (r+8, c), (r+8, c+1).

// Sᵀ from initial_state (any dtype; element (dk, dv) at dk rs + dv cs) or zero.
template <typename A>
__device__ __forceinline__ void wg_init_state(float (&s)[64], const A& a, const WgRun& r, bool h0, int soff, int rs, int cs) {
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            s[4 * j + e] = h0 ? load_f(reinterpret_cast<const void*>(a.h0), a.h0_dtype, r.sbase + soff + (8 * j + (e & 1)) * rs + 8 * (e >> 1) * cs) : 0.f;
}

// Ŝᵀ = bf16(Sᵀ) as the A fragments of its 8 k16 slices (dk).
__device__ __forceinline__ void wg_state_frags(unsigned (&sa)[8][4], const float (&s)[64]) {
#pragma unroll
    for (int k = 0; k < 8; ++k)
#pragma unroll
        for (int m = 0; m < 4; ++m) sa[k][m] = wg_pack(s[8 * k + 2 * m], s[8 * k + 2 * m + 1]);
}

// Sᵀ's fragments to an fp32 state in memory (this thread's first element at ht; element (dk, dv)
// dk rs + dv cs from it).
__device__ __forceinline__ void wg_store_state(float* ht, const float (&s)[64], int rs, int cs) {
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) ht[(8 * j + (e & 1)) * rs + 8 * (e >> 1) * cs] = s[4 * j + e];
}

// Xᵀ = Ŝᵀ (tiles x0, x1)ᵀ and Oᵀ = Ŝᵀ (tiles o0, o1)ᵀ (k step kk: keys 16 kk.., tile kk / 4,
// +32 bytes a step in it), one commit group.
__device__ __forceinline__ void wg_x_o(float (&x)[32], float (&o)[32], const unsigned (&sa)[8][4], unsigned dk) {
    WG_FENCE();
    wgmma_n64<true>(x, sa[0], mkdesc(dk));
#pragma unroll
    for (int kk = 1; kk < 8; ++kk) wgmma_n64<false>(x, sa[kk], mkdesc(dk + ((kk / 4) * WgLayout::TILE + (kk % 4) * 32) / 16));
    wgmma_n64<true>(o, sa[0], mkdesc(dk + T_O0 * WgLayout::TILE / 16));
#pragma unroll
    for (int kk = 1; kk < 8; ++kk) wgmma_n64<false>(o, sa[kk], mkdesc(dk + ((T_O0 + kk / 4) * WgLayout::TILE + (kk % 4) * 32) / 16));
    WG_COMMIT();
}

// Vᵀ (or Uᵀ) fragments of the tile at `tile`: vr[j][half] = V[8j + cq .. + 1][dv0 + 8 half].
__device__ __forceinline__ void wg_v_frags(unsigned (&vr)[8][2], unsigned tile, int w, int mi, int mr) {
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
        unsigned r[4];
        ldsm_x4_t(r, tile + sw128(8 * (j + (mi >> 1)) + mr, 2 * w + (mi & 1)));
        vr[j][0] = r[0];
        vr[j][1] = r[1];
        vr[j + 1][0] = r[2];
        vr[j + 1][1] = r[3];
    }
}

// Oᵀ = Oᵀ diag(fo) + D̂ᵀ Aqkᵀ: output tokens 16 J.. take key steps kk <= J (Aqk need not be
// written above its diagonal 16 x 16 blocks; zero above the diagonal inside them). One commit group.
__device__ __forceinline__ void wg_o_aqk(float (&o)[32], const unsigned (&dh)[4][4], const float* fo, int cq, unsigned aq) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const float2 f = *reinterpret_cast<const float2*>(fo + 8 * j + cq);
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
            o[4 * j + 2 * h2] *= f.x;
            o[4 * j + 2 * h2 + 1] *= f.y;
        }
    }
    WG_FENCE();
    wgmma_n16<0>(o, dh[0], mkdesc(aq));
    wgmma_n16<1>(o, dh[0], mkdesc(aq + 2048 / 16));
    wgmma_n16<1>(o, dh[1], mkdesc(aq + (2048 + 32) / 16));
#pragma unroll
    for (int kk = 0; kk < 3; ++kk) wgmma_n16<2>(o, dh[kk], mkdesc(aq + (4096 + kk * 32) / 16));
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_n16<3>(o, dh[kk], mkdesc(aq + (6144 + kk * 32) / 16));
    WG_COMMIT();
}

// Sᵀ += D′ᵀ B with B the key tiles at kt read N-major (k step kk: tokens 16 kk.., +2048 bytes).
__device__ __forceinline__ void wg_update(float (&s)[64], const unsigned (&da)[4][4], unsigned kt) {
    const unsigned dmn = desc_mn(kt);
    WG_FENCE();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_n128_t(s, da[kk], mkdesc(dmn + kk * 2048 / 16));
    WG_COMMIT();
}

// o of chunk c (rows r0.., nc valid; after Oᵀ's group, the update still running) through staging
// tile c % 2 ([token][dv], stmatrix.trans) and a TMA store of the map at (x, r0), or plain
// 16-byte stores into op (row stride `ostride` elements) for a partial chunk.
__device__ __forceinline__ void wg_store_o(const float (&o)[32], unsigned char* gbase, unsigned base, int c, int t, int w, int mi, int mr,
                                           const TMap* map, int x, int r0, int nc, bf16* op, i64 ostride) {
    const unsigned ob = base + WgLayout::ostage(c & 1);
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
        const int tok = 8 * (j + (mi >> 1)) + mr;
        stsm_x4_t(ob + sw128(tok, 2 * w + (mi & 1)), wg_pack(o[4 * j], o[4 * j + 1]), wg_pack(o[4 * j + 2], o[4 * j + 3]),
                  wg_pack(o[4 * j + 4], o[4 * j + 5]), wg_pack(o[4 * j + 6], o[4 * j + 7]));
    }
    fence_async_smem();
    if (t == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // the previous store has read its tile
    asm volatile("bar.sync 1, 128;" ::: "memory");
    if (nc == WG_BT) {
        if (t == 0) {
            tma_store(map, x, r0, ob);
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        }
    } else {
        for (int i = t; i < nc * 8; i += 128) {
            const int r = i / 8, pc = i % 8;
            *reinterpret_cast<uint4*>(op + (i64)(r0 + r) * ostride + pc * 8) =
                *reinterpret_cast<const uint4*>(gbase + WgLayout::ostage(c & 1) + sw128(r, pc));
        }
    }
}

// The dynamic shared memory from its first 1024-byte boundary (the swizzled tiles' alignment):
// its shared address in `base`, and as a pointer.
__device__ __forceinline__ unsigned char* wg_smem(unsigned& base) {
    extern __shared__ unsigned char smem_raw[];
    base = (smem_u32(smem_raw) + 1023) & ~1023u;
    return smem_raw + (base - smem_u32(smem_raw));
}

// The ring's full / empty mbarriers of stage s (shared addresses from the layout's bars()).
__device__ __forceinline__ unsigned wg_full(unsigned base, int s) { return base + WgLayout::bars() + s * 8; }
__device__ __forceinline__ unsigned wg_empty(unsigned base, int s) { return base + WgLayout::bars() + (WG_NST + s) * 8; }

// The roles around the ring: thread 0 sets up the mbarriers (full: the producer's 32 lanes and
// the TMA bytes; empty: every consumer thread); warpgroup 0 gives its registers away, its warp 0
// runs the producer Pd(p, r, lane) over the chunks (prefetch a chunk ahead, wait for the stage to
// be empty, produce, arrive on full) and its other warps leave; warpgroup 1 takes the registers
// and gets true (the consumer).
template <typename Pd, typename P>
__device__ __forceinline__ bool wg_roles(const P& p, const WgRun& r, unsigned base, unsigned char* gbase) {
    using L = WgLayout;
    if (threadIdx.x == 0) {
        for (int s = 0; s < WG_NST; ++s) {
            mbar_init(wg_full(base, s), 32);
            mbar_init(wg_empty(base, s), 128);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x < 128) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (threadIdx.x >= 32) return false;
        Pd pd(p, r, threadIdx.x);
        if (r.nchunks > 0) pd.prefetch(0);
        for (int c = 0; c < r.nchunks; ++c) {
            const int s = c % WG_NST;
            mbar_wait(wg_empty(base, s), ((c / WG_NST) & 1) ^ 1);
            pd.produce(c, base + L::stage(s), gbase + L::stage(s), reinterpret_cast<float*>(gbase + L::fac(s)), wg_full(base, s));
            mbar_arrive(wg_full(base, s));
            if (c + 1 < r.nchunks) pd.prefetch(c + 1);
        }
        return false;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    return true;
}

// The kernel skeleton (barriers, roles, the chunk loop, initial and final state) around a kind K:
//   K::Producer(p, r, lane): prefetch(c) loads chunk c's per-token inputs into registers a chunk
//     ahead; produce(c, stage address, stage bytes, factors, full barrier) issues the chunk's
//     tiles and writes its factors
//   K::chunk(...): the consumer's products of one chunk from Ŝᵀ to O (unscaled), D̂ and D′;
//   K::decay(s, factors, cq): Sᵀ's decay before the update; K::UPDATE_TILE: the update's B
template <typename K, typename P>
__device__ __forceinline__ void wg_forward(const P& p) {
    const auto& a = p.a;
    using L = WgLayout;
    unsigned base;
    unsigned char* gbase = wg_smem(base);
    WgRun r;
    if (!wg_run(a, r)) return;

    if (!wg_roles<typename K::Producer>(p, r, base, gbase)) return;

    // ---------------------------------- consumer ----------------------------------
    const int t = threadIdx.x - 128, w = t >> 5, l = t & 31;
    const int cq = 2 * (l & 3), dv0 = 16 * w + (l >> 2);
    const int mi = l >> 3, mr = l & 7;  // ldmatrix / stmatrix: lane l serves row l % 8 of matrix l / 8
    // element (dk, dv) of a state in memory: dk rs + dv cs (state_v_first: Sᵀ)
    const int rs = a.v_first ? 1 : (int)a.V, cs = a.v_first ? (int)a.K : 1;
    const int soff = (cq * rs) + (r.c0 + dv0) * cs;
    float s[64];
    wg_init_state(s, a, r, a.h0 != 0 && r.from_start, soff, rs, cs);

    for (int c = 0; c < r.nchunks; ++c) {
        const int stg = c % WG_NST;
        const unsigned st = base + L::stage(stg);
        const int nc = r.rows_of(c);
        const float* fac = reinterpret_cast<const float*>(gbase + L::fac(stg));
        mbar_wait(wg_full(base, stg), (c / WG_NST) & 1);
        unsigned sa[8][4];
        wg_state_frags(sa, s);
        float o[32];
        unsigned dh[4][4], da[4][4];
        K::chunk(sa, o, dh, da, st, fac, w, cq, mi, mr);
        wg_o_aqk(o, dh, fac + L::F_O, cq, desc_k(st) + T_AQK * L::TILE / 16);
        K::decay(s, fac, cq);
        wg_update(s, da, st + K::UPDATE_TILE * L::TILE);
        WG_WAIT(1);  // Oᵀ is done; the update runs on
        if (c >= r.warm) {
            const int r0 = r.row0 + c * WG_BT;
            wg_store_o(o, gbase, base, c, t, w, mi, mr, &p.o, r.hv * (int)a.V + r.c0, r0, nc,
                       reinterpret_cast<bf16*>(a.o) + (i64)r.hv * a.V + r.c0, a.HV * a.V);
        }
        WG_WAIT(0);
        // every consumer thread arrives: an arrival releases only its own thread's reads of the
        // stage (ldmatrix, factors), so one arrival a warp left lanes 1..31 unordered before the
        // producer's refill (compute-sanitizer racecheck, S21)
        mbar_arrive(wg_empty(base, stg));
    }
    if (a.ht != 0 && r.to_end) {
        wg_store_state(reinterpret_cast<float*>(a.ht) + r.sbase + soff, s, rs, cs);
    }
    if (t == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// GDN: tiles k0 k1 q0 q1 v Tb_hi Tb_lo Aqk; factors e·rk, f·rk, λ, scale·e·rq.
struct WgGdn {
    static constexpr int UPDATE_TILE = T_X0;  // the k tile, N-major
    struct Producer {
        const GdnWgArgs& p;
        const WgRun& r;
        const int lane, qh;
        float gr[2], gl;
        float2 nr[2];  // (1 / ‖q‖, 1 / ‖k‖) of the token, (1, 1) without rqk
        __device__ Producer(const GdnWgArgs& p_, const WgRun& r_, int lane_)
            : p(p_), r(r_), lane(lane_), qh(r_.hv / (int)(p_.a.HV / p_.a.QH)) {}
        // the gates (tokens lane, lane + 32, and the last) and norms of chunk c
        __device__ void prefetch(int c) {
            const float* gp = reinterpret_cast<const float*>(p.a.g);
            const float2* rqk = reinterpret_cast<const float2*>(p.a.rqk);
            const i64 r0 = r.row0 + c * WG_BT, hv = r.hv, HV = p.a.HV;
            const int nc = r.rows_of(c);
            gl = gp[(r0 + nc - 1) * HV + hv];
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
                const int t = lane + 32 * h2;
                gr[h2] = t < nc ? gp[(r0 + t) * HV + hv] : 0.f;
                nr[h2] = rqk != nullptr && t < nc ? rqk[(r0 + t) * p.a.QH + qh] : make_float2(1.f, 1.f);
            }
        }
        __device__ void produce(int c, unsigned st, unsigned char* gst, float* fac, unsigned bar) {
            const GdnFusedArgs& a = p.a;
            const int r0 = r.row0 + c * WG_BT, nc = r.rows_of(c), K = (int)a.K;
            if (nc == WG_BT) {
                if (lane == 0) {
                    mbar_expect_tx(bar, 8 * WgLayout::TILE);
                    tma_load(st + T_X0 * WgLayout::TILE, &p.k, qh * K, r0, bar);
                    tma_load(st + T_X1 * WgLayout::TILE, &p.k, qh * K + 64, r0, bar);
                    tma_load(st + T_O0 * WgLayout::TILE, &p.q, qh * K, r0, bar);
                    tma_load(st + T_O1 * WgLayout::TILE, &p.q, qh * K + 64, r0, bar);
                    tma_load(st + T_V * WgLayout::TILE, &p.v, r.hv * (int)a.V + r.c0, r0, bar);
                    tma_load(st + T_5 * WgLayout::TILE, &p.tbh, r.hv * WG_BT, r0, bar);
                    tma_load(st + T_6 * WgLayout::TILE, &p.tbl, r.hv * WG_BT, r0, bar);
                    tma_load(st + T_AQK * WgLayout::TILE, &p.aqk, r.hv * WG_BT, r0, bar);
                }
            } else {
                wg_load_partial(gst, nc, lane, [&](int t, int rr) {
                    const i64 row = (i64)r0 + rr;
                    const i64 kq = (row * a.QH + qh) * a.K, tb = (row * a.HV + r.hv) * WG_BT;
                    const bf16* k = reinterpret_cast<const bf16*>(a.k);
                    const bf16* q = reinterpret_cast<const bf16*>(a.q);
                    switch (t) {
                        case T_X0: return k + kq;
                        case T_X1: return k + kq + 64;
                        case T_O0: return q + kq;
                        case T_O1: return q + kq + 64;
                        case T_V: return reinterpret_cast<const bf16*>(a.v) + (row * a.HV + r.hv) * a.V + r.c0;
                        case T_5: return reinterpret_cast<const bf16*>(a.tbh) + tb;
                        case T_6: return reinterpret_cast<const bf16*>(a.tbl) + tb;
                        default: return reinterpret_cast<const bf16*>(a.aqk) + tb;
                    }
                });
            }
            const float scale = (float)a.scale;
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
                const int t = lane + 32 * h2;
                const bool ok = t < nc;
                const float e = ex2_ftz(gr[h2]);
                fac[WgLayout::F_E + t] = ok ? e * nr[h2].y : 0.f;
                fac[WgLayout::F_F + t] = ok ? ex2_ftz(gl - gr[h2]) * nr[h2].y : 0.f;
                fac[WgLayout::F_O + t] = ok ? scale * e * nr[h2].x : 0.f;
            }
            if (lane == 0) fac[WgLayout::F_LAM1] = ex2_ftz(gl);
        }
    };
    // Xᵀ, Oᵀ; Wᵀ = bf16(Vᵀ - Xᵀ diag(e)); Dᵀ = Wᵀ (Tb_hi + Tb_lo)ᵀ; D̂, D′ = bf16(D diag(f))
    __device__ static void chunk(const unsigned (&sa)[8][4], float (&o)[32], unsigned (&dh)[4][4], unsigned (&da)[4][4], unsigned st,
                                 const float* fac, int w, int cq, int mi, int mr) {
        const unsigned dk = desc_k(st);
        float x[32];
        wg_x_o(x, o, sa, dk);
        unsigned vr[8][2];
        wg_v_frags(vr, st + T_V * WgLayout::TILE, w, mi, mr);
        WG_WAIT(0);  // Xᵀ and Oᵀ (Ŝᵀ's registers free again)
        float2 e[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) e[j] = *reinterpret_cast<const float2*>(fac + WgLayout::F_E + 8 * j + cq);
        unsigned wa[4][4];
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
                const float w0 = fmaf(-e[j].x, x[4 * j + 2 * h2], wg_lo(vr[j][h2]));
                const float w1 = fmaf(-e[j].y, x[4 * j + 2 * h2 + 1], wg_hi(vr[j][h2]));
                wa[j / 2][(j % 2) * 2 + h2] = wg_pack(w0, w1);
            }
        float d[32];
        WG_FENCE();
        wgmma_n64<true>(d, wa[0], mkdesc(dk + T_5 * WgLayout::TILE / 16));
#pragma unroll
        for (int kk = 1; kk < 4; ++kk) wgmma_n64<false>(d, wa[kk], mkdesc(dk + (T_5 * WgLayout::TILE + kk * 32) / 16));
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wgmma_n64<false>(d, wa[kk], mkdesc(dk + (T_6 * WgLayout::TILE + kk * 32) / 16));
        WG_COMMIT();
        float2 f[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) f[j] = *reinterpret_cast<const float2*>(fac + WgLayout::F_F + 8 * j + cq);
        WG_WAIT(0);
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
                const float d0 = d[4 * j + 2 * h2], d1 = d[4 * j + 2 * h2 + 1];
                dh[j / 2][(j % 2) * 2 + h2] = wg_pack(d0, d1);
                da[j / 2][(j % 2) * 2 + h2] = wg_pack(d0 * f[j].x, d1 * f[j].y);
            }
    }
    __device__ static void decay(float (&s)[64], const float* fac, int) {
        const float lam = fac[WgLayout::F_LAM1];
#pragma unroll
        for (int i = 0; i < 64; ++i) s[i] *= lam;
    }
};

// KDA: tiles w0 w1 qg0 qg1 u kg0 kg1 Aqk; factors qf, lam (per key).
struct WgKda {
    static constexpr int UPDATE_TILE = T_5;  // the kg tile, N-major
    struct Producer {
        const KdaWgArgs& p;
        const WgRun& r;
        const int lane;
        const i64 lam0;  // lam row of the CTA's first chunk
        float qf[2];
        float4 lam;
        __device__ Producer(const KdaWgArgs& p_, const WgRun& r_, int lane_)
            : p(p_), r(r_), lane(lane_), lam0(reinterpret_cast<const i64*>(p_.a.seqs)[r_.n * 3 + 2] + (r_.row0 - r_.seq0) / WG_BT) {}
        // qf of chunk c's tokens lane, lane + 32 and lam of keys 4 lane ..
        __device__ void prefetch(int c) {
            const FusedArgs& a = p.a;
            const i64 r0 = r.row0 + c * WG_BT;
            const int nc = r.rows_of(c);
            const float* fp = reinterpret_cast<const float*>(a.qf);
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) qf[h2] = lane + 32 * h2 < nc ? fp[(r0 + lane + 32 * h2) * a.HV + r.hv] : 0.f;
            lam = reinterpret_cast<const float4*>(reinterpret_cast<const float*>(a.lam) + ((lam0 + c) * a.HV + r.hv) * a.K)[lane];
        }
        __device__ void produce(int c, unsigned st, unsigned char* gst, float* fac, unsigned bar) {
            const FusedArgs& a = p.a;
            const int r0 = r.row0 + c * WG_BT, nc = r.rows_of(c), hk = r.hv * (int)a.K;
            if (nc == WG_BT) {
                if (lane == 0) {
                    mbar_expect_tx(bar, 8 * WgLayout::TILE);
                    tma_load(st + T_X0 * WgLayout::TILE, &p.w, hk, r0, bar);
                    tma_load(st + T_X1 * WgLayout::TILE, &p.w, hk + 64, r0, bar);
                    tma_load(st + T_O0 * WgLayout::TILE, &p.qg, hk, r0, bar);
                    tma_load(st + T_O1 * WgLayout::TILE, &p.qg, hk + 64, r0, bar);
                    tma_load(st + T_V * WgLayout::TILE, &p.u, r.hv * (int)a.V + r.c0, r0, bar);
                    tma_load(st + T_5 * WgLayout::TILE, &p.kg, hk, r0, bar);
                    tma_load(st + T_6 * WgLayout::TILE, &p.kg, hk + 64, r0, bar);
                    tma_load(st + T_AQK * WgLayout::TILE, &p.aqk, r.hv * WG_BT, r0, bar);
                }
            } else {
                wg_load_partial(gst, nc, lane, [&](int t, int rr) {
                    const i64 row = (i64)r0 + rr;
                    const i64 kr = (row * a.HV + r.hv) * a.K;
                    switch (t) {
                        case T_X0: return reinterpret_cast<const bf16*>(a.w) + kr;
                        case T_X1: return reinterpret_cast<const bf16*>(a.w) + kr + 64;
                        case T_O0: return reinterpret_cast<const bf16*>(a.qg) + kr;
                        case T_O1: return reinterpret_cast<const bf16*>(a.qg) + kr + 64;
                        case T_V: return reinterpret_cast<const bf16*>(a.u) + (row * a.HV + r.hv) * a.V + r.c0;
                        case T_5: return reinterpret_cast<const bf16*>(a.kg) + kr;
                        case T_6: return reinterpret_cast<const bf16*>(a.kg) + kr + 64;
                        default: return reinterpret_cast<const bf16*>(a.aqk) + (row * a.HV + r.hv) * WG_BT;
                    }
                });
            }
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) fac[WgLayout::F_O + lane + 32 * h2] = qf[h2];
            *reinterpret_cast<float4*>(fac + WgLayout::F_LAM + 4 * lane) = lam;
        }
    };
    // Xᵀ = Ŝᵀ Wᵀ, Oᵀ = Ŝᵀ Qgᵀ; D̂ᵀ = bf16(Uᵀ - Xᵀ) (= D′)
    __device__ static void chunk(const unsigned (&sa)[8][4], float (&o)[32], unsigned (&dh)[4][4], unsigned (&da)[4][4], unsigned st,
                                 const float*, int w, int, int mi, int mr) {
        float x[32];
        wg_x_o(x, o, sa, desc_k(st));
        unsigned ur[8][2];
        wg_v_frags(ur, st + T_V * WgLayout::TILE, w, mi, mr);
        WG_WAIT(0);
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
                const unsigned d = wg_pack(wg_lo(ur[j][h2]) - x[4 * j + 2 * h2], wg_hi(ur[j][h2]) - x[4 * j + 2 * h2 + 1]);
                dh[j / 2][(j % 2) * 2 + h2] = d;
                da[j / 2][(j % 2) * 2 + h2] = d;
            }
    }
    // Sᵀ diag(lam): column dk of the accumulator by lam[dk]
    __device__ static void decay(float (&s)[64], const float* fac, int cq) {
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const float2 f = *reinterpret_cast<const float2*>(fac + WgLayout::F_LAM + 8 * j + cq);
            s[4 * j] *= f.x;
            s[4 * j + 1] *= f.y;
            s[4 * j + 2] *= f.x;
            s[4 * j + 3] *= f.y;
        }
    }
};

// o is computed in every chunk (warm-up chunks too, unstored: no branch around the wgmma
// pipeline) and stored from the piece's first chunk.
extern "C" __global__ void __launch_bounds__(256, 1) delta_fwd_gdn_wg_bf16(const __grid_constant__ GdnWgArgs p) { wg_forward<WgGdn>(p); }
extern "C" __global__ void __launch_bounds__(256, 1) delta_fwd_kda_wg_bf16(const __grid_constant__ KdaWgArgs p) { wg_forward<WgKda>(p); }

// ------------------------------------------------------------------------------------------------
// chunk_gated_delta_rule_fwd_h (conformance/spec/ops-delta-rule.md 2.4, 2.5) on the same pieces
// (chunk_gated_delta_rule_fwd_h_wg_bf16): one CTA of 256 threads per (sequence, value head, 64 state
// columns), the column block fastest. Tiles of a stage: w's two key boxes (T_X0, T_X1), u (T_V), k's
// two key boxes (T_5, T_6); its three spare tiles stage the chunk's outputs: h's two key halves
// (T_O0, T_O1) and v_new (T_AQK). With a_r = exp2(G_l - G_r) (0 beyond n_c; 1 without g) and
// λ_i = exp2(G_l) exp2(Gk_l,i), for every chunk:
//   h[c] = Ŝ = bf16(S)                          stmatrix from Ŝᵀ's A fragments, TMA stores
//   Xᵀ = Ŝᵀ Wᵀ                                  wgmma m64n64k16, RS
//   Dᵀ = Uᵀ - Xᵀ (fp32);  v_new = bf16(D)
//   Sᵀ = Sᵀ diag(λ) + bf16(Dᵀ diag(a)) K        wgmma m64n128k16, B = the k tile read N-major
// The staging tiles of stage s are written again two chunks later, after the consumers' barrier
// that follows the wait for every earlier store's reads (as wg_store_o); the producer never
// writes them.
struct FwdHWgArgs {
    TMap w, k, u, h, vn;  // h: [B NT HV K][V] (state_v_first: [B NT HV V][K]); vn: v_new [B T][HV V]
    FwdHArgs a;
};
enum { FH_H0 = T_O0, FH_H1 = T_O1, FH_VN = T_AQK };
#define FH_TILES ((1u << T_X0) | (1u << T_X1) | (1u << T_V) | (1u << T_5) | (1u << T_6))

struct FwdHWgProducer {
    const FwdHWgArgs& p;
    const WgRun& r;
    const int lane, kh;
    float gr[2], gl;  // G of tokens lane, lane + 32 and of the last row
    float gk[4];      // Gk of keys 4 lane .. at the last row
    __device__ FwdHWgProducer(const FwdHWgArgs& p_, const WgRun& r_, int lane_)
        : p(p_), r(r_), lane(lane_), kh(r_.hv / (int)(p_.a.HV / p_.a.H)) {}
    __device__ void prefetch(int c) {
        const FwdHArgs& a = p.a;
        const i64 r0 = r.row0 + c * WG_BT, hv = r.hv, HV = a.HV;
        const int nc = r.rows_of(c);
        const void* g = reinterpret_cast<const void*>(a.g);
        gl = a.g != 0 ? load_f(g, a.g_dtype, (r0 + nc - 1) * HV + hv) : 0.f;
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
            const int t = lane + 32 * h2;
            gr[h2] = a.g != 0 && t < nc ? load_f(g, a.g_dtype, (r0 + t) * HV + hv) : 0.f;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
            gk[i] = a.gk != 0 ? load_f(reinterpret_cast<const void*>(a.gk), a.gk_dtype, ((r0 + nc - 1) * HV + hv) * a.K + 4 * lane + i) : 0.f;
    }
    __device__ void produce(int c, unsigned st, unsigned char* gst, float* fac, unsigned bar) {
        const FwdHArgs& a = p.a;
        const int r0 = r.row0 + c * WG_BT, nc = r.rows_of(c), K = (int)a.K;
        if (nc == WG_BT) {
            if (lane == 0) {
                mbar_expect_tx(bar, 5 * WgLayout::TILE);
                tma_load(st + T_X0 * WgLayout::TILE, &p.w, r.hv * K, r0, bar);
                tma_load(st + T_X1 * WgLayout::TILE, &p.w, r.hv * K + 64, r0, bar);
                tma_load(st + T_V * WgLayout::TILE, &p.u, r.hv * (int)a.V + r.c0, r0, bar);
                tma_load(st + T_5 * WgLayout::TILE, &p.k, kh * K, r0, bar);
                tma_load(st + T_6 * WgLayout::TILE, &p.k, kh * K + 64, r0, bar);
            }
        } else {
            wg_load_partial<FH_TILES>(gst, nc, lane, [&](int t, int rr) {
                const i64 row = (i64)r0 + rr;
                const i64 wr = (row * a.HV + r.hv) * a.K, kr = (row * a.H + kh) * a.K;
                switch (t) {
                    case T_X0: return reinterpret_cast<const bf16*>(a.w) + wr;
                    case T_X1: return reinterpret_cast<const bf16*>(a.w) + wr + 64;
                    case T_V: return reinterpret_cast<const bf16*>(a.u) + (row * a.HV + r.hv) * a.V + r.c0;
                    case T_5: return reinterpret_cast<const bf16*>(a.k) + kr;
                    default: return reinterpret_cast<const bf16*>(a.k) + kr + 64;
                }
            });
        }
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
            const int t = lane + 32 * h2;
            fac[WgLayout::F_F + t] = t < nc ? (a.g != 0 ? ex2_ftz(gl - gr[h2]) : 1.f) : 0.f;
        }
        const float gamma = a.g != 0 ? ex2_ftz(gl) : 1.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) fac[WgLayout::F_LAM + 4 * lane + i] = a.gk != 0 ? gamma * ex2_ftz(gk[i]) : gamma;
    }
};

// Ŝ (the A fragments sa) into the stage's two h tiles: [dk][dv] through stmatrix.trans, or
// [dv][dk] (state_v_first) through stmatrix; k16 slice kk covers keys 16 kk.. of tile kk / 4.
__device__ __forceinline__ void fh_stage_h(const unsigned (&sa)[8][4], unsigned st, bool v_first, int w, int mi, int mr) {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
        const unsigned tile = st + (FH_H0 + kk / 4) * WgLayout::TILE;
        const int j = 2 * (kk % 4);
        const unsigned addr = v_first ? tile + sw128(16 * w + 8 * (mi & 1) + mr, j + (mi >> 1)) : tile + sw128(8 * (j + (mi >> 1)) + mr, 2 * w + (mi & 1));
        if (v_first)
            stsm_x4(addr, sa[kk][0], sa[kk][1], sa[kk][2], sa[kk][3]);
        else
            stsm_x4_t(addr, sa[kk][0], sa[kk][1], sa[kk][2], sa[kk][3]);
    }
}

__device__ __forceinline__ void fwd_h_wg(const FwdHWgArgs& p) {
    const FwdHArgs& a = p.a;
    using L = WgLayout;
    unsigned base;
    unsigned char* gbase = wg_smem(base);
    const int ncb = (int)(a.V / 64);
    const i64 task = blockIdx.x / ncb, n = task / a.HV;
    const i64* seq = reinterpret_cast<const i64*>(a.seqs) + n * 3;
    WgRun r;
    r.c0 = (int)(blockIdx.x % ncb) * 64;
    r.hv = (int)(task % a.HV);
    r.row0 = (int)seq[0];
    r.len = (int)seq[1];
    r.warm = 0;
    r.nchunks = (r.len + WG_BT - 1) / WG_BT;
    r.from_start = r.to_end = true;
    r.n = n;
    r.seq0 = seq[0];
    r.sbase = (n * a.HV + r.hv) * a.K * a.V;
    const i64 hc0 = seq[2];

    if (!wg_roles<FwdHWgProducer>(p, r, base, gbase)) return;

    const int t = threadIdx.x - 128, w = t >> 5, l = t & 31;
    const int cq = 2 * (l & 3), dv0 = 16 * w + (l >> 2);
    const int mi = l >> 3, mr = l & 7;
    const bool vf = a.v_first != 0;
    const int rs = vf ? 1 : (int)a.V, cs = vf ? (int)a.K : 1;
    const int soff = (cq * rs) + (r.c0 + dv0) * cs;
    float s[64];
    wg_init_state(s, a, r, a.h0 != 0, soff, rs, cs);

    for (int c = 0; c < r.nchunks; ++c) {
        const int stg = c % WG_NST;
        const unsigned st = base + L::stage(stg);
        const int nc = r.rows_of(c), r0 = r.row0 + c * WG_BT;
        const float* fac = reinterpret_cast<const float*>(gbase + L::fac(stg));
        mbar_wait(wg_full(base, stg), (c / WG_NST) & 1);
        unsigned sa[8][4];
        wg_state_frags(sa, s);
        // Xᵀ = Ŝᵀ Wᵀ (k step kk: keys 16 kk.., tile kk / 4)
        const unsigned dk = desc_k(st);
        float x[32];
        WG_FENCE();
        wgmma_n64<true>(x, sa[0], mkdesc(dk));
#pragma unroll
        for (int kk = 1; kk < 8; ++kk) wgmma_n64<false>(x, sa[kk], mkdesc(dk + ((kk / 4) * L::TILE + (kk % 4) * 32) / 16));
        WG_COMMIT();
        fh_stage_h(sa, st, vf, w, mi, mr);
        unsigned ur[8][2];
        wg_v_frags(ur, st + T_V * L::TILE, w, mi, mr);
        float2 f[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) f[j] = *reinterpret_cast<const float2*>(fac + L::F_F + 8 * j + cq);
        WG_WAIT(0);
        unsigned dh[4][4], da[4][4];
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
                const float d0 = wg_lo(ur[j][h2]) - x[4 * j + 2 * h2], d1 = wg_hi(ur[j][h2]) - x[4 * j + 2 * h2 + 1];
                dh[j / 2][(j % 2) * 2 + h2] = wg_pack(d0, d1);
                da[j / 2][(j % 2) * 2 + h2] = wg_pack(d0 * f[j].x, d1 * f[j].y);
            }
        WgKda::decay(s, fac, cq);
        wg_update(s, da, st + T_5 * L::TILE);
        if (a.v_new != 0) {
#pragma unroll
            for (int jj = 0; jj < 4; ++jj)
                stsm_x4_t(st + FH_VN * L::TILE + sw128(8 * (2 * jj + (mi >> 1)) + mr, 2 * w + (mi & 1)), dh[jj][0], dh[jj][1], dh[jj][2], dh[jj][3]);
        }
        fence_async_smem();
        if (t == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // every earlier store has read its tiles
        asm volatile("bar.sync 1, 128;" ::: "memory");
        if (t == 0) {
            const i64 hrow = hc0 + c;
            if (vf) {
                const int y = (int)((hrow * a.HV + r.hv) * a.V + r.c0);
                tma_store(&p.h, 0, y, st + FH_H0 * L::TILE);
                tma_store(&p.h, 64, y, st + FH_H1 * L::TILE);
            } else {
                const int y = (int)((hrow * a.HV + r.hv) * a.K);
                tma_store(&p.h, r.c0, y, st + FH_H0 * L::TILE);
                tma_store(&p.h, r.c0, y + 64, st + FH_H1 * L::TILE);
            }
            if (a.v_new != 0 && nc == WG_BT) tma_store(&p.vn, r.hv * (int)a.V + r.c0, r0, st + FH_VN * L::TILE);
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        }
        if (a.v_new != 0 && nc < WG_BT) {
            bf16* vp = reinterpret_cast<bf16*>(a.v_new) + (i64)r.hv * a.V + r.c0;
            for (int i = t; i < nc * 8; i += 128) {
                const int rr = i / 8, pc = i % 8;
                *reinterpret_cast<uint4*>(vp + (i64)(r0 + rr) * (a.HV * a.V) + pc * 8) =
                    *reinterpret_cast<const uint4*>(gbase + L::stage(stg) + FH_VN * L::TILE + sw128(rr, pc));
            }
        }
        WG_WAIT(0);
        mbar_arrive(wg_empty(base, stg));
    }
    if (a.ht != 0) {
        wg_store_state(reinterpret_cast<float*>(a.ht) + r.sbase + soff, s, rs, cs);
    }
    if (t == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

extern "C" __global__ void __launch_bounds__(256, 1) chunk_gated_delta_rule_fwd_h_wg_bf16(const __grid_constant__ FwdHWgArgs p) { fwd_h_wg(p); }
