"""Where a run's rollout batches come from: the batch sizes (TRL PPO's semantics), the shuffled loader over
train_dataset, and `DataPasses`, the loader as an endless stream that knows where the run stands in the current pass
(an epoch)."""

from __future__ import annotations

import math

import torch
from torch.utils.data import DataLoader


def set_batch_sizes(args, world: int, dataset_rows: int) -> None:
    """Fill the derived sizes on `args` as TRL's PPOTrainer does: local / micro / mini batch sizes, and the number
    of rollout batches (`num_total_batches`) from max_steps, else total_episodes, else num_train_epochs."""
    args.local_batch_size = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.num_mini_batches
    args.micro_batch_size = args.per_device_train_batch_size * world
    args.batch_size = args.local_batch_size * world
    args.mini_batch_size = max(1, args.batch_size // args.num_mini_batches)
    args.local_mini_batch_size = max(1, args.local_batch_size // args.num_mini_batches)
    if args.max_steps is not None and args.max_steps > 0:  # as transformers: max_steps overrides the epochs
        args.num_total_batches = args.max_steps
        args.total_episodes = args.max_steps * args.batch_size
        return
    if args.total_episodes is None:
        args.total_episodes = int(args.num_train_epochs * dataset_rows)
    args.num_total_batches = max(1, math.ceil(args.total_episodes / args.batch_size))


def rollout_loader(dataset, args) -> DataLoader:
    """Shuffled rollout batches of local_batch_size rows (data_seed, else seed), the last partial batch dropped."""
    if len(dataset) < args.local_batch_size:
        raise ValueError(
            f"`train_dataset` has {len(dataset)} rows but one rollout batch takes local_batch_size="
            f"{args.local_batch_size} (per_device_train_batch_size * gradient_accumulation_steps * "
            "num_mini_batches); "
            "lower per_device_train_batch_size or add rows."
        )
    generator = torch.Generator().manual_seed(args.data_seed if args.data_seed is not None else args.seed)
    return DataLoader(
        dataset,
        batch_size=args.local_batch_size,
        shuffle=True,
        drop_last=True,
        collate_fn=lambda rows: rows,
        generator=generator,
    )


class DataPasses:
    """The loader as an endless stream of batches, and where the run stands: `position` batches into pass `epoch`.
    A run resumed at iteration k fast-forwards the same shuffled order by k batches."""

    def __init__(self, loader):
        self.steps_per_epoch = len(loader)  # iterations in one pass over train_dataset
        self.position, self.epoch = 0, 0
        self.started = False  # whether on_epoch_begin has been sent for the current pass
        self._stream = self._endless(loader)

    @staticmethod
    def _endless(loader):
        while True:
            yield from loader

    def next_batch(self) -> list[dict]:
        return next(self._stream)

    def skip(self, batches: int) -> None:
        for _ in range(batches):
            next(self._stream)

    def resume_at(self, global_step: int) -> None:
        """Iterations already done: the position in the current pass (the stream itself is skipped separately)."""
        self.position = global_step % self.steps_per_epoch
        self.epoch = global_step // self.steps_per_epoch

    def advance(self) -> float:
        """One more batch trained; returns the fractional epoch (transformers' `state.epoch`)."""
        self.position += 1
        return self.epoch + self.position / self.steps_per_epoch

    def pass_over(self) -> bool:
        return self.position == self.steps_per_epoch

    def skip_rest_of_pass(self) -> None:
        """should_epoch_stop: the rest of this pass is not trained on."""
        self.skip(self.steps_per_epoch - self.position)

    def next_pass(self) -> float:
        """The pass ended; returns the epoch count (as a float, transformers' `state.epoch`)."""
        self.position, self.epoch, self.started = 0, self.epoch + 1, False
        return float(self.epoch)
