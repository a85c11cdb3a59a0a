//! Static-cache decoding, `conformance/spec/ops-decode.md`: `kv_cache_update`, `decode_attention`.
//! Each op's registry entry, its float64 CPU runner (`<op>_cpu`) and its GPU runner (`<op>_gpu`:
//! the `attn-gpu` kernel on the case's tensors in their own dtypes, the lengths validated on the
//! host first and uploaded as int32, the device flag read after the launch), side by side; the
//! `lse` class and rule.

use super::device::{download, gpu, upload};
use super::{float_dim, indices, input, opt_indices};
use crate::case::Tensors;
use crate::compare::Rule;
use crate::error::Problem;
use crate::params::{ParamSpec, ParamType, Params};
use crate::spec::{self as s, OpSpec, OutputSpec};
use crate::tensor::Tensor;
use attn_gpu::{CacheRows, DecodeFlag, DecodeParams, DeviceTensor, Gpu, KvCache, NewTokens};
use attn_reference::decode::{self, CacheLayout};
use attn_reference::{DtypeClass, Error};
use ndarray::{ArrayD, Ix4};
use std::str::FromStr;

pub const OPS: &[OpSpec] = &[KV_CACHE_UPDATE, DECODE_ATTENTION];

const LAYOUTS: &[&str] = &["bshd", "bhsd"];
const P_LAYOUT: ParamSpec = s::param("cache_layout", ParamType::Str(LAYOUTS), Some("\"bshd\""));

/// The layout of a cache, by `cache_layout`.
const CACHE: &str = "[B_cache, S, H_kv, D] (bshd) or [B_cache, H_kv, S, D] (bhsd)";

const KV_CACHE_UPDATE: OpSpec = OpSpec {
    id: "kv_cache_update",
    summary: "write k, v into static caches at cache_seqlens (bit exact)",
    inputs: &[
        s::float("k_cache", true, CACHE, "float"),
        s::float("v_cache", true, CACHE, "float, as k_cache"),
        s::float("k", true, "[B, L_new, H_kv, D]", "float, as k_cache"),
        s::float("v", true, "[B, L_new, H_kv, D]", "float, as k_cache"),
        s::index("cache_seqlens", true, "[B]"),
        s::index("cache_batch_idx", false, "[B]"),
    ],
    params: &[P_LAYOUT],
    outputs: &[
        s::output(
            "k_cache",
            CACHE,
            "dtype of k_cache",
            |i, _| super::class_of(i, "k_cache"),
            |_, _, _| Rule::Exact,
        ),
        s::output(
            "v_cache",
            CACHE,
            "dtype of v_cache",
            |i, _| super::class_of(i, "v_cache"),
            |_, _, _| Rule::Exact,
        ),
    ],
    cpu: kv_cache_update_cpu,
    gpu: Some(kv_cache_update_gpu),
    cp: None,
    section: "conformance/spec/ops-decode.md §1",
};

/// `(k_cache, v_cache) = kv_cache_update(...)`, in the caches' own dtype (bit exact).
fn kv_cache_update_cpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    const NAMES: [&str; 4] = ["k_cache", "v_cache", "k", "v"];
    let (kc, vc) = (input(inputs, NAMES[0])?, input(inputs, NAMES[1])?);
    let (k, v) = (input(inputs, NAMES[2])?, input(inputs, NAMES[3])?);
    for (name, x) in NAMES.iter().zip([kc, vc, k, v]).skip(1) {
        if x.dtype() != kc.dtype() {
            let expected = format!("the dtype of k_cache ({})", kc.dtype());
            return Err(Error::dtype(*name, expected, x.dtype().name()).into());
        }
    }
    let seqlens = indices(inputs, "cache_seqlens")?;
    let idx = opt_indices(inputs, "cache_batch_idx")?;
    let (idx, layout) = (idx.as_deref(), layout(p)?);
    let (k_out, v_out) = match (kc, vc, k, v) {
        (Tensor::F64(a), Tensor::F64(b), Tensor::F64(c), Tensor::F64(d)) => {
            let (x, y) = update([a, b, c, d], &seqlens, idx, layout)?;
            (Tensor::F64(x), Tensor::F64(y))
        }
        (Tensor::F32(a), Tensor::F32(b), Tensor::F32(c), Tensor::F32(d)) => {
            let (x, y) = update([a, b, c, d], &seqlens, idx, layout)?;
            (Tensor::F32(x), Tensor::F32(y))
        }
        (Tensor::BF16(a), Tensor::BF16(b), Tensor::BF16(c), Tensor::BF16(d)) => {
            let (x, y) = update([a, b, c, d], &seqlens, idx, layout)?;
            (Tensor::BF16(x), Tensor::BF16(y))
        }
        (Tensor::F16(a), Tensor::F16(b), Tensor::F16(c), Tensor::F16(d)) => {
            let (x, y) = update([a, b, c, d], &seqlens, idx, layout)?;
            (Tensor::F16(x), Tensor::F16(y))
        }
        _ => {
            return Err(Error::dtype("k_cache", "a float dtype", kc.dtype().name()).into());
        }
    };
    Ok(Tensors::from([
        ("k_cache".to_string(), k_out),
        ("v_cache".to_string(), v_out),
    ]))
}

/// The row tensors as int32 on the device (values already validated on the host).
struct Rows {
    seqlens: DeviceTensor,
    idx: Option<DeviceTensor>,
}

impl Rows {
    fn upload(gpu: &Gpu, seqlens: &[i64], idx: Option<&[i64]>) -> Result<Rows, Problem> {
        let i32s = |name: &str, v: &[i64]| -> Result<DeviceTensor, Problem> {
            let v = v
                .iter()
                .map(|&x| i32::try_from(x))
                .collect::<Result<Vec<i32>, _>>()
                .map_err(|_| Error::index(name, "values that fit int32", format!("{v:?}")))?;
            Ok(DeviceTensor::from_slice(gpu, &v)?)
        };
        Ok(Rows {
            seqlens: i32s("cache_seqlens", seqlens)?,
            idx: idx.map(|i| i32s("cache_batch_idx", i)).transpose()?,
        })
    }
    fn view(&self) -> CacheRows<'_> {
        CacheRows {
            cache_seqlens: &self.seqlens,
            cache_batch_idx: self.idx.as_ref(),
        }
    }
}

/// `kv_cache_update` on the GPU (bit exact, in the caches' dtype).
fn kv_cache_update_gpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let gpu = gpu()?;
    let names = ["k_cache", "v_cache", "k", "v"];
    let [kc, vc, k, v] = names.map(|n| input(inputs, n));
    let (kc, vc, k, v) = (kc?, vc?, k?, v?);
    let seqlens = indices(inputs, "cache_seqlens")?;
    let idx = opt_indices(inputs, "cache_batch_idx")?;
    let layout = layout(p)?;
    decode::validate_kv_cache_update(
        kc.shape(),
        vc.shape(),
        k.shape(),
        v.shape(),
        &seqlens,
        idx.as_deref(),
        layout,
    )?;
    let rows = Rows::upload(gpu, &seqlens, idx.as_deref())?;
    let mut cache = KvCache {
        k: upload(gpu, kc)?,
        v: upload(gpu, vc)?,
        layout,
    };
    let (k, v) = (upload(gpu, k)?, upload(gpu, v)?);
    let mut flag = DecodeFlag::new(gpu)?;
    let new = NewTokens { k: &k, v: &v };
    attn_gpu::kv_cache_update(gpu, &mut cache, new, rows.view(), &mut flag)?;
    flag.check(gpu)?;
    Ok(Tensors::from([
        ("k_cache".to_string(), download(gpu, &cache.k)?),
        ("v_cache".to_string(), download(gpu, &cache.v)?),
    ]))
}

const DECODE_ATTENTION: OpSpec = OpSpec {
    id: "decode_attention",
    summary: "attention of q over the valid prefix of static KV caches",
    inputs: &[
        s::float("q", true, "[B, L_q, H, D]", "float"),
        s::float("k_cache", true, CACHE, "float"),
        s::float("v_cache", true, CACHE, "float, as k_cache"),
        s::index("cache_seqlens", true, "[B]"),
        s::index("cache_batch_idx", false, "[B]"),
    ],
    params: &[
        s::param("softmax_scale", ParamType::OptFloat, Some("null")),
        s::param("causal", ParamType::Bool, Some("true")),
        P_LAYOUT,
    ],
    outputs: &[
        s::output(
            "o",
            "[B, L_q, H, D]",
            "dtype of q",
            |i, _| super::class_of(i, "q"),
            |_, _, c| Rule::default_for(c),
        ),
        OutputSpec {
            name: "lse",
            optional: true,
            class: lse_class,
            rule: lse_rule,
            parts: &[],
            shape: "[B, H, L_q]",
            dtype: "float32",
            present: "always (a case may leave it out)",
        },
    ],
    cpu: decode_attention_cpu,
    gpu: Some(decode_attention_gpu),
    cp: None,
    section: "conformance/spec/ops-decode.md §2",
};

/// `(o, lse) = decode_attention(...)` in float64.
fn decode_attention_cpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let q = float_dim::<Ix4>(inputs, "q")?;
    let kc = float_dim::<Ix4>(inputs, "k_cache")?;
    let vc = float_dim::<Ix4>(inputs, "v_cache")?;
    let seqlens = indices(inputs, "cache_seqlens")?;
    let idx = opt_indices(inputs, "cache_batch_idx")?;
    let r = decode::decode_attention(
        q.view(),
        kc.view(),
        vc.view(),
        &seqlens,
        idx.as_deref(),
        p.opt_f64("softmax_scale")?,
        p.bool("causal")?,
        layout(p)?,
    )?;
    Ok(Tensors::from([
        ("o".to_string(), Tensor::F64(r.o.into_dyn())),
        ("lse".to_string(), Tensor::F64(r.lse.into_dyn())),
    ]))
}

/// `decode_attention` on the GPU: `o` in `q`'s dtype, `lse` float32.
fn decode_attention_gpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let gpu = gpu()?;
    let (q, kc, vc) = (
        input(inputs, "q")?,
        input(inputs, "k_cache")?,
        input(inputs, "v_cache")?,
    );
    let seqlens = indices(inputs, "cache_seqlens")?;
    let idx = opt_indices(inputs, "cache_batch_idx")?;
    let layout = layout(p)?;
    decode::validate_decode_attention(
        q.shape(),
        kc.shape(),
        vc.shape(),
        &seqlens,
        idx.as_deref(),
        layout,
    )?;
    let rows = Rows::upload(gpu, &seqlens, idx.as_deref())?;
    let cache = KvCache {
        k: upload(gpu, kc)?,
        v: upload(gpu, vc)?,
        layout,
    };
    let params = DecodeParams {
        softmax_scale: p.opt_f64("softmax_scale")?,
        causal: p.bool("causal")?,
    };
    let out = attn_gpu::decode_attention(gpu, &upload(gpu, q)?, &cache, rows.view(), &params)?;
    Ok(Tensors::from([
        ("o".to_string(), download(gpu, &out.o)?),
        ("lse".to_string(), download(gpu, &out.lse)?),
    ]))
}

fn layout(p: &Params) -> Result<CacheLayout, Problem> {
    Ok(CacheLayout::from_str(p.str("cache_layout")?)?)
}

fn rank4<'a, E>(a: &'a ArrayD<E>, name: &str) -> Result<ndarray::ArrayView4<'a, E>, Problem> {
    a.view()
        .into_dimensionality::<Ix4>()
        .map_err(|_| Error::shape(name, "rank 4", a.shape()).into())
}

/// Runs the reference update on four arrays of one element type.
fn update<E: Copy + Send + Sync>(
    t: [&ArrayD<E>; 4],
    seqlens: &[i64],
    idx: Option<&[i64]>,
    layout: CacheLayout,
) -> Result<(ArrayD<E>, ArrayD<E>), Problem> {
    let (kc, vc) = decode::kv_cache_update(
        rank4(t[0], "k_cache")?,
        rank4(t[1], "v_cache")?,
        rank4(t[2], "k")?,
        rank4(t[3], "v")?,
        seqlens,
        idx,
        layout,
    )?;
    Ok((kc.into_dyn(), vc.into_dyn()))
}

/// `lse` is float32 whatever the dtype of `q`.
pub fn lse_class(_: &Tensors, _: &Params) -> Result<DtypeClass, Problem> {
    Ok(DtypeClass::Float32)
}

/// `lse` threshold: `1e-3` for half-precision `q` (fp32 value of bf16-rounded scores), else the
/// default of the class it was computed in.
pub fn lse_rule(inputs: &Tensors, _: &Params, class: DtypeClass) -> Rule {
    match inputs.get("q").map(|q| q.dtype().class()) {
        Some(DtypeClass::Half) => Rule::Threshold(1e-3),
        _ => Rule::default_for(class),
    }
}
