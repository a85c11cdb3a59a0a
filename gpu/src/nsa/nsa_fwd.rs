//! `nsa_fwd` on the GPU (`conformance/spec/ops-nsa.md` §7): the whole FLA forward, queued on one
//! stream with no host synchronisation (the computed selection stays on the device):
//! 1. `k_cmp, v_cmp = nsa_compress_kv(k, v, "mean_of_valid")`;
//! 2. with `g_cmp`: `o_cmp` = the compressed branch (`"complete"`), and without `block_indices`
//!    the selection `nsa_select_blocks(mode "fla", block_counts)` (default 16), returned;
//! 3. `o_slc = nsa_selection_attention(block_indices, block_counts)` (a tensor count that made
//!    the selection sets the per-token quotas; an integer one made exactly `S` slots);
//! 4. with `w = window_size > 0`: `o_swa` = causal sliding-window attention over the `w` keys
//!    `max(0, p - w + 1) ..= p` of the sequence, with the default scale `K ** -0.5` whatever
//!    `scale` is (FLA 0.6.0 calls `flash_attn_func` without `softmax_scale`; the reference
//!    follows it, see NOTES.md);
//! 5. `o = g_slc*o_slc (or o_slc) + g_cmp*o_cmp + g_swa*o_swa` in fp32 (fp64 for fp64), cast
//!    once. The branch outputs are stored in the input dtype (FLA's rounding points, §9).
//!
//! Kernel limits (typed errors): those of the stages — `K <= 256` (naming `q`), `V <= 256`
//! (naming `v`); with computed selection `S <= 32` (naming `block_counts`) and
//! `G * K * sizeof <= 48 KiB` (naming `q`). All checks run before the first launch.

use super::attend::{AttendArgs, Launch};
use super::nsa_compression_attention::{self as cmp_attn, CmpAttnInputs, CmpAttnParams};
use super::nsa_select_blocks::{self as select, SelectInputs};
use super::nsa_selection_attention::{self as sel_attn, check_qkv, SelAttnInputs};
use super::{check_rank, check_same_dtype, token_offsets};
use crate::device::Gpu;
use crate::error::GpuResult;
use crate::kernels::Module;
use crate::params::tag;
use crate::tensor::DeviceTensor;
use crate::{nsa_compress_kv_into, CompressInputs};
use attn_reference::nsa::{check_block_size, check_scale, BlockCounts, CmpLayout};
use attn_reference::nsa::{PartialBlock, SelectMode};
use attn_reference::{Dtype, Error};
use cudarc::driver::DeviceRepr;

/// `q` `[B, T, HQ, K]`, `k` `[B, T, H, K]`, `v` `[B, T, H, V]`; optional gates `[B, T, HQ]`
/// (`q`'s dtype) and `block_indices` `[B, T, H, S]` (int32/int64).
#[derive(Debug, Clone, Copy)]
pub struct FwdInputs<'a> {
    pub q: &'a DeviceTensor,
    pub k: &'a DeviceTensor,
    pub v: &'a DeviceTensor,
    pub g_cmp: Option<&'a DeviceTensor>,
    pub g_slc: Option<&'a DeviceTensor>,
    pub g_swa: Option<&'a DeviceTensor>,
    pub block_indices: Option<&'a DeviceTensor>,
}

/// Outputs of [`nsa_fwd`].
#[derive(Debug)]
pub struct FwdOut {
    /// `[B, T, HQ, V]`, `q`'s dtype.
    pub o: DeviceTensor,
    /// `[B, T, H, S]` int32, only when the selection was computed.
    pub block_indices: Option<DeviceTensor>,
}

/// Mirror of `FwdCombineArgs` (nsa_fwd.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct FwdCombineArgs {
    o_slc: u64,
    o_cmp: u64,
    o_swa: u64,
    g_slc: u64,
    g_cmp: u64,
    g_swa: u64,
    o: u64,
    rows: i64,
    v: i64,
}
// SAFETY: plain `#[repr(C)]` data matching the kernel's struct.
unsafe impl DeviceRepr for FwdCombineArgs {}

/// Checks the gates: each `[B, T, HQ]` in `q`'s dtype.
fn check_gates(x: &FwdInputs<'_>) -> GpuResult<()> {
    let bth = &x.q.shape()[..3];
    for (arg, g) in [("g_cmp", x.g_cmp), ("g_slc", x.g_slc), ("g_swa", x.g_swa)] {
        let Some(g) = g else { continue };
        check_rank(arg, g, 3, "[B, T, HQ]")?;
        if g.shape() != bth {
            return Err(Error::shape(arg, format!("[B, T, HQ] = {bth:?}"), g.shape()).into());
        }
        check_same_dtype(arg, g, "q", x.q.dtype())?;
    }
    Ok(())
}

/// `nsa_fwd(q, k, v, g_cmp, g_slc, g_swa, block_indices, block_counts, ...)`: `o` and, when the
/// selection was computed, its `block_indices`. `block_counts` is the integer (computed
/// selection: the slot count, default 16; given indices: `>= S`) or the host `[B, T, H]`
/// tensor.
///
/// Errors (before any launch): every stage's; neither `g_cmp` nor `block_indices`;
/// `window_size < 0`; `window_size > 0` without `g_swa`; a gate not `[B, T, HQ]` of `q`'s dtype.
#[allow(clippy::too_many_arguments)]
pub fn nsa_fwd(
    gpu: &Gpu,
    x: &FwdInputs<'_>,
    block_counts: Option<BlockCounts<'_>>,
    cu_seqlens: Option<&[i64]>,
    block_size: i64,
    window_size: i64,
    scale: Option<f64>,
) -> GpuResult<FwdOut> {
    let bs = check_block_size(block_size)?;
    check_qkv(x.q, x.k, x.v)?;
    let dtype = x.q.dtype();
    let qs = x.q.shape();
    let (b, t, hq, kd) = (qs[0], qs[1], qs[2], qs[3]);
    let (h, vd) = (x.k.shape()[2], x.v.shape()[3]);
    check_scale::<f64>(scale, kd)?;
    if window_size < 0 {
        return Err(Error::param("window_size", "an integer >= 0", window_size).into());
    }
    check_gates(x)?;
    if x.g_cmp.is_none() && x.block_indices.is_none() {
        return Err(Error::missing(
            "block_indices",
            "block_indices when g_cmp is absent (no selection can be computed)",
            "neither g_cmp nor block_indices",
        )
        .into());
    }
    if window_size > 0 && x.g_swa.is_none() {
        return Err(Error::missing("g_swa", "g_swa with window_size > 0", "absent").into());
    }
    let layout = CmpLayout::new(b, t, cu_seqlens, bs, PartialBlock::MeanOfValid)?;
    let cb = if layout.varlen { 1 } else { b };
    let mut k_cmp = DeviceTensor::alloc(gpu, &[cb, layout.rows, h, kd], dtype)?;
    let mut v_cmp = DeviceTensor::alloc(gpu, &[cb, layout.rows, h, vd], dtype)?;
    // the plans of every stage, before the first launch
    let cmp_params = CmpAttnParams {
        block_size,
        scale,
        ..CmpAttnParams::default()
    };
    let cmp_in = CmpAttnInputs {
        q: x.q,
        k_cmp: &k_cmp,
        v_cmp: &v_cmp,
    };
    let cmp_plan = cmp_attn::plan(&cmp_in, cu_seqlens, &cmp_params)?;
    let sel_in = SelectInputs {
        q: x.q,
        k_cmp: &k_cmp,
    };
    let computed = match x.block_indices {
        Some(_) => None,
        None => {
            let p = select::plan(
                &sel_in,
                block_counts,
                cu_seqlens,
                block_size,
                scale,
                SelectMode::Fla,
                256,
                true,
            )?;
            Some(DeviceTensor::alloc(gpu, &p.out_shape, Dtype::I32)?)
        }
    };
    // the selected branch's quotas: a tensor count (given or the one that made the selection)
    let sel_counts = match (block_counts, &computed) {
        (Some(BlockCounts::Tensor(c)), _) => Some(BlockCounts::Tensor(c)),
        (c, None) => c,
        (_, Some(_)) => None,
    };
    let idx = x
        .block_indices
        .or(computed.as_ref())
        .expect("checked above");
    let slc_in = SelAttnInputs {
        q: x.q,
        k: x.k,
        v: x.v,
        block_indices: idx,
    };
    let slc_plan = sel_attn::plan(&slc_in, sel_counts, cu_seqlens, block_size, scale)?;
    let o_shape = [b, t, hq, vd];
    let mut o = DeviceTensor::alloc(gpu, &o_shape, dtype)?;
    if o.numel() == 0 {
        return Ok(FwdOut {
            o,
            block_indices: computed,
        });
    }
    // 1. compression
    let c_in = CompressInputs {
        k: x.k,
        v: Some(x.v),
        w_k: None,
        w_v: None,
    };
    let mb = PartialBlock::MeanOfValid;
    nsa_compress_kv_into(
        gpu,
        &c_in,
        cu_seqlens,
        block_size,
        mb,
        &mut k_cmp,
        Some(&mut v_cmp),
    )?;
    let cmp_in = CmpAttnInputs {
        q: x.q,
        k_cmp: &k_cmp,
        v_cmp: &v_cmp,
    };
    // 2. compressed branch and selection
    let o_cmp = match x.g_cmp {
        Some(_) => {
            let mut oc = DeviceTensor::alloc(gpu, &o_shape, dtype)?;
            cmp_attn::launch(gpu, &cmp_in, &cmp_plan, &cmp_params, &mut oc, None)?;
            Some(oc)
        }
        None => None,
    };
    let mut computed = computed;
    if let Some(out) = computed.as_mut() {
        let s_in = SelectInputs {
            q: x.q,
            k_cmp: &k_cmp,
        };
        select::nsa_select_blocks_into(
            gpu,
            &s_in,
            block_counts,
            cu_seqlens,
            block_size,
            scale,
            SelectMode::Fla,
            256,
            true,
            out,
        )?;
    }
    // 3. selected branch
    let idx = x
        .block_indices
        .or(computed.as_ref())
        .expect("checked above");
    let slc_in = SelAttnInputs {
        q: x.q,
        k: x.k,
        v: x.v,
        block_indices: idx,
    };
    let mut o_slc = DeviceTensor::alloc(gpu, &o_shape, dtype)?;
    let counts = sel_attn::upload_counts(gpu, sel_counts)?;
    sel_attn::launch(gpu, &slc_in, &slc_plan, counts.as_ref(), &mut o_slc, None)?;
    // 4. sliding window
    let o_swa = match x.g_swa {
        Some(_) if window_size > 0 => {
            let mut ow = DeviceTensor::alloc(gpu, &o_shape, dtype)?;
            let cu = token_offsets(gpu, &layout.seqs, t)?;
            let args = AttendArgs {
                cu: cu.ptr(gpu),
                nseq: layout.seqs.len() as i64,
                bs: bs as i64,
                mode: window_size,
                empty_lse: f32::NEG_INFINITY,
                scale: 1.0 / (kd as f64).sqrt(),
                ..Default::default()
            };
            let l = Launch {
                module: Module::NsaFwd,
                name: "nsa_window_attention",
                q: x.q,
                k: x.k,
                v: x.v,
                shared_rows: true,
            };
            l.run(gpu, args, &mut ow, None)?;
            Some(ow)
        }
        _ => None,
    };
    // 5. the gated sum
    let rows = b * t * hq;
    let ptr = |t: Option<&DeviceTensor>| t.map_or(0, |t| t.ptr(gpu));
    let args = FwdCombineArgs {
        o_slc: o_slc.ptr(gpu),
        o_cmp: ptr(o_cmp.as_ref()),
        o_swa: ptr(o_swa.as_ref()),
        g_slc: ptr(x.g_slc),
        g_cmp: ptr(x.g_cmp.filter(|_| o_cmp.is_some())),
        g_swa: ptr(x.g_swa.filter(|_| o_swa.is_some())),
        o: o.ptr_mut(gpu),
        rows: rows as i64,
        v: vd as i64,
    };
    let blocks = (rows * vd).div_ceil(256).min(gpu.sm_count() * 32);
    let name = format!("nsa_fwd_combine_{}", tag(dtype));
    gpu.launch(Module::NsaFwd, &name, (blocks as u32, 1), 256, &args)?;
    Ok(FwdOut {
        o,
        block_indices: computed,
    })
}
