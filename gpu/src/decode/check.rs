//! Validation of the decode ops from shapes and dtypes alone (no GPU, no host copy of the
//! lengths): the reference's shape rules, the dtypes, and the limits of the launch grid. The
//! values of `cache_seqlens` and `cache_batch_idx` live in device memory and are checked by
//! the kernels (the device flag, see [`super::DecodeFlag`]).

use attn_reference::decode::{
    validate_decode_attention, validate_kv_cache_update, CacheLayout, DecodePlan,
};
use attn_reference::{Dtype, Error, Result};

/// A tensor's shape and dtype.
pub type Meta<'a> = (&'a [usize], Dtype);

/// The most batch rows and KV heads of one launch (grid dimensions y and z).
pub const MAX_GRID_YZ: usize = 65_535;

/// Geometry of a decode step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeShape {
    /// Batch rows `B`.
    pub b: usize,
    pub b_cache: usize,
    /// Cache length `S`.
    pub s: usize,
    pub h_kv: usize,
    pub d: usize,
    /// `L_q` for attention, `L_new` for the update.
    pub l: usize,
    /// Query heads `H` for attention, `H_kv` for the update.
    pub h: usize,
    pub dtype: Dtype,
    pub layout: CacheLayout,
}

impl DecodeShape {
    /// The geometry of the reference's validated plan, with the tensors' dtype and layout.
    fn of(p: &DecodePlan, dtype: Dtype, layout: CacheLayout) -> Self {
        DecodeShape {
            b: p.b,
            b_cache: p.b_cache,
            s: p.s,
            h_kv: p.h_kv,
            d: p.d,
            l: p.l,
            h: p.h,
            dtype,
            layout,
        }
    }

    /// Cache strides in elements: (row, KV head, position).
    pub fn strides(&self) -> (usize, usize, usize) {
        let (s, h_kv, d) = (self.s, self.h_kv, self.d);
        match self.layout {
            CacheLayout::Bshd => (s * h_kv * d, d, h_kv * d),
            CacheLayout::Bhsd => (h_kv * s * d, s * d, d),
        }
    }
}

/// `arg` has `want`'s dtype.
fn same_dtype(arg: &str, got: Dtype, want: Dtype, like: &str) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::dtype(
            arg,
            format!("the dtype of {like} ({want})"),
            got.name(),
        ))
    }
}

/// `cache_seqlens` is int32 `[B]`; `cache_batch_idx`, when given, too.
pub fn check_rows(
    b: usize,
    cache_seqlens: Meta<'_>,
    cache_batch_idx: Option<Meta<'_>>,
) -> Result<()> {
    let rows = std::iter::once(("cache_seqlens", cache_seqlens))
        .chain(cache_batch_idx.map(|m| ("cache_batch_idx", m)));
    for (arg, (shape, dtype)) in rows {
        if dtype != Dtype::I32 {
            return Err(Error::dtype(arg, "int32", dtype.name()));
        }
        if shape != [b] {
            return Err(Error::shape(arg, format!("[B] = [{b}]"), shape));
        }
    }
    Ok(())
}

fn grid_limits(b: usize, h_kv: usize, arg: &str, shape: &[usize]) -> Result<()> {
    if b > MAX_GRID_YZ || h_kv > MAX_GRID_YZ {
        return Err(Error::shape(
            arg,
            format!("B and H_kv at most {MAX_GRID_YZ}"),
            shape,
        ));
    }
    Ok(())
}

/// Validates `kv_cache_update`'s tensors: caches of one float dtype in `layout`, `k` and `v`
/// `[B, L_new, H_kv, D]` of that dtype with `L_new <= S`, the row tensors as [`check_rows`].
pub fn check_kv_cache_update(
    k_cache: Meta<'_>,
    v_cache: Meta<'_>,
    k: Meta<'_>,
    v: Meta<'_>,
    cache_seqlens: Meta<'_>,
    cache_batch_idx: Option<Meta<'_>>,
    layout: CacheLayout,
) -> Result<DecodeShape> {
    if !k_cache.1.is_float() {
        return Err(Error::dtype("k_cache", "a float dtype", k_cache.1.name()));
    }
    for (arg, m) in [("v_cache", v_cache), ("k", k), ("v", v)] {
        same_dtype(arg, m.1, k_cache.1, "k_cache")?;
    }
    let b = k.0.first().copied().unwrap_or(0);
    // all-zero lengths: the shape rules, and L_new <= S
    let p = validate_kv_cache_update(k_cache.0, v_cache.0, k.0, v.0, &vec![0; b], None, layout)
        .map_err(|e| match e.arg.as_str() {
            "cache_seqlens" => Error::shape("k", "L_new at most the cache length S", k.0),
            _ => e,
        })?;
    check_rows(p.b, cache_seqlens, cache_batch_idx)?;
    grid_limits(p.b, p.h_kv, "k", k.0)?;
    Ok(DecodeShape::of(&p, k_cache.1, layout))
}

/// Validates `decode_attention`'s tensors (without the row tensors): `q` float `[B, L_q, H, D]`
/// (fp64 accumulates in fp64, the others in fp32), caches of `q`'s dtype in `layout`, the
/// reference's shape rules
/// (`H % H_kv == 0`, `D <= 256`, `B <= B_cache`), and the grid limits.
pub fn check_attention_shapes(
    q: Meta<'_>,
    k_cache: Meta<'_>,
    v_cache: Meta<'_>,
    layout: CacheLayout,
) -> Result<DecodeShape> {
    if !q.1.is_float() {
        return Err(Error::dtype("q", "a float dtype", q.1.name()));
    }
    same_dtype("k_cache", k_cache.1, q.1, "q")?;
    same_dtype("v_cache", v_cache.1, q.1, "q")?;
    let b = q.0.first().copied().unwrap_or(0);
    let p = validate_decode_attention(q.0, k_cache.0, v_cache.0, &vec![0; b], None, layout)?;
    grid_limits(p.b, p.h_kv, "q", q.0)?;
    Ok(DecodeShape::of(&p, q.1, layout))
}

/// Validates `decode_attention`: [`check_attention_shapes`] and [`check_rows`].
pub fn check_decode_attention(
    q: Meta<'_>,
    k_cache: Meta<'_>,
    v_cache: Meta<'_>,
    cache_seqlens: Meta<'_>,
    cache_batch_idx: Option<Meta<'_>>,
    layout: CacheLayout,
) -> Result<DecodeShape> {
    let shape = check_attention_shapes(q, k_cache, v_cache, layout)?;
    check_rows(shape.b, cache_seqlens, cache_batch_idx)?;
    Ok(shape)
}
