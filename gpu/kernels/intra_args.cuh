// The arguments of the intra-chunk kernels (kda_intra.cu, kda_intra_pipe.cu): one struct, mirrored
// by `IntraArgs` in gpu/src/delta/intra.rs, so that both kernels read the same call.

struct IntraArgs {
    u64 q, k, v, g, beta;  // inputs: q, k [rows][H][K], v [rows][HV][V], g (gate_mode), beta [rows][HV]
    GateArgs gate;         // the in-kernel gate (gate_mode 2)
    u64 chunks;            // i64 [NC][3]: first packed token row, rows n_c, global chunk index
    u64 w, u, kg, qg, qf, aqk, akk, lam, gout;  // outputs (0: not written)
    u64 tbh, tbl;  // the lean outputs of a scalar gate (fused GDN): Akk diag(β) as hi + lo
    u64 rqk;       // with l2norm, for the Hopper kernel: f32 [rows][H][2] (1 / ‖q‖, 1 / ‖k‖), or 0
    i64 H, HV, K, V, bt;
    i64 g_dtype, beta_dtype;
    i64 gate_mode;    // 0: g is G; 1: g is the per-step natural-log gate; 2: g is the KDA gate input
    i64 scalar_gate;  // g (and gout) are [rows][HV] instead of [rows][HV][K]
    i64 l2norm;       // normalise q and k
    i64 beta_mode;    // 0: beta as given; 1: sigmoid(beta); 2: 2 sigmoid(beta)
    i64 kg_gated;     // kg = k . exp2(G_l - G_r) (1) or k (0)
    i64 safe_gate;    // per-step gates promised in [-5, 0] nats (spec 6.3): intra_mma's diagonal on tensor cores (bf16)
    double scale;     // of Aqk
};
