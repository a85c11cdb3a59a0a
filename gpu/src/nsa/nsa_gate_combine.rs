//! `nsa_gate_combine` on the GPU (`conformance/spec/ops-nsa.md` §6): per row `(b, t, hq)`,
//! `o = g_0 o_cmp + g_1 o_slc + g_2 o_swa` in fp32 (fp64 for fp64), cast once, and the gates
//! applied (`[B, T, HQ, 3]`, float32 as the spec has them; unrounded below fp64 data). Gates: W form
//! `g_c = sigmoid(sum_d q[d] W[hq, c, d])` (overflow-safe), G form the given `g_*` widened, U form
//! `1/3`. A warp per row; `W` (any float dtype) widened once per call. No kernel limits.

use super::{acc_dtype, check_rank, check_same_dtype, widen_weight};
use crate::device::Gpu;
use crate::error::GpuResult;
use crate::kernels::Module;
use crate::params::{check_float, dtype_code, tag, vmax};
use crate::tensor::DeviceTensor;
use attn_reference::{Dtype, Error};
use cudarc::driver::DeviceRepr;

/// Where the gates come from.
#[derive(Debug, Clone, Copy)]
pub enum GateForm<'a> {
    /// MSLK: `q` `[B, T, HQ, K]` (the outputs' dtype) and `gate_proj_weight` `[HQ, 3, K]`.
    W {
        q: &'a DeviceTensor,
        weight: &'a DeviceTensor,
    },
    /// FLA: `g_cmp`, `g_slc`, `g_swa` `[B, T, HQ]`, already activated (one float dtype).
    G {
        g_cmp: &'a DeviceTensor,
        g_slc: &'a DeviceTensor,
        g_swa: &'a DeviceTensor,
    },
    /// Ungated: `1/3` each.
    U,
}

/// The branch outputs `[B, T, HQ, V]` (one float dtype) and the gate form.
#[derive(Debug, Clone, Copy)]
pub struct CombineInputs<'a> {
    pub o_cmp: &'a DeviceTensor,
    pub o_slc: &'a DeviceTensor,
    pub o_swa: &'a DeviceTensor,
    pub gates: GateForm<'a>,
}

/// Mirror of `CombineArgs` (nsa_gate_combine.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct CombineArgs {
    o_cmp: u64,
    o_slc: u64,
    o_swa: u64,
    q: u64,
    w: u64,
    g_cmp: u64,
    g_slc: u64,
    g_swa: u64,
    o: u64,
    gates: u64,
    rows: i64,
    hq: i64,
    k: i64,
    v: i64,
    g_dtype: i64,
}
// SAFETY: plain `#[repr(C)]` data matching the kernel's struct.
unsafe impl DeviceRepr for CombineArgs {}

/// Validates a call; returns the shapes of `o` and `gates`.
fn check(x: &CombineInputs<'_>) -> GpuResult<(Vec<usize>, Vec<usize>)> {
    check_rank("o_cmp", x.o_cmp, 4, "[B, T, HQ, V]")?;
    let shape = x.o_cmp.shape();
    for (arg, t) in [("o_slc", x.o_slc), ("o_swa", x.o_swa)] {
        check_float(arg, t.dtype())?;
        if t.shape() != shape {
            return Err(
                Error::shape(arg, format!("the shape of o_cmp {shape:?}"), t.shape()).into(),
            );
        }
        check_same_dtype(arg, t, "o_cmp", x.o_cmp.dtype())?;
    }
    let bth = &shape[..3];
    match x.gates {
        GateForm::W { q, weight } => {
            check_rank("q", q, 4, "[B, T, HQ, K]")?;
            if &q.shape()[..3] != bth {
                return Err(Error::shape(
                    "q",
                    format!("[B, T, HQ, K] with [B, T, HQ] = {bth:?} of o_cmp"),
                    q.shape(),
                )
                .into());
            }
            check_same_dtype("q", q, "o_cmp", x.o_cmp.dtype())?;
            check_rank("gate_proj_weight", weight, 3, "[HQ, 3, K]")?;
            let want = [shape[2], 3, q.shape()[3]];
            if weight.shape() != want {
                return Err(Error::shape(
                    "gate_proj_weight",
                    format!("[HQ, 3, K] = {want:?}"),
                    weight.shape(),
                )
                .into());
            }
        }
        GateForm::G {
            g_cmp,
            g_slc,
            g_swa,
        } => {
            for (arg, g) in [("g_cmp", g_cmp), ("g_slc", g_slc), ("g_swa", g_swa)] {
                check_float(arg, g.dtype())?;
                if g.shape() != bth {
                    return Err(
                        Error::shape(arg, format!("[B, T, HQ] = {bth:?}"), g.shape()).into(),
                    );
                }
                check_same_dtype(arg, g, "g_cmp", g_cmp.dtype())?;
            }
        }
        GateForm::U => {}
    }
    let mut gates = bth.to_vec();
    gates.push(3);
    Ok((shape.to_vec(), gates))
}

/// `(o, gates) = nsa_gate_combine(o_cmp, o_slc, o_swa, gates)` into new tensors.
pub fn nsa_gate_combine(
    gpu: &Gpu,
    x: &CombineInputs<'_>,
) -> GpuResult<(DeviceTensor, DeviceTensor)> {
    let (os, gs) = check(x)?;
    let mut o = DeviceTensor::alloc(gpu, &os, x.o_cmp.dtype())?;
    let mut g = DeviceTensor::alloc(gpu, &gs, Dtype::F32)?;
    nsa_gate_combine_into(gpu, x, &mut o, &mut g)?;
    Ok((o, g))
}

/// [`nsa_gate_combine`] written into `o` (`o_cmp`'s shape and dtype) and `gates`
/// (`[B, T, HQ, 3]`, float32).
pub fn nsa_gate_combine_into(
    gpu: &Gpu,
    x: &CombineInputs<'_>,
    o: &mut DeviceTensor,
    gates: &mut DeviceTensor,
) -> GpuResult<()> {
    let (os, gs) = check(x)?;
    let dtype = x.o_cmp.dtype();
    let acc = acc_dtype(dtype);
    for (arg, t, shape, d) in [("o", &*o, &os, dtype), ("gates", &*gates, &gs, Dtype::F32)] {
        if t.shape() != shape.as_slice() {
            return Err(Error::shape(arg, format!("{shape:?}"), t.shape()).into());
        }
        if t.dtype() != d {
            return Err(Error::dtype(arg, d.name(), t.dtype().name()).into());
        }
    }
    let rows = os[0] * os[1] * os[2];
    if rows == 0 {
        return Ok(());
    }
    let v = os[3];
    let mut args = CombineArgs {
        o_cmp: x.o_cmp.ptr(gpu),
        o_slc: x.o_slc.ptr(gpu),
        o_swa: x.o_swa.ptr(gpu),
        o: o.ptr_mut(gpu),
        gates: gates.ptr_mut(gpu),
        rows: rows as i64,
        hq: os[2] as i64,
        v: v as i64,
        ..Default::default()
    };
    let module = Module::NsaGateCombine;
    let (form, k, _w) = match x.gates {
        GateForm::W { q, weight } => {
            let w = widen_weight(gpu, module, weight, acc)?;
            args.q = q.ptr(gpu);
            args.w = w.ptr(gpu);
            (0, q.shape()[3], Some(w))
        }
        GateForm::G {
            g_cmp,
            g_slc,
            g_swa,
        } => {
            args.g_cmp = g_cmp.ptr(gpu);
            args.g_slc = g_slc.ptr(gpu);
            args.g_swa = g_swa.ptr(gpu);
            args.g_dtype = dtype_code(g_cmp.dtype());
            (1, 0, None)
        }
        GateForm::U => (2, 0, None),
    };
    args.k = k as i64;
    // lanes own VEC adjacent features: the widest vector dividing K and V that still gives
    // every lane work on the longer of the two
    let vec = [8, 4, 2, 1]
        .into_iter()
        .find(|&w| w <= vmax(dtype) && k % w == 0 && v % w == 0 && 32 * w <= k.max(v))
        .unwrap_or(1);
    let warps = rows.min(gpu.sm_count() * 64);
    let name = format!("nsa_gate_combine_f{form}_v{vec}_{}", tag(dtype));
    gpu.launch(module, &name, ((warps.div_ceil(8)) as u32, 1), 256, &args)
}
