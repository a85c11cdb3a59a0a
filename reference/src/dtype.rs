//! Element types that cross the API boundary (case files, device tensors), shared by the
//! reference's validation, the GPU crate and the conformance suite.

use std::fmt;
use std::str::FromStr;

/// The element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    F64,
    F32,
    BF16,
    F16,
    I32,
    I64,
}

/// The precision class a float result was computed in, which selects its comparison threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DtypeClass {
    Float64,
    Float32,
    Half,
    Int,
}

impl Dtype {
    /// Every dtype of the spec, floats first.
    pub const ALL: [Dtype; 6] = [
        Dtype::F64,
        Dtype::F32,
        Dtype::BF16,
        Dtype::F16,
        Dtype::I32,
        Dtype::I64,
    ];

    /// The spec's name (`"float32"`, `"bfloat16"`, `"int32"` ...).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F64 => "float64",
            Dtype::F32 => "float32",
            Dtype::BF16 => "bfloat16",
            Dtype::F16 => "float16",
            Dtype::I32 => "int32",
            Dtype::I64 => "int64",
        }
    }
    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            Dtype::F64 | Dtype::I64 => 8,
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::BF16 | Dtype::F16 => 2,
        }
    }
    /// Whether this is one of the four float dtypes.
    pub fn is_float(self) -> bool {
        !matches!(self, Dtype::I32 | Dtype::I64)
    }
    /// The precision class (the comparison threshold's row) of this dtype.
    pub fn class(self) -> DtypeClass {
        match self {
            Dtype::F64 => DtypeClass::Float64,
            Dtype::F32 => DtypeClass::Float32,
            Dtype::BF16 | Dtype::F16 => DtypeClass::Half,
            Dtype::I32 | Dtype::I64 => DtypeClass::Int,
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Dtype {
    type Err = crate::Error;
    /// Parses the spec's names (`"float32"`) and PyTorch's short ones (`"bf16"`, `"fp32"`).
    fn from_str(s: &str) -> crate::Result<Self> {
        Ok(match s {
            "float64" | "fp64" | "f64" => Dtype::F64,
            "float32" | "fp32" | "f32" => Dtype::F32,
            "bfloat16" | "bf16" => Dtype::BF16,
            "float16" | "fp16" | "f16" => Dtype::F16,
            "int32" | "i32" => Dtype::I32,
            "int64" | "i64" => Dtype::I64,
            _ => {
                return Err(crate::Error::dtype(
                    "dtype",
                    "float64, float32, bfloat16, float16, int32 or int64",
                    s,
                ))
            }
        })
    }
}
