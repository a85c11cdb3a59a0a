//! GPU `kv_cache_update`, `decode_attention` and the fused step against the float64 reference
//! (`conformance/spec/ops-decode.md`): the spec's case list (`L_q` 1, 2, 7; `n` 0, 1, 63, 64, 65,
//! 4000 and `n == S` mixed in one batch; GQA 1, 4, 8; `D` 64, 80, 96, 128, 256; both layouts;
//! `cache_batch_idx`; bf16, fp16, fp32), a serving batch of mostly empty and one-token rows, a full
//! cache of 32768, random shapes (fp64 too), NaN in every cache position past the valid prefix
//! (and in unused cache rows), outputs poisoned with NaN, determinism over 100 launches, the device flag for out-of-range rows, and a captured CUDA graph replayed after the
//! lengths and tokens changed in device memory. Without a GPU each test says why and passes.

mod common;

use attn_gpu::decode::check::check_attention_shapes;
use attn_gpu::{
    capture, decode_attention, decode_attention_into, decode_step, kv_cache_update, CacheLayout,
    CacheRows, DecodeFlag, DecodeOutputs, DecodeParams, DecodeWorkspace, DeviceTensor, Gpu,
    KvCache, NewTokens,
};
use attn_reference::decode as refd;
use attn_reference::{Dtype, ErrorKind};
use common::*;
use ndarray::{s, ArrayD, Axis, Ix4};
use proptest::prelude::{any, prop};
use proptest::test_runner::TestRunner;

const HALF_O: f64 = 5e-3;
const HALF_LSE: f64 = 1e-3;
const F32: f64 = 1e-5;

/// One decode case on the host (float64 values, before rounding to the device dtype).
#[derive(Clone)]
struct Case {
    q: ArrayD<f64>,
    k_cache: ArrayD<f64>,
    v_cache: ArrayD<f64>,
    lens: Vec<i64>,
    idx: Option<Vec<i64>>,
    layout: CacheLayout,
    params: DecodeParams,
}

#[derive(Debug, Clone, Copy)]
struct Geo {
    b: usize,
    b_cache: usize,
    s: usize,
    h: usize,
    h_kv: usize,
    d: usize,
    lq: usize,
}

fn cache_shape(g: &Geo, layout: CacheLayout) -> [usize; 4] {
    match layout {
        CacheLayout::Bshd => [g.b_cache, g.s, g.h_kv, g.d],
        CacheLayout::Bhsd => [g.b_cache, g.h_kv, g.s, g.d],
    }
}

/// Every cache position at or past `n` of each used row, and every unused row, set to NaN.
fn poison_past(cache: &mut ArrayD<f64>, lens: &[i64], rows: &[usize], layout: CacheLayout) {
    let used: Vec<Option<i64>> = (0..cache.shape()[0])
        .map(|r| rows.iter().position(|&x| x == r).map(|b| lens[b]))
        .collect();
    for (r, n) in used.into_iter().enumerate() {
        let n = n.unwrap_or(0) as usize;
        let mut row = cache.index_axis_mut(Axis(0), r);
        match layout {
            CacheLayout::Bshd => row.slice_mut(s![n.., .., ..]).fill(f64::NAN),
            CacheLayout::Bhsd => row.slice_mut(s![.., n.., ..]).fill(f64::NAN),
        }
    }
}

fn make_case(
    rng: &mut Rng,
    g: Geo,
    lens: Vec<i64>,
    with_idx: bool,
    layout: CacheLayout,
    params: DecodeParams,
) -> Case {
    let q = rng.array(&[g.b, g.lq, g.h, g.d], -2.0, 2.0);
    let cs = cache_shape(&g, layout);
    let mut k_cache = rng.array(&cs, -2.0, 2.0);
    let mut v_cache = rng.array(&cs, -1.0, 1.0);
    let idx = with_idx.then(|| {
        rng.distinct(g.b_cache, g.b)
            .into_iter()
            .map(|r| r as i64)
            .collect::<Vec<_>>()
    });
    let rows: Vec<usize> = match &idx {
        Some(i) => i.iter().map(|&r| r as usize).collect(),
        None => (0..g.b).collect(),
    };
    poison_past(&mut k_cache, &lens, &rows, layout);
    poison_past(&mut v_cache, &lens, &rows, layout);
    Case {
        q,
        k_cache,
        v_cache,
        lens,
        idx,
        layout,
        params,
    }
}

fn i32s(v: &[i64]) -> Vec<i32> {
    v.iter().map(|&x| x as i32).collect()
}

/// The case on the device, and the exact values it holds (widened).
struct OnDevice {
    q: DeviceTensor,
    cache: KvCache,
    seqlens: DeviceTensor,
    idx: Option<DeviceTensor>,
    host: Case,
}

impl OnDevice {
    fn new(gpu: &Gpu, c: &Case, dtype: Dtype) -> OnDevice {
        let (q, qv) = upload(gpu, &c.q, dtype);
        let (k, kv) = upload(gpu, &c.k_cache, dtype);
        let (v, vv) = upload(gpu, &c.v_cache, dtype);
        let seqlens = DeviceTensor::from_slice(gpu, &i32s(&c.lens)).unwrap();
        let idx = c
            .idx
            .as_ref()
            .map(|i| DeviceTensor::from_slice(gpu, &i32s(i)).unwrap());
        let host = Case {
            q: qv,
            k_cache: kv,
            v_cache: vv,
            ..c.clone()
        };
        OnDevice {
            q,
            cache: KvCache {
                k,
                v,
                layout: c.layout,
            },
            seqlens,
            idx,
            host,
        }
    }

    fn rows(&self) -> CacheRows<'_> {
        CacheRows {
            cache_seqlens: &self.seqlens,
            cache_batch_idx: self.idx.as_ref(),
        }
    }

    fn workspace(&self, gpu: &Gpu) -> (DecodeWorkspace, DecodeOutputs) {
        let shape = check_attention_shapes(
            (self.q.shape(), self.q.dtype()),
            (self.cache.k.shape(), self.cache.k.dtype()),
            (self.cache.v.shape(), self.cache.v.dtype()),
            self.cache.layout,
        )
        .unwrap();
        let ws = DecodeWorkspace::new(gpu, shape).unwrap();
        let out = DecodeOutputs {
            o: poisoned(gpu, &[shape.b, shape.l, shape.h, shape.d], shape.dtype),
            lse: poisoned(gpu, &[shape.b, shape.h, shape.l], Dtype::F32),
        };
        (ws, out)
    }
}

fn view4(a: &ArrayD<f64>) -> ndarray::ArrayView4<'_, f64> {
    a.view().into_dimensionality::<Ix4>().unwrap()
}

/// The float64 reference on the device's exact values: `(o, lse)`.
fn reference(c: &Case) -> (ArrayD<f64>, ArrayD<f64>) {
    let r = refd::decode_attention(
        view4(&c.q),
        view4(&c.k_cache),
        view4(&c.v_cache),
        &c.lens,
        c.idx.as_deref(),
        c.params.softmax_scale,
        c.params.causal,
        c.layout,
    )
    .unwrap();
    (r.o.into_dyn(), r.lse.into_dyn())
}

/// `(o, lse)` thresholds: `lse` is float32 whatever the dtype of `q`.
fn thresholds(dtype: Dtype) -> (f64, f64) {
    match dtype {
        Dtype::F64 => (1e-10, F32),
        Dtype::F32 => (F32, F32),
        _ => (HALF_O, HALF_LSE),
    }
}

/// Runs `decode_attention_into` on poisoned outputs and checks both against the reference and
/// the flag against 0; with `per_row`, each batch row on its own as well (so that one wrong row
/// among many short ones cannot hide in the batch's RMS).
fn check_attention_with(gpu: &Gpu, c: &Case, dtype: Dtype, what: &str, per_row: bool) {
    let dev = OnDevice::new(gpu, c, dtype);
    let (mut ws, mut out) = dev.workspace(gpu);
    decode_attention_into(
        gpu,
        &dev.q,
        &dev.cache,
        dev.rows(),
        &c.params,
        &mut ws,
        &mut out,
    )
    .unwrap();
    let (o, lse) = reference(&dev.host);
    let (to, tl) = thresholds(dtype);
    let what = format!("{what} {dtype} splits {:?}", ws.splits());
    let (got_o, got_lse) = (download(gpu, &out.o), download(gpu, &out.lse));
    assert_close(&format!("{what} o"), &got_o, &o, to);
    assert_close(&format!("{what} lse"), &got_lse, &lse, tl);
    if per_row {
        for (b, n) in c.lens.iter().enumerate() {
            let row = |a: &ArrayD<f64>| a.index_axis(Axis(0), b).to_owned();
            let what = format!("{what} row {b} (n {n})");
            assert_close(&format!("{what} o"), &row(&got_o), &row(&o), to);
            assert_close(&format!("{what} lse"), &row(&got_lse), &row(&lse), tl);
        }
    }
    assert_eq!(ws.flag().take(gpu).unwrap(), 0, "{what}: device flag");
}

fn check_attention(gpu: &Gpu, c: &Case, dtype: Dtype, what: &str) {
    check_attention_with(gpu, c, dtype, what, false);
}

const DTYPES: [Dtype; 3] = [Dtype::BF16, Dtype::F16, Dtype::F32];
const LAYOUTS: [CacheLayout; 2] = [CacheLayout::Bshd, CacheLayout::Bhsd];

fn spec_cases_match_reference(gpu: &Gpu) {
    let mut rng = Rng::new(12);
    let mut k = 0usize;
    for d in [64usize, 80, 96, 128, 256] {
        for gqa in [1usize, 4, 8] {
            for lq in [1usize, 2, 7] {
                let s = 200;
                // n = 0, 1, 63, 64, 65 and S in one batch, in a random order
                let mut lens = vec![0i64, 1, 63, 64, 65, s as i64];
                for i in (1..lens.len()).rev() {
                    lens.swap(i, rng.below(i + 1));
                }
                let g = Geo {
                    b: 6,
                    b_cache: 8,
                    s,
                    h: 2 * gqa,
                    h_kv: 2,
                    d,
                    lq,
                };
                let (dtype, layout) = (DTYPES[k % 3], LAYOUTS[(k / 3) % 2]);
                let params = DecodeParams {
                    softmax_scale: (k % 5 == 4).then_some(0.3),
                    causal: k % 7 != 6,
                };
                let case = make_case(&mut rng, g, lens.clone(), k % 2 == 0, layout, params);
                check_attention(
                    gpu,
                    &case,
                    dtype,
                    &format!("{g:?} {layout:?} lens {lens:?} {params:?}"),
                );
                k += 1;
            }
        }
    }
}

fn long_rows_match_reference(gpu: &Gpu) {
    let mut rng = Rng::new(4000);
    for (k, (dtype, layout)) in [Dtype::BF16, Dtype::F32]
        .into_iter()
        .flat_map(|d| LAYOUTS.map(|l| (d, l)))
        .enumerate()
    {
        let g = Geo {
            b: 3,
            b_cache: 3,
            s: 4096,
            h: 8,
            h_kv: 2,
            d: 128,
            lq: 1 + k % 2,
        };
        let case = make_case(
            &mut rng,
            g,
            vec![4000, 4096, 1],
            k == 3,
            layout,
            DecodeParams::default(),
        );
        check_attention(gpu, &case, dtype, &format!("{g:?} {layout:?}"));
    }
}

/// A serving-like batch (GQA 32/8, D 128: the 4-row kernel) where most rows are empty or hold
/// one token, beside random, full and split-boundary rows (S 512: 4 splits of 128 keys on 132
/// SMs, so rows of 128 and 129 keys take one split and two), each row checked on its own.
fn mixed_lengths_with_many_empty_and_one_token_rows(gpu: &Gpu) {
    let mut rng = Rng::new(26);
    for (k, dtype) in DTYPES.into_iter().enumerate() {
        let s = 512;
        let g = Geo {
            b: 40,
            b_cache: 44,
            s,
            h: 32,
            h_kv: 8,
            d: 128,
            lq: 1,
        };
        let mut lens: Vec<i64> = (0..g.b)
            .map(|b| match b % 5 {
                0 | 2 => 0,
                1 | 3 => 1,
                _ => rng.below(s + 1) as i64,
            })
            .collect();
        lens[4] = s as i64;
        lens[9] = 129;
        lens[14] = 128;
        for i in (1..lens.len()).rev() {
            lens.swap(i, rng.below(i + 1));
        }
        let layout = LAYOUTS[k % 2];
        let case = make_case(
            &mut rng,
            g,
            lens.clone(),
            k == 1,
            layout,
            DecodeParams::default(),
        );
        check_attention_with(
            gpu,
            &case,
            dtype,
            &format!("mixed {layout:?} lens {lens:?}"),
            true,
        );
    }
}

/// A full cache of 32768 keys (two rows full, one of 32767: 128 splits combined), GQA 4, D 128,
/// each row checked on its own.
fn full_cache_of_32768(gpu: &Gpu) {
    let mut rng = Rng::new(32768);
    for (dtype, layout) in [
        (Dtype::BF16, CacheLayout::Bshd),
        (Dtype::F32, CacheLayout::Bhsd),
    ] {
        let g = Geo {
            b: 3,
            b_cache: 3,
            s: 32768,
            h: 8,
            h_kv: 2,
            d: 128,
            lq: 1,
        };
        let case = make_case(
            &mut rng,
            g,
            vec![32768, 32767, 32768],
            dtype == Dtype::F32,
            layout,
            DecodeParams::default(),
        );
        check_attention_with(gpu, &case, dtype, &format!("full 32768 {layout:?}"), true);
    }
}

fn random_shapes_match_reference(gpu: &Gpu) {
    let s = (
        (1..5usize, 0..3usize, 1..400usize),
        (
            prop::sample::select(vec![1usize, 2, 3, 4, 8, 16]),
            1..3usize,
        ),
        prop::sample::select(vec![16usize, 32, 40, 64, 72, 96, 100, 128, 200, 256]),
        1..9usize,
        (0..4usize, any::<bool>(), any::<bool>(), any::<bool>()),
        any::<u64>(),
    );
    TestRunner::new(cases(24))
        .run(
            &s,
            |((b, extra, s), (gqa, h_kv), d, lq, (di, bhsd, idx, causal), seed)| {
                let mut rng = Rng::new(seed);
                let g = Geo {
                    b,
                    b_cache: b + extra,
                    s,
                    h: gqa * h_kv,
                    h_kv,
                    d,
                    lq,
                };
                let lens: Vec<i64> = (0..b).map(|_| rng.below(s + 1) as i64).collect();
                let layout = LAYOUTS[bhsd as usize];
                let params = DecodeParams {
                    softmax_scale: None,
                    causal,
                };
                let case = make_case(&mut rng, g, lens.clone(), idx, layout, params);
                let what = format!("{g:?} {layout:?} lens {lens:?} causal {causal}");
                check_attention(gpu, &case, FLOATS[di], &what);
                Ok(())
            },
        )
        .unwrap();
}

fn attention_is_bit_identical_over_100_launches(gpu: &Gpu) {
    let mut rng = Rng::new(100);
    let g = Geo {
        b: 4,
        b_cache: 4,
        s: 3000,
        h: 8,
        h_kv: 2,
        d: 128,
        lq: 2,
    };
    let case = make_case(
        &mut rng,
        g,
        vec![2999, 1500, 64, 3000],
        false,
        CacheLayout::Bshd,
        DecodeParams::default(),
    );
    let dev = OnDevice::new(gpu, &case, Dtype::BF16);
    let (mut ws, mut out) = dev.workspace(gpu);
    assert!(ws.splits().0 > 1, "the case must combine several splits");
    let mut first = None;
    for _ in 0..100 {
        out.o.poison(gpu).unwrap();
        out.lse.poison(gpu).unwrap();
        decode_attention_into(
            gpu,
            &dev.q,
            &dev.cache,
            dev.rows(),
            &case.params,
            &mut ws,
            &mut out,
        )
        .unwrap();
        let got = (download(gpu, &out.o), download(gpu, &out.lse));
        match &first {
            None => first = Some(got),
            Some((o, l)) => {
                assert_bit_identical("o", o, &got.0);
                assert_bit_identical("lse", l, &got.1);
            }
        }
    }
}

/// `L_new` random new tokens per row of a case, rounded to `dtype`: device tensors and values.
fn new_tokens(
    gpu: &Gpu,
    rng: &mut Rng,
    b: usize,
    l_new: usize,
    h_kv: usize,
    d: usize,
    dtype: Dtype,
) -> ((DeviceTensor, DeviceTensor), (ArrayD<f64>, ArrayD<f64>)) {
    let (k, kv) = upload(gpu, &rng.array(&[b, l_new, h_kv, d], -2.0, 2.0), dtype);
    let (v, vv) = upload(gpu, &rng.array(&[b, l_new, h_kv, d], -1.0, 1.0), dtype);
    ((k, v), (kv, vv))
}

/// The reference update of both caches of `c` (lengths before the step), in place.
fn reference_update(c: &mut Case, k: &ArrayD<f64>, v: &ArrayD<f64>) {
    let (kc, vc) = refd::kv_cache_update(
        view4(&c.k_cache),
        view4(&c.v_cache),
        view4(k),
        view4(v),
        &c.lens,
        c.idx.as_deref(),
        c.layout,
    )
    .unwrap();
    c.k_cache = kc.into_dyn();
    c.v_cache = vc.into_dyn();
}

fn kv_cache_update_is_bit_exact(gpu: &Gpu) {
    let s = (
        (1..5usize, 0..3usize, 1..100usize, 1..9usize),
        (
            1..4usize,
            prop::sample::select(vec![8usize, 36, 64, 80, 128]),
        ),
        (0..4usize, any::<bool>(), any::<bool>(), any::<u64>()),
    );
    TestRunner::new(cases(24))
        .run(
            &s,
            |((b, extra, s, l_new), (h_kv, d), (di, bhsd, idx, seed))| {
                let mut rng = Rng::new(seed);
                let s = s + l_new;
                let g = Geo {
                    b,
                    b_cache: b + extra,
                    s,
                    h: h_kv,
                    h_kv,
                    d,
                    lq: 1,
                };
                let lens: Vec<i64> = (0..b).map(|_| rng.below(s - l_new + 1) as i64).collect();
                let layout = LAYOUTS[bhsd as usize];
                let mut case = make_case(&mut rng, g, lens, idx, layout, DecodeParams::default());
                let dtype = FLOATS[di];
                let mut dev = OnDevice::new(gpu, &case, dtype);
                let ((k, v), (kv, vv)) = new_tokens(gpu, &mut rng, b, l_new, h_kv, d, dtype);
                let mut flag = DecodeFlag::new(gpu).unwrap();
                let rows = CacheRows {
                    cache_seqlens: &dev.seqlens,
                    cache_batch_idx: dev.idx.as_ref(),
                };
                kv_cache_update(
                    gpu,
                    &mut dev.cache,
                    NewTokens { k: &k, v: &v },
                    rows,
                    &mut flag,
                )
                .unwrap();
                assert_eq!(flag.take(gpu).unwrap(), 0);
                case.k_cache = dev.host.k_cache.clone();
                case.v_cache = dev.host.v_cache.clone();
                reference_update(&mut case, &kv, &vv);
                let what = format!("update {g:?} {layout:?} L_new {l_new} {dtype}");
                assert_bit_identical(
                    &format!("{what} k"),
                    &download(gpu, &dev.cache.k),
                    &case.k_cache,
                );
                assert_bit_identical(
                    &format!("{what} v"),
                    &download(gpu, &dev.cache.v),
                    &case.v_cache,
                );
                Ok(())
            },
        )
        .unwrap();
}

fn fused_step_equals_update_then_attention(gpu: &Gpu) {
    let mut rng = Rng::new(77);
    for (k, (dtype, layout)) in DTYPES
        .into_iter()
        .flat_map(|d| LAYOUTS.map(|l| (d, l)))
        .enumerate()
    {
        let l_new = [1usize, 2, 7][k % 3];
        let g = Geo {
            b: 5,
            b_cache: 6,
            s: 700,
            h: 8,
            h_kv: [8, 2, 1][k % 3],
            d: [64, 128, 80][k % 3],
            lq: l_new,
        };
        let lens = vec![0i64, 1, 63, 690, 300];
        let mut case = make_case(
            &mut rng,
            g,
            lens.clone(),
            k % 2 == 1,
            layout,
            DecodeParams::default(),
        );
        let ((nk, nv), (kv, vv)) = new_tokens(gpu, &mut rng, g.b, l_new, g.h_kv, g.d, dtype);
        let new = NewTokens { k: &nk, v: &nv };
        // fused
        let mut fused = OnDevice::new(gpu, &case, dtype);
        let (mut ws, mut out) = fused.workspace(gpu);
        let rows = CacheRows {
            cache_seqlens: &fused.seqlens,
            cache_batch_idx: fused.idx.as_ref(),
        };
        decode_step(
            gpu,
            &fused.q,
            new,
            &mut fused.cache,
            rows,
            &case.params,
            &mut ws,
            &mut out,
        )
        .unwrap();
        assert_eq!(ws.flag().take(gpu).unwrap(), 0);
        // composition: update, then attention over the advanced lengths
        let mut comp = OnDevice::new(gpu, &case, dtype);
        let mut flag = DecodeFlag::new(gpu).unwrap();
        let rows = CacheRows {
            cache_seqlens: &comp.seqlens,
            cache_batch_idx: comp.idx.as_ref(),
        };
        kv_cache_update(gpu, &mut comp.cache, new, rows, &mut flag).unwrap();
        let after: Vec<i64> = lens.iter().map(|&n| n + l_new as i64).collect();
        let after_dev = DeviceTensor::from_slice(gpu, &i32s(&after)).unwrap();
        let (mut ws2, mut out2) = comp.workspace(gpu);
        let rows2 = CacheRows {
            cache_seqlens: &after_dev,
            cache_batch_idx: comp.idx.as_ref(),
        };
        decode_attention_into(
            gpu,
            &comp.q,
            &comp.cache,
            rows2,
            &case.params,
            &mut ws2,
            &mut out2,
        )
        .unwrap();
        let what = format!("fused {g:?} {layout:?} {dtype}");
        for (name, a, b) in [
            ("k_cache", &fused.cache.k, &comp.cache.k),
            ("v_cache", &fused.cache.v, &comp.cache.v),
            ("o", &out.o, &out2.o),
            ("lse", &out.lse, &out2.lse),
        ] {
            assert_bit_identical(
                &format!("{what} {name}"),
                &download(gpu, a),
                &download(gpu, b),
            );
        }
        // and both against the reference
        case.q = fused.host.q.clone();
        case.k_cache = fused.host.k_cache.clone();
        case.v_cache = fused.host.v_cache.clone();
        reference_update(&mut case, &kv, &vv);
        case.lens = after;
        let (o, lse) = reference(&case);
        let (to, tl) = thresholds(dtype);
        assert_close(&format!("{what} o"), &download(gpu, &out.o), &o, to);
        assert_close(&format!("{what} lse"), &download(gpu, &out.lse), &lse, tl);
    }
}

fn graph_replay_follows_lengths_in_device_memory(shared: &Gpu) {
    let gpu = &shared.fork().unwrap();
    let mut rng = Rng::new(2024);
    for (dtype, layout, idx) in [
        (Dtype::BF16, CacheLayout::Bshd, false),
        (Dtype::F32, CacheLayout::Bhsd, true),
    ] {
        let g = Geo {
            b: 3,
            b_cache: 4,
            s: 1000,
            h: 8,
            h_kv: 2,
            d: 128,
            lq: 1,
        };
        let mut lens = vec![0i64, 5, 400];
        let mut case = make_case(
            &mut rng,
            g,
            lens.clone(),
            idx,
            layout,
            DecodeParams::default(),
        );
        let mut dev = OnDevice::new(gpu, &case, dtype);
        case.k_cache = dev.host.k_cache.clone();
        case.v_cache = dev.host.v_cache.clone();
        let ((mut nk, mut nv), (kh, vh)) = new_tokens(gpu, &mut rng, g.b, 1, g.h_kv, g.d, dtype);
        let (mut ws, mut out) = dev.workspace(gpu);
        let params = case.params;
        let step = |gpu: &Gpu,
                    dev: &mut OnDevice,
                    nk: &DeviceTensor,
                    nv: &DeviceTensor,
                    ws: &mut DecodeWorkspace,
                    out: &mut DecodeOutputs| {
            let rows = CacheRows {
                cache_seqlens: &dev.seqlens,
                cache_batch_idx: dev.idx.as_ref(),
            };
            let new = NewTokens { k: nk, v: nv };
            decode_step(gpu, &dev.q, new, &mut dev.cache, rows, &params, ws, out)
        };
        // one eager step (compiles, checks shapes; writes its token at the current lengths),
        // then the capture of the same step
        step(gpu, &mut dev, &nk, &nv, &mut ws, &mut out).unwrap();
        reference_update(&mut case, &kh, &vh);
        let graph = capture(gpu, |gpu| step(gpu, &mut dev, &nk, &nv, &mut ws, &mut out)).unwrap();
        for t in 0..6 {
            // advance: lengths += 1, except that row 1 starts a new sequence at step 3
            for (b, n) in lens.iter_mut().enumerate() {
                *n = if t == 3 && b == 1 { 0 } else { *n + 1 };
            }
            let q_host = rng.array(&[g.b, 1, g.h, g.d], -2.0, 2.0);
            let k_host = rng.array(&[g.b, 1, g.h_kv, g.d], -2.0, 2.0);
            let v_host = rng.array(&[g.b, 1, g.h_kv, g.d], -1.0, 1.0);
            let (qd, qh) = upload(gpu, &q_host, dtype);
            let (kd, kh) = upload(gpu, &k_host, dtype);
            let (vd, vh) = upload(gpu, &v_host, dtype);
            copy_into(gpu, &mut dev.q, &qd);
            copy_into(gpu, &mut nk, &kd);
            copy_into(gpu, &mut nv, &vd);
            dev.seqlens.copy_from_host(gpu, &i32s(&lens)).unwrap();
            case.lens = lens.clone();
            out.o.poison(gpu).unwrap();
            out.lse.poison(gpu).unwrap();
            graph.replay().unwrap();
            gpu.synchronize().unwrap();
            reference_update(&mut case, &kh, &vh);
            let mut seen = case.clone();
            seen.q = qh;
            seen.lens = lens.iter().map(|&n| n + 1).collect();
            let (o, lse) = reference(&seen);
            let (to, tl) = thresholds(dtype);
            let what = format!("replay {t} {dtype} {layout:?} lens {:?}", seen.lens);
            assert_close(&format!("{what} o"), &download(gpu, &out.o), &o, to);
            assert_close(&format!("{what} lse"), &download(gpu, &out.lse), &lse, tl);
            assert_bit_identical(
                &format!("{what} k_cache"),
                &download(gpu, &dev.cache.k),
                &case.k_cache,
            );
        }
        assert_eq!(ws.flag().take(gpu).unwrap(), 0);
    }
}

/// Copies `src` into `dst` (same shape and dtype) on the stream, device to device.
fn copy_into(gpu: &Gpu, dst: &mut DeviceTensor, src: &DeviceTensor) {
    let n = src.num_bytes();
    let from = src.buffer().slice(0..n);
    let mut to = dst.buffer_mut().slice_mut(0..n);
    gpu.stream().memcpy_dtod(&from, &mut to).unwrap();
}

fn out_of_range_rows_raise_the_device_flag(gpu: &Gpu) {
    let mut rng = Rng::new(5);
    let g = Geo {
        b: 3,
        b_cache: 4,
        s: 300,
        h: 4,
        h_kv: 2,
        d: 64,
        lq: 1,
    };
    // rows 0, 1, 2 valid with cache rows 0, 1, 2 (row 3 unused: all NaN)
    let case = make_case(
        &mut rng,
        g,
        vec![10, 100, 250],
        false,
        CacheLayout::Bshd,
        DecodeParams::default(),
    );
    // row 1's bad length or index, the flag bit, the argument the error names
    let bad: [(Vec<i64>, Vec<i64>, u32, &str); 4] = [
        (vec![10, 301, 250], vec![0, 1, 2], 1, "cache_seqlens"),
        (vec![10, -1, 250], vec![0, 1, 2], 1, "cache_seqlens"),
        (vec![10, 100, 250], vec![0, 4, 2], 2, "cache_batch_idx"),
        (vec![10, 100, 250], vec![0, 0, 2], 4, "cache_batch_idx"),
    ];
    let mut good = case.clone();
    good.lens = vec![10, 0, 250];
    for (lens, idx, bit, arg) in bad {
        let dev = OnDevice::new(gpu, &case, Dtype::BF16);
        let seqlens = DeviceTensor::from_slice(gpu, &i32s(&lens)).unwrap();
        let idx_dev = DeviceTensor::from_slice(gpu, &i32s(&idx)).unwrap();
        let rows = CacheRows {
            cache_seqlens: &seqlens,
            cache_batch_idx: Some(&idx_dev),
        };
        let (mut ws, mut out) = dev.workspace(gpu);
        decode_attention_into(
            gpu,
            &dev.q,
            &dev.cache,
            rows,
            &case.params,
            &mut ws,
            &mut out,
        )
        .unwrap();
        assert_eq!(ws.flag().take(gpu).unwrap(), bit, "{lens:?} {idx:?}");
        assert_eq!(ws.flag().take(gpu).unwrap(), 0, "take clears the flag");
        // row 1 is NaN, rows 0 and 2 are right
        let (o, lse) = (download(gpu, &out.o), download(gpu, &out.lse));
        assert!(o.slice(s![1, .., .., ..]).iter().all(|v| v.is_nan()));
        assert!(lse.slice(s![1, .., ..]).iter().all(|v| v.is_nan()));
        good.q = dev.host.q.clone();
        good.k_cache = dev.host.k_cache.clone();
        good.v_cache = dev.host.v_cache.clone();
        let (want, _) = reference(&good);
        for b in [0usize, 2] {
            assert_close(
                &format!("row {b} beside a bad row"),
                &o.slice(s![b, .., .., ..]).to_owned().into_dyn(),
                &want.slice(s![b, .., .., ..]).to_owned().into_dyn(),
                HALF_O,
            );
        }
        // the checked allocating wrapper turns the flag into a typed error
        let e = decode_attention(gpu, &dev.q, &dev.cache, rows, &case.params).unwrap_err();
        match e {
            attn_gpu::GpuError::Input(e) => {
                assert_eq!((e.kind, e.arg.as_str()), (ErrorKind::Index, arg))
            }
            other => panic!("expected a typed input error, got {other}"),
        }
        // the update skips the row: its cache row stays bit for bit
        let mut upd = OnDevice::new(gpu, &case, Dtype::BF16);
        let before = download(gpu, &upd.cache.k);
        let ((nk, nv), _) = new_tokens(gpu, &mut rng, g.b, 1, g.h_kv, g.d, Dtype::BF16);
        let mut flag = DecodeFlag::new(gpu).unwrap();
        kv_cache_update(
            gpu,
            &mut upd.cache,
            NewTokens { k: &nk, v: &nv },
            rows,
            &mut flag,
        )
        .unwrap();
        assert_eq!(flag.take(gpu).unwrap(), bit);
        let after = download(gpu, &upd.cache.k);
        // cache row 1 is written by nobody (row 1 refused), rows 0 and 2 were written
        assert_bit_identical(
            "cache row 1",
            &after.slice(s![1, .., .., ..]).to_owned().into_dyn(),
            &before.slice(s![1, .., .., ..]).to_owned().into_dyn(),
        );
        assert_ne!(
            after.slice(s![0, 10, .., ..]).to_owned(),
            before.slice(s![0, 10, .., ..]).to_owned(),
            "row 0 written"
        );
    }
}

gpu_tests!(
    spec_cases_match_reference,
    long_rows_match_reference,
    mixed_lengths_with_many_empty_and_one_token_rows,
    full_cache_of_32768,
    random_shapes_match_reference,
    attention_is_bit_identical_over_100_launches,
    kv_cache_update_is_bit_exact,
    fused_step_equals_update_then_attention,
    graph_replay_follows_lengths_in_device_memory,
    out_of_range_rows_raise_the_device_flag
);
