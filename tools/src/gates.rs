//! The per-step gates of the delta-rule benchmarks: natural-log decays `g` (`S ← exp(g) S`
//! per token) in three regimes, the ones the automatic split of issue 24 is measured on.
//! `tools/forward_anchors.py` draws the same distributions (its `decays`) for the anchors.
//!
//! - [`GateRegime::Strong`]: `g ~ U[−1.5, −0.05]` per token and column (mean −0.775; the
//!   whole-forward rows' original generator);
//! - [`GateRegime::Trained`]: `g = −exp(A_log) · softplus(x + dt_bias)`, `x ~ N(0, 1)` per token
//!   and column, with Mamba's initialisation: `A_log = ln U[1, 16]` per value head,
//!   `dt = exp(U[ln 1e-3, ln 1e-1])` and `dt_bias = dt + ln(−expm1(−dt))` (so
//!   `softplus(dt_bias) = dt`) per column ([`MambaGate`]);
//! - [`GateRegime::Long`]: `g ~ U[−1e-3, 0]` per token and column (long memory: the state keeps
//!   thousands of tokens).
//!
//! A column is a value head for GDN (`g` is `[T, HV]`) and a (value head, key) pair for KDA
//! (`[T, HV, K]`).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;
use rayon::prelude::*;

/// A gate regime of the benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateRegime {
    /// Fast forgetting: `U[−1.5, −0.05]`.
    Strong,
    /// Mamba-initialised `−exp(A_log) · softplus(x + dt_bias)`.
    Trained,
    /// Long memory: `U[−1e-3, 0]`.
    Long,
}

/// Tokens per independently seeded block (the values do not depend on the thread count).
const BLOCK_ROWS: usize = 1024;

impl GateRegime {
    /// Every regime, in the order of the benchmark rows.
    pub const ALL: [GateRegime; 3] = [GateRegime::Strong, GateRegime::Trained, GateRegime::Long];

    /// The suffix of the benchmark rows (`strong`, `trained`, `long`).
    pub fn name(self) -> &'static str {
        match self {
            GateRegime::Strong => "strong",
            GateRegime::Trained => "trained",
            GateRegime::Long => "long",
        }
    }

    /// The least decay the regime can draw (`None`: unbounded below, the trained regime).
    pub fn floor(self) -> Option<f32> {
        match self {
            GateRegime::Strong => Some(-1.5),
            GateRegime::Trained => None,
            GateRegime::Long => Some(-1e-3),
        }
    }

    /// Whether every decay lies in `[−5, 0]`, the range KDA's `safe_gate` promises.
    pub fn within_safe_gate(self) -> bool {
        self.floor().is_some_and(|f| f >= -5.0)
    }

    /// The decays of `t` tokens × `cols` columns (row-major `[t, cols]`), `cols = HV · gk` with
    /// `gk` columns per value head (1 for GDN, `K` for KDA). Deterministic per `seed`: the
    /// trained regime's parameters come from `seed`, each block of `BLOCK_ROWS` tokens from
    /// its own stream derived from `seed` and the block index.
    pub fn decays(self, t: usize, hv: usize, gk: usize, seed: u64) -> Vec<f32> {
        self.decays_with(t, hv, gk, seed, seed)
    }

    /// [`GateRegime::decays`] with the trained regime's parameters (one model's `A_log` and
    /// `dt_bias`) drawn from `params` and the tokens from `seed`: the shards of one sequence
    /// share `params` and differ in `seed`.
    pub fn decays_with(self, t: usize, hv: usize, gk: usize, params: u64, seed: u64) -> Vec<f32> {
        let cols = hv * gk;
        let mamba = MambaGate::init(hv, gk, &mut StdRng::seed_from_u64(params));
        let mut g = vec![0f32; t * cols];
        if cols == 0 {
            return g;
        }
        g.par_chunks_mut(BLOCK_ROWS * cols)
            .enumerate()
            .for_each(|(b, block)| {
                let mut rng = StdRng::seed_from_u64(block_seed(seed, b));
                for row in block.chunks_mut(cols) {
                    for (c, x) in row.iter_mut().enumerate() {
                        *x = match self {
                            GateRegime::Strong => rng.random_range(-1.5f32..-0.05),
                            GateRegime::Trained => mamba.decay(c, rng.sample(StandardNormal)),
                            GateRegime::Long => -rng.random_range(0f32..=1e-3),
                        };
                    }
                }
            });
        g
    }
}

/// The stream of block `b` of a `seed`'s decays (a splitmix64 step of both).
fn block_seed(seed: u64, b: usize) -> u64 {
    let mut z = seed ^ (b as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Mamba's gate parameters at initialisation: `A_log[h] = ln U[1, 16]` per value head and
/// `dt_bias[c] = dt + ln(−expm1(−dt))`, `dt = exp(U[ln 1e-3, ln 1e-1])`, per column
/// (`gk` columns per head).
#[derive(Debug, Clone, PartialEq)]
pub struct MambaGate {
    /// `[HV]`.
    pub a_log: Vec<f64>,
    /// `[HV · gk]`.
    pub dt_bias: Vec<f64>,
    /// Columns per value head.
    pub gk: usize,
}

impl MambaGate {
    /// Draws the parameters of `hv` heads with `gk` columns each from `rng` (`A_log` first).
    pub fn init(hv: usize, gk: usize, rng: &mut StdRng) -> MambaGate {
        let a_log = (0..hv).map(|_| rng.random_range(1f64..16.0).ln()).collect();
        let (lo, hi) = (1e-3f64.ln(), 1e-1f64.ln());
        let dt_bias = (0..hv * gk)
            .map(|_| {
                let dt = rng.random_range(lo..hi).exp();
                dt + (-(-dt).exp_m1()).ln()
            })
            .collect();
        MambaGate { a_log, dt_bias, gk }
    }

    /// The decay `−exp(A_log) · softplus(x + dt_bias)` of column `c` for the input `x`.
    pub fn decay(&self, c: usize, x: f64) -> f32 {
        (-self.a_log[c / self.gk].exp() * softplus(x + self.dt_bias[c])) as f32
    }
}

/// `ln(1 + eˣ)`, `x` itself above 20 (torch's threshold).
pub fn softplus(x: f64) -> f64 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_memory_stays_within_1e_3() {
        let g = GateRegime::Long.decays(3000, 3, 5, 7);
        assert!(g.iter().all(|&x| (-1e-3..=0.0).contains(&x)), "|g| > 1e-3");
        let mean = g.iter().map(|&x| x as f64).sum::<f64>() / g.len() as f64;
        assert!((mean + 5e-4).abs() < 2e-5, "mean {mean}");
    }

    #[test]
    fn strong_decay_in_its_range() {
        let g = GateRegime::Strong.decays(2000, 4, 1, 3);
        assert!(g.iter().all(|&x| (-1.5..-0.05).contains(&x)));
        let mean = g.iter().map(|&x| x as f64).sum::<f64>() / g.len() as f64;
        assert!((mean + 0.775).abs() < 0.02, "mean {mean}");
    }

    #[test]
    fn trained_parameters_follow_mambas_init() {
        let m = MambaGate::init(64, 8, &mut StdRng::seed_from_u64(1));
        for a in &m.a_log {
            assert!((1.0..16.0).contains(&a.exp()));
        }
        for &b in &m.dt_bias {
            let dt = softplus(b);
            assert!(
                (1e-3 * (1.0 - 1e-9)..=1e-1 * (1.0 + 1e-9)).contains(&dt),
                "dt {dt}"
            );
        }
    }

    /// Per column `E[softplus(x + b)]` lies in `[softplus(b), e^{1/2} eᵇ]` (Jensen; and
    /// `softplus(z) ≤ eᶻ` with `E[eˣ] = e^{1/2}`), where `softplus(b) = dt`, `eᵇ = expm1(dt)`:
    /// the sample mean of `−g / exp(A_log)` stays there (with a margin for the sampling error).
    #[test]
    fn trained_decays_negative_finite_and_in_mambas_range() {
        let (t, hv, gk, seed) = (16384, 2, 4, 11);
        let g = GateRegime::Trained.decays(t, hv, gk, seed);
        assert!(g.iter().all(|x| x.is_finite() && *x < 0.0));
        let m = MambaGate::init(hv, gk, &mut StdRng::seed_from_u64(seed));
        for c in 0..hv * gk {
            let a = m.a_log[c / gk].exp();
            let mean = (0..t).map(|r| -g[r * hv * gk + c] as f64).sum::<f64>() / (t as f64 * a);
            let dt = softplus(m.dt_bias[c]);
            let (lo, hi) = (dt, 0.5f64.exp() * dt.exp_m1());
            assert!(
                0.95 * lo <= mean && mean <= 1.1 * hi,
                "column {c}: mean {mean} outside [{lo}, {hi}]"
            );
        }
        // the whole regime: per-step decays between −16·e^{1/2}·expm1(0.1) and −1e-3 on average
        let mean = g.iter().map(|&x| x as f64).sum::<f64>() / g.len() as f64;
        assert!((-16.0 * 0.5f64.exp() * 0.1f64.exp_m1()..-1e-3).contains(&mean));
    }

    #[test]
    fn deterministic_per_seed_and_shape_layout() {
        for r in GateRegime::ALL {
            let a = r.decays(2500, 2, 3, 5);
            assert_eq!(a, r.decays(2500, 2, 3, 5), "{r:?}");
            assert_ne!(a, r.decays(2500, 2, 3, 6), "{r:?}");
            assert_eq!(a.len(), 2500 * 6);
            // blocks draw from distinct streams
            assert_ne!(a[..6], a[BLOCK_ROWS * 6..BLOCK_ROWS * 6 + 6], "{r:?}");
        }
    }

    /// Shards of one sequence: the same parameters (each column's typical decay) under other
    /// tokens; other parameters change the columns.
    #[test]
    fn shards_share_the_trained_parameters() {
        let (t, hv, gk) = (16384, 2, 3);
        let r = GateRegime::Trained;
        assert_eq!(r.decays_with(t, hv, gk, 9, 9), r.decays(t, hv, gk, 9));
        let col_means = |g: &[f32]| {
            (0..hv * gk)
                .map(|c| (0..t).map(|i| g[i * hv * gk + c] as f64).sum::<f64>() / t as f64)
                .collect::<Vec<_>>()
        };
        let (a, b) = (
            r.decays_with(t, hv, gk, 9, 1),
            r.decays_with(t, hv, gk, 9, 2),
        );
        assert_ne!(a, b);
        for (x, y) in col_means(&a).iter().zip(col_means(&b)) {
            assert!((x / y - 1.0).abs() < 0.05, "same parameters: {x} vs {y}");
        }
        let other = col_means(&r.decays_with(t, hv, gk, 10, 1));
        let moved = col_means(&a)
            .iter()
            .zip(&other)
            .filter(|(x, y)| (*x / *y - 1.0).abs() > 0.05)
            .count();
        assert!(moved > 0, "other parameters moved no column");
    }

    #[test]
    fn safe_gate_only_where_bounded() {
        assert!(GateRegime::Strong.within_safe_gate());
        assert!(GateRegime::Long.within_safe_gate());
        assert!(!GateRegime::Trained.within_safe_gate());
    }
}
