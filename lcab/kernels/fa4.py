"""Placeholder: filled in by the fa4 adapter work (issue 13)."""
