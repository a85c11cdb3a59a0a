//! `nsa_gate_combine` (`conformance/spec/ops-nsa.md` §6): three branch gates and the gated sum of
//! the branch outputs. Branch order `c = 0, 1, 2` is (cmp, slc, swa).

use crate::error::{Error, Result};
use crate::scalar::Real;
use ndarray::{s, Array4, ArrayView3, ArrayView4, Axis, Zip};

/// The gates of a call, by form.
#[derive(Debug, Clone, Copy)]
pub enum Gates<'a, T> {
    /// W form (MSLK): `g_c = sigmoid(sum_d q[b,t,hq,d] * weight[hq, c, d])`.
    W {
        q: ArrayView4<'a, T>,
        weight: ArrayView3<'a, T>,
    },
    /// G form (FLA): the given, already activated `[g_cmp, g_slc, g_swa]`, each `[B, T, HQ]`.
    G([ArrayView3<'a, T>; 3]),
    /// U form: `g_c = 1/3`.
    U,
}

impl<'a, T> Gates<'a, T> {
    /// The form of a call from its optional inputs. Errors: `gate_proj_weight` together with any
    /// `g_*`; only some of the `g_*`; `gate_proj_weight` without `q`.
    pub fn from_parts(
        q: Option<ArrayView4<'a, T>>,
        gate_proj_weight: Option<ArrayView3<'a, T>>,
        g: [Option<ArrayView3<'a, T>>; 3],
    ) -> Result<Self> {
        const NAMES: [&str; 3] = ["g_cmp", "g_slc", "g_swa"];
        let given = g.iter().filter(|x| x.is_some()).count();
        if gate_proj_weight.is_some() && given > 0 {
            return Err(Error::missing(
                "gate_proj_weight",
                "either gate_proj_weight or g_cmp, g_slc, g_swa, not both",
                "both",
            ));
        }
        if given > 0 && given < 3 {
            let absent = NAMES[g.iter().position(|x| x.is_none()).unwrap_or(0)];
            return Err(Error::missing(
                absent,
                "all three of g_cmp, g_slc, g_swa or none",
                format!("{given} of them"),
            ));
        }
        match (gate_proj_weight, q, g) {
            (Some(weight), Some(q), _) => Ok(Gates::W { q, weight }),
            (Some(_), None, _) => Err(Error::missing(
                "q",
                "q with gate_proj_weight (W form)",
                "absent",
            )),
            (None, _, [Some(a), Some(b), Some(c)]) => Ok(Gates::G([a, b, c])),
            _ => Ok(Gates::U),
        }
    }
}

/// Outputs of [`nsa_gate_combine`].
#[derive(Debug, Clone)]
pub struct GateOut<T> {
    /// `[B, T, HQ, V]`: `g_0 o_cmp + g_1 o_slc + g_2 o_swa`.
    pub o: Array4<T>,
    /// `[B, T, HQ, 3]`: the gates applied.
    pub gates: Array4<T>,
}

/// Overflow-safe logistic `1 / (1 + exp(-x))`: `exp` only of non-positive arguments, so a large
/// negative logit gives 0 (never NaN) and a large positive one 1.
pub fn sigmoid<T: Real>(x: T) -> T {
    if x >= T::zero() {
        T::one() / (T::one() + (-x).exp())
    } else {
        let e = x.exp();
        e / (T::one() + e)
    }
}

/// Checks a `[B, T, HQ]` tensor `arg`.
fn check_bth(arg: &str, shape: &[usize], bth: &[usize]) -> Result<()> {
    if shape != bth {
        return Err(Error::shape(arg, format!("[B, T, HQ] = {bth:?}"), shape));
    }
    Ok(())
}

/// `(o, gates) = nsa_gate_combine(o_cmp, o_slc, o_swa, gates)`.
///
/// Per row `(b, t, hq)`: the gates of the form ([`Gates`]), then
/// `o = g_0 * o_cmp + g_1 * o_slc + g_2 * o_swa` in `T`. Rows run in parallel.
///
/// Errors: `o_slc`, `o_swa` not of `o_cmp`'s shape; W form: `q` not `[B, T, HQ, K]` of the
/// outputs, `gate_proj_weight` not `[HQ, 3, K]`; G form: a `g_*` not `[B, T, HQ]`.
pub fn nsa_gate_combine<T: Real>(
    o_cmp: ArrayView4<'_, T>,
    o_slc: ArrayView4<'_, T>,
    o_swa: ArrayView4<'_, T>,
    gates: Gates<'_, T>,
) -> Result<GateOut<T>> {
    for (name, x) in [("o_slc", o_slc.shape()), ("o_swa", o_swa.shape())] {
        if x != o_cmp.shape() {
            return Err(Error::shape(
                name,
                format!("the shape of o_cmp {:?}", o_cmp.shape()),
                x,
            ));
        }
    }
    let (b, t, hq, _) = o_cmp.dim();
    let bth = [b, t, hq];
    let mut g = Array4::<T>::zeros((b, t, hq, 3));
    match gates {
        Gates::W { q, weight } => {
            if q.shape()[..3] != bth {
                return Err(Error::shape(
                    "q",
                    format!("[B, T, HQ, K] with [B, T, HQ] = {bth:?} of o_cmp"),
                    q.shape(),
                ));
            }
            let kd = q.shape()[3];
            if weight.shape() != [hq, 3, kd] {
                return Err(Error::shape(
                    "gate_proj_weight",
                    format!("[HQ, 3, K] = [{hq}, 3, {kd}]"),
                    weight.shape(),
                ));
            }
            Zip::indexed(g.lanes_mut(Axis(3)))
                .and(q.lanes(Axis(3)))
                .par_for_each(|(_, _, h), mut gr, qr| {
                    let logits = weight.index_axis(Axis(0), h).dot(&qr);
                    gr.assign(&logits.mapv(sigmoid));
                });
        }
        Gates::G(given) => {
            for (c, (name, x)) in ["g_cmp", "g_slc", "g_swa"].iter().zip(given).enumerate() {
                check_bth(name, x.shape(), &bth)?;
                g.slice_mut(s![.., .., .., c]).assign(&x);
            }
        }
        Gates::U => g.fill(T::one() / T::c(3.0)),
    }
    let mut o = o_cmp.to_owned();
    Zip::from(o.lanes_mut(Axis(3)))
        .and(o_slc.lanes(Axis(3)))
        .and(o_swa.lanes(Axis(3)))
        .and(g.lanes(Axis(3)))
        .par_for_each(|mut or, sr, wr, gr| {
            let (g0, g1, g2) = (gr[0], gr[1], gr[2]);
            Zip::from(&mut or)
                .and(&sr)
                .and(&wr)
                .for_each(|x, &sl, &sw| *x = g0 * *x + g1 * sl + g2 * sw);
        });
    Ok(GateOut { o, gates: g })
}
