"""Placeholder: filled in by the vsa adapter work (issue 13)."""
