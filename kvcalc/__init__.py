"""kvcalc: exact KV-cache accounting and paged-attention benchmarks for LLM serving."""

__version__ = "0.1.0"
