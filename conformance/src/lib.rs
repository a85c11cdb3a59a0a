//! `attn-conformance`: case files, the comparison rule of the spec, the op registry, and the
//! `attn-conform` command.
