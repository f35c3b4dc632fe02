"""Training in several processes: torchrun's environment, the process group and the collectives it needs.

`gradcomp train` under `torchrun --nproc_per_node=N` runs one process per device; torchrun sets RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, and `setup` joins the group (NCCL on CUDA, gloo on CPU).
Every collective here is called by all ranks at the same point of the training loop, so that the decisions
that must agree (skip a step, stop on a signal, give up when rank 0 cannot write) are taken by all of them.
Without torchrun (or an initialised process group) everything here is a no-op for a single process.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

CPU = torch.device("cpu")


@dataclass(frozen=True)
class Processes:
    """This process's place among the training processes (rank 0 of 1 when running alone)."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = CPU  # where collectives exchange tensors (NCCL needs CUDA)
    active: bool = False  # a process group is initialised (under torchrun even with --nproc_per_node=1)
    owns_group: bool = False  # `setup` initialised it, so `close` destroys it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def shard(self) -> tuple[int, int]:
        """(rank, world size): which part of every batch this process takes."""
        return self.rank, self.world_size

    def all_sum(self, values: Tensor) -> Tensor:
        """`values` summed elementwise over all processes, in float64 on `values`' device."""
        if not self.active:
            return values.double()
        total = values.to(self.device, torch.float64, copy=True)
        dist.all_reduce(total)
        return total.to(values.device)

    def any(self, flag: bool) -> bool:
        """True on every rank when `flag` is true on at least one."""
        return bool(self.all_sum(torch.tensor([float(flag)])).item())

    def gather(self, value: object) -> list:
        """Every rank's `value` (picklable), in rank order, on every rank."""
        if not self.active:
            return [value]
        values = [None] * self.world_size
        dist.all_gather_object(values, value)
        return values

    def on_main(self, action: Callable[[], object]) -> None:
        """Run `action` on rank 0 only (file writes). If it fails there, every rank raises rather than waiting
        at the next collective for a rank that is gone."""
        error = None
        if self.is_main:
            try:
                action()
            except Exception as failure:
                error = failure
        if self.active:
            message = [None if error is None else f"{type(error).__name__}: {error}"]
            dist.broadcast_object_list(message, src=0)
            if message[0] is not None and not self.is_main:
                raise RuntimeError(f"rank 0 failed: {message[0]}")
        if error is not None:
            raise error

    def broadcast_buffers(self, module: nn.Module) -> None:
        """Rank 0's buffers (BatchNorm running statistics) to every rank, e.g. before a sharded evaluation."""
        if self.active:
            for buffer in module.buffers():
                dist.broadcast(buffer, src=0)

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()


ALONE = Processes()


def setup(device: str = "auto") -> tuple[Processes, torch.device]:
    """The device this process trains on and its place among the processes started by torchrun (if any).

    device: "auto" (CUDA when available), "cpu", "cuda" or "cuda:K"; under torchrun a CUDA process uses the
    GPU of its LOCAL_RANK. A process group initialised by the caller is used as it is and left open.
    """
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    chosen = torch.device(device)
    initialised = dist.is_available() and dist.is_initialized()
    if not initialised and "WORLD_SIZE" not in os.environ:
        return Processes(device=chosen), chosen
    if chosen.type == "cuda":
        chosen = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(chosen)
    if not initialised:
        if chosen.type == "cuda":
            dist.init_process_group("nccl", device_id=chosen)
        else:
            dist.init_process_group("gloo")
    return (
        Processes(dist.get_rank(), dist.get_world_size(), chosen, active=True, owns_group=not initialised),
        chosen,
    )
