"""Reports generated from lcab's registries and records (support matrices, README sections)."""
