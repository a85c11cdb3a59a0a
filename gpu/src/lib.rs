//! `attn-gpu`: CUDA kernels for the operations of `attn-reference`, compiled at run time with
//! NVRTC. The crate builds and its callers test on machines without CUDA.
