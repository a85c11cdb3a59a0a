//! `attn-testkit`: helpers shared by the workspace's test suites (a dev-dependency only).

use ndarray::{ArrayD, IxDyn};
use rand::rngs::StdRng;
use rand::{Rng as _, RngCore, SeedableRng};
use rand_distr::{StandardNormal, Uniform};

/// Seeded random inputs: a thin layer over `rand`'s [`StdRng`] (the seed comes from proptest, so
/// every case is fresh and every failure reproducible).
pub struct Rng(StdRng);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(StdRng::seed_from_u64(seed))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in `[lo, hi)` (`lo < hi`).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        self.0.random_range(lo..hi)
    }
    /// Uniform integer in `0 .. n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        self.0.random_range(0..n)
    }
    /// Standard normal.
    pub fn normal(&mut self) -> f64 {
        self.0.sample(StandardNormal)
    }
    /// A tensor of `shape` with entries uniform in `[lo, hi)`.
    pub fn array(&mut self, shape: &[usize], lo: f64, hi: f64) -> ArrayD<f64> {
        let u = Uniform::new(lo, hi).expect("lo < hi, both finite");
        ArrayD::from_shape_simple_fn(IxDyn(shape), || self.0.sample(u))
    }
    /// A tensor of `shape` with standard-normal entries.
    pub fn randn<D: ndarray::Dimension, Sh: ndarray::ShapeBuilder<Dim = D>>(
        &mut self,
        shape: Sh,
    ) -> ndarray::Array<f64, D> {
        ndarray::Array::from_shape_simple_fn(shape, || self.normal())
    }
    /// A random subset of `0 .. n` of size `k`, in random order.
    pub fn distinct(&mut self, n: usize, k: usize) -> Vec<usize> {
        rand::seq::index::sample(&mut self.0, n, k).into_vec()
    }
}
