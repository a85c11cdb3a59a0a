//! `nsa_compress_kv` on the GPU (`conformance/spec/ops-nsa.md` §2): for sequence `n`, block `c <
//! TC_n` and head `h`, `pooled[c, h, :] = (1/n_c) sum_{t = c*BS}^{c*BS + n_c - 1} x[t, h, :]` with
//! `n_c = min(BS, L - c*BS)`, for `x = k` and `x = v` in one pass (each element read once,
//! fp32 sums; fp64 for fp64), then with `w_k` / `w_v` `[H, D, D]`:
//! `out[c, h, e] = sum_d pooled[c, h, d] * w[h, d, e]` (a second kernel on the unrounded means,
//! weights widened once). One launch for the whole batch, varlen included; 64-bit offsets.
//!
//! Kernel limits: with a projection, `K` (resp. `V`) `<= 256` (a typed error naming `w_k` /
//! `w_v`). The reference has none.

use super::{acc_dtype, check_rank, check_same_dtype, prefix_offsets, token_offsets, widen_weight};
use crate::device::Gpu;
use crate::error::GpuResult;
use crate::kernels::Module;
use crate::params::{tag, vmax};
use crate::tensor::DeviceTensor;
use attn_reference::nsa::{check_block_size, CmpLayout, PartialBlock};
use attn_reference::{Dtype, Error};
use cudarc::driver::DeviceRepr;

/// Largest feature count the projection kernel takes.
const PROJ_MAX_D: usize = 256;

/// The tensors of a call: `k` `[B, T, H, K]`; optional `v` `[B, T, H, V]` (`k`'s dtype),
/// `w_k` `[H, K, K]`, `w_v` `[H, V, V]` (any float dtype; `w_v` needs `v`).
#[derive(Debug, Clone, Copy)]
pub struct CompressInputs<'a> {
    pub k: &'a DeviceTensor,
    pub v: Option<&'a DeviceTensor>,
    pub w_k: Option<&'a DeviceTensor>,
    pub w_v: Option<&'a DeviceTensor>,
}

/// Mirror of `CompressArgs` (nsa_compress_kv.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct CompressArgs {
    k: u64,
    v: u64,
    k_out: u64,
    v_out: u64,
    cu: u64,
    cmp: u64,
    nseq: i64,
    ck: i64,
    cv: i64,
    bs: i64,
    rows: i64,
    k_ws: i64,
    v_ws: i64,
}
// SAFETY: plain `#[repr(C)]` data matching the kernel's struct.
unsafe impl DeviceRepr for CompressArgs {}

/// Mirror of `ProjectArgs` (nsa_compress_kv.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct ProjectArgs {
    pooled: u64,
    w: u64,
    out: u64,
    rows: i64,
    heads: i64,
    d: i64,
}
// SAFETY: plain `#[repr(C)]` data matching the kernel's struct.
unsafe impl DeviceRepr for ProjectArgs {}

/// Validates a call; returns the compressed layout and the output shapes of `k_cmp` and `v_cmp`.
fn check(
    x: &CompressInputs<'_>,
    cu_seqlens: Option<&[i64]>,
    block_size: i64,
    partial: PartialBlock,
) -> GpuResult<(CmpLayout, Vec<usize>, Option<Vec<usize>>)> {
    check_rank("k", x.k, 4, "[B, T, H, K]")?;
    let (b, t, h, kd) = (
        x.k.shape()[0],
        x.k.shape()[1],
        x.k.shape()[2],
        x.k.shape()[3],
    );
    if let Some(v) = x.v {
        check_rank("v", v, 4, "[B, T, H, V]")?;
        if v.shape()[..3] != x.k.shape()[..3] {
            return Err(Error::shape(
                "v",
                format!("[B, T, H, V] with [B, T, H] = {:?} of k", &x.k.shape()[..3]),
                v.shape(),
            )
            .into());
        }
        check_same_dtype("v", v, "k", x.k.dtype())?;
    }
    let bs = check_block_size(block_size)?;
    let vd = x.v.map(|v| v.shape()[3]);
    if x.w_v.is_some() && x.v.is_none() {
        return Err(Error::missing("w_v", "w_v only together with v", "w_v without v").into());
    }
    for (arg, w, d) in [("w_k", x.w_k, Some(kd)), ("w_v", x.w_v, vd)] {
        let (Some(w), Some(d)) = (w, d) else { continue };
        check_rank(arg, w, 3, "[H, D, D]")?;
        if w.shape() != [h, d, d] {
            return Err(
                Error::shape(arg, format!("[H, D, D] = [{h}, {d}, {d}]"), w.shape()).into(),
            );
        }
        if d > PROJ_MAX_D {
            return Err(Error::shape(
                arg,
                format!("a feature size D <= {PROJ_MAX_D} (the GPU projection kernel's limit)"),
                w.shape(),
            )
            .into());
        }
    }
    let layout = CmpLayout::new(b, t, cu_seqlens, bs, partial)?;
    let out_b = if layout.varlen { 1 } else { b };
    let k_shape = vec![out_b, layout.rows, h, kd];
    let v_shape = vd.map(|vd| vec![out_b, layout.rows, h, vd]);
    Ok((layout, k_shape, v_shape))
}

/// `(k_cmp, v_cmp) = nsa_compress_kv(k, v, w_k, w_v, cu_seqlens, block_size, partial_block)`
/// into new tensors of `k`'s dtype (`v_cmp` only when `v` is given).
pub fn nsa_compress_kv(
    gpu: &Gpu,
    x: &CompressInputs<'_>,
    cu_seqlens: Option<&[i64]>,
    block_size: i64,
    partial: PartialBlock,
) -> GpuResult<(DeviceTensor, Option<DeviceTensor>)> {
    let (_, ks, vs) = check(x, cu_seqlens, block_size, partial)?;
    let mut k_cmp = DeviceTensor::alloc(gpu, &ks, x.k.dtype())?;
    let mut v_cmp = vs
        .map(|s| DeviceTensor::alloc(gpu, &s, x.k.dtype()))
        .transpose()?;
    nsa_compress_kv_into(
        gpu,
        x,
        cu_seqlens,
        block_size,
        partial,
        &mut k_cmp,
        v_cmp.as_mut(),
    )?;
    Ok((k_cmp, v_cmp))
}

/// [`nsa_compress_kv`] written into `k_cmp` and `v_cmp` (shapes and dtype as it allocates).
pub fn nsa_compress_kv_into(
    gpu: &Gpu,
    x: &CompressInputs<'_>,
    cu_seqlens: Option<&[i64]>,
    block_size: i64,
    partial: PartialBlock,
    k_cmp: &mut DeviceTensor,
    v_cmp: Option<&mut DeviceTensor>,
) -> GpuResult<()> {
    let (layout, ks, vs) = check(x, cu_seqlens, block_size, partial)?;
    let dtype = x.k.dtype();
    check_out("k_cmp", k_cmp, &ks, dtype)?;
    let v_cmp = match (vs, v_cmp) {
        (Some(s), Some(o)) => {
            check_out("v_cmp", o, &s, dtype)?;
            Some(o)
        }
        (None, None) => None,
        (Some(_), None) => return Err(Error::missing("v_cmp", "an output for v", "none").into()),
        (None, Some(_)) => return Err(Error::missing("v_cmp", "no output without v", "one").into()),
    };
    let (h, kd) = (x.k.shape()[2], x.k.shape()[3]);
    let vd = x.v.map_or(0, |v| v.shape()[3]);
    let total_rows = ks[0] * ks[1];
    if total_rows == 0 {
        return Ok(());
    }
    let (ck, cv) = (h * kd, h * vd);
    let cu = token_offsets(gpu, &layout.seqs, x.k.shape()[1])?;
    let cmp = prefix_offsets(gpu, layout.tc.iter().copied())?;
    // the widest vector dividing both column counts
    let vec = [8, 4, 2, 1]
        .into_iter()
        .find(|&w| w <= vmax(dtype) && ck % w == 0 && cv % w == 0)
        .unwrap_or(1);
    let acc = acc_dtype(dtype);
    // a side with a projection pools into an unrounded workspace, the other straight into its
    // output: still one pass over k and v
    let workspace = |cols: usize, w: Option<&DeviceTensor>| {
        w.map(|_| DeviceTensor::alloc(gpu, &[total_rows, cols], acc))
            .transpose()
    };
    let (mut k_ws, mut v_ws) = (workspace(ck, x.w_k)?, workspace(cv, x.w_v)?);
    let mut v_cmp = v_cmp;
    let k_out = match k_ws.as_mut() {
        Some(w) => w.ptr_mut(gpu),
        None => k_cmp.ptr_mut(gpu),
    };
    let v_out = match (v_ws.as_mut(), v_cmp.as_mut()) {
        (Some(w), _) => w.ptr_mut(gpu),
        (None, Some(o)) => o.ptr_mut(gpu),
        (None, None) => 0,
    };
    let args = CompressArgs {
        k: x.k.ptr(gpu),
        v: x.v.map_or(0, |v| v.ptr(gpu)),
        k_out,
        v_out,
        cu: cu.ptr(gpu),
        cmp: cmp.ptr(gpu),
        nseq: layout.seqs.len() as i64,
        ck: ck as i64,
        cv: cv as i64,
        bs: layout.bs as i64,
        rows: total_rows as i64,
        k_ws: k_ws.is_some() as i64,
        v_ws: v_ws.is_some() as i64,
    };
    let threads = (ck + cv).div_ceil(vec);
    let block = threads.next_multiple_of(32).min(256);
    let grid = (total_rows as u32, threads.div_ceil(block) as u32);
    let name = format!("nsa_compress_kv_v{vec}_{}", tag(dtype));
    gpu.launch(Module::NsaCompressKv, &name, grid, block as u32, &args)?;
    if let (Some(w), Some(pooled)) = (x.w_k, k_ws.as_ref()) {
        project(gpu, w, pooled, k_cmp, total_rows, h, kd)?;
    }
    if let (Some(w), Some(pooled), Some(out)) = (x.w_v, v_ws.as_ref(), v_cmp) {
        project(gpu, w, pooled, out, total_rows, h, vd)?;
    }
    Ok(())
}

/// `out[r, h, :] = pooled[r, h, :] · w[h]` for every row `r` and head `h` (`w` widened first).
fn project(
    gpu: &Gpu,
    w: &DeviceTensor,
    pooled: &DeviceTensor,
    out: &mut DeviceTensor,
    rows: usize,
    h: usize,
    d: usize,
) -> GpuResult<()> {
    let module = Module::NsaCompressKv;
    let w = widen_weight(gpu, module, w, pooled.dtype())?;
    let args = ProjectArgs {
        pooled: pooled.ptr(gpu),
        w: w.ptr(gpu),
        out: out.ptr_mut(gpu),
        rows: rows as i64,
        heads: h as i64,
        d: d as i64,
    };
    let name = format!("nsa_compress_project_{}", tag(out.dtype()));
    gpu.launch(
        module,
        &name,
        (rows.div_ceil(8) as u32, h as u32),
        128,
        &args,
    )
}

fn check_out(arg: &str, o: &DeviceTensor, shape: &[usize], dtype: Dtype) -> GpuResult<()> {
    if o.shape() != shape {
        return Err(Error::shape(arg, format!("{shape:?}"), o.shape()).into());
    }
    if o.dtype() != dtype {
        return Err(Error::dtype(arg, dtype.name(), o.dtype().name()).into());
    }
    Ok(())
}
