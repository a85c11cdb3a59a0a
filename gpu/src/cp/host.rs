//! Whole host inputs through a context-parallel op in one call: partition
//! ([`Partition::balanced`], the call's chunk size), scatter, run, gather. What
//! `attn-conform verify --gpus N` and `attn_conform.reference(..., gpus=N)` run, for a caller
//! that holds the whole input on the host and wants the whole output back.
//!
//! Inputs are `[B, T, ...]` as for the single-GPU ops: with `cu_seqlens` (`B = 1`) the packed
//! varlen tokens are partitioned as they are; without it the `B` sequences of `T` tokens are
//! packed into `[1, B·T, ...]` with `cu_seqlens = [0, T, 2T, …]` (the reference's batch
//! semantics: one sequence per batch row) and the outputs are unpacked back to `[B, ...]`.

use super::comm::CpGroup;
use super::partition::Partition;
use super::run::{cp_chunk_gated_delta_rule_fwd_h, cp_gdn_fwd, cp_kda_fwd};
use super::shard::{gather_final_states, gather_tokens, scatter_states, scatter_tokens};
use crate::delta::forward::{DeltaFwdDeviceOutputs, ForwardPath, ForwardTensors};
use crate::delta::fwd_h::FwdHTensors;
use crate::error::GpuResult;
use crate::tensor::DeviceTensor;
use attn_reference::delta::{FwdHParams, GdnFwdParams, KdaFwdParams};
use attn_reference::{Dtype, Error};
use half::{bf16, f16};
use ndarray::{ArrayD, CowArray, IxDyn};

/// A host array of one of the float device dtypes, borrowed or owned.
#[derive(Debug, Clone)]
pub enum HostTensor<'a> {
    F64(CowArray<'a, f64, IxDyn>),
    F32(CowArray<'a, f32, IxDyn>),
    BF16(CowArray<'a, bf16, IxDyn>),
    F16(CowArray<'a, f16, IxDyn>),
}

/// `$body` with `$a` bound to the array of any [`HostTensor`] variant.
macro_rules! each {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            HostTensor::F64($a) => $body,
            HostTensor::F32($a) => $body,
            HostTensor::BF16($a) => $body,
            HostTensor::F16($a) => $body,
        }
    };
}

impl HostTensor<'_> {
    pub fn shape(&self) -> &[usize] {
        each!(self, a => a.shape())
    }

    pub fn dtype(&self) -> Dtype {
        match self {
            HostTensor::F64(_) => Dtype::F64,
            HostTensor::F32(_) => Dtype::F32,
            HostTensor::BF16(_) => Dtype::BF16,
            HostTensor::F16(_) => Dtype::F16,
        }
    }

    /// The same elements (row-major) under `shape`, borrowed where the layout allows.
    fn reshaped(&self, arg: &str, shape: &[usize]) -> GpuResult<HostTensor<'_>> {
        let bad = |e: ndarray::ShapeError| Error::shape(arg, format!("{shape:?}"), e.to_string());
        let s = shape.to_vec();
        Ok(match self {
            HostTensor::F64(a) => HostTensor::F64(a.to_shape(s).map_err(bad)?),
            HostTensor::F32(a) => HostTensor::F32(a.to_shape(s).map_err(bad)?),
            HostTensor::BF16(a) => HostTensor::BF16(a.to_shape(s).map_err(bad)?),
            HostTensor::F16(a) => HostTensor::F16(a.to_shape(s).map_err(bad)?),
        })
    }

    /// The same tensor owning its elements.
    fn owned(self) -> HostTensor<'static> {
        match self {
            HostTensor::F64(a) => a.into_owned().into(),
            HostTensor::F32(a) => a.into_owned().into(),
            HostTensor::BF16(a) => a.into_owned().into(),
            HostTensor::F16(a) => a.into_owned().into(),
        }
    }
}

macro_rules! from_array {
    ($t:ty, $v:ident) => {
        impl From<ArrayD<$t>> for HostTensor<'static> {
            fn from(a: ArrayD<$t>) -> Self {
                HostTensor::$v(a.into())
            }
        }
    };
}
from_array!(f64, F64);
from_array!(f32, F32);
from_array!(bf16, BF16);
from_array!(f16, F16);

/// The whole inputs of `kda_fwd` / `gdn_fwd` on the host (the single-GPU op's layouts).
#[derive(Debug, Clone)]
pub struct HostForwardInputs<'a> {
    pub q: HostTensor<'a>,
    pub k: HostTensor<'a>,
    pub v: HostTensor<'a>,
    pub g: HostTensor<'a>,
    pub beta: HostTensor<'a>,
    /// `[N, ...]`, one row per sequence.
    pub initial_state: Option<HostTensor<'a>>,
    pub a_log: Option<HostTensor<'a>>,
    pub dt_bias: Option<HostTensor<'a>>,
    pub cu_seqlens: Option<&'a [i64]>,
}

/// The whole outputs of a forward: `o` `[B, T, HV, V]` and, with `output_final_state`, the
/// final states `[N, ...]`.
#[derive(Debug, Clone)]
pub struct HostForwardOutputs {
    pub o: HostTensor<'static>,
    pub final_state: Option<HostTensor<'static>>,
}

/// The whole inputs of `chunk_gated_delta_rule_fwd_h` on the host.
#[derive(Debug, Clone)]
pub struct HostFwdHInputs<'a> {
    pub k: HostTensor<'a>,
    pub w: HostTensor<'a>,
    pub u: HostTensor<'a>,
    pub g: Option<HostTensor<'a>>,
    pub gk: Option<HostTensor<'a>>,
    pub initial_state: Option<HostTensor<'a>>,
    pub cu_seqlens: Option<&'a [i64]>,
}

/// The whole outputs of `chunk_gated_delta_rule_fwd_h`: `h` of every chunk, `v_new` (with
/// `save_new_value`), the final states (with `output_final_state`).
#[derive(Debug, Clone)]
pub struct HostFwdHOutputs {
    pub h: HostTensor<'static>,
    pub v_new: Option<HostTensor<'static>>,
    pub final_state: Option<HostTensor<'static>>,
}

/// Which forward runs, with its parameters.
#[derive(Debug, Clone, Copy)]
pub enum CpForward {
    Kda(KdaFwdParams),
    Gdn(GdnFwdParams),
}

impl CpForward {
    fn chunk_size(&self) -> i64 {
        match self {
            CpForward::Kda(p) => p.chunk_size,
            CpForward::Gdn(p) => p.chunk_size,
        }
    }
}

/// How a call's `[B, T, ...]` tokens are packed: the sequences' `cu_seqlens` over `[1, B·T]`.
struct Packing {
    b: usize,
    t: usize,
    cu: Vec<i64>,
}

impl Packing {
    /// Checks that every token tensor of `named` (the first gives `B`, `T`) is `[B, T, ...]`,
    /// and `B = 1` under `cu_seqlens`.
    fn of(named: &[(&str, &HostTensor<'_>)], cu_seqlens: Option<&[i64]>) -> GpuResult<Packing> {
        let Some(&(first, t0)) = named.first() else {
            return Err(Error::missing("inputs", "the token tensors", "none").into());
        };
        let s = t0.shape();
        if s.len() < 3 {
            return Err(Error::shape(first, "[B, T, ...]", s).into());
        }
        let (b, t) = (s[0], s[1]);
        for &(arg, x) in named {
            let xs = x.shape();
            if xs.len() < 3 || xs[0] != b || xs[1] != t {
                return Err(Error::shape(
                    arg,
                    format!("[{b}, {t}, ...] (the batch and tokens of {first})"),
                    xs,
                )
                .into());
            }
        }
        let cu = match cu_seqlens {
            Some(cu) if b != 1 => {
                return Err(Error::shape(
                    first,
                    format!("[1, T, ...] with cu_seqlens ({} entries)", cu.len()),
                    s,
                )
                .into())
            }
            Some(cu) => cu.to_vec(),
            None => (0..=b).map(|i| (i * t) as i64).collect(),
        };
        Ok(Packing { b, t, cu })
    }

    /// `x` (`[B, T, ...]`) as packed tokens `[1, B·T, ...]`.
    fn pack<'x>(&self, arg: &str, x: &'x HostTensor<'_>) -> GpuResult<HostTensor<'x>> {
        let mut shape = x.shape().to_vec();
        shape[0] = 1;
        shape[1] = self.b * self.t;
        x.reshaped(arg, &shape)
    }

    /// A gathered `[1, B·R, ...]` (tokens or chunks) back to `[B, R, ...]`.
    fn unpack(&self, arg: &str, x: HostTensor<'static>) -> GpuResult<HostTensor<'static>> {
        if self.b == 1 {
            return Ok(x);
        }
        let mut shape = x.shape().to_vec();
        if shape.len() < 2 {
            return Err(Error::shape(arg, "[1, rows, ...]", shape).into());
        }
        shape[1] /= self.b.max(1);
        shape[0] = self.b;
        Ok(x.reshaped(arg, &shape)?.owned())
    }

    /// The balanced partition of the packed tokens over the group's ranks.
    fn partition(
        &self,
        group: &CpGroup,
        chunk_size: i64,
        min_piece_chunks: usize,
    ) -> GpuResult<Partition> {
        let bt = usize::try_from(chunk_size)
            .map_err(|_| Error::param("chunk_size", "a positive chunk size", chunk_size))?;
        Ok(Partition::balanced(
            &self.cu,
            bt,
            group.world(),
            min_piece_chunks,
        )?)
    }
}

/// Rank-by-rank shards of the packed token tensor `x`.
fn scatter(
    group: &CpGroup,
    part: &Partition,
    pk: &Packing,
    arg: &str,
    x: &HostTensor<'_>,
) -> GpuResult<Vec<DeviceTensor>> {
    let packed = pk.pack(arg, x)?;
    each!(&packed, a => scatter_tokens(group, part, arg, a.view()))
}

/// Rank-by-rank state rows of `x` (`[N, ...]`).
fn scatter_rows(
    group: &CpGroup,
    part: &Partition,
    arg: &str,
    x: Option<&HostTensor<'_>>,
) -> GpuResult<Option<Vec<DeviceTensor>>> {
    x.map(|x| each!(x, a => scatter_states(group, part, arg, a.view())))
        .transpose()
}

/// `x` whole on every local rank.
fn broadcast(group: &CpGroup, x: Option<&HostTensor<'_>>) -> GpuResult<Option<Vec<DeviceTensor>>> {
    x.map(|x| {
        group
            .ranks()
            .map(|(_, gpu)| each!(x, a => DeviceTensor::from_array(gpu, a.view())))
            .collect()
    })
    .transpose()
}

/// The host copy of an output gathered from its shards, in the shards' dtype: concatenated
/// along axis 1 (`tokens`: `o`, `v_new`, `h`) or as the sequences' final states.
fn gather(
    group: &CpGroup,
    part: &Partition,
    arg: &str,
    shards: &[&DeviceTensor],
    tokens: bool,
) -> GpuResult<HostTensor<'static>> {
    fn one<T: crate::tensor::HostElem>(
        group: &CpGroup,
        part: &Partition,
        arg: &str,
        shards: &[&DeviceTensor],
        tokens: bool,
    ) -> GpuResult<ArrayD<T>> {
        if tokens {
            gather_tokens(group, arg, shards)
        } else {
            gather_final_states(group, part, shards)
        }
    }
    let dtype = shards.first().map_or(Dtype::F32, |t| t.dtype());
    Ok(match dtype {
        Dtype::F64 => one::<f64>(group, part, arg, shards, tokens)?.into(),
        Dtype::F32 => one::<f32>(group, part, arg, shards, tokens)?.into(),
        Dtype::BF16 => one::<bf16>(group, part, arg, shards, tokens)?.into(),
        Dtype::F16 => one::<f16>(group, part, arg, shards, tokens)?.into(),
        other => return Err(Error::dtype(arg, "a float dtype", other.name()).into()),
    })
}

/// The per-rank optional outputs `f` of `outs`, when every rank has one.
fn all_some<'o, O>(
    outs: &'o [O],
    f: impl Fn(&'o O) -> Option<&'o DeviceTensor>,
) -> Option<Vec<&'o DeviceTensor>> {
    outs.iter().map(f).collect()
}

/// `kda_fwd` / `gdn_fwd` of the whole host input over the group's ranks (every rank local: the
/// single-process group of [`CpGroup::open`]): partitions the packed tokens by
/// [`Partition::balanced`] at the op's chunk size with `min_piece_chunks`, scatters, runs
/// [`cp_kda_fwd`] / [`cp_gdn_fwd`] and gathers `o` and the final states. Errors name the
/// argument (shapes, `cu_seqlens`, `chunk_size`, dtypes) before any launch.
pub fn cp_forward_host(
    group: &CpGroup,
    x: &HostForwardInputs<'_>,
    op: CpForward,
    min_piece_chunks: usize,
    path: ForwardPath,
) -> GpuResult<HostForwardOutputs> {
    let tokens = [
        ("q", &x.q),
        ("k", &x.k),
        ("v", &x.v),
        ("g", &x.g),
        ("beta", &x.beta),
    ];
    let pk = Packing::of(&tokens, x.cu_seqlens)?;
    let part = pk.partition(group, op.chunk_size(), min_piece_chunks)?;
    let sh = tokens
        .iter()
        .map(|&(arg, t)| scatter(group, &part, &pk, arg, t))
        .collect::<GpuResult<Vec<_>>>()?;
    let h0 = scatter_rows(group, &part, "initial_state", x.initial_state.as_ref())?;
    let a_log = broadcast(group, x.a_log.as_ref())?;
    let dt_bias = broadcast(group, x.dt_bias.as_ref())?;
    let shards: Vec<ForwardTensors<'_>> = (0..group.local_ranks().len())
        .map(|i| ForwardTensors {
            initial_state: h0.as_ref().map(|h| &h[i]),
            a_log: a_log.as_ref().map(|a| &a[i]),
            dt_bias: dt_bias.as_ref().map(|a| &a[i]),
            ..ForwardTensors::new(&sh[0][i], &sh[1][i], &sh[2][i], &sh[3][i], &sh[4][i])
        })
        .collect();
    let outs: Vec<DeltaFwdDeviceOutputs> = match op {
        CpForward::Kda(p) => cp_kda_fwd(group, &part, &shards, &p, path)?,
        CpForward::Gdn(p) => cp_gdn_fwd(group, &part, &shards, &p, path)?,
    };
    let o: Vec<&DeviceTensor> = outs.iter().map(|o| &o.o).collect();
    let o = pk.unpack("o", gather(group, &part, "o", &o, true)?)?;
    let final_state = all_some(&outs, |o| o.final_state.as_ref())
        .map(|f| gather(group, &part, "final_state", &f, false))
        .transpose()?;
    Ok(HostForwardOutputs { o, final_state })
}

/// `chunk_gated_delta_rule_fwd_h` of the whole host input over the group's ranks, as
/// [`cp_forward_host`] ([`cp_chunk_gated_delta_rule_fwd_h`]): `h` gathered by chunks, `v_new`
/// by tokens, the final states by sequence.
pub fn cp_fwd_h_host(
    group: &CpGroup,
    x: &HostFwdHInputs<'_>,
    params: &FwdHParams,
    min_piece_chunks: usize,
) -> GpuResult<HostFwdHOutputs> {
    let mut tokens = vec![("k", &x.k), ("w", &x.w), ("u", &x.u)];
    tokens.extend(x.g.as_ref().map(|g| ("g", g)));
    tokens.extend(x.gk.as_ref().map(|g| ("gk", g)));
    let pk = Packing::of(&tokens, x.cu_seqlens)?;
    let part = pk.partition(group, params.chunk_size, min_piece_chunks)?;
    let sc = |arg: &str, t: &HostTensor<'_>| scatter(group, &part, &pk, arg, t);
    let (k, w, u) = (sc("k", &x.k)?, sc("w", &x.w)?, sc("u", &x.u)?);
    let g = x.g.as_ref().map(|t| sc("g", t)).transpose()?;
    let gk = x.gk.as_ref().map(|t| sc("gk", t)).transpose()?;
    let h0 = scatter_rows(group, &part, "initial_state", x.initial_state.as_ref())?;
    let shards: Vec<FwdHTensors<'_>> = (0..group.local_ranks().len())
        .map(|i| FwdHTensors {
            g: g.as_ref().map(|t| &t[i]),
            gk: gk.as_ref().map(|t| &t[i]),
            initial_state: h0.as_ref().map(|t| &t[i]),
            ..FwdHTensors::new(&k[i], &w[i], &u[i])
        })
        .collect();
    let outs = cp_chunk_gated_delta_rule_fwd_h(group, &part, &shards, params)?;
    let h: Vec<&DeviceTensor> = outs.iter().map(|o| &o.h).collect();
    let h = pk.unpack("h", gather(group, &part, "h", &h, true)?)?;
    let v_new = all_some(&outs, |o| o.v_new.as_ref())
        .map(|v| pk.unpack("v_new", gather(group, &part, "v_new", &v, true)?))
        .transpose()?;
    let final_state = all_some(&outs, |o| o.final_state.as_ref())
        .map(|f| gather(group, &part, "final_state", &f, false))
        .transpose()?;
    Ok(HostFwdHOutputs {
        h,
        v_new,
        final_state,
    })
}
