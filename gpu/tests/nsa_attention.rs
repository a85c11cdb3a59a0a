//! GPU NSA part 2 against the float64 reference (`conformance/spec/ops-nsa.md` §3, §5, §7):
//! `nsa_compression_attention` (every visibility, both `empty_lse`, `T < BS`, varlen with empty,
//! short and partial-block sequences), `nsa_selection_attention` (random past blocks padded with
//! `-1`, future and past-the-end indices, duplicates counted twice, tensor counts with zeros,
//! the current partial block, int32 and int64 indices) and `nsa_fwd` (given indices with and
//! without `g_cmp`, `g_slc` absent, windows 0, 1, 16 and `>= T`, tensor counts, computed
//! selection checked by the §7 rule). `G` in {1, 2, 16, 32}, `K != V`, tensor-core and CUDA-core
//! shapes, bf16 and fp32 (f16 and f64 too). Outputs are NaN-poisoned before each launch; varlen
//! isolation; determinism over 100 launches; bad input refused, naming the argument, before
//! any launch. Without a GPU each test says why and passes.

mod common;

use attn_gpu::{
    nsa_compression_attention_into, nsa_fwd, nsa_selection_attention_into, CmpAttnInputs,
    CmpAttnParams, DeviceTensor, FwdInputs, Gpu, GpuError, SelAttnInputs,
};
use attn_reference::nsa::{self as r, AttnOut, BlockCounts, CmpLayout, EmptyLse, FwdGates};
use attn_reference::nsa::{PartialBlock, SelectMode, Visibility};
use attn_reference::Dtype;
use common::nsa::{assert_index_rule, delta_for};
use common::*;
use ndarray::{Array3, Array4, ArrayD, Ix3, Ix4};

fn d4(a: &ArrayD<f64>) -> ndarray::ArrayView4<'_, f64> {
    a.view().into_dimensionality::<Ix4>().unwrap()
}
fn d3(a: &ArrayD<f64>) -> ndarray::ArrayView3<'_, f64> {
    a.view().into_dimensionality::<Ix3>().unwrap()
}

/// `(HQ, H, K, V)`: tensor-core shapes (bf16/f16) with `G` 16, 2, 1, 16 and 32 (two m tiles),
/// then shapes that run on CUDA cores in every dtype.
const SHAPES: [(usize, usize, usize, usize); 7] = [
    (16, 1, 64, 64),
    (2, 1, 32, 64),
    (4, 4, 128, 128),
    (32, 2, 64, 32),
    (64, 2, 32, 32),
    (6, 3, 48, 20),
    (16, 1, 16, 8),
];

/// Batch shape and `cu_seqlens`: fixed length `[b, t]`, or varlen over about `t` tokens with an
/// empty first sequence, random ones, and a one-token last one.
fn layout(rng: &mut Rng, varlen: bool, t: usize) -> (usize, usize, Option<Vec<i64>>) {
    if !varlen {
        return (1 + rng.below(2), t, None);
    }
    let n = 2 + rng.below(3);
    let mut cu = random_cu_seqlens(rng, t, n);
    let last = *cu.last().unwrap();
    cu.insert(1, 0);
    cu.push(last + 1);
    (1, last as usize + 1, Some(cu))
}

/// `o` by the rule of `conformance/spec/README.md` for the output dtype, `lse` (float32) by 5e-3
/// for half inputs, else 1e-5; `-inf` positions must match.
fn check_attn(
    what: &str,
    gpu: &Gpu,
    o: &DeviceTensor,
    lse: &DeviceTensor,
    want: &AttnOut<f64>,
    dtype: Dtype,
) {
    let half = matches!(dtype, Dtype::BF16 | Dtype::F16);
    let o_thr = threshold(dtype, 1e-5);
    assert_close(
        &format!("{what}: o"),
        &download(gpu, o),
        &want.o.clone().into_dyn(),
        o_thr,
    );
    let l_thr = if half { 5e-3 } else { 1e-5 };
    assert_close(
        &format!("{what}: lse"),
        &download(gpu, lse),
        &want.lse.clone().into_dyn(),
        l_thr,
    );
}

// ---------------------------------------------------------------- nsa_compression_attention

#[allow(clippy::too_many_arguments)]
fn cmp_case(
    gpu: &Gpu,
    rng: &mut Rng,
    dtype: Dtype,
    (hq, h, kd, vd): (usize, usize, usize, usize),
    varlen: bool,
    bs: i64,
    t0: usize,
    p: CmpAttnParams,
) {
    let (b, t, cu) = layout(rng, varlen, t0);
    let lay = CmpLayout::new(b, t, cu.as_deref(), bs as usize, p.partial_block).unwrap();
    let cb = if lay.varlen { 1 } else { b };
    let q = upload(gpu, &rng.array(&[b, t, hq, kd], -2.0, 2.0), dtype);
    let kc = upload(gpu, &rng.array(&[cb, lay.rows, h, kd], -2.0, 2.0), dtype);
    let vc = upload(gpu, &rng.array(&[cb, lay.rows, h, vd], -2.0, 2.0), dtype);
    let want = r::nsa_compression_attention(
        d4(&q.1),
        d4(&kc.1),
        d4(&vc.1),
        cu.as_deref(),
        bs,
        p.scale,
        p.visibility,
        p.partial_block,
        p.empty_lse,
    )
    .unwrap();
    let mut o = poisoned(gpu, want.o.shape(), dtype);
    let mut lse = poisoned(gpu, want.lse.shape(), Dtype::F32);
    let x = CmpAttnInputs {
        q: &q.0,
        k_cmp: &kc.0,
        v_cmp: &vc.0,
    };
    nsa_compression_attention_into(gpu, &x, cu.as_deref(), &p, &mut o, Some(&mut lse)).unwrap();
    let what =
        format!("compression {dtype} b{b} t{t} hq{hq} h{h} k{kd} v{vd} bs{bs} {p:?} cu {cu:?}");
    check_attn(&what, gpu, &o, &lse, &want, dtype);
}

fn compression_attention_matches_the_reference(gpu: &Gpu) {
    let mut rng = Rng::new(0xc0de);
    let n = cases(28).cases as usize;
    let vis = [Visibility::Complete, Visibility::Started, Visibility::All];
    for i in 0..n {
        let dtype = [Dtype::BF16, Dtype::F32, Dtype::BF16, Dtype::F16, Dtype::F64][i % 5];
        let shape = SHAPES[i % SHAPES.len()];
        let bs = [4i64, 8, 16, 32, 64][rng.below(5)];
        // every tenth case shorter than one block: every "complete" row empty
        let t0 = if i % 10 == 9 {
            1 + rng.below(bs as usize - 1)
        } else {
            1 + rng.below(160)
        };
        let p = CmpAttnParams {
            block_size: bs,
            scale: (i % 3 == 0).then(|| rng.uniform(0.05, 0.5)),
            visibility: vis[i % 3],
            partial_block: if i % 4 < 2 {
                PartialBlock::MeanOfValid
            } else {
                PartialBlock::Drop
            },
            empty_lse: if i % 2 == 0 {
                EmptyLse::NegInf
            } else {
                EmptyLse::Zero
            },
        };
        cmp_case(gpu, &mut rng, dtype, shape, i % 3 != 1, bs, t0, p);
    }
}

// ---------------------------------------------------------------- nsa_selection_attention

/// The slots of a row at position `p`: past blocks (the current, possibly partial, one
/// included), `-1`, other negatives, future blocks, blocks far past the sequence end, and
/// duplicates of earlier slots.
fn random_slots(rng: &mut Rng, p: usize, bs: usize, s: usize) -> Vec<i64> {
    let last = (p / bs) as i64;
    let mut row: Vec<i64> = Vec::with_capacity(s);
    for _ in 0..s {
        let v = match rng.below(10) {
            0..=4 => rng.below(last as usize + 1) as i64,
            5 => -1,
            6 => -(2 + rng.below(5) as i64),
            7 => last + 1 + rng.below(4) as i64,
            8 => [1i64 << 40, i64::MAX, i32::MAX as i64][rng.below(3)],
            _ => row.last().copied().unwrap_or(last),
        };
        row.push(v);
    }
    row
}

/// `[B, T, H, S]` random slots for every row (positions from the layout).
fn random_indices(
    rng: &mut Rng,
    lay: &CmpLayout,
    (b, t, h): (usize, usize, usize),
    s: usize,
) -> Array4<i64> {
    let mut idx = Array4::<i64>::zeros((b, t, h, s));
    for bb in 0..b {
        for tt in 0..t {
            let p = tt - lay.seqs[lay.seq_of(bb, tt)].bos;
            for hh in 0..h {
                let row = random_slots(rng, p, lay.bs, s);
                for (i, v) in row.into_iter().enumerate() {
                    idx[[bb, tt, hh, i]] = v;
                }
            }
        }
    }
    idx
}

/// Indices on the device: int64 as they are, or int32 (values outside int32 become -1, as
/// invalid as they were).
fn upload_indices(gpu: &Gpu, idx: &Array4<i64>, wide: bool) -> DeviceTensor {
    if wide {
        DeviceTensor::from_array(gpu, idx.view().into_dyn()).unwrap()
    } else {
        let narrow = idx.mapv(|v| i32::try_from(v).unwrap_or(-1));
        DeviceTensor::from_array(gpu, narrow.view().into_dyn()).unwrap()
    }
}

#[allow(clippy::too_many_arguments)]
fn sel_case(
    gpu: &Gpu,
    rng: &mut Rng,
    dtype: Dtype,
    (hq, h, kd, vd): (usize, usize, usize, usize),
    varlen: bool,
    bs: i64,
    s: usize,
    tensor_counts: bool,
    wide: bool,
) {
    let t0 = 1 + rng.below(160);
    let (b, t, cu) = layout(rng, varlen, t0);
    let lay = CmpLayout::new(b, t, cu.as_deref(), bs as usize, PartialBlock::MeanOfValid).unwrap();
    let q = upload(gpu, &rng.array(&[b, t, hq, kd], -2.0, 2.0), dtype);
    let k = upload(gpu, &rng.array(&[b, t, h, kd], -2.0, 2.0), dtype);
    let v = upload(gpu, &rng.array(&[b, t, h, vd], -2.0, 2.0), dtype);
    let idx = random_indices(rng, &lay, (b, t, h), s);
    // counts with many zeros (empty rows: o = 0, lse = -inf)
    let counts = tensor_counts.then(|| {
        Array3::from_shape_fn((b, t, h), |_| {
            rng.below(s + 1).saturating_sub(rng.below(2)) as i64
        })
    });
    let bc = counts.as_ref().map(|c| BlockCounts::Tensor(c.view()));
    let scale = rng.uniform(0.05, 0.4);
    let want = r::nsa_selection_attention(
        d4(&q.1),
        d4(&k.1),
        d4(&v.1),
        idx.view(),
        bc,
        cu.as_deref(),
        bs,
        Some(scale),
    )
    .unwrap();
    let di = upload_indices(gpu, &idx, wide);
    let mut o = poisoned(gpu, want.o.shape(), dtype);
    let mut lse = poisoned(gpu, want.lse.shape(), Dtype::F32);
    let x = SelAttnInputs {
        q: &q.0,
        k: &k.0,
        v: &v.0,
        block_indices: &di,
    };
    nsa_selection_attention_into(
        gpu,
        &x,
        bc,
        cu.as_deref(),
        bs,
        Some(scale),
        &mut o,
        Some(&mut lse),
    )
    .unwrap();
    let what = format!("selection {dtype} b{b} t{t} hq{hq} h{h} k{kd} v{vd} bs{bs} s{s} counts {tensor_counts} cu {cu:?}");
    check_attn(&what, gpu, &o, &lse, &want, dtype);
}

fn selection_attention_matches_the_reference(gpu: &Gpu) {
    let mut rng = Rng::new(0x5e1);
    let n = cases(28).cases as usize;
    for i in 0..n {
        let dtype = [Dtype::BF16, Dtype::F32, Dtype::BF16, Dtype::F16, Dtype::F64][i % 5];
        let shape = SHAPES[i % SHAPES.len()];
        let bs = [1i64, 4, 8, 16, 32][rng.below(5)];
        let s = [0usize, 1, 3, 5, 8, 16][rng.below(6)];
        sel_case(
            gpu,
            &mut rng,
            dtype,
            shape,
            i % 3 != 1,
            bs,
            s,
            i % 2 == 0,
            i % 4 < 2,
        );
    }
}

fn selection_attention_counts_duplicates_twice(gpu: &Gpu) {
    // a row selecting block 0 twice must weigh its keys twice: differs from selecting it once
    let mut rng = Rng::new(22);
    let (t, hq, h, d, bs) = (64, 16, 1, 64, 16i64);
    let q = upload(gpu, &rng.array(&[1, t, hq, d], -2.0, 2.0), Dtype::BF16);
    let k = upload(gpu, &rng.array(&[1, t, h, d], -2.0, 2.0), Dtype::BF16);
    let v = upload(gpu, &rng.array(&[1, t, h, d], -2.0, 2.0), Dtype::BF16);
    let run = |slots: [i64; 2]| {
        let idx = Array4::from_shape_fn(
            (1, t, h, 2),
            |(_, tt, _, i)| {
                if tt >= 20 {
                    slots[i]
                } else {
                    0
                }
            },
        );
        let want = r::nsa_selection_attention(
            d4(&q.1),
            d4(&k.1),
            d4(&v.1),
            idx.view(),
            None,
            None,
            bs,
            None,
        )
        .unwrap();
        let di = upload_indices(gpu, &idx, false);
        let x = SelAttnInputs {
            q: &q.0,
            k: &k.0,
            v: &v.0,
            block_indices: &di,
        };
        let mut o = poisoned(gpu, want.o.shape(), Dtype::BF16);
        let mut lse = poisoned(gpu, want.lse.shape(), Dtype::F32);
        nsa_selection_attention_into(gpu, &x, None, None, bs, None, &mut o, Some(&mut lse))
            .unwrap();
        check_attn(
            &format!("slots {slots:?}"),
            gpu,
            &o,
            &lse,
            &want,
            Dtype::BF16,
        );
        download(gpu, &o)
    };
    let twice = run([0, 0]);
    let with_one = run([0, 1]);
    let once = run([0, -1]);
    // rows past block 1 see block 0 twice vs once: the softmax weights differ
    let differs = |a: &ArrayD<f64>, b: &ArrayD<f64>| {
        a.slice(ndarray::s![.., 40.., .., ..])
            .iter()
            .zip(b.slice(ndarray::s![.., 40.., .., ..]).iter())
            .any(|(x, y)| x != y)
    };
    assert!(
        differs(&twice, &with_one),
        "a duplicate slot must not act as another block"
    );
    // duplicates of one block: the same softmax as the block once (weights doubled and renormalised)
    assert_close("duplicate vs once", &twice, &once, 5e-3);
}

// ---------------------------------------------------------------- nsa_fwd

/// One `nsa_fwd` case: given indices (`given`) or the computed selection (with `g_cmp`).
#[allow(clippy::too_many_arguments)]
fn fwd_case(
    gpu: &Gpu,
    rng: &mut Rng,
    dtype: Dtype,
    (hq, h, kd, vd): (usize, usize, usize, usize),
    varlen: bool,
    bs: i64,
    window: i64,
    (with_cmp, with_slc, given, tensor_counts): (bool, bool, bool, bool),
) {
    let t0 = 1 + rng.below(150);
    let (b, t, cu) = layout(rng, varlen, t0);
    let cu = cu.as_deref();
    let lay = CmpLayout::new(b, t, cu, bs as usize, PartialBlock::MeanOfValid).unwrap();
    let q = upload(gpu, &rng.array(&[b, t, hq, kd], -2.0, 2.0), dtype);
    let k = upload(gpu, &rng.array(&[b, t, h, kd], -2.0, 2.0), dtype);
    let v = upload(gpu, &rng.array(&[b, t, h, vd], -2.0, 2.0), dtype);
    let gate = |rng: &mut Rng| upload(gpu, &rng.array(&[b, t, hq], 0.0, 1.0), dtype);
    let g_cmp = (with_cmp || !given).then(|| gate(rng));
    let g_slc = with_slc.then(|| gate(rng));
    let g_swa = (window > 0 || rng.below(2) == 0).then(|| gate(rng));
    let s = 1 + rng.below(6);
    let idx = given.then(|| random_indices(rng, &lay, (b, t, h), s));
    let counts =
        tensor_counts.then(|| Array3::from_shape_fn((b, t, h), |_| rng.below(s + 1) as i64));
    let bc = match &counts {
        Some(c) => Some(BlockCounts::Tensor(c.view())),
        None if !given => Some(BlockCounts::Int(s as i64)),
        None => None,
    };
    let scale = (rng.below(2) == 0).then(|| rng.uniform(0.05, 0.4));
    let di = idx
        .as_ref()
        .map(|i| upload_indices(gpu, i, rng.below(2) == 0));
    let x = FwdInputs {
        q: &q.0,
        k: &k.0,
        v: &v.0,
        g_cmp: g_cmp.as_ref().map(|g| &g.0),
        g_slc: g_slc.as_ref().map(|g| &g.0),
        g_swa: g_swa.as_ref().map(|g| &g.0),
        block_indices: di.as_ref(),
    };
    let got = nsa_fwd(gpu, &x, bc, cu, bs, window, scale).unwrap();
    let gates = FwdGates {
        g_cmp: g_cmp.as_ref().map(|g| d3(&g.1)),
        g_slc: g_slc.as_ref().map(|g| d3(&g.1)),
        g_swa: g_swa.as_ref().map(|g| d3(&g.1)),
    };
    let what = format!(
        "fwd {dtype} b{b} t{t} hq{hq} h{h} k{kd} v{vd} bs{bs} w{window} s{s} cmp {with_cmp} slc {with_slc} given {given} counts {tensor_counts} cu {cu:?}"
    );
    let (q4, k4, v4) = (d4(&q.1), d4(&k.1), d4(&v.1));
    let want = match &idx {
        Some(i) => {
            assert!(
                got.block_indices.is_none(),
                "{what}: indices returned though given"
            );
            r::nsa_fwd(q4, k4, v4, gates, Some(i.view()), bc, cu, bs, window, scale).unwrap()
        }
        None => {
            // §7: the selection by the index rule, then the reference o with the GPU's indices
            let sel = r::nsa_fwd(q4, k4, v4, gates, None, bc, cu, bs, window, scale).unwrap();
            let gi = got
                .block_indices
                .as_ref()
                .expect("computed indices returned");
            let gi = gi.to_array::<i32>(gpu).unwrap();
            let want_idx = sel.block_indices.as_ref().unwrap();
            let banded = assert_index_rule(
                &what,
                &gi,
                want_idx,
                sel.scores.as_ref().unwrap(),
                SelectMode::Fla,
                delta_for(dtype),
            );
            assert!(
                banded * 20 <= gi.len() / s + 20,
                "{what}: {banded} rows passed only by the band"
            );
            let gi4 = gi.into_dimensionality::<Ix4>().unwrap().mapv(i64::from);
            let counts = bc.filter(|c| matches!(c, BlockCounts::Tensor(_)));
            r::nsa_fwd(
                q4,
                k4,
                v4,
                gates,
                Some(gi4.view()),
                counts,
                cu,
                bs,
                window,
                scale,
            )
            .unwrap()
        }
    };
    assert_close(
        &format!("{what}: o"),
        &download(gpu, &got.o),
        &want.o.into_dyn(),
        threshold(dtype, 1e-5),
    );
}

fn fwd_matches_the_reference(gpu: &Gpu) {
    let mut rng = Rng::new(0xf0d);
    let n = cases(25).cases as usize;
    // G 1, 4 (CPU and GPU only) and 16
    let shapes = [
        (4, 4, 64, 64),
        (16, 4, 32, 64),
        (16, 1, 64, 64),
        (8, 2, 48, 24),
    ];
    for i in 0..n {
        let dtype = [Dtype::BF16, Dtype::F32, Dtype::BF16, Dtype::F64][i % 4];
        let shape = shapes[i % shapes.len()];
        let bs = [4i64, 8, 16, 32][rng.below(4)];
        let window = [0i64, 1, 16, 1000][(i / 2) % 4];
        let given = i % 3 != 0;
        let flags = (given && i % 2 == 0, i % 5 != 4, given, i % 4 == 1);
        fwd_case(gpu, &mut rng, dtype, shape, i % 2 == 1, bs, window, flags);
    }
}

// ---------------------------------------------------------------- isolation, determinism, errors

fn varlen_sequences_are_isolated(gpu: &Gpu) {
    let mut rng = Rng::new(77);
    let cu = [0i64, 70, 150, 230];
    let (t, hq, h, d, bs) = (230, 16, 2, 64, 16i64);
    let qa = rng.array(&[1, t, hq, d], -2.0, 2.0);
    let ka = rng.array(&[1, t, h, d], -2.0, 2.0);
    let va = rng.array(&[1, t, h, d], -2.0, 2.0);
    let g = upload(gpu, &rng.array(&[1, t, hq], 0.0, 1.0), Dtype::BF16).0;
    let run = |qa: &ArrayD<f64>, ka: &ArrayD<f64>, va: &ArrayD<f64>| {
        let (q, k, v) = (
            upload(gpu, qa, Dtype::BF16).0,
            upload(gpu, ka, Dtype::BF16).0,
            upload(gpu, va, Dtype::BF16).0,
        );
        let x = FwdInputs {
            q: &q,
            k: &k,
            v: &v,
            g_cmp: Some(&g),
            g_slc: Some(&g),
            g_swa: Some(&g),
            block_indices: None,
        };
        let r = nsa_fwd(gpu, &x, Some(BlockCounts::Int(4)), Some(&cu), bs, 16, None).unwrap();
        (
            download(gpu, &r.o),
            r.block_indices.unwrap().to_array::<i32>(gpu).unwrap(),
        )
    };
    let (o0, i0) = run(&qa, &ka, &va);
    // change every input of the middle sequence (tokens 70..150)
    let mut qb = qa.clone();
    let mut kb = ka.clone();
    let mut vb = va.clone();
    for a in [&mut qb, &mut kb, &mut vb] {
        a.slice_mut(ndarray::s![.., 70..150, .., ..])
            .mapv_inplace(|x| -0.5 * x + 0.25);
    }
    let (o1, i1) = run(&qb, &kb, &vb);
    for (lo, hi) in [(0usize, 70usize), (150, 230)] {
        let sl = ndarray::s![.., lo..hi, .., ..];
        assert_bit_identical(
            "o of an unchanged sequence",
            &o0.slice(sl).to_owned().into_dyn(),
            &o1.slice(sl).to_owned().into_dyn(),
        );
        assert_eq!(
            i0.slice(sl),
            i1.slice(sl),
            "block_indices of an unchanged sequence"
        );
    }
    let changed = o0
        .slice(ndarray::s![.., 70..150, .., ..])
        .iter()
        .zip(o1.slice(ndarray::s![.., 70..150, .., ..]).iter())
        .filter(|(a, b)| a != b)
        .count();
    assert!(changed > 0, "the changed sequence's outputs must change");
}

fn repeated_launches_are_bit_identical(gpu: &Gpu) {
    let mut rng = Rng::new(100);
    let (t, hq, h, d) = (1000, 32, 2, 128);
    let q = upload(gpu, &rng.array(&[1, t, hq, d], -2.0, 2.0), Dtype::BF16).0;
    let k = upload(gpu, &rng.array(&[1, t, h, d], -2.0, 2.0), Dtype::BF16).0;
    let v = upload(gpu, &rng.array(&[1, t, h, d], -2.0, 2.0), Dtype::BF16).0;
    let g = upload(gpu, &rng.array(&[1, t, hq], 0.0, 1.0), Dtype::BF16).0;
    let x = FwdInputs {
        q: &q,
        k: &k,
        v: &v,
        g_cmp: Some(&g),
        g_slc: None,
        g_swa: Some(&g),
        block_indices: None,
    };
    let mut first: Option<(ArrayD<f64>, ArrayD<i32>)> = None;
    for _ in 0..100 {
        let r = nsa_fwd(gpu, &x, Some(BlockCounts::Int(8)), None, 32, 64, None).unwrap();
        let now = (
            download(gpu, &r.o),
            r.block_indices.unwrap().to_array::<i32>(gpu).unwrap(),
        );
        assert!(now.0.iter().all(|v| v.is_finite()), "every element written");
        match &first {
            None => first = Some(now),
            Some((o0, i0)) => {
                assert_bit_identical("o", o0, &now.0);
                assert_eq!(i0, &now.1, "block_indices");
            }
        }
    }
}

fn arg_of(e: GpuError) -> String {
    match e {
        GpuError::Input(e) => e.arg,
        other => panic!("expected an input error, got {other}"),
    }
}

fn bad_input_is_refused_before_any_launch(gpu: &Gpu) {
    let mut rng = Rng::new(3);
    let up = |rng: &mut Rng, s: &[usize], d| upload(gpu, &rng.array(s, -1.0, 1.0), d).0;
    let q = up(&mut rng, &[1, 64, 4, 32], Dtype::BF16);
    let kc = up(&mut rng, &[1, 8, 2, 32], Dtype::BF16);
    let vc = up(&mut rng, &[1, 8, 2, 16], Dtype::BF16);
    let vc_f32 = up(&mut rng, &[1, 8, 2, 16], Dtype::F32);
    let q_wide = up(&mut rng, &[1, 64, 4, 300], Dtype::BF16);
    let kc_wide = up(&mut rng, &[1, 8, 2, 300], Dtype::BF16);
    let vc_wide = up(&mut rng, &[1, 8, 2, 264], Dtype::BF16);
    let v_wide = up(&mut rng, &[1, 64, 2, 264], Dtype::BF16);
    let p = CmpAttnParams {
        block_size: 8,
        ..CmpAttnParams::default()
    };
    let cmp = |q, k_cmp, v_cmp, p: CmpAttnParams, cu: Option<&[i64]>| {
        let mut o = poisoned(gpu, &[1, 64, 4, 16], Dtype::BF16);
        let x = CmpAttnInputs { q, k_cmp, v_cmp };
        let e = nsa_compression_attention_into(gpu, &x, cu, &p, &mut o, None).map(|_| ());
        (e, o)
    };
    let (e, o) = cmp(&q, &kc, &vc_f32, p, None);
    assert_eq!(arg_of(e.unwrap_err()), "v_cmp");
    assert!(
        download(gpu, &o).iter().all(|v| v.is_nan()),
        "nothing launched"
    );
    assert_eq!(
        arg_of(cmp(&q_wide, &kc_wide, &vc, p, None).0.unwrap_err()),
        "q"
    );
    assert_eq!(
        arg_of(cmp(&q, &kc, &vc_wide, p, None).0.unwrap_err()),
        "v_cmp"
    );
    assert_eq!(
        arg_of(
            cmp(&q, &kc, &vc, CmpAttnParams { block_size: 3, ..p }, None)
                .0
                .unwrap_err()
        ),
        "block_size"
    );
    assert_eq!(
        arg_of(
            cmp(
                &q,
                &kc,
                &vc,
                CmpAttnParams {
                    block_size: 16,
                    ..p
                },
                None
            )
            .0
            .unwrap_err()
        ),
        "k_cmp"
    );
    assert_eq!(
        arg_of(
            cmp(
                &q,
                &kc,
                &vc,
                CmpAttnParams {
                    scale: Some(-1.0),
                    ..p
                },
                None
            )
            .0
            .unwrap_err()
        ),
        "scale"
    );
    assert_eq!(
        arg_of(cmp(&q, &kc, &vc, p, Some(&[0, 70])).0.unwrap_err()),
        "cu_seqlens"
    );
    // the output's shape is checked too, before the launch
    let x = CmpAttnInputs {
        q: &q,
        k_cmp: &kc,
        v_cmp: &vc,
    };
    let mut o = poisoned(gpu, &[1, 64, 4, 16], Dtype::BF16);
    let mut bad_lse = poisoned(gpu, &[1, 64, 5], Dtype::F32);
    let e = nsa_compression_attention_into(gpu, &x, None, &p, &mut o, Some(&mut bad_lse));
    assert_eq!(arg_of(e.unwrap_err()), "lse");
    assert!(
        download(gpu, &o).iter().all(|v| v.is_nan()),
        "nothing launched"
    );

    // selection attention
    let k = up(&mut rng, &[1, 64, 2, 32], Dtype::BF16);
    let v = up(&mut rng, &[1, 64, 2, 16], Dtype::BF16);
    let idx = DeviceTensor::from_array(gpu, Array4::<i32>::zeros((1, 64, 2, 4)).view().into_dyn())
        .unwrap();
    let idx_f = up(&mut rng, &[1, 64, 2, 4], Dtype::F32);
    let sel = |idx: &DeviceTensor, bc: Option<BlockCounts<'_>>| {
        let x = SelAttnInputs {
            q: &q,
            k: &k,
            v: &v,
            block_indices: idx,
        };
        attn_gpu::nsa_selection_attention(gpu, &x, bc, None, 8, None).map(|_| ())
    };
    assert_eq!(arg_of(sel(&idx_f, None).unwrap_err()), "block_indices");
    assert_eq!(
        arg_of(sel(&idx, Some(BlockCounts::Int(3))).unwrap_err()),
        "block_counts"
    );
    let over = Array3::from_elem((1, 64, 2), 5i64);
    assert_eq!(
        arg_of(sel(&idx, Some(BlockCounts::Tensor(over.view()))).unwrap_err()),
        "block_counts"
    );
    assert!(sel(&idx, Some(BlockCounts::Int(4))).is_ok());

    // nsa_fwd
    let g = up(&mut rng, &[1, 64, 4], Dtype::BF16);
    let g_bad = up(&mut rng, &[1, 64, 3], Dtype::BF16);
    let fwd = |x: FwdInputs<'_>, bc, w| nsa_fwd(gpu, &x, bc, None, 8, w, None).map(|_| ());
    let base = FwdInputs {
        q: &q,
        k: &k,
        v: &v,
        g_cmp: None,
        g_slc: None,
        g_swa: None,
        block_indices: None,
    };
    assert_eq!(arg_of(fwd(base, None, 0).unwrap_err()), "block_indices");
    let with_cmp = FwdInputs {
        g_cmp: Some(&g),
        ..base
    };
    assert_eq!(arg_of(fwd(with_cmp, None, 4).unwrap_err()), "g_swa");
    assert_eq!(arg_of(fwd(with_cmp, None, -1).unwrap_err()), "window_size");
    assert_eq!(
        arg_of(
            fwd(
                FwdInputs {
                    g_slc: Some(&g_bad),
                    ..with_cmp
                },
                None,
                0
            )
            .unwrap_err()
        ),
        "g_slc"
    );
    assert_eq!(
        arg_of(fwd(with_cmp, Some(BlockCounts::Int(33)), 0).unwrap_err()),
        "block_counts"
    );
    assert_eq!(
        arg_of(
            fwd(
                FwdInputs {
                    v: &v_wide,
                    ..with_cmp
                },
                None,
                0
            )
            .unwrap_err()
        ),
        "v"
    );
    assert!(fwd(with_cmp, Some(BlockCounts::Int(4)), 0).is_ok());
}

gpu_tests!(
    compression_attention_matches_the_reference,
    selection_attention_matches_the_reference,
    selection_attention_counts_duplicates_twice,
    fwd_matches_the_reference,
    varlen_sequences_are_isolated,
    repeated_launches_are_bit_identical,
    bad_input_is_refused_before_any_launch
);
