//! Input validation shared by the delta-rule ops (`conformance/spec/ops-delta-rule.md` §1.5):
//! shapes, heads, `K`, `chunk_size`, `cu_seqlens`, states, `scale`, and the dtype rules of section
//! 1.4.

use super::MAX_K;
use crate::dtype::{Dtype, DtypeClass};
use crate::error::{Error, ErrorKind, Result};
use crate::varlen::{self, Seq};

/// The validated geometry of a delta-rule call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    /// Batch rows `B`.
    pub b: usize,
    /// Tokens per batch row `T`.
    pub t: usize,
    /// Query/key heads `H`.
    pub h: usize,
    /// Value heads `HV` (a multiple of `H`).
    pub hv: usize,
    /// Key dimension `K` (`1 ..= 256`).
    pub k: usize,
    /// Value dimension `V` (`>= 1`).
    pub v: usize,
    /// Chunk size `BT`.
    pub bt: usize,
    /// The sequences (batch rows, or `cu_seqlens` ranges).
    pub seqs: Vec<Seq>,
}

impl Geometry {
    /// Number of sequences `N`.
    pub fn n(&self) -> usize {
        self.seqs.len()
    }
    /// Key head read by value head `hv`: `hv / (HV / H)` (a group of 1 when a hand-built
    /// geometry has `H = 0` or `HV < H`).
    pub fn kh(&self, hv: usize) -> usize {
        hv / (self.hv / self.h.max(1)).max(1)
    }
    /// `chunk_offsets[n]`: the global index of the first chunk of each sequence (varlen), or
    /// `c` within batch row `n` (non-varlen: every row restarts at 0).
    pub fn chunk_starts(&self, varlen: bool) -> Vec<usize> {
        if varlen {
            varlen::chunk_offsets(&self.seqs, self.bt)
        } else {
            vec![0; self.seqs.len() + 1]
        }
    }
    /// The `NT` extent of `h`: total chunks (varlen) or `ceil(T / BT)` (per batch row); `BT = 0`
    /// counts as 1, as in [`Seq::chunks`].
    pub fn nt(&self, varlen: bool) -> usize {
        if varlen {
            self.seqs.iter().map(|s| s.num_chunks(self.bt)).sum()
        } else {
            self.t.div_ceil(self.bt.max(1))
        }
    }
    /// The state shape `[N, HV, K, V]` (`[N, HV, V, K]` with `state_v_first`).
    pub fn state_shape(&self, state_v_first: bool) -> [usize; 4] {
        if state_v_first {
            [self.n(), self.hv, self.v, self.k]
        } else {
            [self.n(), self.hv, self.k, self.v]
        }
    }
}

/// `shape` must have `rank` dimensions.
pub(crate) fn rank(arg: &str, shape: &[usize], rank: usize) -> Result<()> {
    if shape.len() == rank {
        Ok(())
    } else {
        Err(Error::shape(arg, format!("a {rank}-D tensor"), shape))
    }
}

/// `shape` must equal `expected` (`desc` names the letters, e.g. `"[B, T, HV, K]"`).
pub(crate) fn exact(arg: &str, shape: &[usize], expected: &[usize], desc: &str) -> Result<()> {
    if shape == expected {
        Ok(())
    } else {
        Err(Error::shape(arg, format!("{desc} = {expected:?}"), shape))
    }
}

/// An extent that must be at least 1.
pub(crate) fn positive(arg: &str, letter: &str, shape: &[usize], value: usize) -> Result<()> {
    if value >= 1 {
        Ok(())
    } else {
        Err(Error::shape(arg, format!("{letter} >= 1"), shape))
    }
}

/// `K` in `1 ..= 256`.
pub(crate) fn key_dim(arg: &str, shape: &[usize], k: usize) -> Result<()> {
    positive(arg, "K", shape, k)?;
    if k > MAX_K {
        return Err(Error::shape(arg, format!("K <= {MAX_K}"), shape));
    }
    Ok(())
}

/// `HV >= 1` and `HV % H == 0`, `H` being the heads of `keys`.
fn heads(arg: &str, shape: &[usize], keys: (&str, &[usize]), h: usize, hv: usize) -> Result<()> {
    positive(arg, "HV", shape, hv)?;
    if hv % h != 0 {
        return Err(Error::shape(
            arg,
            format!(
                "HV a multiple of H = {h} (`{}` is [B, T, H, K] = {:?})",
                keys.0, keys.1
            ),
            shape,
        ));
    }
    Ok(())
}

/// `q`/`k`-style `[B, T, H, K]` tensor: returns `(B, T, H, K)` after checking `B, H, K`.
pub(crate) fn keys(arg: &str, shape: &[usize]) -> Result<(usize, usize, usize, usize)> {
    rank(arg, shape, 4)?;
    let (b, t, h, k) = (shape[0], shape[1], shape[2], shape[3]);
    positive(arg, "B", shape, b)?;
    positive(arg, "H", shape, h)?;
    key_dim(arg, shape, k)?;
    Ok((b, t, h, k))
}

/// A `[B, T, HV, V]` value tensor with the `B, T` of the keys `keys` (name and shape, checked
/// by [`keys`]): returns `(HV, V)`. A mismatch names both tensors.
pub(crate) fn values(arg: &str, shape: &[usize], keys: (&str, &[usize])) -> Result<(usize, usize)> {
    let (b, t, h) = (keys.1[0], keys.1[1], keys.1[2]);
    rank(arg, shape, 4)?;
    if shape[0] != b || shape[1] != t {
        return Err(Error::shape(
            arg,
            format!(
                "[B, T, HV, V] with B = {b}, T = {t} (`{}` is [B, T, H, K] = {:?})",
                keys.0, keys.1
            ),
            shape,
        ));
    }
    heads(arg, shape, keys, h, shape[2])?;
    positive(arg, "V", shape, shape[3])?;
    Ok((shape[2], shape[3]))
}

/// The extents `(B, T, H, K, HV, V)` of a call's main tensors.
pub(crate) type Extents = (usize, usize, usize, usize, usize, usize);

/// The geometry of a call with extents `dims`: `chunk_size` in `allowed`, then `cu_seqlens`.
pub(crate) fn geometry(
    dims: Extents,
    cu_seqlens: Option<&[i64]>,
    chunk_size: i64,
    allowed: &[usize],
) -> Result<Geometry> {
    let (b, t, h, k, hv, v) = dims;
    let bt = varlen::check_chunk_size(chunk_size, Some(allowed))?;
    let seqs = varlen::sequences(b, t, cu_seqlens)?;
    Ok(Geometry {
        b,
        t,
        h,
        hv,
        k,
        v,
        bt,
        seqs,
    })
}

/// An optional state tensor `[N, HV, K, V]` (`[N, HV, V, K]` with `state_v_first`).
pub(crate) fn state(
    arg: &str,
    shape: Option<&[usize]>,
    g: &Geometry,
    state_v_first: bool,
) -> Result<()> {
    let Some(shape) = shape else { return Ok(()) };
    let desc = if state_v_first {
        "[N, HV, V, K] (state_v_first)"
    } else {
        "[N, HV, K, V]"
    };
    rank(arg, shape, 4)?;
    exact(arg, shape, &g.state_shape(state_v_first), desc)
}

/// `scale` must be finite when given; returns the scale to use (`K^-0.5` by default).
pub(crate) fn scale(scale: Option<f64>, k: usize) -> Result<f64> {
    match scale {
        None => Ok(1.0 / (k as f64).sqrt()),
        Some(s) if s.is_finite() => Ok(s),
        Some(s) => Err(Error::param("scale", "a finite float or null", s)),
    }
}

/// The dtypes of one delta-rule call, by argument class
/// (`conformance/spec/ops-delta-rule.md` §1.4).
#[derive(Debug, Clone, Default)]
pub struct DeltaDtypes<'a> {
    /// Main data (`k, w, u` or `q, k, v`): one common dtype among f64, f32, bf16, f16.
    pub main: Vec<(&'a str, Dtype)>,
    /// Gates, `beta`, `A_log`, `dt_bias`: any float dtype.
    pub float: Vec<(&'a str, Dtype)>,
    /// States (`initial_state`, `hm`): f32 or f64.
    pub state: Vec<(&'a str, Dtype)>,
    /// Index tensors (`cu_seqlens`, `subseq_cu_seqlens`, `subseq_offsets`): i32 or i64.
    pub index: Vec<(&'a str, Dtype)>,
}

/// Checks the dtype rules of `conformance/spec/ops-delta-rule.md` §1.4 for the tensors of one call
/// (the reference itself computes on widened `f32`/`f64` views; the GPU crate and the case reader
/// call this).
pub fn validate_delta_dtypes(d: &DeltaDtypes<'_>) -> Result<()> {
    let mut common: Option<(&str, Dtype)> = None;
    for &(arg, dt) in &d.main {
        if !dt.is_float() {
            return Err(Error::dtype(
                arg,
                "float64, float32, bfloat16 or float16",
                dt.name(),
            ));
        }
        match common {
            None => common = Some((arg, dt)),
            Some((first, c)) if c != dt => {
                return Err(Error::dtype(
                    arg,
                    format!("the dtype of `{first}` ({c})"),
                    dt.name(),
                ))
            }
            Some(_) => {}
        }
    }
    for &(arg, dt) in &d.float {
        if !dt.is_float() {
            return Err(Error::dtype(arg, "a float dtype", dt.name()));
        }
    }
    for &(arg, dt) in &d.state {
        if !matches!(dt.class(), DtypeClass::Float64 | DtypeClass::Float32) {
            return Err(Error::dtype(arg, "float32 or float64", dt.name()));
        }
    }
    for &(arg, dt) in &d.index {
        if dt.class() != DtypeClass::Int {
            return Err(Error::dtype(arg, "int32 or int64", dt.name()));
        }
    }
    Ok(())
}

/// A boundary array (`subseq_cu_seqlens`, `subseq_offsets`) error.
pub(crate) fn boundary(arg: &str, expected: impl Into<String>, got: impl Into<String>) -> Error {
    Error::new(ErrorKind::CuSeqlens, arg, expected, got)
}
