//! The truncation policy of a split on the device (`conformance/spec/ops-delta-rule.md` §5.10):
//! per piece, a warm-up of `w` chunks where the log bound of its window
//!
//! ```text
//! Λ = Σ_t [ s · max_k a_{t,k} + ln max(1, |1 − β_t ‖k_t‖²|) ]     (tokens of chunks c0 − w .. c0 − 1)
//! ```
//!
//! gives `exp(Λ) ≤ ε` for every value head (`ε = 2^-30` by default), else the exact summaries.
//! `a` are the per-token gates (natural log after the factor `s`), `β`, `k` what the recurrence
//! uses. Three kernels (gpu/kernels/fwd_h_truncation.cu), queued with no host synchronisation:
//! the bound of every chunk and value head (fp64, plus `1e-9 · Σ|terms|`, so it is never below
//! the exact real-number bound, hence never below the float64 reference
//! `attn_reference::delta::truncation_log_bound` beyond its own rounding: the decision is
//! conservative by construction), the smallest admissible `w ≤ max_warmup_chunks` per piece (a
//! warm-up that reaches the sequence start is exact and always admissible), and which pre-scan
//! summaries the merge still reads.
//!
//! The pieces are numbered as the split's re-run rows (`split.rs`, fwd_h_split.cu): a
//! [`TruncationPolicy`] is made for one split (`FwdHSplitPlan::truncation_policy`). A caller
//! that produces the chunk bounds itself (a fused forward computing them with its gates) calls
//! [`TruncationPolicy::queue_decide`] on them.

use super::pieces::Tables;
use crate::device::Gpu;
use crate::error::GpuResult;
use crate::kernels::Module;
use crate::params::dtype_code;
use crate::tensor::DeviceTensor;
use attn_reference::delta::Geometry;
use attn_reference::{Dtype, Error};
use cudarc::driver::DeviceRepr;

/// Most chunks a warm-up may span (`TRUNC_MAX_WARMUP`).
pub const MAX_WARMUP_CHUNKS: usize = 256;

/// The policy's knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TruncationParams {
    /// `log2 ε`: a warm-up is admissible where `Λ ≤ log2_eps · ln 2` for every value head.
    pub log2_eps: f64,
    /// The longest warm-up (chunks, at most [`MAX_WARMUP_CHUNKS`]).
    pub max_warmup_chunks: usize,
}

impl Default for TruncationParams {
    /// `ε = 2^-30` (§5.10), warm-ups of at most 64 chunks.
    fn default() -> Self {
        TruncationParams {
            log2_eps: -30.0,
            max_warmup_chunks: 64,
        }
    }
}

/// Per-token gates on the device, over the flattened `B · T` rows.
#[derive(Debug, Clone, Copy)]
pub enum BoundGates<'a> {
    /// `[B, T, HV]` (GDN).
    Scalar(&'a DeviceTensor),
    /// `[B, T, HV, K]` (KDA).
    PerKey(&'a DeviceTensor),
}

/// What the bound reads (§5.10).
#[derive(Debug, Clone, Copy)]
pub struct TruncationInputs<'a> {
    /// The per-token gates, `gate_scale · gates` in natural-log units (1 for natural-log gates,
    /// `ln 2` for log2 gates).
    pub gates: BoundGates<'a>,
    pub gate_scale: f64,
    /// `β` `[B, T, HV]` and the keys `[B, T, H, K]` the recurrence uses (normalised as it uses
    /// them). `None`: the caller promises `‖I − β k kᵀ‖₂ ≤ 1` (L2-normalised keys, `0 ≤ β ≤ 2`, in
    /// exact arithmetic) and the norm term is 0.
    pub contraction: Option<(&'a DeviceTensor, &'a DeviceTensor)>,
}

/// Mirror of `ChunkBoundArgs`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct ChunkBoundArgs {
    gates: u64,
    beta: u64,
    k: u64,
    chunks: u64,
    lam: u64,
    heads: i64,
    value_heads: i64,
    k_dim: i64,
    per_key: i64,
    gate_dtype: i64,
    beta_dtype: i64,
    k_dtype: i64,
    gate_scale: f64,
}
// SAFETY: plain `#[repr(C)]` data (every field 8 bytes) matching the kernel's struct.
unsafe impl DeviceRepr for ChunkBoundArgs {}

/// Mirror of `WarmupDecideArgs`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct WarmupDecideArgs {
    lam: u64,
    pieces: u64,
    warm: u64,
    value_heads: i64,
    max_warmup: i64,
    log_eps: f64,
}
// SAFETY: as above.
unsafe impl DeviceRepr for WarmupDecideArgs {}

/// Mirror of `WarmupSummaryArgs`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct WarmupSummaryArgs {
    merge: u64,
    warm: u64,
    skip: u64,
    n: i64,
}
// SAFETY: as above.
unsafe impl DeviceRepr for WarmupSummaryArgs {}

/// The device tables of the policy for one split.
#[derive(Debug)]
pub struct TruncationPolicy {
    params: TruncationParams,
    /// `[C, 2]` chunk rows (first token row, tokens).
    chunks: DeviceTensor,
    /// `[S, 2]` per re-run row: first `h` row, first chunk in its sequence.
    pieces: DeviceTensor,
    /// `[N, 2]` the split's merge table.
    merge: DeviceTensor,
    c: usize,
    s: usize,
    q: usize,
    n: usize,
    hv: usize,
}

impl TruncationPolicy {
    /// The policy for the pieces of `tables` (validated `params`: a `max_warmup_chunks` above
    /// [`MAX_WARMUP_CHUNKS`] or a non-negative / NaN `log2_eps` is an error naming the field).
    pub(crate) fn new(
        gpu: &Gpu,
        geo: &Geometry,
        tables: &Tables,
        params: &TruncationParams,
    ) -> GpuResult<TruncationPolicy> {
        if params.max_warmup_chunks > MAX_WARMUP_CHUNKS {
            return Err(Error::param(
                "max_warmup_chunks",
                format!("at most {MAX_WARMUP_CHUNKS}"),
                params.max_warmup_chunks,
            )
            .into());
        }
        if params.log2_eps.is_nan() || params.log2_eps >= 0.0 {
            return Err(Error::param("log2_eps", "a negative number", params.log2_eps).into());
        }
        let s = tables.run.len() / 3;
        let mut pieces = Vec::with_capacity(2 * s);
        for (r, &c0) in tables.c0.iter().enumerate() {
            pieces.extend([tables.run[3 * r + 2], c0]);
        }
        Ok(TruncationPolicy {
            params: *params,
            chunks: DeviceTensor::from_slice(gpu, &tables.chunks)?,
            pieces: DeviceTensor::from_slice(gpu, &pieces)?,
            merge: DeviceTensor::from_slice(gpu, &tables.merge)?,
            c: tables.chunks.len() / 2,
            s,
            q: tables.pre.len() / 3,
            n: tables.merge.len() / 2,
            hv: geo.hv,
        })
    }

    /// Checks `inp` against the split's geometry: gates `[B, T, HV]` / `[B, T, HV, K]`, `β`
    /// `[B, T, HV]`, keys `[B, T, H, K]`, float dtypes, a finite positive `gate_scale`; each
    /// error names its argument.
    pub fn check(&self, geo: &Geometry, inp: &TruncationInputs<'_>) -> GpuResult<()> {
        let (b, t, h, hv, k) = (geo.b, geo.t, geo.h, geo.hv, geo.k);
        let want = |arg: &str, x: &DeviceTensor, shape: &[usize]| -> GpuResult<()> {
            if x.shape() != shape {
                return Err(Error::shape(arg, format!("{shape:?}"), x.shape()).into());
            }
            if !x.dtype().is_float() {
                return Err(Error::dtype(arg, "a float dtype", x.dtype().name()).into());
            }
            Ok(())
        };
        match inp.gates {
            BoundGates::Scalar(g) => want("gates", g, &[b, t, hv])?,
            BoundGates::PerKey(g) => want("gates", g, &[b, t, hv, k])?,
        }
        if let Some((beta, keys)) = inp.contraction {
            want("beta", beta, &[b, t, hv])?;
            want("k", keys, &[b, t, h, k])?;
        }
        if !(inp.gate_scale.is_finite() && inp.gate_scale > 0.0) {
            return Err(Error::param("gate_scale", "finite and > 0", inp.gate_scale).into());
        }
        Ok(())
    }

    /// Queues the chunk bounds of `inp` into `bounds` (`[C, HV]` f64) and the decision
    /// ([`TruncationPolicy::queue_decide`]). `inp` must pass [`TruncationPolicy::check`].
    pub fn queue(
        &self,
        gpu: &Gpu,
        inp: &TruncationInputs<'_>,
        bounds: &mut DeviceTensor,
        warm: &mut DeviceTensor,
        skip: &mut DeviceTensor,
    ) -> GpuResult<()> {
        self.check_out("bounds", bounds, &[self.c, self.hv], Dtype::F64)?;
        let (gates, per_key) = match inp.gates {
            BoundGates::Scalar(g) => (g, 0),
            BoundGates::PerKey(g) => (g, 1),
        };
        let k_dim = gates.shape().get(3).copied().unwrap_or(0) as i64;
        let (heads, k_dim) = match inp.contraction {
            Some((_, keys)) => (keys.shape()[2] as i64, keys.shape()[3] as i64),
            None => (1, k_dim),
        };
        let args = ChunkBoundArgs {
            gates: gates.ptr(gpu),
            beta: inp.contraction.map_or(0, |(b, _)| b.ptr(gpu)),
            k: inp.contraction.map_or(0, |(_, k)| k.ptr(gpu)),
            chunks: self.chunks.ptr(gpu),
            lam: bounds.ptr_mut(gpu),
            // without keys every value head reads "key head" 0 (unused)
            heads: if inp.contraction.is_some() {
                heads
            } else {
                self.hv as i64
            },
            value_heads: self.hv as i64,
            k_dim,
            per_key,
            gate_dtype: dtype_code(gates.dtype()),
            beta_dtype: inp.contraction.map_or(1, |(b, _)| dtype_code(b.dtype())),
            k_dtype: inp.contraction.map_or(1, |(_, k)| dtype_code(k.dtype())),
            gate_scale: inp.gate_scale,
        };
        if self.c > 0 {
            gpu.queue_with_smem(
                Module::FwdHTruncation,
                "fwd_h_chunk_log_bound",
                (grid("bounds", self.c)?, self.hv as u32),
                128,
                0,
                &args,
            )?;
        }
        self.queue_decide(gpu, bounds, warm, skip)
    }

    /// Queues the decision from chunk bounds (`[C, HV]` f64, `C` the `h` rows of the call, each
    /// at least the chunk's exact `Λ`): per re-run row the warm-up into `warm` `[S]` (0: exact),
    /// per summary row `-1` (skipped) or 0 into `skip` `[Q]`; the split reads both.
    pub fn queue_decide(
        &self,
        gpu: &Gpu,
        bounds: &DeviceTensor,
        warm: &mut DeviceTensor,
        skip: &mut DeviceTensor,
    ) -> GpuResult<()> {
        self.check_out("bounds", bounds, &[self.c, self.hv], Dtype::F64)?;
        self.check_out("warm", warm, &[self.s], Dtype::I64)?;
        self.check_out("skip", skip, &[self.q], Dtype::I64)?;
        let decide = WarmupDecideArgs {
            lam: bounds.ptr(gpu),
            pieces: self.pieces.ptr(gpu),
            warm: warm.ptr_mut(gpu),
            value_heads: self.hv as i64,
            max_warmup: self.params.max_warmup_chunks as i64,
            log_eps: self.params.log2_eps * std::f64::consts::LN_2,
        };
        gpu.queue_with_smem(
            Module::FwdHTruncation,
            "fwd_h_warmup_decide",
            (grid("warm", self.s)?, 1),
            256,
            0,
            &decide,
        )?;
        let summaries = WarmupSummaryArgs {
            merge: self.merge.ptr(gpu),
            warm: warm.ptr(gpu),
            skip: skip.ptr_mut(gpu),
            n: self.n as i64,
        };
        gpu.queue_with_smem(
            Module::FwdHTruncation,
            "fwd_h_warmup_summaries",
            (grid("skip", self.n.div_ceil(128))?, 1),
            128,
            0,
            &summaries,
        )
    }

    /// `(C, S, Q)`: chunk rows, pieces (re-run rows) and summary rows.
    pub fn sizes(&self) -> (usize, usize, usize) {
        (self.c, self.s, self.q)
    }

    fn check_out(
        &self,
        arg: &str,
        t: &DeviceTensor,
        shape: &[usize],
        dtype: Dtype,
    ) -> GpuResult<()> {
        if t.shape() != shape {
            return Err(Error::shape(arg, format!("{shape:?}"), t.shape()).into());
        }
        if t.dtype() != dtype {
            return Err(Error::dtype(arg, dtype.name(), t.dtype().name()).into());
        }
        Ok(())
    }
}

/// A grid extent (at least 1 block), refused beyond `2^31 − 1`.
fn grid(arg: &str, n: usize) -> GpuResult<u32> {
    u32::try_from(n.max(1))
        .ok()
        .filter(|&x| x <= i32::MAX as u32)
        .ok_or_else(|| Error::shape(arg, "< 2^31 blocks", vec![n]).into())
}
