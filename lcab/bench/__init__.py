"""Measurement protocol: how lcab times a call and measures its peak memory."""
