"""Triton kernels, one file per op family: each kernel sits next to its launcher, which checks its inputs.

The torch implementations in `gradcomp.ops` are the oracles these kernels are tested against.
"""
