"""The random Hadamard transform of blocks: what low-precision training recipes apply before quantizing.

Each block of `block_size` consecutive elements along `axis` is multiplied by H D / sqrt(block_size): D a
diagonal of random signs (one per position in the block, the same for every block of the tensor, as both
operands of a GEMM must share it), H the Walsh-Hadamard matrix. The transform is orthogonal, so a block's
energy is kept while its largest value shrinks towards the root mean square (a block of independent values
becomes near-Gaussian), and a GEMM whose two operands are transformed along their reduction axis is
unchanged. The inverse is D H / sqrt(block_size), the same butterfly followed by the signs; transforming
back gives x up to float32 rounding.

The butterfly runs log2(block_size) stages of sums and differences, stage s pairing the elements 2^s apart,
then multiplies by the float32 value of 1/sqrt(block_size): the torch path and the kernel do these
operations in this order, so that they agree bit for bit. A block whose largest magnitude reaches
2^(127 - P), P = 2 log2(block_size) + 2, is multiplied by 2^-P first and by 2^P last (`prescales`), so
that no sum overflows: exact but for values below 2^(P - 126) beside it, which lie far below its rounding
error. Where the exact result exceeds float32's range (a block within a factor sqrt(block_size) of it),
the output is +-inf there, as float32 has no larger value (and past float16's or bfloat16's range, the
dtype's inf). The signs come from the counter-based bits at
positions SIGN_COUNTER + j (j < block_size), beyond any element index, so that they are independent of the
bits stochastic rounding draws for the elements; seed=None takes no signs (the plain transform).
"""

from __future__ import annotations

import torch
from torch import Tensor

from gradcomp._backend import KERNEL_DTYPES, Backend, check_float, use_triton
from gradcomp.formats.block import check_transform_size, prescale_shift, transform_norm
from gradcomp.ops._blocks import as_blocks, check_axis
from gradcomp.rng import SIGN_COUNTER, random_bits, resolve_seed


def hadamard(
    x: Tensor, block_size: int = 32, axis: int = -1, seed: int | None = None, backend: Backend = "auto"
) -> Tensor:
    """The random Hadamard transform of each block of `block_size` elements along `axis` (see the module),
    in x's dtype and shape; `axis`'s length must be a multiple of block_size. Computed in float32
    (float16/bfloat16/float32 input). One kernel launch on CUDA (plus a copy where `axis` is not the last,
    contiguous one). Not differentiable."""
    return _transform(x, block_size, axis, seed, backend, inverse=False)


def hadamard_inverse(
    y: Tensor, block_size: int = 32, axis: int = -1, seed: int | None = None, backend: Backend = "auto"
) -> Tensor:
    """The inverse of `hadamard` with the same block_size, axis and seed."""
    return _transform(y, block_size, axis, seed, backend, inverse=True)


def _transform(x: Tensor, size: int, axis: int, seed: int | None, backend: Backend, inverse: bool) -> Tensor:
    x = check_kernel_dtype(check_float(x, "hadamard"), "hadamard")
    seed = None if seed is None else resolve_seed(seed)  # None: no signs (not a fresh seed)
    check_transform_size(size)
    axis = check_axis(x, axis)
    length = x.shape[axis] if x.dim() else 1  # a 0-d tensor: one element
    if length % size:
        raise ValueError(f"hadamard: the length {length} of axis {axis} is not a multiple of {size}")
    if x.numel() == 0:
        return x.clone()
    blocks, restore = as_blocks(x, size, axis)
    if use_triton(x, backend):
        from gradcomp.kernels.hadamard import hadamard_triton

        return restore(hadamard_triton(blocks, seed, inverse))
    signs = transform_signs(seed, size, x.device)
    values = blocks.float()
    prescale, unscale = prescales(values.abs().amax(1, keepdim=True), size)
    values = values * prescale
    out = signs * butterfly(values) if inverse else butterfly(values * signs)
    return restore((out * unscale).to(x.dtype))


def check_kernel_dtype(x: Tensor, op: str) -> Tensor:
    if x.dtype not in KERNEL_DTYPES:
        raise TypeError(
            f"{op} computes in float32: pass a float16, bfloat16 or float32 tensor, got {x.dtype}"
        )
    return x


def transform_signs(seed: int | None, size: int, device: torch.device) -> Tensor:
    """D's diagonal: +-1.0 (float32) from the top bit of the counter-based bits at SIGN_COUNTER + j; all +1
    without a seed."""
    if seed is None:
        return torch.ones(size, device=device)
    bits = random_bits(seed, size, device, SIGN_COUNTER)
    return torch.where(bits < 0, -1.0, 1.0)


def prescales(amax: Tensor, hadamard: int) -> tuple[Tensor, Tensor]:
    """(2^-P, 2^P) where a block's largest magnitude reaches 2^(127 - P), else (1, 1)."""
    shift = prescale_shift(hadamard)
    big = amax >= 2.0 ** (127 - shift)
    return torch.where(big, 2.0**-shift, 1.0), torch.where(big, 2.0**shift, 1.0)


@torch.library.custom_op("gradcomp::butterfly", mutates_args=())
def butterfly(values: Tensor, dim: int = -1) -> Tensor:
    """H v / sqrt(n) along `dim` (n a power of two), float32, in the kernel's order of operations
    (contiguous). The position within the transform is the outer axis while the stages run, so that each
    stage is two passes over contiguous halves, written into the other of two buffers (several times
    faster than strided pairs). An operator of its own, so that compiled callers call it as it is:
    inductor inlined each stage into the next (every output reading all n inputs) and took a minute to
    compile that into code slower than this."""
    source = values.movedim(dim, 0)
    size = source.shape[0]
    columns = torch.empty(source.shape, dtype=values.dtype, device=values.device)  # (position, transform)
    columns.copy_(source)  # a copy also where source is one: the stages write into both buffers
    columns = columns.view(size, -1)
    spare = torch.empty_like(columns)
    half = 1
    while half < size:  # stage: the sums and differences of the positions `half` apart
        shape = (size // (2 * half), 2, -1)  # (pair groups, first or second, half x transforms)
        first, second = columns.view(shape).unbind(1)
        sums, differences = spare.view(shape).unbind(1)
        torch.add(first, second, out=sums)
        torch.sub(first, second, out=differences)
        columns, spare = spare, columns
        half *= 2
    out = torch.empty(values.shape, dtype=values.dtype, device=values.device)
    torch.mul(columns.view(source.shape).movedim(0, dim), transform_norm(size), out=out)
    return out


@butterfly.register_fake
def _butterfly_shape(values: Tensor, dim: int = -1) -> Tensor:
    return torch.empty_like(values, memory_format=torch.contiguous_format)
