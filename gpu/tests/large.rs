//! More than 2^31 elements (64-bit indexing): one look-back lane, the rows kernel, the strided
//! kernel and the chunk tile kernel, each over > 2^31 bf16 elements in {-1, 0, 1}, whose fp32
//! prefix sums are exact (|sum| < 2^24), so every element is checked exactly against an integer
//! prefix sum.
//! Needs about 13 GB of device memory per case; without a GPU it says why and passes.

mod common;

use attn_gpu::cumsum::{strategy, CumsumStrategy};
use attn_gpu::tile::{chunk_scan_kernel, ChunkScanKernel};
use attn_gpu::{chunk_local_cumsum_into, cumsum_into, DeviceTensor};
use attn_reference::cumsum::validate_cumsum;
use attn_reference::Dtype;
use common::{poisoned, Gpu};
use half::bf16;
use ndarray::{ArrayViewD, IxDyn};

/// Runs `f(offset, part)` over 16 parts of `v` in parallel.
fn par_chunks<T: Send>(v: &mut [T], f: impl Fn(usize, &mut [T]) + Sync) {
    let step = v.len().div_ceil(16).max(1);
    std::thread::scope(|sc| {
        for (k, part) in v.chunks_mut(step).enumerate() {
            let f = &f;
            sc.spawn(move || f(k * step, part));
        }
    });
}

/// `x[i]` in {-1, 0, 1}: a stateless hash of `(i, seed)` (a SplitMix64-style multiply–xorshift
/// mix), not a random stream. Both the fill and the check visit > 2^31 positions in parallel parts
/// that do not line up, so each must compute `x[i]` from `i` alone in a few cycles; a seeded RNG
/// (`rand`) yields a sequence, and reseeding one per element would be far slower. Statistical
/// quality does not matter here: only that the values are mixed and reproducible.
fn ternary_at(i: usize, seed: u64) -> i8 {
    let mut z = (i as u64)
        .wrapping_add(seed)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z ^= z >> 29;
    z = z.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z ^= z >> 32;
    (z % 3) as i8 - 1
}

fn cumsum_over_more_than_2_pow_31_elements_is_exact(gpu: &Gpu) {
    let cases: [(&[usize], i64, CumsumStrategy); 3] = [
        (&[(1 << 31) + 4099], 0, CumsumStrategy::Lookback),
        (&[(1 << 21) + 1, 1024], -1, CumsumStrategy::Rows),
        (&[5, (1 << 29) + 3], 0, CumsumStrategy::Strided),
    ];
    for (shape, dim, want_strategy) in cases {
        let plan = validate_cumsum(shape, dim).unwrap();
        assert_eq!(strategy(&plan, gpu.sm_count()), want_strategy, "{shape:?}");
        let n: usize = shape.iter().product();
        assert!(n > 1 << 31);
        let seed = n as u64;
        let mut host = vec![bf16::ZERO; n];
        par_chunks(&mut host, |off, part| {
            for (i, v) in part.iter_mut().enumerate() {
                *v = bf16::from_f32(ternary_at(off + i, seed) as f32);
            }
        });
        let x = DeviceTensor::from_array(gpu, ArrayViewD::from_shape(IxDyn(shape), &host).unwrap())
            .unwrap();
        drop(host);
        let mut y = poisoned(gpu, shape, Dtype::F32);
        cumsum_into(gpu, &x, dim, false, &mut y).unwrap();
        drop(x);
        let got = y.to_array::<f32>(gpu).unwrap();
        let got = got.as_slice().unwrap();
        // lanes: (outer, inner) pairs, scanned along len with stride inner; checked in 16
        // parallel parts (ranges of outer indices, or of columns when outer is small)
        let (outer, len, inner) = (plan.outer, plan.len, plan.inner);
        let parts: Vec<(std::ops::Range<usize>, std::ops::Range<usize>)> = if outer >= 16 {
            let step = outer.div_ceil(16);
            (0..outer)
                .step_by(step)
                .map(|o| (o..(o + step).min(outer), 0..inner))
                .collect()
        } else {
            let step = inner.div_ceil(16);
            (0..outer)
                .flat_map(|o| {
                    (0..inner)
                        .step_by(step)
                        .map(move |c| (o..o + 1, c..(c + step).min(inner)))
                })
                .collect()
        };
        std::thread::scope(|sc| {
            for (orange, crange) in parts {
                sc.spawn(move || {
                    for o in orange {
                        let mut acc = vec![0i64; crange.len()];
                        for l in 0..len {
                            let row = (o * len + l) * inner;
                            for (a, c) in acc.iter_mut().zip(crange.clone()) {
                                *a += ternary_at(row + c, seed) as i64;
                                let g = got[row + c];
                                assert!(
                                    g == *a as f32,
                                    "{shape:?} dim {dim}: element {} is {g}, expected {a}",
                                    row + c
                                );
                            }
                        }
                    }
                });
            }
        });
    }
}

fn chunk_local_cumsum_tile_over_more_than_2_pow_31_elements_is_exact(gpu: &Gpu) {
    // [1, T, 4096] in chunks of 64 (the last one partial), scanned in reverse
    let (t, cols, chunk) = ((1usize << 19) + 37, 4096usize, 64usize);
    let shape = [1, t, cols];
    assert_eq!(
        chunk_scan_kernel(Dtype::BF16, Dtype::F32, cols, cols, chunk),
        ChunkScanKernel::Tile
    );
    let n = t * cols;
    assert!(n > 1 << 31);
    let seed = 7;
    let mut host = vec![bf16::ZERO; n];
    par_chunks(&mut host, |off, part| {
        for (i, v) in part.iter_mut().enumerate() {
            *v = bf16::from_f32(ternary_at(off + i, seed) as f32);
        }
    });
    let x = DeviceTensor::from_array(gpu, ArrayViewD::from_shape(IxDyn(&shape), &host).unwrap())
        .unwrap();
    drop(host);
    let mut y = poisoned(gpu, &shape, Dtype::F32);
    chunk_local_cumsum_into(gpu, &x, None, chunk as i64, true, None, &mut y).unwrap();
    drop(x);
    let got = y.to_array::<f32>(gpu).unwrap();
    let got = got.as_slice().unwrap();
    // 16 parallel parts of whole chunks; each chunk summed from its last row back
    let chunks = t.div_ceil(chunk);
    let step = chunks.div_ceil(16);
    std::thread::scope(|sc| {
        for first in (0..chunks).step_by(step) {
            sc.spawn(move || {
                for ch in first..(first + step).min(chunks) {
                    let mut acc = vec![0i64; cols];
                    for r in (ch * chunk..((ch + 1) * chunk).min(t)).rev() {
                        for (c, a) in acc.iter_mut().enumerate() {
                            let i = r * cols + c;
                            *a += ternary_at(i, seed) as i64;
                            assert!(
                                got[i] == *a as f32,
                                "element {i} (row {r}, lane {c}) is {}, expected {a}",
                                got[i]
                            );
                        }
                    }
                }
            });
        }
    });
}

gpu_tests!(
    cumsum_over_more_than_2_pow_31_elements_is_exact,
    chunk_local_cumsum_tile_over_more_than_2_pow_31_elements_is_exact
);
