//! GPU scans against the float64 reference: `cumsum` over random ranks, dims, layouts (every
//! kernel strategy), dtypes and directions; `chunk_local_cumsum` / `chunk_global_cumsum` over
//! random shapes, varlen layouts and options. Outputs are poisoned with NaN before each launch
//! and every element is checked. Without a GPU each test says why and passes.

mod common;

use attn_gpu::cumsum::{strategy, CumsumStrategy};
use attn_gpu::tile::{chunk_scan_kernel, ChunkScanKernel};
use attn_gpu::{chunk_global_cumsum_into, chunk_local_cumsum_into, cumsum_into, Gpu};
use attn_reference::cumsum as refr;
use attn_reference::{Dtype, RCP_LN2};
use common::*;
use proptest::prelude::{any, prop, Strategy};
use proptest::test_runner::TestRunner;

fn out_dtype(input: Dtype, pick: usize) -> Dtype {
    [input, Dtype::F32, Dtype::F64][pick % 3]
}

/// Runs one cumsum case on the GPU and checks it against the f64 reference.
fn check_cumsum(
    gpu: &Gpu,
    shape: &[usize],
    dim: i64,
    reverse: bool,
    din: Dtype,
    dout: Dtype,
    seed: u64,
) {
    let mut rng = Rng::new(seed);
    let a = rng.array(shape, -1.0, 1.0);
    let (x, xv) = upload(gpu, &a, din);
    let mut y = poisoned(gpu, shape, dout);
    cumsum_into(gpu, &x, dim, reverse, &mut y).unwrap();
    let want = refr::cumsum(xv.view(), dim, reverse).unwrap();
    let len = refr::validate_cumsum(shape, dim).unwrap().len;
    let thr = threshold(dout, if len > 1 << 16 { 1e-4 } else { 1e-5 });
    assert_close(
        &format!("cumsum {shape:?} dim {dim} rev {reverse} {din}->{dout}"),
        &download(gpu, &y),
        &want,
        thr,
    );
}

fn dims_strategy() -> impl Strategy<Value = Vec<usize>> {
    let size = prop::sample::select(vec![0usize, 1, 2, 3, 7, 31, 32, 33, 64, 100]);
    prop::collection::vec(size, 1..=5)
        .prop_filter("bounded size", |d| d.iter().product::<usize>() <= 1 << 18)
}

fn cumsum_any_rank_dim_dtype_matches_reference(gpu: &Gpu) {
    let s = (
        dims_strategy(),
        any::<i64>(),
        any::<bool>(),
        0..4usize,
        0..3usize,
        any::<u64>(),
    );
    TestRunner::new(cases(48))
        .run(&s, |(shape, d, reverse, di, oi, seed)| {
            let r = shape.len() as i64;
            let dim = d.rem_euclid(2 * r) - r; // -r ..= r-1
            let din = FLOATS[di];
            check_cumsum(gpu, &shape, dim, reverse, din, out_dtype(din, oi), seed);
            Ok(())
        })
        .unwrap();
}

fn cumsum_every_strategy_matches_reference(gpu: &Gpu) {
    // (outer, len, inner) shapes chosen to land on each kernel, with odd sizes for the scalar
    // (unaligned) variants.
    let s = (
        prop::sample::select(vec![
            vec![4096, 64],       // rows, many short rows
            vec![999, 257],       // rows, unaligned
            vec![3, 70000],       // look-back, long rows
            vec![2, 65537],       // look-back, unaligned
            vec![1, 300001],      // look-back, one lane
            vec![40, 3000],       // look-back, few moderate rows
            vec![8, 300, 64],     // strided, middle
            vec![500, 3, 33],     // strided, unaligned inner
            vec![257, 1024],      // dim 0 with very many lanes (below)
            vec![2, 2, 64, 8, 8], // the seed layout, reduced
        ]),
        any::<bool>(),
        0..4usize,
        0..3usize,
        any::<u64>(),
    );
    TestRunner::new(cases(40))
        .run(&s, |(shape, reverse, di, oi, seed)| {
            let dim = match shape.len() {
                5 => 2,
                2 if shape == [257, 1024] => 0,
                _ => -1,
            };
            let din = FLOATS[di];
            check_cumsum(gpu, &shape, dim, reverse, din, out_dtype(din, oi), seed);
            Ok(())
        })
        .unwrap();
}

fn cumsum_strategies_are_the_intended_ones(gpu: &Gpu) {
    let sm = gpu.sm_count();
    let plan = |s: &[usize], d| refr::validate_cumsum(s, d).unwrap();
    assert_eq!(
        strategy(&plan(&[1048576, 1024], -1), sm),
        CumsumStrategy::Rows
    );
    assert_eq!(
        strategy(&plan(&[1, 1 << 28], -1), sm),
        CumsumStrategy::Lookback
    );
    assert_eq!(
        strategy(&plan(&[16, 16, 1024, 64, 64], 2), sm),
        CumsumStrategy::Strided
    );
    assert_eq!(
        strategy(&plan(&[1024, 1048576], 0), sm),
        CumsumStrategy::Strided
    );
}

fn cumsum_long_lane_lookback_matches_reference_and_is_deterministic(gpu: &Gpu) {
    // More than 1024 tiles of 8192 elements: exercises groups and super-groups of the look-back.
    for (len, din, reverse) in [
        (9_000_011usize, Dtype::F32, false),
        (9_437_184, Dtype::F32, true),
        (5_000_000, Dtype::BF16, false),
    ] {
        let mut rng = Rng::new(len as u64);
        let a = rng.array(&[len], -1.0, 1.0);
        let (x, xv) = upload(gpu, &a, din);
        let mut y = poisoned(gpu, &[len], Dtype::F32);
        cumsum_into(gpu, &x, 0, reverse, &mut y).unwrap();
        let first = download(gpu, &y);
        let want = refr::cumsum(xv.view(), 0, reverse).unwrap();
        assert_close(&format!("one lane of {len}"), &first, &want, 1e-4);
        for _ in 0..3 {
            y.poison(gpu).unwrap();
            cumsum_into(gpu, &x, 0, reverse, &mut y).unwrap();
            assert_bit_identical("repeated look-back", &first, &download(gpu, &y));
        }
    }
}

fn cumsum_is_bit_identical_over_repeated_launches(gpu: &Gpu) {
    for (shape, dim) in [
        (vec![64usize, 3000], -1i64),
        (vec![4, 256, 96], 1),
        (vec![512, 200], -1),
    ] {
        let mut rng = Rng::new(7);
        let (x, _) = upload(gpu, &rng.array(&shape, -1.0, 1.0), Dtype::F32);
        let mut y = poisoned(gpu, &shape, Dtype::F32);
        cumsum_into(gpu, &x, dim, false, &mut y).unwrap();
        let first = download(gpu, &y);
        for _ in 0..3 {
            y.poison(gpu).unwrap();
            cumsum_into(gpu, &x, dim, false, &mut y).unwrap();
            assert_bit_identical("repeated cumsum", &first, &download(gpu, &y));
        }
    }
}

fn cumsum_nan_and_inf_propagate_like_sequential_summation(gpu: &Gpu) {
    let s = (
        prop::sample::select(vec![
            vec![50, 700],
            vec![3, 40000],
            vec![6, 500, 16],
            vec![1000, 33],
        ]),
        any::<bool>(),
        any::<u64>(),
    );
    TestRunner::new(cases(16))
        .run(&s, |(shape, reverse, seed)| {
            let mut rng = Rng::new(seed);
            let mut a = rng.array(&shape, -1.0, 1.0);
            let n = a.len();
            for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, f64::INFINITY] {
                let i = rng.below(n);
                a.as_slice_mut().unwrap()[i] = v;
            }
            let dim = if shape.len() == 3 { 1 } else { -1 };
            let (x, xv) = upload(gpu, &a, Dtype::F32);
            let mut y = poisoned(gpu, &shape, Dtype::F32);
            cumsum_into(gpu, &x, dim, reverse, &mut y).unwrap();
            let want = refr::cumsum(xv.view(), dim, reverse).unwrap();
            assert_close("cumsum with NaN/Inf", &download(gpu, &y), &want, 1e-5);
            Ok(())
        })
        .unwrap();
}

/// (shape, number of varlen sequences, chunk size, reverse, scale, input dtype index,
/// keep the input dtype for the output, seed).
type SeqCase = (
    Vec<usize>,
    Option<usize>,
    usize,
    bool,
    Option<f64>,
    usize,
    bool,
    u64,
);

/// Shapes `[B, T, H]` or `[B, T, H, S]`, optional varlen (then B = 1), a chunk size.
fn seq_case() -> impl Strategy<Value = SeqCase> {
    (
        1..4usize,
        prop::sample::select(vec![1usize, 15, 63, 64, 65, 130, 300, 1000]),
        1..6usize,
        prop::sample::select(vec![0usize, 1, 3, 8, 16, 64, 128]),
        prop::option::of(1..8usize),
        prop::sample::select(vec![16usize, 32, 64, 128]),
        any::<bool>(),
        prop::sample::select(vec![None, Some(RCP_LN2), Some(-0.75)]),
        0..4usize,
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(
            |(b, t, h, s, nseq, bt, reverse, scale, di, keep_dtype, seed)| {
                let b = if nseq.is_some() { 1 } else { b };
                let shape = if s == 0 {
                    vec![b, t, h]
                } else {
                    vec![b, t, h, s]
                };
                (shape, nseq, bt, reverse, scale, di, keep_dtype, seed)
            },
        )
}

fn check_seq_scan(gpu: &Gpu, local: bool, case: SeqCase) {
    let (shape, nseq, bt, reverse, scale, di, keep_dtype, seed) = case;
    let mut rng = Rng::new(seed);
    let cu = nseq.map(|n| random_cu_seqlens(&mut rng, shape[1], n));
    let din = FLOATS[di];
    let dout = if keep_dtype { din } else { Dtype::F32 };
    let (g, gv) = upload(gpu, &rng.array(&shape, -3.0, 1.0), din);
    let mut o = poisoned(gpu, &shape, dout);
    let (got, want, thr) = if local {
        chunk_local_cumsum_into(gpu, &g, cu.as_deref(), bt as i64, reverse, scale, &mut o).unwrap();
        let w =
            refr::chunk_local_cumsum(gv.view(), cu.as_deref(), bt as i64, reverse, scale).unwrap();
        (download(gpu, &o), w, threshold(dout, 1e-6))
    } else {
        chunk_global_cumsum_into(gpu, &g, cu.as_deref(), reverse, scale, &mut o).unwrap();
        let w = refr::chunk_global_cumsum(gv.view(), cu.as_deref(), reverse, scale).unwrap();
        (download(gpu, &o), w, threshold(dout, 1e-5))
    };
    let op = if local {
        "chunk_local_cumsum"
    } else {
        "chunk_global_cumsum"
    };
    assert_close(
        &format!("{op} {shape:?} cu {cu:?} bt {bt} rev {reverse} scale {scale:?} {din}->{dout}"),
        &got,
        &want,
        thr,
    );
}

fn chunk_local_cumsum_matches_reference(gpu: &Gpu) {
    TestRunner::new(cases(48))
        .run(&seq_case(), |case| {
            check_seq_scan(gpu, true, case);
            Ok(())
        })
        .unwrap();
}

fn chunk_global_cumsum_matches_reference(gpu: &Gpu) {
    TestRunner::new(cases(48))
        .run(&seq_case(), |case| {
            check_seq_scan(gpu, false, case);
            Ok(())
        })
        .unwrap();
}

fn chunk_scan_kernels_are_the_intended_ones() {
    use ChunkScanKernel::{Strided, Tile};
    let (bf, f32_) = (Dtype::BF16, Dtype::F32);
    // the benchmark shapes: H * K = 4096, 2048, 1024 lanes in chunks of 64
    for cols in [4096, 2048, 1024] {
        assert_eq!(chunk_scan_kernel(bf, f32_, cols, cols, 64), Tile, "{cols}");
    }
    assert_eq!(chunk_scan_kernel(bf, f32_, 512, 512, 16), Tile);
    // chunks of more than 16 parts of 8 rows, or fewer than 32 lane groups: the strided kernel
    assert_eq!(chunk_scan_kernel(bf, f32_, 512, 512, 1024), Strided);
    assert_eq!(chunk_scan_kernel(bf, f32_, 64, 64, 64), Strided);
    assert_eq!(
        chunk_scan_kernel(Dtype::F64, Dtype::F64, 24, 24, 64),
        Strided
    );
    // under the KDA gate a vector stays within one head (unit K): K = 1 gives 64 one-lane groups
    // (tiles) where 64 free lanes make 16 groups of 4 (strided)
    assert_eq!(chunk_scan_kernel(bf, f32_, 64, 1, 64), Tile);
    assert_eq!(chunk_scan_kernel(bf, f32_, 2048, 2, 64), Tile);
}

/// Fixed cases on both chunk kernels (asserted), forward and reverse, uniform and varlen.
fn chunk_local_cumsum_tile_and_strided_match_reference(gpu: &Gpu) {
    let cases: [(&[usize], usize, Option<usize>); 6] = [
        (&[2, 300, 4, 128], 64, None),
        (&[2, 300, 4, 128], 16, None),
        (&[1, 1000, 2, 64], 32, Some(5)),
        (&[2, 300, 4, 128], 1024, None),
        (&[1, 200, 3, 8], 64, None),
        (&[1, 1000, 2, 64], 64, Some(4)),
    ];
    let mut rng = Rng::new(11);
    for (shape, chunk, nseq) in cases {
        let cols = shape[2] * shape[3];
        for (din, dout) in [
            (Dtype::BF16, Dtype::F32),
            (Dtype::F32, Dtype::F32),
            (Dtype::F64, Dtype::F64),
        ] {
            let kernel = chunk_scan_kernel(din, dout, cols, cols, chunk);
            let want_kernel = if chunk <= 128 && cols >= 128 {
                ChunkScanKernel::Tile
            } else {
                ChunkScanKernel::Strided
            };
            assert_eq!(kernel, want_kernel, "{shape:?} chunk {chunk} {din}->{dout}");
            for reverse in [false, true] {
                let cu = nseq.map(|n| random_cu_seqlens(&mut rng, shape[1], n));
                let (g, gv) = upload(gpu, &rng.array(shape, -3.0, 1.0), din);
                let mut o = poisoned(gpu, shape, dout);
                chunk_local_cumsum_into(
                    gpu,
                    &g,
                    cu.as_deref(),
                    chunk as i64,
                    reverse,
                    Some(0.5),
                    &mut o,
                )
                .unwrap();
                let want = refr::chunk_local_cumsum(
                    gv.view(),
                    cu.as_deref(),
                    chunk as i64,
                    reverse,
                    Some(0.5),
                )
                .unwrap();
                assert_close(
                    &format!(
                        "{kernel:?} {shape:?} chunk {chunk} cu {cu:?} rev {reverse} {din}->{dout}"
                    ),
                    &download(gpu, &o),
                    &want,
                    threshold(dout, 1e-6),
                );
            }
        }
    }
}

fn chunk_local_cumsum_spec_varlen_lengths(gpu: &Gpu) {
    // lengths 1, 15, 63, 64, 65, 1000 and a zero-length sequence (spec test cases)
    let lens = [1usize, 15, 0, 63, 64, 65, 1000];
    let mut cu = vec![0i64];
    for l in lens {
        cu.push(cu.last().unwrap() + l as i64);
    }
    let t = *cu.last().unwrap() as usize;
    for (shape, reverse) in [(vec![1, t, 4], false), (vec![1, t, 2, 64], true)] {
        let mut rng = Rng::new(t as u64);
        let (g, gv) = upload(gpu, &rng.array(&shape, -2.0, 0.0), Dtype::BF16);
        let mut o = poisoned(gpu, &shape, Dtype::F32);
        chunk_local_cumsum_into(gpu, &g, Some(&cu), 64, reverse, Some(RCP_LN2), &mut o).unwrap();
        let want =
            refr::chunk_local_cumsum(gv.view(), Some(&cu), 64, reverse, Some(RCP_LN2)).unwrap();
        assert_close(
            "chunk_local_cumsum spec lengths",
            &download(gpu, &o),
            &want,
            1e-6,
        );
    }
}

fn chunk_global_cumsum_equals_cumsum_on_the_seed_layout(gpu: &Gpu) {
    // cumsum(x.reshape(B*H, T, D*D), dim=1) == chunk_global_cumsum on the view [B*H, T, 1, D*D]
    let (b, h, t, d) = (2usize, 2usize, 64usize, 8usize);
    let mut rng = Rng::new(11);
    let a = rng.array(&[b * h, t, d * d], -1.0, 1.0);
    let (x, _) = upload(gpu, &a, Dtype::F32);
    let mut y = poisoned(gpu, &[b * h, t, d * d], Dtype::F32);
    cumsum_into(gpu, &x, 1, false, &mut y).unwrap();
    let a4 = a
        .clone()
        .into_shape_with_order(vec![b * h, t, 1, d * d])
        .unwrap();
    let (g, _) = upload(gpu, &a4, Dtype::F32);
    let mut o = poisoned(gpu, &[b * h, t, 1, d * d], Dtype::F32);
    chunk_global_cumsum_into(gpu, &g, None, false, None, &mut o).unwrap();
    let y = download(gpu, &y)
        .into_shape_with_order(vec![b * h, t, 1, d * d])
        .unwrap();
    assert_bit_identical("cumsum vs chunk_global_cumsum", &y, &download(gpu, &o));
}

gpu_tests!(
    cumsum_any_rank_dim_dtype_matches_reference,
    cumsum_every_strategy_matches_reference,
    cumsum_strategies_are_the_intended_ones,
    cumsum_long_lane_lookback_matches_reference_and_is_deterministic,
    cumsum_is_bit_identical_over_repeated_launches,
    cumsum_nan_and_inf_propagate_like_sequential_summation,
    chunk_local_cumsum_matches_reference,
    chunk_global_cumsum_matches_reference,
    chunk_scan_kernels_are_the_intended_ones,
    chunk_local_cumsum_tile_and_strided_match_reference,
    chunk_local_cumsum_spec_varlen_lengths,
    chunk_global_cumsum_equals_cumsum_on_the_seed_layout
);
