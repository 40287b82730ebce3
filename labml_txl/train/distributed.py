r"""
# Distributed data-parallel training

Launched by `torchrun --nproc_per_node N experiments/train_xl.py ...`, every process (rank) reads the same
ordered stream and takes its own columns of each batch: with global batch size $B$ and $N$ ranks, rank $r$ trains
on columns $[rB/N, (r+1)B/N)$ and keeps the memories of those columns. `DistributedDataParallel` averages the
gradients over the ranks, so, the loss of each rank being the mean over its columns, every rank applies the
gradient of the mean over all $B$ columns: the step one process would take on the whole batch.

The backend is gloo on the CPU and NCCL on CUDA. Only rank 0 writes checkpoints and reports to labml's dashboard;
checkpoints hold the memories of all columns (gathered from the ranks), so a run can resume on any number of
ranks that divides the batch.
"""
import contextlib
import os
from dataclasses import dataclass
from typing import Iterator, List, Optional

import torch
import torch.distributed as dist


@dataclass
class DistributedContext:
    """This process's place in a distributed run."""
    rank: int
    world_size: int
    local_rank: int
    #: whether `from_environment` joined the process group (and so `close` leaves it)
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def columns(self, batch_size: int) -> slice:
        """The columns of a batch of `batch_size` that this rank trains on."""
        size = batch_size // self.world_size
        return slice(self.rank * size, (self.rank + 1) * size)

    def gather_columns(self, tensors: Optional[List[torch.Tensor]]) -> Optional[List[torch.Tensor]]:
        """Every rank's columns of `tensors` (`[rows, columns, ...]` each), joined in rank order."""
        if tensors is None:
            return None
        gathered = []
        for t in tensors:
            parts = [torch.empty_like(t) for _ in range(self.world_size)]
            dist.all_gather(parts, t.contiguous())
            gathered.append(torch.cat(parts, dim=1))
        return gathered

    def sum(self, *values: float) -> List[float]:
        """Sums of `values` over the ranks."""
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t)
        return t.tolist()

    def max(self, value: int) -> int:
        """The largest of the ranks' `value`s."""
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def close(self, completed: bool = True) -> None:
        """Leave the process group this context joined; after a `completed` run, first wait for every rank.

        Gloo's worker threads must be stopped before the interpreter exits: a process that exits with the group
        still open can abort at exit ("terminate called without an active exception"), failing the launch after
        training succeeded. After an error no rank waits for the others, which may never arrive."""
        if not self.owns_group or not dist.is_initialized():
            return
        if completed:
            dist.barrier()
        dist.destroy_process_group()
        self.owns_group = False

    def broadcast(self, value):
        """Rank 0's `value` on every rank."""
        holder = [value]
        dist.broadcast_object_list(holder, src=0)
        return holder[0]


def from_environment(device: torch.device) -> Optional[DistributedContext]:
    """Join the process group that `torchrun` describes in the environment; `None` for a single process."""
    world_size = int(os.environ.get('WORLD_SIZE', '1'))
    if world_size <= 1:
        return None
    rank, local_rank = int(os.environ['RANK']), int(os.environ.get('LOCAL_RANK', '0'))
    joins = not dist.is_initialized()
    if joins:
        dist.init_process_group(backend='nccl' if device.type == 'cuda' else 'gloo')
    return DistributedContext(rank=rank, world_size=world_size, local_rank=local_rank, owns_group=joins)


@contextlib.contextmanager
def run_in_environment(device: torch.device) -> Iterator[Optional[DistributedContext]]:
    """`from_environment` for the length of a `with` block; the group is left when the block ends."""
    distributed = from_environment(device)
    completed = False
    try:
        yield distributed
        completed = True
    finally:
        if distributed is not None:
            distributed.close(completed)


def check_divisible(batch_size: int, world_size: int, batch_chunk: int) -> None:
    if batch_size % world_size != 0 or (batch_size // world_size) % batch_chunk != 0:
        raise ValueError(f"batch_size={batch_size} is not accepted with {world_size} processes and "
                         f"batch_chunk={batch_chunk}: each process takes batch_size / processes columns and splits "
                         f"them into batch_chunk chunks, so batch_size must be a multiple of "
                         f"{world_size * batch_chunk}")
