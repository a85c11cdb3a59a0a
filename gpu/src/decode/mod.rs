//! Decoding against a static KV cache on the GPU (`conformance/spec/ops-decode.md`):
//! `kv_cache_update`, `decode_attention` (split-KV flash-decoding), and the fused step (update then
//! attention in one launch).
//!
//! The caches are allocated once at their full length `S`. `cache_seqlens` (int32 `[B]`,
//! the valid length of each row before this step's tokens) and `cache_batch_idx` (int32 `[B]`,
//! optional) stay in device memory: the grid and the kernel arguments depend on the shapes and
//! the device only, so one captured CUDA graph ([`crate::graph`]) serves every step while the
//! lengths advance on the device. The kernels read only each row's valid prefix.
//!
//! Math (batch row `b`, cache row `r = cache_batch_idx[b]`, `n` valid keys, query `i` of
//! `L_q`, head `h`, KV head `h / (H / H_kv)`): visible keys `j < n` (and `j <= n - L_q + i`
//! when causal), `s_j = softmax_scale · q·k_j`, `o = Σ_j softmax(s)_j v_j`,
//! `lse = log Σ_j exp(s_j)` (float32); no visible key gives `o = 0`, `lse = -inf`.
//!
//! Shapes and dtypes are checked on the host before any launch ([`check`], typed errors naming
//! the argument). Values of `cache_seqlens` / `cache_batch_idx` out of range are refused by the
//! kernels through the device flag ([`DecodeFlag`]): checked on demand, and by the allocating
//! wrappers when the GPU handle is checked.

mod args;
pub mod check;
pub mod timeline;
mod workspace;

pub use attn_reference::decode::CacheLayout;
pub use check::DecodeShape;
pub use workspace::{flag_error, split_plan, DecodeFlag, DecodeWorkspace, MAX_SPLITS};

use crate::device::Gpu;
use crate::error::GpuResult;
use crate::kernels::Module;
use crate::knobs;
use crate::params::tag;
use crate::tensor::DeviceTensor;
use args::{DecodeArgs, UpdateArgs};
use attn_reference::{Dtype, Error};
use check::{check_attention_shapes, check_kv_cache_update, check_rows, Meta};

/// A static KV cache: `k` and `v` in `layout` (`[B_cache, S, H_kv, D]` or `[B_cache, H_kv, S, D]`).
#[derive(Debug)]
pub struct KvCache {
    pub k: DeviceTensor,
    pub v: DeviceTensor,
    pub layout: CacheLayout,
}

/// Which cache row each batch row uses and how long its valid prefix is (device memory).
#[derive(Clone, Copy)]
pub struct CacheRows<'a> {
    /// int32 `[B]`.
    pub cache_seqlens: &'a DeviceTensor,
    /// int32 `[B]`, distinct values in `0 .. B_cache`; `None`: row `b` uses cache row `b`.
    pub cache_batch_idx: Option<&'a DeviceTensor>,
}

/// This step's new tokens `[B, L_new, H_kv, D]`.
#[derive(Clone, Copy)]
pub struct NewTokens<'a> {
    pub k: &'a DeviceTensor,
    pub v: &'a DeviceTensor,
}

/// Parameters of `decode_attention`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeParams {
    /// `None`: `1 / sqrt(D)`. Must be finite.
    pub softmax_scale: Option<f64>,
    /// Bottom-right causal alignment for `L_q > 1`.
    pub causal: bool,
}

impl Default for DecodeParams {
    fn default() -> Self {
        DecodeParams {
            softmax_scale: None,
            causal: true,
        }
    }
}

/// Outputs of `decode_attention`: `o` `[B, L_q, H, D]` in `q`'s dtype, `lse` float32
/// `[B, H, L_q]`.
#[derive(Debug)]
pub struct DecodeOutputs {
    pub o: DeviceTensor,
    pub lse: DeviceTensor,
}

impl DecodeOutputs {
    /// Uninitialised outputs for `shape` (from [`check::check_attention_shapes`]).
    pub fn alloc(gpu: &Gpu, shape: &DecodeShape) -> GpuResult<DecodeOutputs> {
        Ok(DecodeOutputs {
            o: DeviceTensor::alloc(gpu, &[shape.b, shape.l, shape.h, shape.d], shape.dtype)?,
            lse: DeviceTensor::alloc(gpu, &[shape.b, shape.h, shape.l], Dtype::F32)?,
        })
    }
}

fn meta(t: &DeviceTensor) -> Meta<'_> {
    (t.shape(), t.dtype())
}

fn rows_meta<'a>(rows: &CacheRows<'a>) -> (Meta<'a>, Option<Meta<'a>>) {
    (meta(rows.cache_seqlens), rows.cache_batch_idx.map(meta))
}

/// `kv_cache_update`: writes `new` into both caches at `cache_seqlens[b] .. + L_new` of
/// cache row `cache_batch_idx[b]`, bit for bit; every other position is untouched. A row
/// whose values are out of range is skipped and sets its bit of `flag`.
pub fn kv_cache_update(
    gpu: &Gpu,
    cache: &mut KvCache,
    new: NewTokens<'_>,
    rows: CacheRows<'_>,
    flag: &mut DecodeFlag,
) -> GpuResult<()> {
    let (sl, idx) = rows_meta(&rows);
    let shape = check_kv_cache_update(
        meta(&cache.k),
        meta(&cache.v),
        meta(new.k),
        meta(new.v),
        sl,
        idx,
        cache.layout,
    )?;
    if shape.b == 0 || shape.l == 0 || shape.d == 0 || shape.h_kv == 0 {
        return Ok(());
    }
    let esize = shape.dtype.size_bytes();
    let row_bytes = shape.d * esize;
    let vb = [16, 8, 4, 2]
        .into_iter()
        .find(|&w| row_bytes % w == 0)
        .unwrap_or(2);
    let (sb, sh, ss) = shape.strides();
    let args = UpdateArgs {
        k_cache: cache.k.ptr_mut(gpu),
        v_cache: cache.v.ptr_mut(gpu),
        k: new.k.ptr(gpu),
        v: new.v.ptr(gpu),
        seqlens: rows.cache_seqlens.ptr(gpu),
        batch_idx: rows.cache_batch_idx.map_or(0, |t| t.ptr(gpu)),
        flag: flag.ptr(gpu),
        l_new: shape.l as i64,
        h_kv: shape.h_kv as i64,
        d: shape.d as i64,
        s: shape.s as i64,
        b_cache: shape.b_cache as i64,
        stride_b: sb as i64,
        stride_h: sh as i64,
        stride_s: ss as i64,
        esize: esize as i64,
    };
    let pieces = shape.l * shape.h_kv * row_bytes / vb;
    let gx = pieces.div_ceil(256).clamp(1, 65_535) as u32;
    let name = format!("kv_cache_update_b{vb}");
    gpu.launch(
        Module::KvCacheUpdate,
        &name,
        (gx, shape.b as u32),
        256,
        &args,
    )
}

/// Threads of a `decode_attention` block (`DECODE_THREADS`).
const DECODE_THREADS: usize = 128;
/// The least rows per pass whose kernels use the cp.async ring (`DECODE_RING_ROWS` of
/// `decode_attention.cu`; the knob passes the same value to NVRTC).
const DECODE_RING_ROWS: usize = 4;
/// A ring slot's bytes above which the ring has 2 slots instead of 3 (`DECODE_RING_SLOT_MAX`).
const DECODE_RING_SLOT_MAX: usize = 16384;

/// The attention kernel for `shape` (padded head dim `DP`, elements per load `W`, rows per pass
/// `RB`) and its dynamic shared memory: the cp.async ring of 3 slots (2 above
/// `DECODE_RING_SLOT_MAX`), each `2 U NV` 16-byte pieces per thread (`U` keys per lane group per
/// step: 2 at 8 rows, else 4; `NV` pieces per lane: `DP / W` pieces a key over at most 32
/// lanes); none for pieces narrower than 16 bytes or fewer rows than `DECODE_RING_ROWS`.
fn attention_kernel(shape: &DecodeShape) -> (String, u32) {
    let esize = shape.dtype.size_bytes();
    let width = 16 / esize;
    let (dp, w) = match shape.d {
        d if d % width != 0 => (256, 1),
        d if d <= 64 => (64, width),
        d if d <= 128 => (128, width),
        _ => (256, width),
    };
    let rows = shape.h / shape.h_kv * shape.l;
    // fp64 kernels hold at most 4 rows per pass (their shared memory)
    let most = if shape.dtype == Dtype::F64 { 4 } else { 8 };
    let rb = [1, 2, 4, 8]
        .into_iter()
        .find(|&r| r >= rows.min(most))
        .unwrap_or(most);
    let ring_rows = knobs::decode_ring_rows().unwrap_or(DECODE_RING_ROWS);
    let ring = if w * esize == 16 && rb >= ring_rows {
        let u = if rb >= 8 { 2 } else { 4 };
        let pieces = dp / w;
        let nv = pieces / pieces.min(32);
        let slot = 2 * u * nv * DECODE_THREADS * 16;
        slot * if slot <= DECODE_RING_SLOT_MAX { 3 } else { 2 }
    } else {
        0
    };
    let name = format!("decode_attention_{}_d{dp}_w{w}_r{rb}", tag(shape.dtype));
    (name, ring as u32)
}

/// Checks that `q`, the caches, the rows and the outputs match the workspace's geometry.
fn check_attention(
    q: &DeviceTensor,
    cache: &KvCache,
    rows: &CacheRows<'_>,
    ws: &DecodeWorkspace,
    out: &DecodeOutputs,
) -> GpuResult<DecodeShape> {
    let shape = check_attention_shapes(meta(q), meta(&cache.k), meta(&cache.v), cache.layout)?;
    let (sl, idx) = rows_meta(rows);
    check_rows(shape.b, sl, idx)?;
    if shape != ws.shape {
        return Err(Error::shape(
            "workspace",
            format!("a workspace made for {:?}", shape),
            format!("{:?}", ws.shape),
        )
        .into());
    }
    let o_shape = [shape.b, shape.l, shape.h, shape.d];
    if out.o.shape() != o_shape || out.o.dtype() != shape.dtype {
        return Err(Error::shape(
            "o",
            format!("{o_shape:?} of {}", shape.dtype),
            out.o.shape(),
        )
        .into());
    }
    let lse_shape = [shape.b, shape.h, shape.l];
    if out.lse.shape() != lse_shape || out.lse.dtype() != Dtype::F32 {
        return Err(Error::shape("lse", format!("float32 {lse_shape:?}"), out.lse.shape()).into());
    }
    Ok(shape)
}

/// The attention launch, with or without this step's new tokens (`new`: the fused step).
#[allow(clippy::too_many_arguments)]
fn launch_attention(
    gpu: &Gpu,
    q: &DeviceTensor,
    cache: &KvCache,
    cache_ptrs: (u64, u64),
    new: Option<NewTokens<'_>>,
    rows: CacheRows<'_>,
    params: &DecodeParams,
    ws: &mut DecodeWorkspace,
    out: &mut DecodeOutputs,
) -> GpuResult<()> {
    let shape = check_attention(q, cache, &rows, ws, out)?;
    let l_new = match new {
        Some(t) => {
            let (sl, idx) = rows_meta(&rows);
            let u = check_kv_cache_update(
                meta(&cache.k),
                meta(&cache.v),
                meta(t.k),
                meta(t.v),
                sl,
                idx,
                cache.layout,
            )?;
            u.l
        }
        None => 0,
    };
    let scale = params
        .softmax_scale
        .unwrap_or(1.0 / (shape.d.max(1) as f64).sqrt());
    if !scale.is_finite() {
        return Err(Error::param("softmax_scale", "a finite value", scale).into());
    }
    if shape.b == 0 || shape.h == 0 || shape.l == 0 {
        return Ok(());
    }
    let (sb, sh, ss) = shape.strides();
    let (nsplit, chunk) = (ws.nsplit, ws.chunk);
    let (part_o, part_lse, counters, flag) = ws.ptrs(gpu);
    let args = DecodeArgs {
        q: q.ptr(gpu),
        k_cache: cache_ptrs.0,
        v_cache: cache_ptrs.1,
        k_new: new.map_or(0, |t| t.k.ptr(gpu)),
        v_new: new.map_or(0, |t| t.v.ptr(gpu)),
        seqlens: rows.cache_seqlens.ptr(gpu),
        batch_idx: rows.cache_batch_idx.map_or(0, |t| t.ptr(gpu)),
        o: out.o.ptr_mut(gpu),
        lse: out.lse.ptr_mut(gpu),
        part_o,
        part_lse,
        counters,
        flag,
        lq: shape.l as i64,
        h: shape.h as i64,
        h_kv: shape.h_kv as i64,
        d: shape.d as i64,
        s: shape.s as i64,
        b_cache: shape.b_cache as i64,
        l_new: l_new as i64,
        stride_b: sb as i64,
        stride_h: sh as i64,
        stride_s: ss as i64,
        chunk: chunk as i64,
        nsplit: nsplit as i64,
        causal: params.causal as i64,
        scale_log2: scale * std::f64::consts::LOG2_E,
    };
    let grid = (nsplit as u32, shape.h_kv as u32, shape.b as u32);
    let (kernel, ring) = attention_kernel(&shape);
    gpu.launch_3d(
        Module::DecodeAttention,
        &kernel,
        grid,
        DECODE_THREADS as u32,
        ring,
        &args,
    )
}

/// `decode_attention` into `out` with the workspace `ws` (made for these shapes): one launch
/// whose grid and arguments never depend on the lengths (graph-capturable).
pub fn decode_attention_into(
    gpu: &Gpu,
    q: &DeviceTensor,
    cache: &KvCache,
    rows: CacheRows<'_>,
    params: &DecodeParams,
    ws: &mut DecodeWorkspace,
    out: &mut DecodeOutputs,
) -> GpuResult<()> {
    // read only: the kernel writes the caches only in the fused step
    let ptrs = (cache.k.ptr(gpu), cache.v.ptr(gpu));
    launch_attention(gpu, q, cache, ptrs, None, rows, params, ws, out)
}

/// The fused decode step in one launch: `kv_cache_update(cache, new, rows)` then
/// `decode_attention(q, cache)` over `cache_seqlens[b] + L_new` keys. `cache_seqlens` holds the
/// lengths before the step (the host or a later kernel advances them).
#[allow(clippy::too_many_arguments)]
pub fn decode_step(
    gpu: &Gpu,
    q: &DeviceTensor,
    new: NewTokens<'_>,
    cache: &mut KvCache,
    rows: CacheRows<'_>,
    params: &DecodeParams,
    ws: &mut DecodeWorkspace,
    out: &mut DecodeOutputs,
) -> GpuResult<()> {
    let ptrs = (cache.k.ptr_mut(gpu), cache.v.ptr_mut(gpu));
    launch_attention(gpu, q, cache, ptrs, Some(new), rows, params, ws, out)
}

/// `decode_attention` into new tensors with a fresh workspace; when `gpu` is checked, the
/// device flag is read too (a refused row becomes a typed error).
pub fn decode_attention(
    gpu: &Gpu,
    q: &DeviceTensor,
    cache: &KvCache,
    rows: CacheRows<'_>,
    params: &DecodeParams,
) -> GpuResult<DecodeOutputs> {
    let shape = check_attention_shapes(meta(q), meta(&cache.k), meta(&cache.v), cache.layout)?;
    let mut ws = DecodeWorkspace::new(gpu, shape)?;
    let mut out = DecodeOutputs::alloc(gpu, &shape)?;
    decode_attention_into(gpu, q, cache, rows, params, &mut ws, &mut out)?;
    if gpu.is_checked() {
        ws.flag().check(gpu)?;
    }
    Ok(out)
}
