"""Fixture generators of attn-conformance (see `tools/README.md`)."""
