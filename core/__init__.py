"""Numpy-only accounting core: model KV specs, the equations, length sources, the block pool."""
