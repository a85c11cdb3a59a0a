//! `nsa_selection_attention` on the GPU (`conformance/spec/ops-nsa.md` §5): for a row `(b, t, h)`
//! with `n_sel` = `block_counts[b, t, h]` (the tensor form) or all `S` slots, each valid slot
//! (`0 <= idx <= p / BS`, `p` the position in the sequence; tested without computing
//! `idx * BS`) contributes tokens `idx*BS .. min(idx*BS + BS, p + 1) - 1` of the sequence, a
//! multiset (duplicates count twice); every query head of the group gets
//! `lse = logsumexp_j z_j`, `o = sum_j exp(z_j - lse) v[j, h]`, `z_j = scale * q[t, hq] · k[j, h]`;
//! no key: `o = 0`, `lse = -inf`. Tensor cores for bf16/f16 (see [`super::attend`]).
//!
//! `block_indices` stays on the device (int32 or int64; any value is allowed, invalid ones are
//! ignored); the tensor `block_counts` is checked on the host (entries in `0 ..= S`) and
//! uploaded.
//!
//! Kernel limits (typed errors): `K <= 256` (naming `q`) and `V <= 256` (naming `v`). The
//! reference has none; `G` is free.

use super::attend::{check_dims, check_out, AttendArgs, Launch};
use super::{check_rank, check_same_dtype, token_offsets};
use crate::device::Gpu;
use crate::error::GpuResult;
use crate::kernels::Module;
use crate::tensor::DeviceTensor;
use attn_reference::nsa::nsa_selection_attention::check_kv;
use attn_reference::nsa::{check_block_size, check_scale, BlockCounts, CmpLayout, PartialBlock};
use attn_reference::{Dtype, Error};

/// `q` `[B, T, HQ, K]`, `k` `[B, T, H, K]`, `v` `[B, T, H, V]` (one float dtype) and
/// `block_indices` `[B, T, H, S]` (int32 or int64, sequence-relative block numbers).
#[derive(Debug, Clone, Copy)]
pub struct SelAttnInputs<'a> {
    pub q: &'a DeviceTensor,
    pub k: &'a DeviceTensor,
    pub v: &'a DeviceTensor,
    pub block_indices: &'a DeviceTensor,
}

/// Checks `q`, `k`, `v` (ranks, dtypes, shapes, the kernels' limits); returns `G`.
pub(super) fn check_qkv(q: &DeviceTensor, k: &DeviceTensor, v: &DeviceTensor) -> GpuResult<usize> {
    check_rank("q", q, 4, "[B, T, HQ, K]")?;
    check_rank("k", k, 4, "[B, T, H, K]")?;
    check_rank("v", v, 4, "[B, T, H, V]")?;
    check_same_dtype("k", k, "q", q.dtype())?;
    check_same_dtype("v", v, "q", q.dtype())?;
    let g = check_kv(q.shape(), k.shape(), v.shape())?;
    check_dims("q", q.shape(), "v", v.shape())?;
    Ok(g)
}

/// Checks `block_indices` against `[B, T, H]` and `block_counts` against `S` (an integer must
/// be `>= S`; a tensor `[B, T, H]` with entries in `0 ..= S`); returns `S`.
pub(super) fn check_indices(
    idx: &DeviceTensor,
    bth: [usize; 3],
    block_counts: Option<BlockCounts<'_>>,
) -> GpuResult<usize> {
    if !matches!(idx.dtype(), Dtype::I32 | Dtype::I64) {
        return Err(Error::dtype("block_indices", "int32 or int64", idx.dtype().name()).into());
    }
    if idx.shape().len() != 4 || idx.shape()[..3] != bth {
        return Err(Error::shape(
            "block_indices",
            format!("[B, T, H, S] with [B, T, H] = {bth:?}"),
            idx.shape(),
        )
        .into());
    }
    let s = idx.shape()[3];
    match block_counts {
        Some(BlockCounts::Int(n)) if n < s as i64 => Err(Error::param(
            "block_counts",
            format!(
                "an integer >= S = {s} (all slots; for fewer, give a [B, T, H] tensor or slice \
                 block_indices)"
            ),
            n,
        )
        .into()),
        Some(c) => {
            c.check_tensor(bth, Some(s as i64))?;
            Ok(s)
        }
        None => Ok(s),
    }
}

/// A validated call.
pub(super) struct SelPlan {
    pub layout: CmpLayout,
    pub scale: f64,
    pub s: usize,
    pub o: Vec<usize>,
    pub lse: Vec<usize>,
}

pub(super) fn plan(
    x: &SelAttnInputs<'_>,
    block_counts: Option<BlockCounts<'_>>,
    cu_seqlens: Option<&[i64]>,
    block_size: i64,
    scale: Option<f64>,
) -> GpuResult<SelPlan> {
    let bs = check_block_size(block_size)?;
    check_qkv(x.q, x.k, x.v)?;
    let qs = x.q.shape();
    let (b, t, h) = (qs[0], qs[1], x.k.shape()[2]);
    let s = check_indices(x.block_indices, [b, t, h], block_counts)?;
    let layout = CmpLayout::new(b, t, cu_seqlens, bs, PartialBlock::MeanOfValid)?;
    let scale = check_scale::<f64>(scale, qs[3])?;
    Ok(SelPlan {
        layout,
        scale,
        s,
        o: vec![b, t, qs[2], x.v.shape()[3]],
        lse: qs[..3].to_vec(),
    })
}

/// `(o, lse) = nsa_selection_attention(q, k, v, block_indices, block_counts, ...)` into new
/// tensors (`o` in `q`'s dtype, `lse` float32); `block_counts` as the integer (`>= S`: all
/// slots) or the host `[B, T, H]` tensor.
pub fn nsa_selection_attention(
    gpu: &Gpu,
    x: &SelAttnInputs<'_>,
    block_counts: Option<BlockCounts<'_>>,
    cu_seqlens: Option<&[i64]>,
    block_size: i64,
    scale: Option<f64>,
) -> GpuResult<(DeviceTensor, DeviceTensor)> {
    let pl = plan(x, block_counts, cu_seqlens, block_size, scale)?;
    let mut o = DeviceTensor::alloc(gpu, &pl.o, x.q.dtype())?;
    let mut lse = DeviceTensor::alloc(gpu, &pl.lse, Dtype::F32)?;
    let counts = upload_counts(gpu, block_counts)?;
    launch(gpu, x, &pl, counts.as_ref(), &mut o, Some(&mut lse))?;
    Ok((o, lse))
}

/// [`nsa_selection_attention`] written into `o` (and `lse` when given).
#[allow(clippy::too_many_arguments)]
pub fn nsa_selection_attention_into(
    gpu: &Gpu,
    x: &SelAttnInputs<'_>,
    block_counts: Option<BlockCounts<'_>>,
    cu_seqlens: Option<&[i64]>,
    block_size: i64,
    scale: Option<f64>,
    o: &mut DeviceTensor,
    lse: Option<&mut DeviceTensor>,
) -> GpuResult<()> {
    let pl = plan(x, block_counts, cu_seqlens, block_size, scale)?;
    check_out("o", o, &pl.o, x.q.dtype())?;
    if let Some(l) = lse.as_deref() {
        check_out("lse", l, &pl.lse, Dtype::F32)?;
    }
    let counts = upload_counts(gpu, block_counts)?;
    launch(gpu, x, &pl, counts.as_ref(), o, lse)
}

/// The tensor form of `block_counts` as int32 on the device (checked: entries in `0 ..= S`).
pub(super) fn upload_counts(
    gpu: &Gpu,
    block_counts: Option<BlockCounts<'_>>,
) -> GpuResult<Option<DeviceTensor>> {
    match block_counts {
        Some(BlockCounts::Tensor(c)) => {
            let c32 = c.mapv(|n| n as i32);
            Ok(Some(DeviceTensor::from_array(gpu, c32.view().into_dyn())?))
        }
        _ => Ok(None),
    }
}

/// Launches a validated call (`counts`: the int32 tensor form, or all `S` slots).
pub(super) fn launch(
    gpu: &Gpu,
    x: &SelAttnInputs<'_>,
    pl: &SelPlan,
    counts: Option<&DeviceTensor>,
    o: &mut DeviceTensor,
    lse: Option<&mut DeviceTensor>,
) -> GpuResult<()> {
    if o.numel() == 0 {
        return Ok(());
    }
    let cu = token_offsets(gpu, &pl.layout.seqs, x.q.shape()[1])?;
    let args = AttendArgs {
        cu: cu.ptr(gpu),
        idx: x.block_indices.ptr(gpu),
        counts: counts.map_or(0, |c| c.ptr(gpu)),
        nseq: pl.layout.seqs.len() as i64,
        bs: pl.layout.bs as i64,
        s: pl.s as i64,
        idx64: (x.block_indices.dtype() == Dtype::I64) as i64,
        empty_lse: f32::NEG_INFINITY,
        scale: pl.scale,
        ..Default::default()
    };
    let l = Launch {
        module: Module::NsaSelectionAttention,
        name: "nsa_selection_attention",
        q: x.q,
        k: x.k,
        v: x.v,
        shared_rows: false,
    };
    l.run(gpu, args, o, lse)
}
