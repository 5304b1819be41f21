"""Placeholder: filled in by the sparse_flex adapter work (issue 13)."""
