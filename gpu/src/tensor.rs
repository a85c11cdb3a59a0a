//! Device tensors: a byte buffer with a shape and an [`attn_reference::Dtype`], row-major and
//! contiguous, moved to and from `ndarray` arrays.

use crate::device::Gpu;
use crate::error::{GpuError, GpuResult};
use attn_reference::Dtype;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use half::{bf16, f16};
use ndarray::{ArrayD, ArrayViewD, IxDyn};

/// A host element type that has a device dtype.
pub trait HostElem: Copy + Default + Send + Sync + 'static {
    const DTYPE: Dtype;
}
impl HostElem for f32 {
    const DTYPE: Dtype = Dtype::F32;
}
impl HostElem for f64 {
    const DTYPE: Dtype = Dtype::F64;
}
impl HostElem for bf16 {
    const DTYPE: Dtype = Dtype::BF16;
}
impl HostElem for f16 {
    const DTYPE: Dtype = Dtype::F16;
}
impl HostElem for i32 {
    const DTYPE: Dtype = Dtype::I32;
}
impl HostElem for i64 {
    const DTYPE: Dtype = Dtype::I64;
}

/// A contiguous row-major tensor in device memory.
pub struct DeviceTensor {
    buf: CudaSlice<u8>,
    shape: Vec<usize>,
    dtype: Dtype,
}

impl std::fmt::Debug for DeviceTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceTensor({}, {:?})", self.dtype, self.shape)
    }
}

fn as_bytes<T: HostElem>(s: &[T]) -> &[u8] {
    // SAFETY: HostElem types are plain numbers without padding.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), std::mem::size_of_val(s)) }
}

fn as_bytes_mut<T: HostElem>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: as above, and every bit pattern is a valid value of these types.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), std::mem::size_of_val(s)) }
}

impl DeviceTensor {
    /// An uninitialised tensor (callers write every element before reading it).
    pub fn alloc(gpu: &Gpu, shape: &[usize], dtype: Dtype) -> GpuResult<DeviceTensor> {
        let n = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .and_then(|n| n.checked_mul(dtype.size_bytes()))
            .ok_or_else(|| {
                attn_reference::Error::shape("shape", "a size that fits in memory", shape)
            })?;
        // Zero-size allocations are refused by the driver: keep a small buffer instead.
        // SAFETY: the buffer is only read after a kernel or a copy has written it.
        let buf = unsafe { gpu.stream().alloc::<u8>(n.max(16)) }
            .map_err(GpuError::driver(format!("allocation of {n} bytes")))?;
        Ok(DeviceTensor {
            buf,
            shape: shape.to_vec(),
            dtype,
        })
    }

    /// Copies a host array (any layout) to the device.
    pub fn from_array<T: HostElem>(gpu: &Gpu, a: ArrayViewD<'_, T>) -> GpuResult<DeviceTensor> {
        let mut t = Self::alloc(gpu, a.shape(), T::DTYPE)?;
        let owned;
        let data: &[T] = match a.as_slice() {
            Some(s) => s,
            None => {
                owned = a.iter().copied().collect::<Vec<T>>();
                &owned
            }
        };
        if !data.is_empty() {
            let bytes = as_bytes(data);
            let mut dst = t.buf.slice_mut(0..bytes.len());
            gpu.stream()
                .memcpy_htod(bytes, &mut dst)
                .map_err(GpuError::driver("host-to-device copy"))?;
        }
        Ok(t)
    }

    /// Copies a host slice to the device as a 1-D tensor.
    pub fn from_slice<T: HostElem>(gpu: &Gpu, s: &[T]) -> GpuResult<DeviceTensor> {
        Self::from_array(
            gpu,
            ArrayViewD::from_shape(IxDyn(&[s.len()]), s).expect("1-D view"),
        )
    }

    /// Overwrites the tensor with `data` (same dtype, `numel` elements), in stream order: how a
    /// captured graph's inputs (new tokens, lengths) are refreshed between replays.
    pub fn copy_from_host<T: HostElem>(&mut self, gpu: &Gpu, data: &[T]) -> GpuResult<()> {
        if T::DTYPE != self.dtype {
            return Err(GpuError::HostDtype {
                arg: "data".into(),
                expected: self.dtype.name(),
                got: T::DTYPE.name(),
            });
        }
        if data.len() != self.numel() {
            return Err(attn_reference::Error::shape(
                "data",
                format!("{} elements", self.numel()),
                [data.len()],
            )
            .into());
        }
        if !data.is_empty() {
            let bytes = as_bytes(data);
            let mut dst = self.buf.slice_mut(0..bytes.len());
            gpu.stream()
                .memcpy_htod(bytes, &mut dst)
                .map_err(GpuError::driver("host-to-device copy"))?;
        }
        Ok(())
    }

    /// Copies the tensor back to the host; `T` must match its dtype.
    pub fn to_array<T: HostElem>(&self, gpu: &Gpu) -> GpuResult<ArrayD<T>> {
        if T::DTYPE != self.dtype {
            return Err(GpuError::HostDtype {
                arg: "tensor".into(),
                expected: T::DTYPE.name(),
                got: self.dtype.name(),
            });
        }
        let mut v = vec![T::default(); self.numel()];
        if !v.is_empty() {
            let n = self.num_bytes();
            let src = self.buf.slice(0..n);
            gpu.stream()
                .memcpy_dtoh(&src, as_bytes_mut(&mut v))
                .map_err(GpuError::driver("device-to-host copy"))?;
        }
        gpu.synchronize()?;
        Ok(ArrayD::from_shape_vec(IxDyn(&self.shape), v).expect("shape matches length"))
    }

    /// Fills every byte with 0xFF: NaN in every float dtype (poisons an output before a test).
    pub fn poison(&mut self, gpu: &Gpu) -> GpuResult<()> {
        gpu.bind()?;
        let n = self.buf.len();
        let (ptr, _g) = self.buf.device_ptr_mut(gpu.stream());
        // SAFETY: `ptr` points to `n` bytes owned by this tensor.
        unsafe { cudarc::driver::result::memset_d8_async(ptr, 0xFF, n, gpu.stream().cu_stream()) }
            .map_err(GpuError::driver("memset"))
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn num_bytes(&self) -> usize {
        self.numel() * self.dtype.size_bytes()
    }

    /// Device address of the first element (for kernel parameter structs).
    pub(crate) fn ptr(&self, gpu: &Gpu) -> u64 {
        let (p, _g) = self.buf.device_ptr(gpu.stream());
        p
    }

    /// Device address for writing.
    pub(crate) fn ptr_mut(&mut self, gpu: &Gpu) -> u64 {
        let (p, _g) = self.buf.device_ptr_mut(gpu.stream());
        p
    }

    /// The raw buffer (benchmarks copy it for the bandwidth ceiling).
    pub fn buffer(&self) -> &CudaSlice<u8> {
        &self.buf
    }
    pub fn buffer_mut(&mut self) -> &mut CudaSlice<u8> {
        &mut self.buf
    }
}
