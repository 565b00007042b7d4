"""memwall.trainer.Trainer: Hugging Face transformers' Trainer (its own
training loop) with a memwall.torch.ZeroOptimizer as its optimizer.

    opt = memwall.torch.ZeroOptimizer(model, groups, config)
    args = memwall.trainer.TrainingArguments(output_dir=..., max_grad_norm=0, ...)
    trainer = memwall.trainer.Trainer(model=model, args=args, train_dataset=data,
                                      optimizers=(opt, scheduler))
    trainer.train()

Launched as K ranks (memwall launch --ranks K -- python train.py), each rank
runs the Trainer; what the adapter changes, and why:

- data: each global batch of args.per_device_train_batch_size x K samples
  is split into K equal parts, rank r taking part r (a last partial batch
  cannot be split evenly: on K > 1 ranks it needs dataloader_drop_last), so K ranks train on
  what one process with the whole batch would (set
  per_device_train_batch_size to the per-rank share, as with DDP); the
  order is the dataset's ("sequential") or one permutation drawn from
  data_seed (or seed) alike on every rank ("random": not the order of
  torch's RandomSampler in one process, which draws from the global RNG);
- backward: the Trainer normalises each micro-batch's loss for its own
  gradient accumulation, and the engine averages over ranks and the
  config's gradient_accumulation_steps, which must equal the Trainer's;
  the adapter multiplies the loss the Trainer backpropagates by the
  accumulation count, so the two averages are one, and scales it for fp16
  (ZeroOptimizer.scale);
- clipping and the gradient norm: the engine clips (the config's
  gradient_clipping) and takes the global norm at its step, after the
  Trainer has asked for it, so args.max_grad_norm must be 0 and no
  grad_norm is logged (ZeroOptimizer.last_step["grad_norm"] holds it when
  clipping or fp16 made the engine take it);
- saving: the model's state dict is taken inside
  ZeroOptimizer.gathered_parameters() on every rank and written by rank 0;
- the ranks: under mpirun, accelerate (which the Trainer runs on) would
  take the MPI ranks for a torch.distributed world and wrap the model in
  DDP; memwall's engine is what the ranks communicate through, so
  memwall.trainer.TrainingArguments sets the Trainer up as one process on
  each rank.

Checks at construction name the argument at fault.
"""
import contextlib
import os

import torch
import transformers

import memwall.torch

# What accelerate reads to find a multi-process CPU world (MPI launchers'
# variables among them).
_WORLD_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "WORLD_SIZE",
                    "LOCAL_RANK")


@contextlib.contextmanager
def _one_process():
    hidden = {k: os.environ.pop(k) for k in _WORLD_VARIABLES if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(hidden)


class TrainingArguments(transformers.TrainingArguments):
    """transformers.TrainingArguments set up (devices, accelerate's state)
    as one process on each rank: memwall's engine, not torch.distributed,
    connects the ranks."""

    def __post_init__(self):
        with _one_process():
            super().__post_init__()


class _RankShare(torch.utils.data.Sampler):
    """Rank r's part of each global batch of `global_batch` samples drawn
    in `order` (the indices one process would use). On several ranks a
    last partial batch is left out (the DataLoader, told to drop it, drops
    it as one process would; split unevenly, some ranks would run a
    micro-batch the others do not); one rank takes all of `order`."""

    def __init__(self, order, global_batch, rank, ranks):
        self._indices = []
        share = global_batch // ranks
        end = len(order) if ranks == 1 else len(order) - len(order) % global_batch
        for start in range(0, end, global_batch):
            batch = order[start:start + global_batch]
            self._indices.extend(batch[rank * share:(rank + 1) * share])

    def __iter__(self):
        return iter(self._indices)

    def __len__(self):
        return len(self._indices)


class Trainer(transformers.Trainer):
    """transformers.Trainer whose optimizer is a ZeroOptimizer (see the
    module's comment): optimizers=(ZeroOptimizer, scheduler or None)."""

    def __init__(self, *args, optimizers=(None, None), **kwargs):
        zero = optimizers[0]
        if not isinstance(zero, memwall.torch.ZeroOptimizer):
            raise ValueError("optimizers: expected (memwall.torch.ZeroOptimizer, scheduler), got "
                             "%s" % type(zero).__name__)
        super().__init__(*args, optimizers=optimizers, **kwargs)
        self._zero = zero
        if self.args.world_size != 1:
            raise ValueError(
                "args: accelerate set the Trainer up for %d torch.distributed processes; memwall "
                "connects the ranks itself: use memwall.trainer.TrainingArguments"
                % self.args.world_size)
        if self.args.max_grad_norm and self.args.max_grad_norm > 0:
            raise ValueError(
                "TrainingArguments.max_grad_norm: %g; memwall's engine clips the global norm at "
                "its step: set max_grad_norm=0 and the config's gradient_clipping"
                % self.args.max_grad_norm)
        if self.args.gradient_accumulation_steps != zero.accumulation_steps:
            raise ValueError(
                "TrainingArguments.gradient_accumulation_steps: %d, the config's "
                "gradient_accumulation_steps is %d; they must be equal"
                % (self.args.gradient_accumulation_steps, zero.accumulation_steps))
        def engine_backward(loss, **kwargs):
            # The Trainer divided by its accumulation; the engine divides too.
            zero.scale(loss * self.current_gradient_accumulation_steps).backward()
        self.accelerator.backward = engine_backward

    def _get_train_sampler(self, train_dataset=None):
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        ranks = self._zero.engine.world_size
        strategy = self.args.train_sampling_strategy
        if strategy == "sequential":
            order = list(range(len(dataset)))
        elif strategy == "random":
            generator = torch.Generator().manual_seed(
                self.args.data_seed if self.args.data_seed is not None else self.args.seed)
            order = torch.randperm(len(dataset), generator=generator).tolist()
        else:
            raise ValueError("TrainingArguments.train_sampling_strategy: %r; memwall.trainer "
                             "splits random or sequential batches across its ranks" % strategy)
        global_batch = self.args.per_device_train_batch_size * ranks
        if ranks > 1 and len(order) % global_batch and not self.args.dataloader_drop_last:
            raise ValueError(
                "TrainingArguments.dataloader_drop_last: %d samples are not whole global batches "
                "of %d (%d per rank x %d ranks), and the last one cannot be split evenly across "
                "the ranks: set dataloader_drop_last=True"
                % (len(order), global_batch, self.args.per_device_train_batch_size, ranks))
        return _RankShare(order, global_batch, self._zero.engine.rank, ranks)

    def _get_grad_norm(self, model, grad_norm=None):
        return None  # the engine takes it at its step, after the Trainer asks

    def _save(self, output_dir=None, state_dict=None):
        with self._zero.gathered_parameters():
            if self._zero.engine.rank == 0:
                super()._save(output_dir, state_dict=state_dict)
