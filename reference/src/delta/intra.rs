//! `kda_intra` (`conformance/spec/ops-delta-rule.md` §7): the intra-chunk stage of KDA.
//!
//! Per chunk and value head, with `G` the chunk-local cumulative per-key gate (log2 units):
//!
//! ```text
//! Aqk[r, j] = scale · Σ_d q_{r,d} k_{j,d} exp2(G_{r,d} − G_{j,d})     j ≤ r, else 0
//! L[r, j]   = β_r   · Σ_d k_{r,d} k_{j,d} exp2(G_{r,d} − G_{j,d})     j < r, else 0
//! Akk = (I + L)^{-1};   w = Akk diag(β) (K ⊙ exp2(G));   u = Akk diag(β) V
//! kg_r = k_r ⊙ exp2(G_ℓ − G_r)
//! ```
//!
//! Pairs in different 16-row sub-blocks are formed as `exp2(G_r − G_m) · exp2(G_m − G_j)` with
//! `m` the first row of `r`'s sub-block (so `j < m <= r`): with gates `<= 0` both factors are
//! `<= 1` and nothing overflows; pairs inside a sub-block use `exp2(G_r − G_j)` directly.

use super::check::{self, Geometry};
use super::chunk;
use super::fwd_h::scatter;
use crate::error::Result;
use crate::scalar::Real;
use ndarray::linalg::general_mat_mul;
use ndarray::{s, Array2, Array4, ArrayView1, ArrayView2, ArrayView3, ArrayView4, Axis, Zip};
use rayon::prelude::*;

/// Allowed `chunk_size` of `kda_intra` and `kda_fwd`.
pub(crate) const KDA_CHUNK_SIZES: &[usize] = &[32, 64];

/// Rows of the sub-blocks whose pairs are formed directly.
const SUB_BLOCK: usize = 16;

/// Parameters of [`kda_intra`] (`conformance/spec/ops-delta-rule.md` §7.2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KdaIntraParams {
    /// `None` = `K^-0.5`.
    pub scale: Option<f64>,
    /// 32 or 64 (default 64).
    pub chunk_size: i64,
    /// Numerics hint (per-step gates in `[−5, 0]`); no effect on the exact result.
    pub safe_gate: bool,
}

impl Default for KdaIntraParams {
    fn default() -> Self {
        KdaIntraParams {
            scale: None,
            chunk_size: 64,
            safe_gate: false,
        }
    }
}

/// Shapes of the inputs of [`kda_intra`].
#[derive(Debug, Clone, Copy, Default)]
pub struct KdaIntraShapes<'a> {
    pub q: &'a [usize],
    pub k: &'a [usize],
    pub v: &'a [usize],
    pub gk: &'a [usize],
    pub beta: &'a [usize],
}

/// The tensors of one [`kda_intra`] call.
#[derive(Debug, Clone)]
pub struct KdaIntraInputs<'a, T> {
    /// `[B, T, H, K]`.
    pub q: ArrayView4<'a, T>,
    /// `[B, T, H, K]`.
    pub k: ArrayView4<'a, T>,
    /// `[B, T, HV, V]`.
    pub v: ArrayView4<'a, T>,
    /// `[B, T, HV, K]`: chunk-local cumulative gate in log2 units.
    pub gk: ArrayView4<'a, T>,
    /// `[B, T, HV]`.
    pub beta: ArrayView3<'a, T>,
    pub cu_seqlens: Option<&'a [i64]>,
}

/// Outputs of [`kda_intra`] (`conformance/spec/ops-delta-rule.md` §7.3).
#[derive(Debug, Clone, PartialEq)]
pub struct KdaIntraOutputs<T> {
    /// `[B, T, HV, K]`.
    pub w: Array4<T>,
    /// `[B, T, HV, V]`.
    pub u: Array4<T>,
    /// `[B, T, HV, K]`.
    pub kg: Array4<T>,
    /// `[B, T, HV, BT]`: row `r` of the chunk's `Aqk` at the chunk's token `r`; `0` for `j > r`.
    pub aqk: Array4<T>,
    /// `[B, T, HV, BT]`: `(I + L)^{-1}` by rows, `0` above the diagonal.
    pub akk: Array4<T>,
}

/// Checks `q`, `k` (`q.shape == k.shape`), `v` `[B, T, HV, V]`, `beta` `[B, T, HV]`; returns
/// `(B, T, H, K, HV, V)`.
pub(crate) fn validate_qkvb(
    q: &[usize],
    k: &[usize],
    v: &[usize],
    beta: &[usize],
) -> Result<check::Extents> {
    let (b, t, h, kd) = check::keys("q", q)?;
    check::exact("k", k, q, "the shape of q")?;
    let (hv, vd) = check::values("v", v, ("q", q))?;
    check::rank("beta", beta, 3)?;
    check::exact("beta", beta, &[b, t, hv], "[B, T, HV]")?;
    Ok((b, t, h, kd, hv, vd))
}

/// Validates a [`kda_intra`] call (`conformance/spec/ops-delta-rule.md` §7.6).
pub fn validate_kda_intra(
    shapes: &KdaIntraShapes<'_>,
    cu_seqlens: Option<&[i64]>,
    params: &KdaIntraParams,
) -> Result<Geometry> {
    let dims = validate_qkvb(shapes.q, shapes.k, shapes.v, shapes.beta)?;
    let (b, t, _, k, hv, _) = dims;
    check::rank("gk", shapes.gk, 4)?;
    check::exact("gk", shapes.gk, &[b, t, hv, k], "[B, T, HV, K]")?;
    let geo = check::geometry(dims, cu_seqlens, params.chunk_size, KDA_CHUNK_SIZES)?;
    check::scale(params.scale, k)?;
    Ok(geo)
}

/// The intra stage of `conformance/spec/ops-delta-rule.md` §7.4 for every chunk of every (sequence,
/// value head): with the chunk-local log2 gate `G`, `Aqk[r, j] = scale Σ_d q_{r,d} k_{j,d}
/// exp2(G_{r,d} − G_{j,d})` (`j ≤ r`), `Akk = (I + L)^{-1}` with `L[r, j] = β_r Σ_d k_{r,d} k_{j,d}
/// exp2(G_{r,d} − G_{j,d})` (`j < r`), `w = Akk diag(β) (K ⊙ exp2(G))`, `u = Akk diag(β) V`,
/// `kg_r = k_r ⊙ exp2(G_ℓ − G_r)`.
pub fn kda_intra<T: Real>(
    inp: &KdaIntraInputs<'_, T>,
    params: &KdaIntraParams,
) -> Result<KdaIntraOutputs<T>> {
    let shapes = KdaIntraShapes {
        q: inp.q.shape(),
        k: inp.k.shape(),
        v: inp.v.shape(),
        gk: inp.gk.shape(),
        beta: inp.beta.shape(),
    };
    let geo = validate_kda_intra(&shapes, inp.cu_seqlens, params)?;
    let scale = T::c(check::scale(params.scale, geo.k)?);
    let bt = geo.bt;
    let jobs: Vec<(usize, usize, usize)> = super::fwd_h::tasks(&geo)
        .into_iter()
        .flat_map(|(i, hv)| {
            let seq = geo.seqs[i];
            seq.chunks(bt)
                .map(move |(a, _)| (i, hv, a))
                .collect::<Vec<_>>()
        })
        .collect();
    let chunks: Vec<_> = jobs
        .into_par_iter()
        .map(|(i, hv, a)| {
            let seq = geo.seqs[i];
            let e = (a + bt).min(seq.eos);
            let (b, kh) = (seq.batch, geo.kh(hv));
            let ic = intra_chunk(
                inp.q.slice(s![b, a..e, kh, ..]),
                inp.k.slice(s![b, a..e, kh, ..]),
                inp.v.slice(s![b, a..e, hv, ..]),
                inp.gk.slice(s![b, a..e, hv, ..]),
                inp.beta.slice(s![b, a..e, hv]),
                scale,
            );
            (i, hv, (a..e, ic))
        })
        .collect();
    let (b, t, hv) = (geo.b, geo.t, geo.hv);
    let mut out = KdaIntraOutputs {
        w: Array4::zeros((b, t, hv, geo.k)),
        u: Array4::zeros((b, t, hv, geo.v)),
        kg: Array4::zeros((b, t, hv, geo.k)),
        aqk: Array4::zeros((b, t, hv, bt)),
        akk: Array4::zeros((b, t, hv, bt)),
    };
    // each output in parallel over its value heads; a chunk's rows `r` of batch row `seq.batch`
    let parts: [(&mut Array4<T>, Part<T>); 5] = [
        (&mut out.w, |ic| &ic.w),
        (&mut out.u, |ic| &ic.u),
        (&mut out.kg, |ic| &ic.kg),
        (&mut out.aqk, |ic| &ic.aqk),
        (&mut out.akk, |ic| &ic.akk),
    ];
    for (dst, part) in parts {
        scatter(dst, 2, &geo, &chunks, |mut d, seq, (r, ic)| {
            let m = part(ic);
            d.slice_mut(s![seq.batch, r.clone(), ..m.ncols()]).assign(m);
        });
    }
    Ok(out)
}

/// Selects one matrix of an [`IntraChunk`].
type Part<T> = fn(&IntraChunk<T>) -> &Array2<T>;

/// The intra-stage matrices of one chunk (`n` rows).
pub(crate) struct IntraChunk<T> {
    /// `n × n`, lower triangular with diagonal.
    pub aqk: Array2<T>,
    /// `n × n`, `(I + L)^{-1}`.
    pub akk: Array2<T>,
    pub w: Array2<T>,
    pub u: Array2<T>,
    pub kg: Array2<T>,
}

/// `conformance/spec/ops-delta-rule.md` §7.4 for one chunk: `q, k` `n × K`, `v` `n × V`, `g` (=
/// `G`) `n × K`, `beta` `n`.
pub(crate) fn intra_chunk<T: Real>(
    q: ArrayView2<'_, T>,
    k: ArrayView2<'_, T>,
    v: ArrayView2<'_, T>,
    g: ArrayView2<'_, T>,
    beta: ArrayView1<'_, T>,
    scale: T,
) -> IntraChunk<T> {
    let n = k.nrows();
    let mut aqk = Array2::<T>::zeros((n, n));
    let mut l = Array2::<T>::zeros((n, n));
    for r0 in (0..n).step_by(SUB_BLOCK) {
        let r1 = (r0 + SUB_BLOCK).min(n);
        if r0 > 0 {
            // rows r in r0..r1 against columns j < r0 through the reference row m = r0
            let gm = g.row(r0);
            let fr = (&g.slice(s![r0..r1, ..]) - &gm).mapv(T::exp2);
            let fc = (&gm - &g.slice(s![..r0, ..])).mapv(T::exp2);
            let kj = &k.slice(s![..r0, ..]) * &fc;
            let qd = &q.slice(s![r0..r1, ..]) * &fr;
            let kd = &k.slice(s![r0..r1, ..]) * &fr;
            general_mat_mul(
                scale,
                &qd,
                &kj.t(),
                T::zero(),
                &mut aqk.slice_mut(s![r0..r1, ..r0]),
            );
            general_mat_mul(
                T::one(),
                &kd,
                &kj.t(),
                T::zero(),
                &mut l.slice_mut(s![r0..r1, ..r0]),
            );
        }
        for r in r0..r1 {
            for j in r0..=r {
                let (mut sq, mut sk) = (T::zero(), T::zero());
                Zip::from(g.row(r))
                    .and(g.row(j))
                    .and(q.row(r))
                    .and(k.row(r))
                    .and(k.row(j))
                    .for_each(|&gr, &gj, &qr, &kr, &kj| {
                        let e = (gr - gj).exp2() * kj;
                        sq += qr * e;
                        sk += kr * e;
                    });
                aqk[[r, j]] = scale * sq;
                if j < r {
                    l[[r, j]] = sk;
                }
            }
        }
    }
    for (mut row, &b) in l.axis_iter_mut(Axis(0)).zip(beta) {
        row *= b;
    }
    let akk = chunk::unit_lower_inverse(&l);
    let mut kb = &k * &g.mapv(T::exp2);
    let mut vb = v.to_owned();
    for ((mut kr, mut vr), &b) in kb
        .axis_iter_mut(Axis(0))
        .zip(vb.axis_iter_mut(Axis(0)))
        .zip(beta)
    {
        kr *= b;
        vr *= b;
    }
    let w = akk.dot(&kb);
    let u = akk.dot(&vb);
    let kg = match n {
        0 => Array2::zeros((0, k.ncols())),
        _ => &k * &(&g.row(n - 1) - &g).mapv(T::exp2),
    };
    IntraChunk { aqk, akk, w, u, kg }
}
