//! The whole continuing piece's summary, in parallel (a rank whose tail the bound does not
//! allow: long memory, a slow head). The piece's `L` chunks are cut at chunk boundaries into
//! `m` sub-pieces ([`sub_pieces`]); one forward over the sub-pieces as `m` sequences, each from
//! `[0 | I]` with values `[v | 0]`, ends at their summaries `[b_j | M_j]` (as the serial run ends
//! at the whole piece's); then `fwd_h_merge` chains them at `V + K` columns from `[0 | I]` with
//! the slots widened to `[b_j | 0 | M_j]`:
//!
//! `X ← M_j X + [b_j | 0]` ends at `[b | M]`, `M = M_m ⋯ M_1`, `b = Σ_j M_m ⋯ M_{j+1} b_j`,
//!
//! the whole piece's summary (`conformance/spec/ops-delta-rule.md` §3.1, §4): the same map,
//! exact up to rounding. The serial chain of `L` chunks becomes `m` chains of `L / m` side by
//! side and a merge chain of `m` steps (fp32 products of `K × K` by `K × (V + K)`). KDA H4 × 1M
//! trained-like on 2 H100s (S12-3, S12-8): the serial whole summary took 27.8 ms of a 55.0 ms
//! run, this one 16.4 ms of 41.4.

use super::{copy_columns, zero, zero_identity, SummaryRun, SummarySpec};
use crate::delta::forward::ForwardTensors;
use crate::delta::fwd_h::FwdHTensors;
use crate::delta::merge::{FwdHMergeDeviceOutputs, FwdHMergePlan};
use crate::delta::prescan::FwdHPreScanPlan;
use crate::device::Gpu;
use crate::error::GpuResult;
use crate::tensor::DeviceTensor;
use attn_reference::delta::{FwdHMergeParams, FwdHPreScanParams};
use attn_reference::Error;

/// Chunks a sub-piece has at least.
const SUB_CHUNKS: usize = 8;

/// Sub-pieces at most: the merge chains them one after the other.
const MAX_SUB_PIECES: usize = 64;

/// Sub-pieces of a piece of `chunks` chunks: as many as give each [`SUB_CHUNKS`], at most
/// [`MAX_SUB_PIECES`], at least one.
fn sub_pieces(chunks: usize) -> usize {
    (chunks / SUB_CHUNKS).clamp(1, MAX_SUB_PIECES)
}

/// The sub-pieces' boundaries within a piece of `len` rows (chunk `bt`): `m + 1` offsets, inner
/// ones on chunk boundaries, as even as the chunks allow.
fn boundaries(len: usize, bt: usize) -> Vec<i64> {
    let chunks = len.div_ceil(bt);
    let m = sub_pieces(chunks);
    (0..=m)
        .map(|j| (j * chunks / m * bt).min(len) as i64)
        .collect()
}

/// The merge of the sub-pieces' summaries (where there is more than one).
#[derive(Debug)]
struct Chain {
    /// `[m, HV, K, V + 2K]`: `[b_j | 0 | M_j]`, the middle columns zeroed once.
    wide: DeviceTensor,
    plan: FwdHMergePlan,
    /// `final_state`: `[1, HV, K, V + K]`, the slot sent.
    out: FwdHMergeDeviceOutputs,
}

impl Chain {
    /// The merge of `m` sub-pieces' summaries of `spec`'s piece from `one` (`None` for one).
    fn new(
        gpu: &Gpu,
        m: usize,
        spec: &SummarySpec,
        one: &DeviceTensor,
    ) -> GpuResult<Option<Chain>> {
        if m < 2 {
            return Ok(None);
        }
        let d = spec.dims;
        let mut wide = DeviceTensor::alloc(gpu, &[m, d.hv, d.k, d.v + 2 * d.k], d.state)?;
        zero(gpu, &mut wide)?;
        let params = FwdHMergeParams {
            state_v_first: false,
            output_final_state: true,
        };
        let plan = FwdHMergePlan::new(gpu, &wide, Some(one), &[0, m as i64], &params)?;
        let out = plan.alloc_outputs(gpu)?;
        Ok(Some(Chain { wide, plan, out }))
    }

    /// Queues the merge of `m` summaries `[b_j | M_j]` of `parts` (`[·, HV, K, V + K]`, from
    /// its flattened row `row0`) from `one`.
    fn run(
        &mut self,
        gpu: &Gpu,
        (parts, row0): (&DeviceTensor, usize),
        one: &DeviceTensor,
        (v, k): (usize, usize),
    ) -> GpuResult<()> {
        copy_columns(gpu, (parts, row0, 0), (&mut self.wide, 0), v)?;
        copy_columns(gpu, (parts, row0, v), (&mut self.wide, v + k), k)?;
        self.plan.run(gpu, &self.wide, Some(one), &mut self.out)
    }
}

/// The whole piece's summary of one rank: the forward over its sub-pieces and their merge.
#[derive(Debug)]
pub(super) struct WholeSummary {
    run: SummaryRun,
    /// `[m, HV, K, V + K]`: `[0 | I]` per sub-piece.
    h0: DeviceTensor,
    chain: Option<Chain>,
    /// `V` and `K` of the states.
    v: usize,
    k: usize,
}

impl WholeSummary {
    /// The summary of `spec`'s piece of the shard `t`; `one` is the `[1, HV, K, V + K]` state
    /// `[0 | I]` the merge starts from.
    pub(super) fn new(
        gpu: &Gpu,
        spec: &SummarySpec,
        t: &ForwardTensors<'_>,
        one: &DeviceTensor,
    ) -> GpuResult<WholeSummary> {
        let d = spec.dims;
        let cu = boundaries(spec.piece.len, spec.op.flags().0 as usize);
        let m = cu.len() - 1;
        let h0 = zero_identity(gpu, m, (d.hv, d.k, d.v), d.state)?;
        let run = SummaryRun::new(gpu, spec, t, &spec.piece, &h0, Some(&cu))?;
        let chain = Chain::new(gpu, m, spec, one)?;
        Ok(WholeSummary {
            run,
            h0,
            chain,
            v: d.v,
            k: d.k,
        })
    }

    /// Queues the sub-pieces' forward over the rows of `t` and the merge (`one` as at
    /// [`WholeSummary::new`]).
    pub(super) fn run(
        &mut self,
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        one: &DeviceTensor,
    ) -> GpuResult<()> {
        self.run.run(gpu, t, &self.h0)?;
        let Some(c) = &mut self.chain else {
            return Ok(());
        };
        let Some(parts) = self.run.out.final_state.as_ref() else {
            return Err(attn_reference::Error::missing(
                "summary",
                "the sub-pieces' final states",
                "none",
            )
            .into());
        };
        c.run(gpu, (parts, 0), one, (self.v, self.k))
    }

    /// The slot the last run filled: `[1, HV, K, V + K]`.
    pub(super) fn slot(&self) -> Option<&DeviceTensor> {
        match &self.chain {
            Some(c) => c.out.final_state.as_ref(),
            None => self.run.out.final_state.as_ref(),
        }
    }
}

/// The whole piece's summary from the tiles of the rank's own local forward (`kg, w, u` and
/// the gate of every shard row, written by its first half: the exact fallback's staged path,
/// or the fused path with full tiles, KDA, whose intra stage then also writes the gate per
/// token): `fwd_h_pre_scan` over the piece's sub-pieces (the same [`boundaries`]) writes their
/// `[b_j | M_j]` (hi + lo operands on the `M` columns, about fp32), and the same merge chains
/// them. No intra stage of its own and no `[v | 0]` copy: the summary costs the pre-scan and
/// the merge chain beside what the local forward computes anyway (S15, 2 H100s, KDA H16 × 1M
/// trained-like: the summary by its own intra stage took ~49 ms beside a 27 ms head).
#[derive(Debug)]
pub(super) struct PreScanned {
    plan: FwdHPreScanPlan,
    /// `[m, HV, K, V + K]`.
    hm: DeviceTensor,
    chain: Option<Chain>,
    v: usize,
    k: usize,
}

impl PreScanned {
    /// The pre-scan of `spec`'s piece over `tiles` (the fallback's `fwd_h` inputs of the shard).
    pub(super) fn new(
        gpu: &Gpu,
        spec: &SummarySpec,
        tiles: &FwdHTensors<'_>,
        one: &DeviceTensor,
    ) -> GpuResult<PreScanned> {
        let d = spec.dims;
        let bt = spec.op.flags().0 as usize;
        let cu = boundaries(spec.piece.len, bt);
        let rows: Vec<(usize, usize)> = cu
            .windows(2)
            .map(|w| (spec.piece.start + w[0] as usize, (w[1] - w[0]) as usize))
            .collect();
        let params = FwdHPreScanParams {
            chunk_size: bt as i64,
        };
        let plan = FwdHPreScanPlan::over_rows(gpu, tiles, &rows, &params)?;
        if plan.hm_dtype() != d.state {
            let want = format!("the summaries' {}", d.state.name());
            return Err(Error::dtype("hm", want, plan.hm_dtype().name()).into());
        }
        let hm = DeviceTensor::alloc(gpu, &plan.hm_shape(), plan.hm_dtype())?;
        Ok(PreScanned {
            plan,
            hm,
            chain: Chain::new(gpu, rows.len(), spec, one)?,
            v: d.v,
            k: d.k,
        })
    }

    /// Queues the pre-scan over `tiles` and the merge (`one` as at [`PreScanned::new`]).
    pub(super) fn run(
        &mut self,
        gpu: &Gpu,
        tiles: &FwdHTensors<'_>,
        one: &DeviceTensor,
    ) -> GpuResult<()> {
        self.plan.run(gpu, tiles, &mut self.hm)?;
        match &mut self.chain {
            Some(c) => c.run(gpu, (&self.hm, 0), one, (self.v, self.k)),
            None => Ok(()),
        }
    }

    /// The slot the last run filled: `[1, HV, K, V + K]`.
    pub(super) fn slot(&self) -> Option<&DeviceTensor> {
        match &self.chain {
            Some(c) => c.out.final_state.as_ref(),
            None => Some(&self.hm),
        }
    }
}

/// The whole piece's summary from the exact fallback's own split `fwd_h` (the rank's local
/// forward took it, and its plan summarises the last sequence's last piece too:
/// `DeltaFwdPlan::with_exit_summary`): its pre-scan left the `[b_j | M_j]` of the piece's `m ≥ 2`
/// pieces in consecutive rows of its `hm`, which the same merge chains. Beside what the local
/// forward computes anyway, this costs one piece's pre-scan and the chain.
#[derive(Debug)]
pub(super) struct SplitRows {
    m: usize,
    chain: Chain,
    dims: (usize, usize, usize),
}

impl SplitRows {
    /// The chain of `m` pieces' summaries of `spec`'s piece from `one`.
    pub(super) fn new(
        gpu: &Gpu,
        spec: &SummarySpec,
        m: usize,
        one: &DeviceTensor,
    ) -> GpuResult<SplitRows> {
        let Some(chain) = Chain::new(gpu, m, spec, one)? else {
            let got = format!("{m} piece(s)");
            return Err(Error::missing("summary", "the split's pieces (2 or more)", got).into());
        };
        let d = spec.dims;
        Ok(SplitRows {
            m,
            chain,
            dims: (d.hv, d.k, d.v),
        })
    }

    /// Queues the chain of `hm`'s rows `row0 .. row0 + m` (`[·, HV, K, V + K]`).
    pub(super) fn run(
        &mut self,
        gpu: &Gpu,
        (hm, row0, m): (&DeviceTensor, usize, usize),
        one: &DeviceTensor,
    ) -> GpuResult<()> {
        if m != self.m {
            let want = format!("the {} pieces of the plan", self.m);
            return Err(Error::shape("hm", want, [row0, m]).into());
        }
        let (hv, k, v) = self.dims;
        self.chain.run(gpu, (hm, row0 * hv * k), one, (v, k))
    }

    /// The slot the last run filled: `[1, HV, K, V + K]`.
    pub(super) fn slot(&self) -> Option<&DeviceTensor> {
        self.chain.out.final_state.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Boundaries cover the piece, start on chunk boundaries, leave no sub-piece empty and give
    /// each at least SUB_CHUNKS chunks where there is more than one.
    #[test]
    fn sub_pieces_cover_the_piece_on_chunk_boundaries() {
        for (len, bt) in [
            (1, 64),
            (64, 64),
            (511, 64),
            (2641, 64),
            (64 * 4096, 64),
            (1000, 16),
        ] {
            let b = boundaries(len, bt);
            let m = b.len() - 1;
            assert_eq!((b[0], b[m]), (0, len as i64), "{len} {bt}");
            assert!((1..=MAX_SUB_PIECES).contains(&m), "{len} {bt}: {m}");
            for w in b.windows(2) {
                assert!(w[1] > w[0], "{len} {bt}: {b:?}");
                assert_eq!(w[0] % bt as i64, 0, "{len} {bt}: {b:?}");
                if m > 1 {
                    assert!(w[1] - w[0] >= (SUB_CHUNKS * bt) as i64 || w[1] == len as i64);
                }
            }
        }
        assert_eq!(sub_pieces(4096), MAX_SUB_PIECES);
        assert_eq!(sub_pieces(41), 5);
    }
}
