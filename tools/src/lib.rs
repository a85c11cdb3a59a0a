//! `attn-tools`: benchmark helpers for the `attn-gpu` kernels: the delta-rule gate regimes
//! ([`gates`]).

pub mod gates;
