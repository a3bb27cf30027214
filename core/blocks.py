"""Block arithmetic every part shares: ceiling division, block-table entries and the default block size.

Kept free of numpy so that `kvcalc size` starts without it; `ceil_div` works on ints and numpy arrays alike
(for the vectorised hot path over millions of lengths see `paging.ceil_div_array`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, overload

if TYPE_CHECKING:
    import numpy as np

DEFAULT_BLOCK_SIZE = 16  # tokens per block: vLLM's default page size
MAX_LENGTH = 2**62  # the longest length kvcalc holds: n + B − 1 never wraps in int64 for any block up to 2^62
BLOCK_TABLE_ENTRY_BYTES = 4  # one int32 physical block id per logical block, as vLLM's and FlashInfer's kernels take
# vLLM v1's BlockPool takes block 0 as its null block at start (`null_block = free_block_queue.popleft()`: the
# placeholder of a table's skipped entries), so of the num_gpu_blocks it logs, one fewer is ever handed out.
# Every pool that models vLLM's (sim, share --memory) leaves it out; kvcalc's ideal layout has none.
VLLM_NULL_BLOCKS = 1


@overload
def ceil_div(numerator: int, divisor: int) -> int: ...
@overload
def ceil_div(numerator: np.ndarray, divisor: int) -> np.ndarray: ...


def ceil_div(numerator: int | np.ndarray, divisor: int) -> int | np.ndarray:
    """ceil(numerator / divisor), exact for Python ints of any size and elementwise for integer arrays."""
    return -(-numerator // divisor)
