//! The per-chunk linear algebra shared by the chunked delta-rule ops
//! (`conformance/spec/ops-delta-rule.md` §2.4, §3.1, §7.4).
//!
//! One chunk of one (sequence, value head) has `n` rows. With the chunk's state (or augmented
//! state) `X` (`K × C`), WY factors `W` (`n × K`), `U` (`n × V`, `V <= C`) and keys `K_c`:
//!
//! ```text
//! D  = [U | 0] − W X                                   (delta)
//! X ← γ · diag(λ) · X + K̃ᵀ D,   K̃ rows a_r · k_rᵀ      (advance)
//! γ = exp2(G_ℓ), a_r = exp2(G_ℓ − G_r)   (scalar gate g);   λ = exp2(Gk_ℓ)   (per-key gate gk)
//! ```

use crate::scalar::Real;
use ndarray::linalg::general_mat_mul;
use ndarray::{s, Array1, Array2, ArrayView1, ArrayView2, Axis};

/// `D = [U | 0] − W X`: the chunk's new values (`v_new`) in the first `V` columns.
pub(crate) fn delta<T: Real>(
    x: &Array2<T>,
    w: ArrayView2<'_, T>,
    u: ArrayView2<'_, T>,
) -> Array2<T> {
    let mut d = Array2::<T>::zeros((w.nrows(), x.ncols()));
    d.slice_mut(s![.., ..u.ncols()]).assign(&u);
    general_mat_mul(-T::one(), &w, x, T::one(), &mut d);
    d
}

/// `X ← γ diag(λ) X + K̃ᵀ D` with the gates read at the chunk's last valid row `ℓ`; the
/// scalar-gate factors `a_r` are applied to the rows of `D` (selected, never `0 · exp2`).
pub(crate) fn advance<T: Real>(
    x: &mut Array2<T>,
    k: ArrayView2<'_, T>,
    d: &Array2<T>,
    g: Option<ArrayView1<'_, T>>,
    gk: Option<ArrayView2<'_, T>>,
) {
    let n = k.nrows();
    if n == 0 {
        return;
    }
    let last = n - 1;
    if let Some(gk) = gk {
        for (mut row, &gl) in x.axis_iter_mut(Axis(0)).zip(gk.row(last)) {
            row *= gl.exp2();
        }
    }
    match g {
        Some(g) => {
            let gl = g[last];
            *x *= gl.exp2();
            let mut da = d.clone();
            for (mut row, &gr) in da.axis_iter_mut(Axis(0)).zip(g) {
                row *= (gl - gr).exp2();
            }
            general_mat_mul(T::one(), &k.t(), &da, T::one(), x);
        }
        None => general_mat_mul(T::one(), &k.t(), d, T::one(), x),
    }
}

/// `(I + L)^{-1}` of a strictly lower triangular `L` (`n × n`), by forward substitution:
/// row `r` of the inverse is `e_r − Σ_{j<r} L[r, j] · row_j`.
pub(crate) fn unit_lower_inverse<T: Real>(l: &Array2<T>) -> Array2<T> {
    let n = l.nrows();
    let mut inv = Array2::<T>::eye(n);
    for r in 1..n {
        let (done, mut rest) = inv.view_mut().split_at(Axis(0), r);
        let mut row = rest.row_mut(0);
        for j in 0..r {
            let c = l[[r, j]];
            if c != T::zero() {
                row.scaled_add(-c, &done.row(j));
            }
        }
    }
    inv
}

/// Chunk-local cumulative gate in log2 units, `G_r = (1/ln 2) · Σ_{s ≤ r} a_s`, of a chunk's
/// natural-log gate rows (sequential sum, then the exact `1/ln 2` of the float64 oracle).
pub(crate) fn log2_cumsum<T: Real>(a: ArrayView2<'_, T>) -> Array2<T> {
    let mut out = a.to_owned();
    out.accumulate_axis_inplace(Axis(0), |&prev, cur| *cur += prev);
    out *= T::c(std::f64::consts::LOG2_E);
    out
}

/// The scalar-gate form of [`log2_cumsum`].
pub(crate) fn log2_cumsum1<T: Real>(a: ArrayView1<'_, T>) -> Array1<T> {
    let mut out = a.to_owned();
    out.accumulate_axis_inplace(Axis(0), |&prev, cur| *cur += prev);
    out *= T::c(std::f64::consts::LOG2_E);
    out
}
