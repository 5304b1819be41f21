"""Placeholder: filled in by the block_sparse_attn adapter work (issue 13)."""
