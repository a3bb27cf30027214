"""The CUDA paged-attention extension, its pure-torch references and the benchmark harness.

torch is imported only inside this package, and only when an op is used.
"""
