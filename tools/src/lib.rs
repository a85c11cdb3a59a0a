//! `attn-tools`: benchmark helpers for the `attn-gpu` kernels.
