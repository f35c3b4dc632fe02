"""Triton kernels, one file per op family: each kernel sits next to its launcher, which checks its inputs.

The torch implementations in `gradcomp.ops` are the oracles these kernels are tested against.
"""


def elementwise_grid(n: int, block: int | None = None) -> tuple[int, int, int]:
    """(programs, block, warps) of an elementwise kernel over n elements: larger programs for large tensors
    (fewer per-program set-ups, longer runs of vector loads). Results never depend on the block size."""
    if block is None:
        block, warps = (4096, 8) if n >= 1 << 20 else (1024, 4)
    else:
        warps = 4
    return -(-n // block), block, warps
