"""Placeholder: filled in by the flashinfer adapter work (issue 13)."""
