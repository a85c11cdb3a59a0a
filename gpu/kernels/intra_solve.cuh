// The unit lower triangular inverse of the intra kernels (kda_intra.cu, kda_intra_pipe.cu):
// X = (I + L)^-1 of a strictly lower 64 x 64 L, by forward substitution on the diagonal 16 x 16
// blocks and blockwise on tensor cores (3xTF32) off the diagonal.

#define INTRA_THREADS 256
#define INTRA_BT 64

// X = (I + L)^-1 of the strictly lower 64 x 64 L, first half: X's off-diagonal blocks zeroed and
// its diagonal 16 x 16 blocks by forward substitution row by row, each column in the registers
// of one lane (warp b: block b). Ends with a barrier. LP: the row pitch of L and X (>= 64).
template <typename Acc, int LP>
__device__ void intra_solve_diag(Acc (*L)[LP], Acc (*X)[LP]) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    {
        // thread: column j = tid % 64 of rows tid / 64 + 4 u (row block u / 4)
        const int j = tid % INTRA_BT, r0 = tid / INTRA_BT;
#pragma unroll
        for (int u = 0; u < INTRA_BT * INTRA_BT / INTRA_THREADS; ++u)
            if (u / 4 != j / 16) X[r0 + 4 * u][j] = Acc(0);
    }
    if (warp < 4 && lane < 16) {
        const int b0 = warp * 16, cc = lane;
        Acc x[16];  // column cc of the block's inverse
#pragma unroll
        for (int j = 0; j < 16; ++j) x[j] = j == cc ? Acc(1) : Acc(0);
#pragma unroll
        for (int r = 1; r < 16; ++r) {
            Acc s = Acc(0);
#pragma unroll
            for (int j = 0; j < r; ++j) s = fma(L[b0 + r][b0 + j], x[j], s);
            if (r > cc) x[r] = -s;
        }
#pragma unroll
        for (int r = 0; r < 16; ++r) X[b0 + r][b0 + cc] = x[r];
    }
    __syncthreads();
}

// x as a pair of tf32 values hi + lo (hi = x rounded to tf32, lo = the rest rounded again):
// hi + lo carries 21 significant bits of the fp32 x.
__device__ __forceinline__ void split_tf32(float x, unsigned& hi, unsigned& lo) {
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(hi) : "f"(x));
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(lo) : "f"(x - __uint_as_float(hi)));
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// d += A[ar .. ar+16)[ac .. ac+8) B[br .. br+8)[bc .. bc+8) for fp32 A, B in shared memory, on
// tensor cores as three tf32 products (lo hi, hi lo, hi hi; lo lo dropped): about fp32 accuracy
// (each product's relative error ~2^-21 against fp32's 2^-24). d: the m16n8 accumulator
// fragment (rows g, g + 8, columns 2t, 2t + 1 of lane 4g + t).
template <int PA, int PB>
__device__ __forceinline__ void mma3_tf32(float (&d)[4], const float (*A)[PA], int ar, int ac, const float (*B)[PB], int br, int bc) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    unsigned ah[4], al[4], bh[2], bl[2];
    split_tf32(A[ar + g][ac + t], ah[0], al[0]);
    split_tf32(A[ar + g + 8][ac + t], ah[1], al[1]);
    split_tf32(A[ar + g][ac + t + 4], ah[2], al[2]);
    split_tf32(A[ar + g + 8][ac + t + 4], ah[3], al[3]);
    split_tf32(B[br + t][bc + g], bh[0], bl[0]);
    split_tf32(B[br + t + 4][bc + g], bh[1], bl[1]);
    mma_tf32(d, al, bh);
    mma_tf32(d, ah, bl);
    mma_tf32(d, ah, bh);
}

// intra_solve for fp32 on tensor cores (the half-input kernels; their products are rounded to
// T afterwards): the off-diagonal blocks of distance d = i - j by two warps each (8 columns a
// warp): T = Σ_{m=j}^{i-1} L_im X_mj (2d steps of 8 keys), kept by the warp in tmp, then
// X_ij = -X_ii T, all with mma3_tf32. S9 profile: the FMA solve was ~45% of gdn_intra's
// instructions. LP, TP: the row pitches of L and X, and of tmp (>= 16). The fragments' scalar
// loads (A[g][t], B[t][g]: lane 4g + t) hit banks (g LP + t) and (t P + g) mod 32: LP = 65 and
// TP = 17 give up to 4-way conflicts; LP ≡ 4 (mod 32) makes A's conflict-free and B's 2-way at
// most, TP ≡ 24 B's from tmp conflict-free (gdn_intra: 68, 24; S20 ncu: 43% of its shared
// wavefronts were conflicts).
template <int LP, int TP>
__device__ void intra_solve_tc(float (*L)[LP], float (*X)[LP], float (*tmp)[TP]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    intra_solve_diag<float, LP>(L, X);
    for (int dist = 1; dist < 4; ++dist) {
        if (warp < 2 * (4 - dist)) {  // warp-uniform: every lane of a working warp runs the mma
            const int e = warp >> 1, bi = dist + e, bj = bi - dist, nc8 = 8 * (warp & 1), c0 = 16 * bj + nc8;
            float d[4] = {0.f, 0.f, 0.f, 0.f};
            for (int k0 = 16 * bj; k0 < 16 * bi; k0 += 8) mma3_tf32<LP, LP>(d, L, 16 * bi, k0, X, k0, c0);
            tmp[16 * e + g][nc8 + 2 * t] = d[0];
            tmp[16 * e + g][nc8 + 2 * t + 1] = d[1];
            tmp[16 * e + g + 8][nc8 + 2 * t] = d[2];
            tmp[16 * e + g + 8][nc8 + 2 * t + 1] = d[3];
            __syncwarp();  // the warp's own 16 x 8 of T, read back as B fragments
            float x[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int k0 = 0; k0 < 16; k0 += 8) mma3_tf32<LP, TP>(x, X, 16 * bi, 16 * bi + k0, tmp, 16 * e + k0, nc8);
            X[16 * bi + g][c0 + 2 * t] = -x[0];
            X[16 * bi + g][c0 + 2 * t + 1] = -x[1];
            X[16 * bi + g + 8][c0 + 2 * t] = -x[2];
            X[16 * bi + g + 8][c0 + 2 * t + 1] = -x[3];
        }
        __syncthreads();
    }
}

