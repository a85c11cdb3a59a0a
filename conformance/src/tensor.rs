//! A host tensor of one of the case-file dtypes, with its widening conversions and its
//! little-endian byte encoding (the safetensors one).

use crate::error::Problem;
use attn_reference::Dtype;
use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};

/// A contiguous row-major host tensor of one of the six case dtypes.
#[derive(Debug, Clone, PartialEq)]
pub enum Tensor {
    F64(ArrayD<f64>),
    F32(ArrayD<f32>),
    BF16(ArrayD<bf16>),
    F16(ArrayD<f16>),
    I32(ArrayD<i32>),
    I64(ArrayD<i64>),
}

/// Applies `$body` to the array inside any variant.
macro_rules! each {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            Tensor::F64($a) => $body,
            Tensor::F32($a) => $body,
            Tensor::BF16($a) => $body,
            Tensor::F16($a) => $body,
            Tensor::I32($a) => $body,
            Tensor::I64($a) => $body,
        }
    };
}

/// Element types of [`Tensor`] and their fixed-size little-endian encoding.
trait Element: Copy {
    const SIZE: usize;
    fn write_le(self, out: &mut Vec<u8>);
    fn read_le(b: &[u8]) -> Self;
}

macro_rules! element {
    ($t:ty, $n:expr) => {
        impl Element for $t {
            const SIZE: usize = $n;
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read_le(b: &[u8]) -> Self {
                let mut a = [0u8; $n];
                a.copy_from_slice(b);
                <$t>::from_le_bytes(a)
            }
        }
    };
}
element!(f64, 8);
element!(f32, 4);
element!(bf16, 2);
element!(f16, 2);
element!(i32, 4);
element!(i64, 8);

fn decode<E: Element>(name: &str, shape: &[usize], bytes: &[u8]) -> Result<ArrayD<E>, Problem> {
    let want = shape
        .iter()
        .try_fold(E::SIZE, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Problem::BadTensor {
            name: name.to_string(),
            msg: format!("shape {shape:?} has more bytes than fit in usize"),
        })?;
    if bytes.len() != want {
        return Err(Problem::BadTensor {
            name: name.to_string(),
            msg: format!("{} bytes for shape {shape:?}, expected {want}", bytes.len()),
        });
    }
    let v: Vec<E> = bytes.chunks_exact(E::SIZE).map(E::read_le).collect();
    ArrayD::from_shape_vec(IxDyn(shape), v).map_err(|e| Problem::BadTensor {
        name: name.to_string(),
        msg: e.to_string(),
    })
}

fn encode<E: Element>(a: &ArrayD<E>) -> Vec<u8> {
    let mut out = Vec::with_capacity(a.len() * E::SIZE);
    // `iter` walks in logical row-major order whatever the memory layout.
    a.iter().for_each(|&x| x.write_le(&mut out));
    out
}

impl Tensor {
    pub fn dtype(&self) -> Dtype {
        match self {
            Tensor::F64(_) => Dtype::F64,
            Tensor::F32(_) => Dtype::F32,
            Tensor::BF16(_) => Dtype::BF16,
            Tensor::F16(_) => Dtype::F16,
            Tensor::I32(_) => Dtype::I32,
            Tensor::I64(_) => Dtype::I64,
        }
    }

    pub fn shape(&self) -> &[usize] {
        each!(self, a => a.shape())
    }

    pub fn len(&self) -> usize {
        each!(self, a => a.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Row-major little-endian bytes (the safetensors payload).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        each!(self, a => encode(a))
    }

    /// Decodes a safetensors payload; `name` is only used in the error.
    pub fn from_le_bytes(
        name: &str,
        dtype: Dtype,
        shape: &[usize],
        bytes: &[u8],
    ) -> Result<Tensor, Problem> {
        Ok(match dtype {
            Dtype::F64 => Tensor::F64(decode(name, shape, bytes)?),
            Dtype::F32 => Tensor::F32(decode(name, shape, bytes)?),
            Dtype::BF16 => Tensor::BF16(decode(name, shape, bytes)?),
            Dtype::F16 => Tensor::F16(decode(name, shape, bytes)?),
            Dtype::I32 => Tensor::I32(decode(name, shape, bytes)?),
            Dtype::I64 => Tensor::I64(decode(name, shape, bytes)?),
        })
    }

    /// Rounds a float64 array once to `dtype` (integer dtypes truncate toward zero).
    pub fn from_f64(a: &ArrayD<f64>, dtype: Dtype) -> Tensor {
        match dtype {
            Dtype::F64 => Tensor::F64(a.to_owned()),
            Dtype::F32 => Tensor::F32(a.mapv(|x| x as f32)),
            Dtype::BF16 => Tensor::BF16(a.mapv(bf16::from_f64)),
            Dtype::F16 => Tensor::F16(a.mapv(f16::from_f64)),
            Dtype::I32 => Tensor::I32(a.mapv(|x| x as i32)),
            Dtype::I64 => Tensor::I64(a.mapv(|x| x as i64)),
        }
    }

    /// Every value widened exactly to `f64` (integers included, as a comparison would see them).
    pub fn widen_f64(&self) -> ArrayD<f64> {
        match self {
            Tensor::F64(a) => a.clone(),
            Tensor::F32(a) => a.mapv(f64::from),
            Tensor::BF16(a) => a.mapv(f64::from),
            Tensor::F16(a) => a.mapv(f64::from),
            Tensor::I32(a) => a.mapv(f64::from),
            Tensor::I64(a) => a.mapv(|x| x as f64),
        }
    }

    /// A float tensor widened to `f64`; an integer tensor is a dtype error naming `name`.
    pub fn to_f64(&self, name: &str) -> Result<ArrayD<f64>, Problem> {
        self.require_float(name)?;
        Ok(self.widen_f64())
    }

    /// A float tensor as `f32` (widened from half, rounded once from `f64`).
    pub fn to_f32(&self, name: &str) -> Result<ArrayD<f32>, Problem> {
        Ok(match self {
            Tensor::F32(a) => a.clone(),
            Tensor::BF16(a) => a.mapv(f32::from),
            Tensor::F16(a) => a.mapv(f32::from),
            _ => self.to_f64(name)?.mapv(|x| x as f32),
        })
    }

    /// An index tensor (int32/int64) flattened to `i64`; a float tensor is a dtype error.
    pub fn to_indices(&self, name: &str) -> Result<Vec<i64>, Problem> {
        match self {
            Tensor::I32(a) => Ok(a.iter().map(|&x| i64::from(x)).collect()),
            Tensor::I64(a) => Ok(a.iter().copied().collect()),
            _ => Err(
                attn_reference::Error::dtype(name, "int32 or int64", self.dtype().name()).into(),
            ),
        }
    }

    fn require_float(&self, name: &str) -> Result<(), Problem> {
        if self.dtype().is_float() {
            Ok(())
        } else {
            Err(attn_reference::Error::dtype(
                name,
                "float64, float32, bfloat16 or float16",
                self.dtype().name(),
            )
            .into())
        }
    }

    /// The elements `range` of the last axis (same dtype; e.g. `hm[..., :V]`).
    pub fn slice_last(&self, range: std::ops::Range<usize>) -> Tensor {
        use ndarray::{Axis, Slice};
        if self.shape().is_empty() {
            return self.clone();
        }
        let last = Axis(self.shape().len().saturating_sub(1));
        let take = |n: usize| Slice::from(range.start.min(n)..range.end.min(n));
        match self {
            Tensor::F64(a) => Tensor::F64(a.slice_axis(last, take(a.len_of(last))).to_owned()),
            Tensor::F32(a) => Tensor::F32(a.slice_axis(last, take(a.len_of(last))).to_owned()),
            Tensor::BF16(a) => Tensor::BF16(a.slice_axis(last, take(a.len_of(last))).to_owned()),
            Tensor::F16(a) => Tensor::F16(a.slice_axis(last, take(a.len_of(last))).to_owned()),
            Tensor::I32(a) => Tensor::I32(a.slice_axis(last, take(a.len_of(last))).to_owned()),
            Tensor::I64(a) => Tensor::I64(a.slice_axis(last, take(a.len_of(last))).to_owned()),
        }
    }

    /// Whether two tensors have the same dtype, shape and bit pattern (NaN payloads included).
    pub fn bit_identical(&self, other: &Tensor) -> bool {
        self.dtype() == other.dtype()
            && self.shape() == other.shape()
            && self.to_le_bytes() == other.to_le_bytes()
    }
}

/// `attn_reference::Dtype` to the safetensors dtype.
pub fn to_st_dtype(d: Dtype) -> safetensors::Dtype {
    match d {
        Dtype::F64 => safetensors::Dtype::F64,
        Dtype::F32 => safetensors::Dtype::F32,
        Dtype::BF16 => safetensors::Dtype::BF16,
        Dtype::F16 => safetensors::Dtype::F16,
        Dtype::I32 => safetensors::Dtype::I32,
        Dtype::I64 => safetensors::Dtype::I64,
    }
}

/// The safetensors dtype to ours; the others (bool, int8, fp8, ...) are not case dtypes.
pub fn from_st_dtype(d: safetensors::Dtype) -> Option<Dtype> {
    Some(match d {
        safetensors::Dtype::F64 => Dtype::F64,
        safetensors::Dtype::F32 => Dtype::F32,
        safetensors::Dtype::BF16 => Dtype::BF16,
        safetensors::Dtype::F16 => Dtype::F16,
        safetensors::Dtype::I32 => Dtype::I32,
        safetensors::Dtype::I64 => Dtype::I64,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_every_dtype() {
        let a = ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![1.5, -2.25, 3.0, 0.0, -7.0, 100.0])
            .unwrap();
        for d in Dtype::ALL {
            let t = Tensor::from_f64(&a, d);
            let back = Tensor::from_le_bytes("x", d, &[2, 3], &t.to_le_bytes()).unwrap();
            assert!(back.bit_identical(&t), "{d}");
            let want = if d.is_float() {
                a.clone()
            } else {
                a.mapv(f64::trunc)
            };
            assert_eq!(back.widen_f64(), want, "{d}");
        }
    }

    #[test]
    fn wrong_byte_count_is_an_error_naming_the_tensor() {
        let e = Tensor::from_le_bytes("in.x", Dtype::F32, &[3], &[0u8; 8]).unwrap_err();
        assert!(e.to_string().contains("in.x"), "{e}");
    }

    #[test]
    fn index_and_float_conversions_refuse_the_other_kind() {
        let f = Tensor::F32(ArrayD::from_elem(IxDyn(&[2]), 1.0));
        let i = Tensor::I32(ArrayD::from_elem(IxDyn(&[2]), 1));
        assert!(f.to_indices("cu_seqlens").is_err());
        assert!(i.to_f64("x").is_err());
        assert_eq!(i.to_indices("cu_seqlens").unwrap(), vec![1, 1]);
    }
}
