//! `nsa_compression_attention` on the GPU (`conformance/spec/ops-nsa.md` §3): a query at position
//! `t` of its sequence (head `hq`, KV head `h = hq / G`) attends to its visible compressed rows
//! `C(t)` (`"complete"`: `c < (t+1)/BS`; `"started"`: `c <= t/BS`; `"all"`: every row of the
//! sequence; always `c < TC_n`): `z_c = scale * q[t, hq] · k_cmp[c, h]`, `lse = logsumexp z`,
//! `o = sum_c exp(z_c - lse) v_cmp[c, h]`; an empty `C(t)` gives `o = 0` and `lse = -inf`
//! (or 0 with `empty_lse = "zero"`). Tensor cores for bf16/f16 (see [`super::attend`]).
//!
//! Kernel limits (typed errors): `K <= 256` (naming `q`) and `V <= 256` (naming `v_cmp`). The
//! reference has none; `G` is free (tensor cores take the group in m tiles of 16 heads).

use super::attend::{check_dims, check_out, AttendArgs, Launch};
use super::{check_rank, check_same_dtype, prefix_offsets, token_offsets};
use crate::device::Gpu;
use crate::error::GpuResult;
use crate::kernels::Module;
use crate::tensor::DeviceTensor;
use attn_reference::nsa::nsa_compression_attention::check_cmp_shapes;
use attn_reference::nsa::{check_block_size, check_scale, CmpLayout};
use attn_reference::nsa::{EmptyLse, PartialBlock, Visibility};
use attn_reference::Dtype;

/// `q` `[B, T, HQ, K]`, `k_cmp` `[B, TC, H, K]`, `v_cmp` `[B, TC, H, V]` (varlen packed), one
/// float dtype.
#[derive(Debug, Clone, Copy)]
pub struct CmpAttnInputs<'a> {
    pub q: &'a DeviceTensor,
    pub k_cmp: &'a DeviceTensor,
    pub v_cmp: &'a DeviceTensor,
}

/// The parameters of a call (`conformance/spec/ops-nsa.md` §3 defaults: `block_size` 64, `scale` `K
/// ** -0.5`, `"complete"`, `"mean_of_valid"`, `"-inf"`).
#[derive(Debug, Clone, Copy)]
pub struct CmpAttnParams {
    pub block_size: i64,
    pub scale: Option<f64>,
    pub visibility: Visibility,
    pub partial_block: PartialBlock,
    pub empty_lse: EmptyLse,
}

impl Default for CmpAttnParams {
    fn default() -> Self {
        CmpAttnParams {
            block_size: 64,
            scale: None,
            visibility: Visibility::Complete,
            partial_block: PartialBlock::MeanOfValid,
            empty_lse: EmptyLse::NegInf,
        }
    }
}

/// A validated call: the layout, the scale, and the shapes of `o` and `lse`.
pub(super) struct CmpPlan {
    pub layout: CmpLayout,
    pub scale: f64,
    pub o: Vec<usize>,
    pub lse: Vec<usize>,
}

pub(super) fn plan(
    x: &CmpAttnInputs<'_>,
    cu_seqlens: Option<&[i64]>,
    p: &CmpAttnParams,
) -> GpuResult<CmpPlan> {
    check_rank("q", x.q, 4, "[B, T, HQ, K]")?;
    check_rank("k_cmp", x.k_cmp, 4, "[B, TC, H, K]")?;
    check_rank("v_cmp", x.v_cmp, 4, "[B, TC, H, V]")?;
    check_same_dtype("k_cmp", x.k_cmp, "q", x.q.dtype())?;
    check_same_dtype("v_cmp", x.v_cmp, "q", x.q.dtype())?;
    let bs = check_block_size(p.block_size)?;
    let qs = x.q.shape();
    let layout = CmpLayout::new(qs[0], qs[1], cu_seqlens, bs, p.partial_block)?;
    let rule = match p.partial_block {
        PartialBlock::MeanOfValid => "ceil(L / block_size) rows per sequence",
        PartialBlock::Drop => "floor(L / block_size) rows per sequence",
    };
    check_cmp_shapes(qs, x.k_cmp.shape(), Some(x.v_cmp.shape()), &layout, rule)?;
    check_dims("q", qs, "v_cmp", x.v_cmp.shape())?;
    let scale = check_scale::<f64>(p.scale, qs[3])?;
    let o = vec![qs[0], qs[1], qs[2], x.v_cmp.shape()[3]];
    let lse = qs[..3].to_vec();
    Ok(CmpPlan {
        layout,
        scale,
        o,
        lse,
    })
}

/// `(o, lse) = nsa_compression_attention(q, k_cmp, v_cmp, ...)` into new tensors (`o` in `q`'s
/// dtype, `lse` float32).
pub fn nsa_compression_attention(
    gpu: &Gpu,
    x: &CmpAttnInputs<'_>,
    cu_seqlens: Option<&[i64]>,
    p: &CmpAttnParams,
) -> GpuResult<(DeviceTensor, DeviceTensor)> {
    let pl = plan(x, cu_seqlens, p)?;
    let mut o = DeviceTensor::alloc(gpu, &pl.o, x.q.dtype())?;
    let mut lse = DeviceTensor::alloc(gpu, &pl.lse, Dtype::F32)?;
    launch(gpu, x, &pl, p, &mut o, Some(&mut lse))?;
    Ok((o, lse))
}

/// [`nsa_compression_attention`] written into `o` (and `lse` when given).
pub fn nsa_compression_attention_into(
    gpu: &Gpu,
    x: &CmpAttnInputs<'_>,
    cu_seqlens: Option<&[i64]>,
    p: &CmpAttnParams,
    o: &mut DeviceTensor,
    lse: Option<&mut DeviceTensor>,
) -> GpuResult<()> {
    let pl = plan(x, cu_seqlens, p)?;
    check_out("o", o, &pl.o, x.q.dtype())?;
    if let Some(l) = lse.as_deref() {
        check_out("lse", l, &pl.lse, Dtype::F32)?;
    }
    launch(gpu, x, &pl, p, o, lse)
}

/// Launches a validated call.
pub(super) fn launch(
    gpu: &Gpu,
    x: &CmpAttnInputs<'_>,
    pl: &CmpPlan,
    p: &CmpAttnParams,
    o: &mut DeviceTensor,
    lse: Option<&mut DeviceTensor>,
) -> GpuResult<()> {
    if o.numel() == 0 {
        return Ok(());
    }
    let cu = token_offsets(gpu, &pl.layout.seqs, x.q.shape()[1])?;
    let cmp = prefix_offsets(gpu, pl.layout.tc.iter().copied())?;
    let args = AttendArgs {
        cu: cu.ptr(gpu),
        cmp: cmp.ptr(gpu),
        nseq: pl.layout.seqs.len() as i64,
        bs: pl.layout.bs as i64,
        mode: match p.visibility {
            Visibility::Complete => 0,
            Visibility::Started => 1,
            Visibility::All => 2,
        },
        empty_lse: match p.empty_lse {
            EmptyLse::NegInf => f32::NEG_INFINITY,
            EmptyLse::Zero => 0.0,
        },
        scale: pl.scale,
        ..Default::default()
    };
    let l = Launch {
        module: Module::NsaCompressionAttention,
        name: "nsa_compression_attention",
        q: x.q,
        k: x.k_cmp,
        v: x.v_cmp,
        shared_rows: true,
    };
    l.run(gpu, args, o, lse)
}
