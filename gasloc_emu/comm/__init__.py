"""Compressed communication: codecs, and the state that keeps lossy messages unbiased."""
