//! `cumsum` on the GPU (`conformance/spec/ops-cumsum.md` §1): `y[.., i, ..] = Σ_{j ≤ i} x[.., j,
//! ..]` along `dim` (`j ≥ i` when `reverse`), accumulated in fp32 (fp64 when fp64 is involved) and
//! rounded once to the output dtype.
//!
//! With the plan `(outer, len, inner)` of [`attn_reference::cumsum::validate_cumsum`], one
//! kernel per call:
//! - `inner == 1`, many rows of moderate length: one warp per row (`cumsum_rows_*`);
//! - `inner == 1`, long rows or few rows: tiles chained by a deterministic single-pass
//!   look-back (`cumsum_lookback_*`), which also scans one lane of 10^8+ elements;
//! - `inner > 1` (scan axis in the middle or outermost): one thread per group of adjacent lanes
//!   (up to 16 bytes), walking the scan axis with loads in flight (`cumsum_strided_*`); with too
//!   few lanes to fill the GPU, a three-pass split (chunk totals, their running totals, chunk
//!   scans carried in).

use crate::device::Gpu;
use crate::error::GpuResult;
use crate::kernels::Module;
use crate::knobs;
use crate::params::{check_float, grid_for, scan_output_dtype, tag, vmax, GateArgs, RowArgs};
use crate::strided::{launch_strided, Jobs};
use crate::tensor::DeviceTensor;
use attn_reference::cumsum::{validate_cumsum, CumsumPlan};
use attn_reference::{Dtype, Error};

/// Warps per look-back tile (rows.cuh `LB_WARPS`).
const LB_WARPS: usize = 8;

/// Elements one warp of a look-back tile scans (`U * 32 * VEC`, rows.cuh `LbU`).
fn lookback_warp_elems(vec: usize, acc_f64: bool) -> usize {
    let row_u = if vec >= 8 { 4 } else { 8 };
    let u = knobs::lookback_u().unwrap_or(if acc_f64 { row_u } else { 2 * row_u });
    u * 32 * vec
}

/// Which kernel scans a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CumsumStrategy {
    /// `inner == 1`: one warp per row.
    Rows,
    /// `inner == 1`: tiles with a single-pass look-back.
    Lookback,
    /// `inner > 1`: a thread per group of adjacent lanes.
    Strided,
}

/// The strategy [`cumsum`] uses for `plan` on a GPU with `sm_count` multiprocessors.
pub fn strategy(plan: &CumsumPlan, sm_count: usize) -> CumsumStrategy {
    if plan.inner > 1 {
        CumsumStrategy::Strided
    } else if plan.len > 16384 || (plan.len > 1024 && plan.outer * 4 < sm_count * 64) {
        CumsumStrategy::Lookback
    } else {
        CumsumStrategy::Rows
    }
}

/// Validates a `cumsum` call from shapes and dtypes alone (no GPU needed): `x` holds floats,
/// `dim` is in range (the reference's rule), `y` has `x`'s shape and dtype float32, float64 or
/// `x`'s own.
pub fn check_cumsum(
    x_shape: &[usize],
    x_dtype: Dtype,
    dim: i64,
    y_shape: &[usize],
    y_dtype: Dtype,
) -> attn_reference::Result<CumsumPlan> {
    check_float("x", x_dtype)?;
    let plan = validate_cumsum(x_shape, dim)?;
    scan_output_dtype(x_dtype, Some(y_dtype))?;
    if y_shape != x_shape {
        return Err(Error::shape(
            "y",
            format!("the shape of x {x_shape:?}"),
            y_shape,
        ));
    }
    Ok(plan)
}

/// `cumsum(x, dim, reverse)` into a new tensor of `output_dtype` (`None`: `x`'s dtype).
pub fn cumsum(
    gpu: &Gpu,
    x: &DeviceTensor,
    dim: i64,
    reverse: bool,
    output_dtype: Option<Dtype>,
) -> GpuResult<DeviceTensor> {
    check_float("x", x.dtype())?;
    validate_cumsum(x.shape(), dim)?;
    let od = scan_output_dtype(x.dtype(), output_dtype)?;
    let mut y = DeviceTensor::alloc(gpu, x.shape(), od)?;
    cumsum_into(gpu, x, dim, reverse, &mut y)?;
    Ok(y)
}

/// `cumsum` written into `y` (same shape as `x`; dtype float32, float64 or `x`'s).
pub fn cumsum_into(
    gpu: &Gpu,
    x: &DeviceTensor,
    dim: i64,
    reverse: bool,
    y: &mut DeviceTensor,
) -> GpuResult<()> {
    let plan = check_cumsum(x.shape(), x.dtype(), dim, y.shape(), y.dtype())?;
    if x.numel() == 0 {
        return Ok(());
    }
    let pair = format!("{}_{}", tag(x.dtype()), tag(y.dtype()));
    // rows and look-back tiles: whole 16-byte vectors when the row length allows
    let vec = if plan.len % vmax(x.dtype()) == 0 {
        vmax(x.dtype())
    } else {
        1
    };
    let kind = if vec > 1 { "vec" } else { "scalar" };
    match strategy(&plan, gpu.sm_count()) {
        CumsumStrategy::Strided => launch_strided(
            gpu,
            Module::Cumsum,
            x,
            y,
            plan.inner,
            &Jobs::whole(plan.outer, plan.len),
            reverse,
            None,
            GateArgs::none(),
        ),
        CumsumStrategy::Rows => {
            let args = RowArgs {
                x: x.ptr(gpu),
                y: y.ptr_mut(gpu),
                rows: plan.outer as i64,
                len: plan.len as i64,
                reverse: reverse as i64,
                ..Default::default()
            };
            let name = format!("cumsum_rows_{kind}_{pair}");
            gpu.launch(
                Module::Cumsum,
                &name,
                (grid_for(plan.outer * 32), 1),
                256,
                &args,
            )
        }
        CumsumStrategy::Lookback => {
            let acc_f64 = x.dtype() == Dtype::F64 || y.dtype() == Dtype::F64;
            let tile = LB_WARPS * lookback_warp_elems(vec, acc_f64);
            let tiles_per_row = plan.len.div_ceil(tile);
            let tiles = plan.outer * tiles_per_row;
            if tiles > i32::MAX as usize {
                return Err(Error::shape("x", "fewer than 2^31 scan tiles", x.shape()).into());
            }
            // Status<Acc> entries are 16 bytes: tile, group and super-group aggregates and
            // hyper-group prefixes, each region `tiles` entries.
            let scratch = gpu.scratch(4 * tiles * 16)?;
            let status = {
                let buf = scratch.buf.as_ref().expect("scratch allocated");
                let (p, _g) = cudarc::driver::DevicePtr::device_ptr(buf, gpu.stream());
                p
            };
            let args = RowArgs {
                x: x.ptr(gpu),
                y: y.ptr_mut(gpu),
                rows: plan.outer as i64,
                len: plan.len as i64,
                reverse: reverse as i64,
                status,
                epoch: scratch.epoch as i64,
                tiles_per_row: tiles_per_row as i64,
            };
            let name = format!("cumsum_lookback_{kind}_{pair}");
            gpu.launch(Module::Cumsum, &name, (tiles as u32, 1), 256, &args)
        }
    }
}
