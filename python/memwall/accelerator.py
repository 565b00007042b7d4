"""memwall.accelerator.Accelerator: the loop a Hugging Face accelerate user
writes, with a memwall.torch.ZeroOptimizer as its optimizer.

    accelerator = memwall.accelerator.Accelerator(gradient_accumulation_steps=2)
    opt = memwall.torch.ZeroOptimizer(model, None, config)   # the config's accumulation: 2
    model, opt, data = accelerator.prepare(model, opt, data)
    for batch in data:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            opt.step()
            opt.zero_grad()

Launched as K ranks (memwall launch --ranks K -- python train.py, or
torchrun --nproc_per_node K train.py). What
differs from accelerate's own Accelerator, and why:

- the ranks: under mpirun or torchrun accelerate would take the ranks for a
  torch.distributed world and wrap the model in DDP; memwall's engine is
  what the ranks communicate through, so each rank is set up as one
  process (the model is not wrapped) ...
- ... and the data loaders are still shared out across memwall's ranks as
  accelerate shares them across its processes (each rank takes every K-th
  batch, or its part of each batch with split_batches);
- backward: accelerate divides each micro-batch's loss by its
  gradient_accumulation_steps, and the engine averages over ranks and the
  config's gradient_accumulation_steps, which must equal accelerate's: the
  loss is backpropagated undivided, times the loss scale for fp16
  (ZeroOptimizer.scale);
- clipping: the engine clips at its step (the config's gradient_clipping);
  accelerator.clip_grad_norm_ would read the placeholders ZeroOptimizer
  leaves in .grad, which refuse it by name.
"""
import contextlib
import os

import accelerate
import torch
from accelerate.data_loader import prepare_data_loader

import memwall
import memwall.torch

# What accelerate reads to find a multi-process CPU world (MPI launchers'
# variables among them).
_WORLD_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "WORLD_SIZE",
                    "LOCAL_RANK")


@contextlib.contextmanager
def _one_process():
    """accelerate (and the Trainer on it) sees one process: memwall's
    engine, not torch.distributed, connects the ranks."""
    hidden = {k: os.environ.pop(k) for k in _WORLD_VARIABLES if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(hidden)


class Accelerator(accelerate.Accelerator):
    """accelerate.Accelerator set up as one process on each of memwall's
    ranks, whose prepare() takes a ZeroOptimizer (see the module's
    comment). Every accelerate argument is accepted; cpu=True is implied."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("cpu", True)
        with _one_process():
            super().__init__(*args, **kwargs)
        self._zero = None

    def prepare(self, *args, **kwargs):
        zeros = [a for a in args if isinstance(a, memwall.torch.ZeroOptimizer)]
        optimizers = [a for a in args if isinstance(a, torch.optim.Optimizer)]
        if len(zeros) != 1 or len(optimizers) != 1:
            raise ValueError("prepare: expected one memwall.torch.ZeroOptimizer among the "
                             "objects (and no other optimizer), got %d ZeroOptimizer(s) and %d "
                             "optimizer(s)" % (len(zeros), len(optimizers)))
        zero = zeros[0]
        if self.gradient_accumulation_steps != zero.accumulation_steps:
            raise ValueError(
                "Accelerator.gradient_accumulation_steps: %d, the config's "
                "gradient_accumulation_steps is %d; they must be equal"
                % (self.gradient_accumulation_steps, zero.accumulation_steps))
        self._zero = zero
        return super().prepare(*args, **kwargs)

    def prepare_data_loader(self, data_loader, device_placement=None,
                            slice_fn_for_dispatch=None):
        """accelerate's sharing out of `data_loader`, across memwall's ranks."""
        prepared = prepare_data_loader(
            data_loader, self.device, num_processes=memwall.world_size(),
            process_index=memwall.rank(), split_batches=self.split_batches,
            put_on_device=self.device_placement if device_placement is None
            else device_placement,
            rng_types=self.rng_types.copy(), dispatch_batches=self.dispatch_batches,
            even_batches=self.even_batches, slice_fn_for_dispatch=slice_fn_for_dispatch,
            use_seedable_sampler=self.use_seedable_sampler,
            data_seed=self.dataloader_config.data_seed, non_blocking=self.non_blocking,
            use_stateful_dataloader=self.use_stateful_dataloader)
        self._dataloaders.append(prepared)
        return prepared

    def backward(self, loss, **kwargs):
        """The loss undivided (the engine averages over the accumulation),
        scaled for fp16, through the ZeroOptimizer."""
        if self._zero is None:
            raise memwall.Error("FAILED_PRECONDITION: backward: prepare() the ZeroOptimizer "
                                "first")
        self._zero.scale(loss).backward(**kwargs)
