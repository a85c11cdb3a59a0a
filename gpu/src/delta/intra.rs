//! The intra stage of the delta-rule forwards on the GPU (`kda_intra.cu`), and the `kda_intra`
//! op (`conformance/spec/ops-delta-rule.md` §7): one CTA per (chunk, value head) computes
//!
//! ```text
//! Aqk = scale (Q Kᵀ ⊙ exp2(G_r − G_j))_{j≤r},  Akk = (I + β (K Kᵀ ⊙ exp2(G_r − G_j))_{j<r})⁻¹
//! w = Akk diag(β) (K ⊙ exp2(G)),  u = Akk diag(β) V,  kg = K ⊙ exp2(G_ℓ − G)
//! ```
//!
//! and, for the forwards, `qg`, the fp32 row factors `qf` and the per-chunk decay `exp2(G_ℓ)`.
//! Tensor cores for bf16/f16 data, IEEE FMAs for fp32, fp64 for fp64.

use super::launch::grid_x;
use crate::device::Gpu;
use crate::error::GpuResult;
use crate::kernels::Module;
use crate::params::{dtype_code, GateArgs};
use crate::tensor::DeviceTensor;
use attn_reference::delta::{
    validate_delta_dtypes, validate_kda_intra, DeltaDtypes, Geometry, KdaIntraParams,
    KdaIntraShapes,
};
use attn_reference::Dtype;
use cudarc::driver::DeviceRepr;

pub(crate) const THREADS: u32 = 256;
/// Largest chunk of the kernels.
pub(crate) const MAX_BT: usize = 64;
/// Key / value columns per tile of the FMA intra and output kernels (`INTRA_KT`, `OUT_BV`).
pub(crate) const KT: usize = 32;

/// The device tensors of a `kda_intra` call (`conformance/spec/ops-delta-rule.md` §7.1).
#[derive(Debug, Clone, Copy)]
pub struct KdaIntraTensors<'a> {
    pub q: &'a DeviceTensor,
    pub k: &'a DeviceTensor,
    pub v: &'a DeviceTensor,
    /// `[B, T, HV, K]`: the chunk-local cumulative gate in log2 units.
    pub gk: &'a DeviceTensor,
    pub beta: &'a DeviceTensor,
}

/// Outputs of `kda_intra` (`conformance/spec/ops-delta-rule.md` §7.3): `w`, `kg`, `Aqk`, `Akk` in
/// `k`'s dtype, `u` in `v`'s.
#[derive(Debug)]
pub struct KdaIntraDeviceOutputs {
    pub w: DeviceTensor,
    pub u: DeviceTensor,
    pub kg: DeviceTensor,
    pub aqk: DeviceTensor,
    pub akk: DeviceTensor,
}

/// Mirror of `IntraArgs` (kda_intra.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IntraArgs {
    pub(crate) q: u64,
    pub(crate) k: u64,
    pub(crate) v: u64,
    pub(crate) g: u64,
    pub(crate) beta: u64,
    pub(crate) gate: GateArgs,
    pub(crate) chunks: u64,
    pub(crate) w: u64,
    pub(crate) u: u64,
    pub(crate) kg: u64,
    pub(crate) qg: u64,
    pub(crate) qf: u64,
    pub(crate) aqk: u64,
    pub(crate) akk: u64,
    pub(crate) lam: u64,
    pub(crate) gout: u64,
    pub(crate) tbh: u64,
    pub(crate) tbl: u64,
    pub(crate) rqk: u64,
    pub(crate) heads: i64,
    pub(crate) value_heads: i64,
    pub(crate) k_dim: i64,
    pub(crate) v_dim: i64,
    pub(crate) bt: i64,
    pub(crate) g_dtype: i64,
    pub(crate) beta_dtype: i64,
    pub(crate) gate_mode: i64,
    pub(crate) scalar_gate: i64,
    pub(crate) l2norm: i64,
    pub(crate) beta_mode: i64,
    pub(crate) kg_gated: i64,
    /// Per-step gates promised in `[−5, 0]` (spec 6.3): the bf16 kernel's diagonal blocks on
    /// tensor cores.
    pub(crate) safe_gate: i64,
    pub(crate) scale: f64,
}
// SAFETY: plain `#[repr(C)]` data (every field 8 bytes) matching the kernel's struct.
unsafe impl DeviceRepr for IntraArgs {}

/// Short dtype tag of the kernel names.
pub(crate) fn tag(d: Dtype) -> &'static str {
    match d {
        Dtype::BF16 => "bf16",
        Dtype::F16 => "f16",
        Dtype::F64 => "f64",
        _ => "f32",
    }
}

/// Accumulator dtype of the FMA kernels (the cumulative gate `G`, the state).
pub(crate) fn acc_dtype(d: Dtype) -> Dtype {
    if d == Dtype::F64 {
        Dtype::F64
    } else {
        Dtype::F32
    }
}

/// The per-chunk table `[NC, 3]` (first packed token row, rows, global chunk index: the `h` row
/// of section 2) of a validated geometry, and its number of chunks.
pub(crate) fn chunk_table(
    gpu: &Gpu,
    geo: &Geometry,
    varlen: bool,
) -> GpuResult<(DeviceTensor, usize)> {
    let nt = geo.nt(varlen);
    let starts = geo.chunk_starts(varlen);
    let mut rows = Vec::new();
    for s in &geo.seqs {
        for (c, (a, e)) in s.chunks(geo.bt).enumerate() {
            rows.push((s.batch * geo.t + a) as i64);
            rows.push((e - a) as i64);
            rows.push((s.batch * nt + starts[s.n] + c) as i64);
        }
    }
    let n = rows.len() / 3;
    if rows.is_empty() {
        rows.push(0);
    }
    Ok((DeviceTensor::from_slice(gpu, &rows)?, n))
}

/// The intra kernel of `args` for `dtype` and its shared memory: tensor cores for bf16/f16
/// (`IntraMmaSmem<T>`, key tiles of 64; K and V multiples of 8 take a `fast` instance, compiled
/// without the other layouts' code, where the gate is scalar or an fp32 `g`), FMAs for
/// float32/float64 (`IntraSmem<Acc>`).
fn intra_kernel(dtype: Dtype, args: &IntraArgs) -> (String, u32) {
    let sq = MAX_BT * (MAX_BT + 1);
    match dtype {
        Dtype::BF16 | Dtype::F16 => {
            // pass 1's tiles (q, k, qe, ke and their lo parts: 64 rows; kf, kfl: 96 rows), over
            // which the solve's L, Aqk, X and tmp lie; G (pitch 68); the per-row values
            let tiles = (6 * MAX_BT + 2 * 96) * (64 + 8) * 2;
            let bytes = tiles + MAX_BT * (64 + 4) * 4 + 4 * MAX_BT * 4;
            let whole = args.k_dim % 8 == 0 && args.v_dim % 8 == 0;
            let kind = match (args.scalar_gate != 0, whole) {
                (true, true) => "mma_scalar_fast",
                (true, false) => "mma_scalar",
                (false, true) if args.g_dtype == dtype_code(Dtype::F32) => "mma_fast",
                (false, _) => "mma",
            };
            (format!("kda_intra_{kind}_{}", tag(dtype)), bytes as u32)
        }
        _ => {
            // q, k, x (Acc), G (f64), L, A, X, tmp (Acc), invq, invk, beta (Acc), gs (f64)
            let acc = acc_dtype(dtype).size_bytes();
            let p = KT + 1;
            let bytes = 3 * MAX_BT * p * acc
                + MAX_BT * p * 8
                + (3 * sq + 48 * 17 + 3 * MAX_BT) * acc
                + MAX_BT * 8;
            (
                format!("kda_intra_fma_{}", tag(dtype)),
                bytes.next_multiple_of(8) as u32,
            )
        }
    }
}

/// One launch of the intra kernel over every chunk and value head.
pub(crate) fn launch_intra(
    gpu: &Gpu,
    dtype: Dtype,
    chunks: usize,
    hv: usize,
    args: &IntraArgs,
) -> GpuResult<()> {
    if chunks == 0 || hv == 0 {
        return Ok(());
    }
    let grid_x = grid_x(chunks, "q", "fewer than 2^31 chunks")?;
    let (name, smem) = intra_kernel(dtype, args);
    gpu.launch_with_smem(
        Module::KdaIntra,
        &name,
        (grid_x, hv as u32),
        THREADS,
        smem,
        args,
    )
}

/// Row pitches of `gdn_intra`'s solve (`GDN_LP`, `GDN_TP` of kda_intra.cu: bank-conflict-free
/// fragment loads in `intra_solve_tc`).
const GDN_LP: usize = 68;
const GDN_TP: usize = 24;

/// One launch of the lean intra kernel of the fused GDN path (`gdn_intra`, `K ≤ 128`: keys
/// padded to 64 or 128) over every chunk and value head, or with `HV > H` every chunk and key
/// head (`gdn_intra_grouped`: a CTA serves the key head's `HV / H` value heads from one load and
/// one product of its `q, k`): it writes `Aqk`, `Akk diag(β)` as hi + lo (`tbh`, `tbl`), `G`
/// (`gout`) per value head, and with l2norm the normalised `q, k` (`qg`, `kg`).
pub(crate) fn launch_gdn_intra(
    gpu: &Gpu,
    dtype: Dtype,
    chunks: usize,
    hv: usize,
    k: usize,
    args: &IntraArgs,
) -> GpuResult<()> {
    if chunks == 0 || hv == 0 {
        return Ok(());
    }
    let grid_x = grid_x(chunks, "q", "fewer than 2^31 chunks")?;
    let kp = if k <= 64 { 64 } else { 128 };
    // `GdnIntraSmem<T, kp>`: the q, k tiles under the solve's L, X (pitch GDN_LP), tmp (pitch
    // GDN_TP); β and G
    let tiles = 2 * MAX_BT * (kp + 8) * 2;
    let solve = (2 * MAX_BT * GDN_LP + 48 * GDN_TP) * 4;
    let smem = tiles.max(solve) + 2 * MAX_BT * 4;
    // more value heads than key heads: a CTA per key head serves its group
    let (name, heads) = if args.value_heads > args.heads {
        ("gdn_intra_grouped", args.heads)
    } else {
        ("gdn_intra", args.value_heads)
    };
    gpu.launch_with_smem(
        Module::KdaIntra,
        &format!("{name}_{}_k{kp}", tag(dtype)),
        (grid_x, heads as u32),
        THREADS,
        smem as u32,
        args,
    )
}

/// Validates a `kda_intra` call from its tensors (`conformance/spec/ops-delta-rule.md` §1.5, 7.6,
/// the dtype rules).
fn check_intra(
    t: &KdaIntraTensors<'_>,
    cu_seqlens: Option<&[i64]>,
    p: &KdaIntraParams,
) -> attn_reference::Result<Geometry> {
    validate_delta_dtypes(&DeltaDtypes {
        main: vec![("q", t.q.dtype()), ("k", t.k.dtype()), ("v", t.v.dtype())],
        float: vec![("gk", t.gk.dtype()), ("beta", t.beta.dtype())],
        ..DeltaDtypes::default()
    })?;
    validate_kda_intra(
        &KdaIntraShapes {
            q: t.q.shape(),
            k: t.k.shape(),
            v: t.v.shape(),
            gk: t.gk.shape(),
            beta: t.beta.shape(),
        },
        cu_seqlens,
        p,
    )
}

/// `kda_intra` (`conformance/spec/ops-delta-rule.md` §7) into new outputs.
pub fn kda_intra(
    gpu: &Gpu,
    t: &KdaIntraTensors<'_>,
    cu_seqlens: Option<&[i64]>,
    p: &KdaIntraParams,
) -> GpuResult<KdaIntraDeviceOutputs> {
    let geo = check_intra(t, cu_seqlens, p)?;
    let dtype = t.q.dtype();
    let (chunks, nchunks) = chunk_table(gpu, &geo, cu_seqlens.is_some())?;
    let tok = |w: usize| DeviceTensor::alloc(gpu, &[geo.b, geo.t, geo.hv, w], dtype);
    let mut out = KdaIntraDeviceOutputs {
        w: tok(geo.k)?,
        u: tok(geo.v)?,
        kg: tok(geo.k)?,
        aqk: tok(geo.bt)?,
        akk: tok(geo.bt)?,
    };
    let scale = p.scale.unwrap_or(1.0 / (geo.k as f64).sqrt());
    let args = IntraArgs {
        q: t.q.ptr(gpu),
        k: t.k.ptr(gpu),
        v: t.v.ptr(gpu),
        g: t.gk.ptr(gpu),
        beta: t.beta.ptr(gpu),
        gate: GateArgs::none(),
        chunks: chunks.ptr(gpu),
        w: out.w.ptr_mut(gpu),
        u: out.u.ptr_mut(gpu),
        kg: out.kg.ptr_mut(gpu),
        aqk: out.aqk.ptr_mut(gpu),
        akk: out.akk.ptr_mut(gpu),
        heads: geo.h as i64,
        value_heads: geo.hv as i64,
        k_dim: geo.k as i64,
        v_dim: geo.v as i64,
        bt: geo.bt as i64,
        g_dtype: dtype_code(t.gk.dtype()),
        beta_dtype: dtype_code(t.beta.dtype()),
        gate_mode: 0,
        kg_gated: 1,
        safe_gate: p.safe_gate as i64,
        scale,
        ..IntraArgs::default()
    };
    launch_intra(gpu, dtype, nchunks, geo.hv, &args)?;
    Ok(out)
}
