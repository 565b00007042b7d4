"""memwall.trainer.Trainer: Hugging Face transformers' Trainer (its own
training loop) with a memwall.torch.ZeroOptimizer as its optimizer, built
from the DeepSpeed config a Trainer user already has:

    args = memwall.trainer.TrainingArguments(output_dir=..., ...)
    trainer = memwall.trainer.Trainer(model=model, args=args, train_dataset=data,
                                      config="ds_config.json")
    trainer.train()

or given ready-made (optimizers=(ZeroOptimizer(model, groups, config),
scheduler), with args.max_grad_norm=0).

config: as with TrainingArguments(deepspeed=...), its "auto" values are
filled from the arguments the way transformers' DeepSpeed integration
fills them (train_micro_batch_size_per_gpu, gradient_accumulation_steps,
train_batch_size over memwall's ranks, gradient_clipping from
max_grad_norm, the optimizer's lr, betas, eps and weight_decay, fp16/bf16,
the scheduler's warmup_min_lr, warmup_max_lr, warmup_num_steps and
total_num_steps, and the hidden-size based bucket sizes), and a value
that is not "auto" must agree with the argument (ValueError listing every
mismatch). The parameters are grouped as the Trainer groups them (weight
decay except on biases and norms). With a "scheduler" section the
engine schedules the rate (the Trainer's lr_scheduler reports it);
without one the Trainer's own lr_scheduler_type schedules it. DeepSpeed
settings memwall has no counterpart for are named in a warning (the
engine's config reader lists them), or refused where memwall cannot do
what they ask.

Launched as K ranks (memwall launch --ranks K -- python train.py, or
torchrun --nproc_per_node K train.py), each rank runs the Trainer; what
the adapter changes, and why:

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
- the ranks: under mpirun or torchrun, accelerate (which the Trainer runs
  on) would take the ranks for a torch.distributed world and wrap the
  model in DDP; memwall's engine is what the ranks communicate through, so
  memwall.trainer.TrainingArguments sets the Trainer up as one process on
  each rank.

Checks at construction name the argument at fault.
"""
import copy
import json

import torch
import transformers

import memwall
import memwall.torch
from memwall.accelerator import _one_process
from memwall.torch import _config_text

class TrainingArguments(transformers.TrainingArguments):
    """transformers.TrainingArguments set up (devices, accelerate's state)
    as one process on each rank: memwall's engine, not torch.distributed,
    connects the ranks."""

    def __post_init__(self):
        with _one_process():
            super().__post_init__()


def _node(config, key):
    """(the dict holding dotted `key`, its last part), or (None, part)."""
    *path, last = key.split(".")
    for part in path:
        config = config.get(part) if isinstance(config, dict) else None
    return (config if isinstance(config, dict) else None), last


def _is_auto(config, key):
    node, last = _node(config, key)
    return node is not None and node.get(last) == "auto"


def _hidden_size(model):
    """The model's hidden size, where transformers' DeepSpeed integration
    looks for it (config.hidden_size, the largest of hidden_sizes, or its
    text_config's)."""
    for c in (getattr(model, "config", None),
              getattr(getattr(model, "config", None), "text_config", None)):
        if getattr(c, "hidden_size", None) is not None:
            return c.hidden_size
        if getattr(c, "hidden_sizes", None):
            return max(c.hidden_sizes)
    return None


def fill_auto(config, args, model, ranks, num_training_steps):
    """`config` (a dict, JSON text or a file path: a DeepSpeed config as
    TrainingArguments(deepspeed=...) takes it) with its "auto" values
    filled as transformers' DeepSpeed integration fills them for `args`
    (transformers.TrainingArguments) on `ranks` ranks training
    `num_training_steps` steps; a value that disagrees with its argument is
    refused (ValueError listing every one). Returns a new dict."""
    config = copy.deepcopy(json.loads(_config_text(config)))
    mismatches = []

    def fill(key, value, argument=None):
        node, last = _node(config, key)
        if node is None or last not in node:
            return
        if node[last] == "auto":
            node[last] = value
        elif argument is not None and node[last] != value:
            mismatches.append("- %s=%r vs %s=%r" % (key, node[last], argument, value))

    batch = args.per_device_train_batch_size
    fill("train_micro_batch_size_per_gpu", batch, "per_device_train_batch_size")
    fill("gradient_accumulation_steps", args.gradient_accumulation_steps,
         "gradient_accumulation_steps")
    fill("train_batch_size", ranks * batch * args.gradient_accumulation_steps,
         "train_batch_size (ranks x per_device_train_batch_size x gradient_accumulation_steps)")
    fill("gradient_clipping", args.max_grad_norm, "max_grad_norm")
    fill("optimizer.params.lr", args.learning_rate, "learning_rate")
    fill("optimizer.params.betas", [args.adam_beta1, args.adam_beta2], "adam_beta1+adam_beta2")
    fill("optimizer.params.eps", args.adam_epsilon, "adam_epsilon")
    fill("optimizer.params.weight_decay", args.weight_decay, "weight_decay")
    fill("fp16.enabled", bool(args.fp16 or args.fp16_full_eval), "fp16|fp16_full_eval")
    fill("bf16.enabled", bool(args.bf16 or args.bf16_full_eval), "bf16|bf16_full_eval")
    fill("scheduler.params.warmup_min_lr", 0)
    fill("scheduler.params.warmup_max_lr", args.learning_rate, "learning_rate")
    fill("scheduler.params.total_num_steps", num_training_steps, "num_training_steps")
    fill("scheduler.params.warmup_num_steps", max(1, args.get_warmup_steps(num_training_steps)),
         "warmup_steps")
    # The bucket sizes from the hidden size; stage 3's own two at stage 3 only.
    stage3 = config.get("zero_optimization", {}).get("stage") == 3
    hidden_keys = [k for k in ("zero_optimization.reduce_bucket_size",
                               "zero_optimization.stage3_prefetch_bucket_size",
                               "zero_optimization.stage3_param_persistence_threshold")
                   if _is_auto(config, k) and (stage3 or k.endswith("reduce_bucket_size"))]
    if hidden_keys:
        hidden = _hidden_size(model)
        if hidden is None:
            raise ValueError("config: %s are \"auto\", filled from the model's hidden size, "
                             "which its config does not give: set them" % ", ".join(hidden_keys))
        fill("zero_optimization.reduce_bucket_size", hidden * hidden)
        if stage3:
            fill("zero_optimization.stage3_prefetch_bucket_size", int(0.9 * hidden * hidden))
            fill("zero_optimization.stage3_param_persistence_threshold", 10 * hidden)
    if mismatches:
        raise ValueError("config: values that disagree with the TrainingArguments (set them to "
                         "\"auto\" to take the arguments'):\n" + "\n".join(mismatches))
    return config


def deepspeed_config(config, args, model, ranks, num_training_steps):
    """fill_auto's config, with "auto" left where the integration fills
    none refused (ValueError naming the keys). The engine reads the rest:
    DeepSpeed knobs it has no counterpart for are named in a warning when
    the ZeroOptimizer is built (engine/config.h Config::not_applied)."""
    config = fill_auto(config, args, model, ranks, num_training_steps)
    left = []

    def find_auto(node, prefix):
        for k, v in node.items():
            if isinstance(v, dict):
                find_auto(v, prefix + k + ".")
            elif v == "auto" and prefix + k != "zero_optimization.stage":
                left.append(prefix + k)
    find_auto(config, "")
    if left:
        raise ValueError("config: %s: \"auto\" is filled only where transformers' DeepSpeed "
                         "integration fills it; give a value" % ", ".join(left))
    return config


class _EngineSchedule:
    """The Trainer's lr_scheduler when the config schedules the rate (its
    "scheduler" section): the engine sets each step's rate, and this
    reports the rate the last step trained with (before any step, the
    first's). Saving and loading it carry nothing: the engine's checkpoint
    holds its step."""

    def __init__(self, optimizer):
        self._optimizer = optimizer
        self._last = self._rates()
        optimizer.register_step_pre_hook(lambda *unused: self._record())

    def _rates(self):
        return [self._optimizer.engine.learning_rate(i)
                for i in range(len(self._optimizer.param_groups))]

    def _record(self):
        self._last = self._rates()

    def get_last_lr(self):
        return list(self._last)

    def step(self):
        pass  # the engine's step advances the schedule

    def state_dict(self):
        return {}

    def load_state_dict(self, state_dict):
        if state_dict:
            raise ValueError("lr_scheduler.load_state_dict: the config's scheduler is the "
                             "engine's, whose step its checkpoint holds; got the state of "
                             "another scheduler (keys %s)" % ", ".join(sorted(state_dict)))


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
    module's comment): config=DeepSpeed config (the optimizer built at
    train() from it, the arguments and the model; ZeroOptimizer options
    such as device_memory in zero_options), or optimizers=(ZeroOptimizer,
    scheduler or None)."""

    def __init__(self, *args, optimizers=(None, None), config=None, zero_options=None,
                 **kwargs):
        zero = optimizers[0]
        if config is not None and zero is not None:
            raise ValueError("config and optimizers: give one (config builds the ZeroOptimizer)")
        if config is None and not isinstance(zero, memwall.torch.ZeroOptimizer):
            raise ValueError("optimizers: expected (memwall.torch.ZeroOptimizer, scheduler), got "
                             "%s" % type(zero).__name__)
        super().__init__(*args, optimizers=optimizers, **kwargs)
        self._config, self._zero_options = config, dict(zero_options or {})
        if self.args.world_size != 1:
            raise ValueError(
                "args: accelerate set the Trainer up for %d torch.distributed processes; memwall "
                "connects the ranks itself: use memwall.trainer.TrainingArguments"
                % self.args.world_size)
        if zero is not None:
            if self.args.max_grad_norm and self.args.max_grad_norm > 0:
                raise ValueError(
                    "TrainingArguments.max_grad_norm: %g; memwall's engine clips the global norm "
                    "at its step: set max_grad_norm=0 and the config's gradient_clipping"
                    % self.args.max_grad_norm)
            self._adopt(zero)

    def _adopt(self, zero):
        """Makes `zero` the Trainer's optimizer: backward through it."""
        if self.args.gradient_accumulation_steps != zero.accumulation_steps:
            raise ValueError(
                "TrainingArguments.gradient_accumulation_steps: %d, the config's "
                "gradient_accumulation_steps is %d; they must be equal"
                % (self.args.gradient_accumulation_steps, zero.accumulation_steps))
        self._zero = zero
        self.optimizer = zero

        def engine_backward(loss, **kwargs):
            # The Trainer divided by its accumulation; the engine divides too.
            zero.scale(loss * self.current_gradient_accumulation_steps).backward()
        self.accelerator.backward = engine_backward

    def create_optimizer(self, model=None):
        if self._config is not None and getattr(self, "_zero", None) is None:
            # The Trainer's own would be a torch optimizer the run then kept.
            raise ValueError("create_optimizer: with config=, memwall.trainer builds the "
                             "ZeroOptimizer when train() starts (the config's schedule needs "
                             "the number of steps)")
        return super().create_optimizer(model)

    @property
    def zero_optimizer(self):
        """The ZeroOptimizer (self.optimizer is accelerate's wrapper of it once
        training starts); None before train() when config built it."""
        return getattr(self, "_zero", None)

    def _prepare_for_training(self, max_steps, *args, **kwargs):
        # Where transformers' DeepSpeed integration builds its engine: the
        # number of steps (for the config's "auto" schedule) is known here.
        if self._config is not None and self.optimizer is None:
            ranks = memwall.world_size()
            config = deepspeed_config(self._config, self.args, self.model, ranks, max_steps)
            decay = set(self.get_decay_parameter_names(self.model))
            named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
            groups = [{"params": [p for n, p in named if n in decay]},
                      {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
            zero = memwall.torch.ZeroOptimizer(self.model, [g for g in groups if g["params"]],
                                               config, **self._zero_options)
            self._adopt(zero)
            if "scheduler" in config:
                self.lr_scheduler = _EngineSchedule(zero)
        return super()._prepare_for_training(max_steps, *args, **kwargs)

    def _clip_grad_norm(self, model):
        return None  # the engine clips (the config's gradient_clipping) at its step

    def _get_train_sampler(self, train_dataset=None):
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        ranks = memwall.world_size()
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
        return _RankShare(order, global_batch, memwall.rank(), ranks)

    def _get_grad_norm(self, model, grad_norm=None):
        return None  # the engine takes it at its step, after the Trainer asks

    def _save(self, output_dir=None, state_dict=None):
        with self._zero.gathered_parameters():
            if self._zero.engine.rank == 0:
                super()._save(output_dir, state_dict=state_dict)
