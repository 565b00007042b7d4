"""memwall.torch: hand a PyTorch model's optimizer step to memwall's engine.

    import memwall.torch
    opt = memwall.torch.ZeroOptimizer(model, groups, config)   # config: dict or JSON
    for batch in data:
        loss = model(**batch).loss
        opt.backward(loss)          # loss x loss scale; accumulation is the engine's
        opt.step()                  # every gradient_accumulation_steps backward passes

The engine (memwall._memwall, engine/engine.h) owns the model states: the
parameters torch computes with are views of its memory (no copies), the
gradients autograd produces are added into its gradient buffers as each
parameter's gradient is final (post-accumulate-grad hooks) and freed, and
every collective and update is the engine's. What the glue does:

- groups: each module's own parameters form one memwall group, the unit
  that is gathered, released and reduced (frozen ones a group of their own);
  a parameter shared by two modules (GPT-2's tied wte / lm_head) belongs to
  the module named_parameters() meets first;
- param_groups: each torch param_group is a hyperparameter group of the
  engine; lr, betas, eps and weight_decay are sent at every step, so any
  torch.optim.lr_scheduler works;
- stage 3: a module's forward pre-hook gathers its groups and points its
  parameters at the gathered memory; the post-hook releases them. Tensors
  autograd saves from gathered memory (a weight, or a view of it such as
  the transposed weight of a linear layer) are saved as references
  (saved_tensors_hooks) and re-gathered when backward unpacks them; a group
  gathered for backward is released once its gradients are reduced (at the
  latest when backward ends);
- recomputation: the config's activation_checkpointing is planned for
  the model as `memwall plan` plans a traced one (a meta copy traced at the
  first forward's batch size (grad enabled), or at construction from
  example_inputs) and executed by memwall.recompute, whose saved-tensor
  hooks sit inside stage 3's (a recomputed block gathers its parameters
  again as its forward runs); stage "auto" takes the auto strategy's
  choice for the traced model at the loop's micro-batch;
- the model's own state dict: outside forward a stage-3 parameter holds
  only a placeholder, so model.state_dict() (save_pretrained,
  torch.save(model.state_dict())) is refused there rather than saving it;
  inside `with opt.gathered_parameters():` (collective) every parameter
  holds its values, at every stage. model.load_state_dict (or any write
  into the parameters) goes inside `with opt.gathered_parameters(modify=
  True):`, which makes what was written the master weights as the block
  ends (outside it the engine's next step would overwrite the write with
  the master weights at bf16, or lose it at stage 3: refused).

Gradient contract (the engine's): backward adds the gradient of each
micro-batch's loss (times loss_scale, which backward() applies); step()
averages over ranks and over the config's gradient_accumulation_steps
micro-batches, so losses are not divided by the accumulation count.
"""
import collections.abc
import contextlib
import copy
import inspect
import json
import logging
import os
import signal
import types
import warnings
import weakref

import torch

import memwall
from memwall import _groups, recompute
from memwall import trace as tracing
from memwall.trace import _map, _tensors, watch_modules

_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
_DTYPE_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
# What stage "auto" and the recomputation plan chose, at INFO on rank 0
# (also the auto_choice and recomputation properties).
_log = logging.getLogger("memwall")


def _config_text(config):
    if config is None:
        return "{}"
    if isinstance(config, dict):
        return json.dumps(config)
    if isinstance(config, str):
        text = config.strip()
        if text.startswith("{"):
            return text
        with open(config) as f:
            return f.read()
    raise TypeError("config: expected a dict, a JSON string or a path, got %s"
                    % type(config).__name__)


# Signals whose Python handlers raise between two bytecodes (Ctrl-C's
# KeyboardInterrupt, a timeout's SIGALRM handler, ...): held while the glue
# and the engine change state together (ZeroOptimizer._atomic), delivered
# right after. Faults (SIGSEGV, ...) are never held.
_ASYNC_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGALRM, signal.SIGVTALRM,
                  signal.SIGPROF, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP}


def _weak(method):
    """A hook that calls `method` while its optimizer lives. The hooks on
    the model and its parameters must not keep a ZeroOptimizer alive once
    its user drops it: its engine holds the model states' memory and the
    lock of the directory it saves checkpoints into."""
    ref = weakref.WeakMethod(method)

    def call(*args, **kwargs):
        bound = ref()
        return None if bound is None else bound(*args, **kwargs)
    return call


# torch.optim param_group options memwall's update does not implement, with
# the value that asks for nothing (torch's default): any other is refused.
_UNIMPLEMENTED = {"amsgrad": False, "maximize": False, "nesterov": False, "dampening": 0,
                  "capturable": False, "differentiable": False}
# The options memwall's update reads, and what lr schedulers and users add
# for themselves; foreach and fused choose among torch's own kernels, and
# memwall's kernels run the update whatever they say.
_READ = {"params", "lr", "betas", "eps", "weight_decay", "momentum"}
_CARRIED = {"initial_lr", "name", "foreach", "fused"}


def _check_group_options(param_groups):
    """ValueError naming the first option a param_group sets that memwall's
    update would not honour (it would train otherwise than asked)."""
    for i, group in enumerate(param_groups):
        for key, value in group.items():
            if key in _READ or key in _CARRIED:
                continue
            if key not in _UNIMPLEMENTED:
                raise ValueError(
                    "param_groups[%d]: unknown option '%s'; memwall's update takes lr, betas, "
                    "eps, weight_decay and momentum" % (i, key))
            if value is not None and value != _UNIMPLEMENTED[key]:
                raise ValueError(
                    "param_groups[%d]: %s=%r is not implemented by memwall's update (only %r "
                    "is)" % (i, key, value, _UNIMPLEMENTED[key]))


def _model_device(model, backend):
    """The device `model`'s parameters are on, as `backend` takes them:
    the CPU for "host", one GPU for "cuda" (ValueError otherwise)."""
    devices = sorted({str(p.device) for p in model.parameters()})
    if backend == "host":
        if devices and devices != ["cpu"]:
            raise ValueError(
                "backend \"host\" trains a model on the CPU; got parameters on %s "
                "(backend=\"cuda\" trains a model on one GPU)" % ", ".join(devices))
        return torch.device("cpu")
    if backend == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("backend \"cuda\" trains on a GPU, and torch sees none "
                             "(torch.cuda.is_available() is False)")
        if devices == ["cpu"]:
            return device()  # the engine puts it there
        if len(devices) != 1 or not devices[0].startswith("cuda:"):
            raise ValueError(
                "backend \"cuda\" trains a model whose parameters are all on one GPU, or all "
                "on the CPU (memwall then puts them on memwall.torch.device()); got "
                "parameters on %s" % (", ".join(devices) or "no device (the model has none)"))
        return torch.device(devices[0])
    raise ValueError("backend: expected \"host\" (a model on the CPU) or \"cuda\" (a model "
                     "on one GPU), got %r" % (backend,))


def device():
    """The device this rank trains on: the GPU memwall's cuda backend gives
    the rank (its MPI rank modulo the GPUs this process sees: the ranks of a
    node share its GPUs round-robin, one each when there are as many), or
    the CPU where torch sees no GPU. model.to(memwall.torch.device())."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", memwall._memwall.cuda_ordinal(memwall.rank()))


def _check_launcher(timeout):
    """memwall's collectives run among MPI's ranks: where torch.distributed
    is initialised too, it must be the same job (ValueError naming both).
    Under torchrun alone memwall.rank() has joined its ranks into one MPI
    world first (memwall._join), as it does here for a job torchrun started
    without initialising torch.distributed (before the engine starts MPI),
    waiting for the other ranks at most `timeout` seconds (0: forever)."""
    memwall._join_torch_ranks(timeout if timeout > 0 else None)
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return
    theirs = (dist.get_rank(), dist.get_world_size())
    ours = (memwall.rank(), memwall.world_size())
    if theirs != ours:
        raise ValueError(
            "torch.distributed is rank %d of %d and MPI, which memwall's collectives run "
            "among, rank %d of %d: under mpirun (or memwall launch) initialise "
            "torch.distributed from MPI's ranks, or launch with torchrun alone (README: "
            "\"Launchers\")" % (theirs + ours))


class _OrderedEngine:
    """The engine on cuda, every call in order with torch's current stream:
    the engine computes on the stream current when the ZeroOptimizer was
    made, and a call made while another is current (inside `with
    torch.cuda.stream(s):`) has the engine's stream wait for that one's
    work so far, and that one wait for the engine's after the call (events:
    no host wait)."""

    def __init__(self, engine, stream):
        self._inner = engine
        self._stream = stream

    def __getattr__(self, name):
        # Only for names not set yet: each method is wrapped once, then found
        # as an attribute (the glue calls some per parameter per step).
        value = getattr(self._inner, name)
        if not callable(value):
            return value  # a property: read anew each time
        stream = self._stream

        def ordered(*args, **kwargs):
            current = torch.cuda.current_stream(stream.device)
            if current == stream:
                return value(*args, **kwargs)
            stream.wait_stream(current)
            try:
                return value(*args, **kwargs)
            finally:
                current.wait_stream(stream)
        setattr(self, name, ordered)
        return ordered


@contextlib.contextmanager
def _collective(call):
    """A collective call of the glue's: a rank that waited past the
    collective timeout is told which call every rank must make."""
    try:
        yield
    except memwall.DeadlineExceededError as e:
        raise memwall.DeadlineExceededError(
            "DEADLINE_EXCEEDED: %s is collective: every rank calls it, in the same order, and "
            "not every rank did (%s)" % (call, str(e).split(": ", 1)[-1])) from None


def _group_defaults(config):
    """torch param_group defaults from the config's optimizer section, as
    written (Python floats, which lr schedulers scale; the engine, which
    validated them, keeps f32s), with the engine's defaults."""
    params = config.get("optimizer", {}).get("params", {})
    betas = params.get("betas", [0.9, 0.999])
    return {
        "lr": params.get("lr", 1e-3),
        "betas": (betas[0], betas[1]),
        "eps": params.get("eps", 1e-8),
        "weight_decay": params.get("weight_decay", 0.0),
        "momentum": params.get("momentum", 0.0),
    }


class _Group:
    """One memwall group: its index, its parameters (name, tensor)."""

    def __init__(self, index, name, params, trainable):
        self.index = index
        self.name = name
        self.params = params
        self.trainable = trainable
        self.forward_uses = 0       # stage 3: modules in forward using it
        self.gathered = False       # stage 3
        self.backward_gathered = False
        self.acquired = False       # stages 2-3: its gradient buffer exists
        self.pending = 0            # trainable parameters still to get a gradient


class _EngineGradient(torch.Tensor):
    """What p.grad holds once a backward has ended: the gradient itself is
    in the engine's buffers (summed over this rank's micro-batches, reduced
    across ranks at the step, sharded at stages 2-3), which no tensor here
    shows, so every use of this one raises, naming what to do instead
    (torch.nn.utils.clip_grad_norm_ would otherwise clip nothing and return
    0). Setting p.grad = None (model.zero_grad()) drops the step's
    gradients, as in torch."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise memwall.Error(
            "FAILED_PRECONDITION: p.grad: memwall's engine holds the gradients (reduced across "
            "ranks at the step, sharded at stages 2-3), not the parameters' .grad: clip them "
            "with the config's gradient_clipping (the global norm, applied at the step; "
            "opt.last_step['grad_norm'] reports it), and drop them with opt.zero_grad()")


class _StateSnapshot(torch.Tensor):
    """An optimizer state as opt.state shows it: a copy of the engine's
    (which holds the states, sharded at stages 1-3). Reading works as on
    any tensor; writing into it would change nothing the engine holds, so
    an in-place operation on it (or on a view of it) raises."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        target = kwargs.get("out", args[0] if args else None)
        inplace = name == "__setitem__" or (name.endswith("_") and not name.endswith("__"))
        if isinstance(target, cls) and (inplace or "out" in kwargs):
            raise memwall.Error(
                "FAILED_PRECONDITION: opt.state: the optimizer states are the engine's; these "
                "tensors are copies of them, so %s would change nothing: set states with "
                "opt.load_state_dict()" % (name or "the write"))
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        return _snapshot_views(out, args[0] if args else None)


def _snapshot_views(out, source):
    """`out`, with each tensor in it that shares `source`'s storage (a view)
    made a _StateSnapshot too."""
    if isinstance(out, (tuple, list)):
        return type(out)(_snapshot_views(o, source) for o in out)
    if (type(out) is torch.Tensor and isinstance(source, torch.Tensor)
            and out.untyped_storage().data_ptr() == source.untyped_storage().data_ptr()):
        return out.as_subclass(_StateSnapshot)
    return out


class _OptimizerState(collections.abc.Mapping):
    """opt.state: torch's AdamW's (or SGD's) per-parameter state, read from
    the engine. Empty until a step has been applied (as torch's, which
    creates a parameter's state at its first step); then every trainable
    parameter maps to {"step", "exp_avg", "exp_avg_sq"} of the parameter's
    shape (SGD: {"momentum_buffer"}, and nothing in a param_group without
    momentum, as torch's SGD), frozen ones to nothing. The states are
    gathered from every rank (collective: every rank reads opt.state, or
    none) once per step and held until the next step or load; they are
    copies that refuse writes (_StateSnapshot)."""

    def __init__(self, optimizer):
        self._opt = optimizer
        self._key = None  # (steps applied, loads) the snapshot is of
        self._snapshot = {}

    def _entries(self):
        opt = self._opt
        key = (opt._engine.progress()["steps_applied"], opt._loads)
        if key != self._key:
            self._snapshot = {}
            if key[0] > 0:
                with _collective("opt.state"):
                    gathered = {g.index: opt._gather_states(g)
                                for g in opt._groups if g.trainable}
                names = opt._state_names()
                sgd = names == ["momentum_buffer"]
                momentum = {id(p): group.get("momentum", 0.0)
                            for group in opt.param_groups for p in group["params"]}
                for _, p, g, offset, numel in opt._slices():
                    if sgd and momentum[id(p)] == 0:
                        continue  # torch's SGD keeps no buffer without momentum
                    entry = {} if sgd else {
                        "step": torch.tensor(float(key[0])).as_subclass(_StateSnapshot)}
                    for which, name in enumerate(names, start=1):
                        entry[name] = gathered[g.index][which][offset:offset + numel].clone() \
                            .view(opt._shape[id(p)]).as_subclass(_StateSnapshot)
                    self._snapshot[p] = entry
            self._key = key
        return self._snapshot

    def __getitem__(self, p):
        entries = self._entries()
        if p not in entries and id(p) in self._opt._names:
            return types.MappingProxyType({})  # torch's defaultdict(dict): no state yet
        return entries[p]

    def __contains__(self, p):
        return p in self._entries()

    def __iter__(self):
        return iter(self._entries())

    def __len__(self):
        return len(self._entries())

    def __setitem__(self, p, value):
        raise memwall.Error(
            "FAILED_PRECONDITION: opt.state: the optimizer states are the engine's; set them "
            "with opt.load_state_dict()")

    __delitem__ = __setitem__

    def __repr__(self):
        # Not len(self): a repr (a debugger's, a traceback's) must not be
        # a collective.
        return "ZeroOptimizer.state (a mapping read from every rank at once)"


class _Counted:
    """A saved tensor's share of a storage the profiler counts: the last one
    released (autograd frees what it saved after the node that used it)
    declares the storage's bytes released."""

    __slots__ = ("profile", "key", "value", "__weakref__")

    def __init__(self, profile, key, value):
        self.profile, self.key, self.value = profile, key, value

    def __del__(self):
        self.profile._release(self.key)


class Profile:
    """Memory profile of a torch training run with a ZeroOptimizer (use
    memwall.torch.profile(opt, directory) or opt.profile(directory)).

    While the context is open memwall's profiler sees, besides the engine
    allocator's parameters, gradients, optimizer states and communication
    buffers (exact, as always), the activations: every storage autograd
    saves for backward (saved_tensors_hooks) counted once, however many
    saved tensors view it, from the first save until the last is released,
    parameters excluded, attributed to the innermost module whose forward
    saved it first. Phases: "forward" with "forward <module>" for each
    block (the items of a ModuleList or Sequential), "backward" (around
    opt.backward), "optimizer step". On leaving, the reports (profile.txt,
    profile.json, trace.json, profile.html) are written to
    <directory>/rank<r>/, as `memwall profile` writes them.

    Only the saving forward passes of the wrapped model are seen (its
    forward hooks install the saved-tensor hooks); torch's other
    temporaries (outputs not saved, gradients before they reach the
    engine) are not counted.
    """

    def __init__(self, optimizer, directory):
        self._opt = optimizer
        self.directory = str(directory)
        self.active = False
        self._live = {}  # storage key -> [owner, bytes, references]

    def __enter__(self):
        # The reports' directory is made now: a path that cannot hold them
        # fails here, not after the training it was to profile.
        where = os.path.join(self.directory, "rank%d" % self._opt._engine.rank)
        if os.path.exists(self.directory) and not os.path.isdir(self.directory):
            raise NotADirectoryError("profile directory %s: not a directory" % self.directory)
        os.makedirs(where, exist_ok=True)
        self._opt._start_profile(self)
        self.active = True
        return self

    def __exit__(self, kind, value, traceback):
        self.active = False
        self._opt._stop_profile()
        if kind is None:
            self._opt._engine.write_reports(
                os.path.join(self.directory, "rank%d" % self._opt._engine.rank))
        return False

    def peak(self):
        """The profiler's peak: bytes, phase, by_category, top_owners."""
        return self._opt._engine.peak()

    def owners(self):
        """Live bytes now: [(owner, category, bytes)], largest first."""
        return self._opt._engine.owners()

    def _count(self, tensor, owner):
        storage = tensor.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        entry = self._live.get(key)
        if entry is None:
            entry = self._live[key] = [owner, storage.nbytes(), 0]
            self._opt._engine.record_activation(owner, entry[1])
        entry[2] += 1
        return key

    def _release(self, key):
        entry = self._live.get(key)
        if entry is None:
            return
        entry[2] -= 1
        if entry[2] == 0:
            del self._live[key]
            self._opt._engine.record_activation(entry[0], -entry[1])


def profile(optimizer, directory="memwall-profile", model=None):
    """memwall's memory reports of the training run inside the `with`
    block. `optimizer`: the run's ZeroOptimizer (Profile: the engine's
    exact books plus the activations), or any torch.optim.Optimizer with
    the `model` it trains (memwall.loop_profile.LoopProfile: every tensor
    the loop holds, by category, owner and phase)."""
    if isinstance(optimizer, ZeroOptimizer):
        if model is not None and model is not optimizer._model:
            raise ValueError("model: not the model this ZeroOptimizer wraps (leave it out)")
        return Profile(optimizer, directory)
    if model is None:
        raise ValueError("model: profiling a loop with %s needs the model it trains "
                         "(memwall.torch.profile(opt, directory, model=model))"
                         % type(optimizer).__name__)
    from memwall.loop_profile import LoopProfile
    return LoopProfile(model, optimizer, directory)


class ZeroOptimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer whose step is memwall's ZeRO engine.

    model: the torch.nn.Module whose parameters the engine takes over.
    params: what torch optimizers take (model.parameters() or param_group
        dicts with per-group lr, betas, eps, weight_decay, momentum); None:
        every parameter of the model in one group. Options the update does
        not implement (maximize, amsgrad, nesterov, dampening, ...) are
        refused unless at torch's defaults; foreach and fused are accepted
        (memwall's kernels run the update); add_param_group after
        construction is refused. Every parameter that requires
        grad must be in it; parameters that do not are frozen (no gradient,
        no optimizer state) whether listed or not, and stay so (a
        requires_grad changed later is refused at the step).
    config: the DeepSpeed-style config (a dict, JSON text or a file path);
        its optimizer.params are the param_groups' defaults. Its
        activation_checkpointing (a planner other than "none", with its
        budget) is planned at the model's first forward with grad
        enabled: a copy of the model on torch's meta device
        is traced at that forward's batch size (memwall.trace, attention as
        torch runs it on the model's device), dry-run under the config as `memwall
        plan` does, and the plan's recomputed segments of blocks are
        executed from then on (memwall.recompute; the `recomputation`
        property says what was chosen; a forward under torch.no_grad()
        plans nothing). The forward's tensors' first dimension is taken for
        the batch. Activation offload (offload,
        cpu_checkpointing) is refused: on the CPU the activations are in
        host memory already, and on a GPU torch's allocator holds them; so
        is the "selective" planner (whole blocks are recomputed, a traced
        block offers no selective mode).
    backend: "host" (a model on the CPU, MPI ranks) or "cuda" (a model on
        one GPU, one GPU per rank, NCCL among the ranks; a model on the CPU
        is put on memwall.torch.device(), parameter by parameter into the
        engine's memory, so a model too large to sit on the GPU twice is
        best handed over on the CPU): the engine keeps the model states in
        its own memory on that device, and the parameters torch computes
        with (and the
        gradient buffers backward adds into) are views of it (DLPack, no
        copies). On cuda the engine computes on torch's current stream
        when the optimizer is made (keep that stream alive as long as the
        optimizer), ordering its communication and offload streams against
        it with events; calls made while another stream is current are
        ordered with that one the same way.
    device_memory / pinned_memory: the engine device's capacity and pinned
        pool ("8GiB"; pinned "0": derived from the config).
    example_inputs: one batch as the model's forward takes it (a dict of
        keyword arguments, a tuple of positional ones, or one tensor; its
        first dimension the micro-batch). Required by stage "auto", which
        traces the model with it and takes the configuration the auto
        strategy chooses for it (`memwall plan --auto`, rates measured on
        this machine, the micro-batch and accumulation kept; `auto_choice`
        says which); with it the recomputation plan is made at
        construction rather than at the first forward. Unused when the
        config asks for neither.
    collective_timeout: the seconds a rank waits in a collective for the
        others (0: forever) before memwall.DeadlineExceededError (a
        TimeoutError) names the collective: what a call only some ranks
        make, such as state_dict() under `if rank == 0`, ends in.

    Launch one process per rank (mpirun -np K python train.py,
    memwall launch --ranks K -- python train.py, or torchrun
    --nproc_per_node K train.py with init_process_group() called first);
    every rank builds the same model with the same initial values.
    """

    def __init__(self, model, params=None, config=None, *, backend="host",
                 device_memory="4GiB", pinned_memory="0", collective_timeout=600.0,
                 example_inputs=None):
        if not isinstance(model, torch.nn.Module):
            raise TypeError("model: expected a torch.nn.Module, got %s" % type(model).__name__)
        self._device = _model_device(model, backend)
        _check_launcher(collective_timeout)
        for name, p in model.named_parameters():
            if p.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                raise ValueError(
                    "parameter '%s' is %s; memwall keeps f32 master weights and computes in f32 "
                    "or the config's bf16/fp16: convert the model first (model.float())"
                    % (name, p.dtype))
        text = _config_text(config)
        read = memwall._memwall.config_values(text)  # the engine's reading, checked
        if read["not_applied"]:
            warnings.warn("memwall: DeepSpeed settings with no memwall counterpart, not "
                          "applied: " + ", ".join(read["not_applied"]), stacklevel=2)
        parsed = json.loads(text)
        self._device_memory = str(device_memory)
        self._collective_timeout = collective_timeout
        self._recomputation_report = None
        self._auto_choice = None
        auto = (parsed.get("zero_optimization") or {}).get("stage") == "auto"
        traced = None  # (description, batch) of example_inputs, when there is a plan to make
        if example_inputs is not None and (auto or read["recomputes"]):
            traced = _describe(model, *_example_call(example_inputs), device=self._device,
                               dtype=_DTYPES[read["param_dtype"]])
        if auto:
            if traced is None:
                raise ValueError(
                    "zero_optimization.stage \"auto\": memwall chooses by tracing the model and "
                    "dry-running each configuration; pass ZeroOptimizer(..., example_inputs=...): "
                    "one batch as the model's forward takes it (a dict of keyword arguments, a "
                    "tuple of positional ones, or one tensor)")
            text = self._resolve_auto(text, *traced)
            read = memwall._memwall.config_values(text)
            parsed = json.loads(text)
        if (parsed.get("activation_checkpointing") or {}).get("planner") == "selective":
            raise ValueError(
                "activation_checkpointing.planner \"selective\": memwall.torch recomputes whole "
                "blocks, and a traced block offers no selective mode (its attention alone); "
                "use full, uniform:K, sqrt or optimal")
        if read["recomputes"] and read["offloads_activations"] and self._device.type != "cpu":
            raise ValueError(
                "activation_checkpointing.offload (or cpu_checkpointing): memwall.torch does "
                "not move a GPU model's activations (torch's allocator holds them); set it "
                "false (recomputation alone is planned and applied)")
        if read["recomputes"] and read["offloads_activations"]:
            raise ValueError(
                "activation_checkpointing.offload (or cpu_checkpointing): memwall.torch's "
                "activations are CPU tensors already, with no device memory to offload them "
                "from; set it false (recomputation alone is planned and applied)")
        # The recomputation plan is the glue's to execute (at the first
        # training forward); the engine takes the rest of the config.
        self._plan_text = text if read["recomputes"] else None
        engine_text = text if not read["recomputes"] else json.dumps(
            {k: v for k, v in parsed.items() if k != "activation_checkpointing"})
        if params is None:
            params = list(model.parameters())
        super().__init__(params, _group_defaults(parsed))
        _check_group_options(self.param_groups)
        self.state = _OptimizerState(self)
        self._loads = 0  # load_state_dict/load_checkpoint calls: opt.state's snapshot is older
        self._model = model
        self._names = {}  # id(param) -> name
        self._shape = {}  # id(param) -> its shape (stage 3 empties the tensor)
        for name, p in model.named_parameters():
            self._names[id(p)] = name
            self._shape[id(p)] = tuple(p.shape)
        hyper_of = {}
        for i, group in enumerate(self.param_groups):
            for p in group["params"]:
                if id(p) not in self._names:
                    raise ValueError(
                        "param_groups[%d]: a parameter of shape %s is not a parameter of the "
                        "model" % (i, tuple(p.shape)))
                hyper_of[id(p)] = i
        for name, p in model.named_parameters():
            if p.requires_grad and id(p) not in hyper_of:
                raise ValueError(
                    "parameter '%s' of the model requires grad but was not given to the "
                    "optimizer; pass it in a param_group, or freeze it (requires_grad=False)"
                    % name)
        self._groups, specs, values = self._plan_groups(model, hyper_of)
        # On cuda the engine computes for torch on torch's current stream
        # (its views are read and written in that stream's order) and
        # orders its own streams against it with events; _OrderedEngine
        # orders it against another stream current at a later call.
        self._stream = (torch.cuda.current_stream(self._device)
                        if self._device.type == "cuda" else None)
        engine = memwall.Engine(
            engine_text, specs, backend=backend, device_memory=device_memory,
            pinned_memory=pinned_memory, collective_timeout=collective_timeout,
            device_ordinal=-1 if self._stream is None else self._device.index,
            stream=None if self._stream is None else self._stream.cuda_stream)
        self._engine = engine if self._stream is None else _OrderedEngine(engine, self._stream)
        del values  # the engine has its copy
        self._send_hyperparameters()  # refused values leave the model untouched
        self._stage = self._engine.stage
        self._dtype = _DTYPES[self._engine.param_dtype]
        self._group_of = {}  # id(param) -> _Group
        for g in self._groups:
            for _, p in g.params:
                self._group_of[id(p)] = g
        self._storage = {}  # stage 3: data_ptr of a gathered parameter -> param
        self._micro_batches = 0
        self._sent_hyperparameters = False  # this step's, to the engine
        self._atomic_depth = 0  # nesting of _atomic sections
        self._backward_open = False  # a backward's gradients arrive; not ended yet
        # scale() multiplied a loss by the loss scale for the next backward
        # (backward() calls it).
        self._scaled_next = False
        # Whether the trainable parameters' .grad hold their placeholders
        # (self._placeholders, made below; from the end of a backward to the
        # next forward, step() or zero_grad()).
        self._grads_out = False
        self._accumulation = read["gradient_accumulation_steps"]
        self._hooks = []
        self._saving = None
        self._profile = None  # the open Profile
        self._profile_hooks = []
        self._module_stack = []  # names of the modules in forward, innermost last
        self._parameter_storage = set()
        # Inside gathered_parameters(): every group stays gathered; with
        # modify, writes to the parameters are taken as they are made.
        self._holding_all = False
        self._modifying = False
        # Stage 3: each released parameter's one element, and by its address
        # the parameter's name. Stages 0-2: each parameter's address.
        self._holders = {id(p): torch.zeros(1, dtype=self._dtype, device=self._device)
                         for _, p in self._named()} if self._stage == 3 else {}
        self._released = {self._holders[id(p)].data_ptr(): name
                          for name, p in self._named() if id(p) in self._holders}
        self._homes = {}
        if self._dtype != torch.float32:
            model.to(self._dtype)  # buffers too, as the parameters' dtype
        for g in self._groups:
            if self._stage == 3:
                self._release_views(g)
            else:
                self._point_at_engine(g)
        # A model handed over on the CPU: its parameters are the engine's
        # memory on the GPU now (never copied there whole: the engine took
        # them from host memory); its buffers follow.
        for module in model.modules():
            for key, b in module._buffers.items():
                if b is not None and b.device != self._device:
                    module._buffers[key] = b.to(self._device)
        # Each parameter's version counter when its values were last the
        # engine's: torch counts every in-place write (and not the .data
        # swaps of stage 3's gathers), so a moved counter finds a write.
        self._versions = {}
        self._record_versions()
        # Where each parameter starts in its group (the layout is fixed).
        self._offsets = {name: offset for d in self._engine.groups()
                         for name, offset in zip(d["parameters"], d["offsets"])}
        # What .grad shows between a backward and the step (_EngineGradient).
        self._placeholders = {
            id(p): torch.Tensor._make_subclass(
                _EngineGradient,
                torch.zeros(1, dtype=self._dtype, device=self._device).expand(self._shape[id(p)]))
            for _, p in self._named() if p.requires_grad}
        self._install_hooks(model)
        if self._plan_text is not None and traced is not None:
            self._apply_recomputation(model, *traced)
        elif self._plan_text is not None:
            self._planning = model.register_forward_pre_hook(
                _weak(self._plan_recomputation), with_kwargs=True)

    # -- set-up -------------------------------------------------------------

    def _named(self):
        return [(self._names[id(p)], p) for g in self._groups for _, p in g.params]

    def _plan_groups(self, model, hyper_of):
        """Groups in module order: each module's own parameters, trainable
        ones and frozen ones apart. Also returns the host tensors whose
        addresses the specs hold, to keep alive until the engine copies
        them."""
        groups, specs, values = [], [], []
        for _, label, members, trainable in _groups.module_groups(model):
            groups.append(_Group(len(groups), label, members, trainable))
            parameters = []
            for n, p in members:
                # The engine reads initial values from host memory, in the
                # parameter's own dtype (a CPU model's memory as it is, no
                # f32 copy beside it).
                values.append(p.detach().to(device="cpu").contiguous())
                parameters.append(memwall.Parameter(
                    n, list(p.shape), values[-1].data_ptr(), trainable,
                    hyper_of.get(id(p), 0), _DTYPE_NAMES[p.dtype]))
            specs.append((label, parameters))
        return groups, specs, values

    def _view(self, memory, p):
        # memory: a DLPack capsule of the engine's memory, on the engine's
        # device, in param_dtype.
        return torch.from_dlpack(memory).view(self._shape[id(p)])

    def _point_at_engine(self, g):
        # Stages 0-2: the parameters stay where they are for the engine's
        # lifetime; _check_model compares against these addresses.
        for name, p in g.params:
            p.data = self._view(self._engine.parameter(name), p)
            self._homes[id(p)] = p.data.data_ptr()

    def _release_views(self, g):
        # Released parameters keep their shape (autograd checks gradients
        # against it when it accumulates them) over one element of memory
        # of their own, which the saved-tensor hook recognises: their values
        # are the engine's, gathered only while in use.
        for _, p in g.params:
            self._storage.pop(p.data.data_ptr(), None)
            p.data = self._holders[id(p)].expand(self._shape[id(p)])

    def _install_hooks(self, model):
        on_gradient, gather, release = (_weak(self._on_gradient), _weak(self._forward_gather),
                                        _weak(self._forward_release))
        for _, p in self._named():
            if p.requires_grad:
                self._hooks.append(p.register_post_accumulate_grad_hook(on_gradient))
        self._hooks.append(model.register_forward_pre_hook(_weak(self._enter_saving)))
        self._hooks.append(model.register_forward_hook(_weak(self._exit_saving), always_call=True))
        saving, loading = _weak(self._check_state_dict), _weak(self._check_load_state_dict)
        for module in model.modules():
            if any(p is not None for p in module._parameters.values()):
                self._hooks.append(module.register_state_dict_pre_hook(saving))
                self._hooks.append(module.register_load_state_dict_pre_hook(loading))
        if self._stage != 3:
            return
        for module in model.modules():
            groups = []
            for p in module._parameters.values():
                if p is not None and self._group_of[id(p)] not in groups:
                    groups.append(self._group_of[id(p)])
            if not groups:
                continue
            self._hooks.append(module.register_forward_pre_hook(
                lambda m, args, groups=groups: gather(groups)))
            self._hooks.append(module.register_forward_hook(
                lambda m, args, out, groups=groups: release(groups),
                always_call=True))

    # -- the recomputation plan ---------------------------------------------

    def _resolve_auto(self, text, description, batch):
        """Stage "auto": the auto strategy's choice for the traced model at
        the example's micro-batch and the config's accumulation (as `memwall
        plan --auto` chooses, on this machine's measured rates); its config
        text."""
        # The rates are measured on rank 0 and its choice taken by every
        # rank: ranks measuring each for themselves could choose apart.
        said = ""
        if memwall.rank() == 0:
            try:
                said = "ok\n" + memwall._memwall.plan(
                    json.dumps(description), text, memwall.world_size(), self._device_memory,
                    "512GiB", "0", batch, True, "this-machine", False)
            except Exception as error:  # the other ranks raise it too, not hang
                said = "error\n%s\n%s" % (type(error).__name__, error)
        said = memwall._memwall.share_from_rank0(said, self._collective_timeout)
        kind, rest = said.split("\n", 1)
        if kind == "error":
            name, message = rest.split("\n", 1)
            raise getattr(memwall, name, memwall.Error)(message)
        report = json.loads(rest)
        if not report["fits"]:
            raise memwall.OutOfMemoryError(
                "RESOURCE_EXHAUSTED: zero_optimization.stage \"auto\": no configuration of %s "
                "fits device_memory %s at micro-batch %d (tried: %s)" % (
                    description["model"], self._device_memory, batch,
                    "; ".join(c["name"] for c in report["candidates"])))
        self._auto_choice = {"chosen": report["chosen"], "config": report["config"],
                             "step_seconds": report["step_seconds"]}
        if memwall.rank() == 0:
            _log.info("memwall: zero_optimization.stage \"auto\" chose %s (predicted %.3g s "
                      "per step on this machine)", report["chosen"], report["step_seconds"])
        return json.dumps(report["config"])

    def communication(self):
        """What this rank's collectives moved so far: {"nodes" (the ranks'
        machines: those sharing memory, MEMWALL_RANKS_PER_NODE's blocks, or
        the config's ranks_per_node), "collectives" (per collective
        "calls", logical "bytes", and the whole job's link bytes
        "intra_node_bytes" / "inter_node_bytes" as a node-aware algorithm
        moves them), "intra_node_bytes" / "inter_node_bytes" (their sums),
        "arrived_last" and "wait_caused_s" (per rank: the collectives it
        arrived last to, and the seconds the others waited for it then:
        the straggler)}. Counters since the optimizer was made; take
        differences for a step."""
        return self._engine.communication()

    @property
    def auto_choice(self):
        """What stage "auto" chose: {"chosen" (the candidate's name, as
        `memwall plan --auto` prints it: stage, offload, recomputation,
        buckets), "config" (the whole config it trains with),
        "step_seconds" (predicted on this machine)}; None for a named
        stage."""
        return copy.deepcopy(self._auto_choice)

    def _plan_recomputation(self, model, args, kwargs):
        """At the first forward with grad: the config's recomputation plan
        for this model at this batch size, applied (see __init__)."""
        if not torch.is_grad_enabled():
            return
        self._apply_recomputation(
            model, *_describe(model, args, kwargs, self._shape, device=self._device))
        self._planning.remove()
        self._planning = None

    def _apply_recomputation(self, model, description, batch):
        report = json.loads(memwall._memwall.plan(
            json.dumps(description), self._plan_text, memwall.world_size(), self._device_memory,
            "512GiB", "0", batch, False, "this-machine"))
        segments = recompute.segments_of(description, report)
        recompute.Recomputation(model, segments)  # its hooks on the model keep it
        self._recomputation_report = {
            "planner": report["recomputation"],
            "note": report.get("recomputation_note", ""),
            "micro_batch": batch,
            "segments": segments,
            "stages": [s["name"] for s in description["stages"]],
            "held_after_forward": report["recompute_held_after_forward"],
            "activation_peak": report["recompute_predicted_peak"],
            "recompute_flops": report["recompute_flops_per_step"],
            "forward_flops": report["forward_flops_per_step"],
        }
        if memwall.rank() == 0:
            _log.info("memwall: recomputation %s at micro-batch %d: %d segments %s; activations "
                      "held after forward %d bytes, peak %d", report["recomputation"], batch,
                      len(segments), segments, report["recompute_held_after_forward"],
                      report["recompute_predicted_peak"])

    @property
    def recomputation(self):
        """The recomputation plan applied to the model (None before the
        first forward with grad, or with none asked for): {"planner",
        "note" (why the least-peak plan, if no plan met the budget),
        "micro_batch" it was planned at, "segments" (module names, each
        list recomputed together), "stages" (the traced chain),
        "held_after_forward" and "activation_peak" (the plan's activation
        bytes: what the step keeps once forward ends, and its peak
        counting gradients), "recompute_flops" / "forward_flops" (per
        step)}."""
        return copy.deepcopy(self._recomputation_report)

    # -- keeping the glue and the engine in step ------------------------------

    @contextlib.contextmanager
    def _atomic(self):
        """A change of the glue's state and the engine's together. Signals
        that raise in Python (Ctrl-C) are held until it ends, so none lands
        between the two; any exception inside (the engine's, or a signal
        raised by the code it calls) forgets the step on both sides
        (_abort_step) before it propagates: a step retried afterwards runs
        from the state before it, never from half of it."""
        outermost = self._atomic_depth == 0
        # A handler pending from before may raise as pthread_sigmask returns
        # (Python runs pending handlers then): the mask is restored, and the
        # section, which changed nothing yet, does not start.
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, _ASYNC_SIGNALS)
        except BaseException:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
            raise
        self._atomic_depth += 1
        try:
            yield
        except BaseException:
            if outermost:
                self._abort_step()
            raise
        finally:
            self._atomic_depth -= 1
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def _abort_step(self):
        """Forgets the step in progress, here and in the engine: its
        micro-batches' gradients, what stage 3 gathered, the counts."""
        self._micro_batches = 0
        self._sent_hyperparameters = False
        self._backward_open = False
        self._grads_out = False
        for g in self._groups:
            g.acquired = False
            g.pending = 0
            g.forward_uses = 0
            g.backward_gathered = False
            for _, p in g.params:
                p.grad = None  # autograd's, not yet handed to the engine
            if g.gathered:  # the engine's abort drops what it gathered
                self._release_views(g)
                g.gathered = False
        self._engine.abort_step()

    def _check_backward_ended(self, where):
        """A backward whose gradients began to arrive but that never ended
        (an exception or Ctrl-C inside loss.backward()) left part of a
        micro-batch's gradients: the step is forgotten (torch would go on
        from the partial gradients). Returns whether it was."""
        if torch._C._current_autograd_node() is not None:
            return False
        # A gradient autograd accumulated whose hook never ran (the backward
        # ended before it) counts too: the next backward would add to it.
        if not self._backward_open and all(p.grad is None or
                                           p.grad is self._placeholders.get(id(p))
                                           for _, p in self._named()):
            return False
        with self._atomic():
            self._abort_step()
        warnings.warn("memwall: %s: the last backward did not finish (interrupted?); the "
                      "step's gradients so far were dropped, and it starts again" % where,
                      RuntimeWarning, stacklevel=3)
        return True

    # -- stage 3 ------------------------------------------------------------

    def _gather(self, g):
        if g.gathered:
            return
        self._engine.gather(g.index)
        g.gathered = True
        for name, p in g.params:
            p.data = self._view(self._engine.parameter(name), p)
            self._storage[p.data.data_ptr()] = p

    def _release(self, g):
        if not g.gathered or self._holding_all:
            return
        self._release_views(g)
        self._engine.release(g.index)
        g.gathered = False
        g.backward_gathered = False

    def _forward_gather(self, groups):
        with self._atomic():
            for g in groups:
                self._gather(g)
                g.forward_uses += 1

    def _forward_release(self, groups):
        with self._atomic():
            for g in groups:
                if g.forward_uses == 0:  # a forward the step's abort forgot
                    continue
                g.forward_uses -= 1
                if g.forward_uses == 0 and not g.backward_gathered:
                    self._release(g)

    # -- the model's state dict ---------------------------------------------

    def _check_state_dict(self, module, prefix, keep_vars):
        if self._stage != 3 or self._holding_all:
            return
        name = next(n for n, p in module._parameters.items() if p is not None)
        raise memwall.Error(
            "FAILED_PRECONDITION: state_dict(): at ZeRO stage 3 parameter '%s%s' holds only a "
            "placeholder outside forward; take the state dict inside `with "
            "opt.gathered_parameters():` (every rank enters it), or use "
            "opt.full_model_state_dict()" % (prefix, name))

    def _check_load_state_dict(self, module, state_dict, prefix, *args):
        if self._modifying:
            return
        raise memwall.Error(
            "FAILED_PRECONDITION: load_state_dict(): memwall keeps the master weights the next "
            "step starts from; load inside `with opt.gathered_parameters(modify=True):` (every "
            "rank enters it, loading the same values) so that they become the master weights "
            "(module '%s')" % prefix.rstrip("."))

    @contextlib.contextmanager
    def gathered_parameters(self, modify=False):
        """Collective (every rank enters it, in the same order): inside the
        block every parameter holds its values in full, at every stage, so
        model.state_dict(), save_pretrained or an evaluation see the trained
        weights (stage 3 holds only a shard otherwise). modify=True: what the
        block writes into the parameters (model.load_state_dict, p.copy_)
        becomes their master weights when it ends without an exception;
        every rank must write the same values (at stages 0-2 in-place
        writes become the master weights at the next step anyway; at stage
        3 a write inside a block without modify is refused as it ends). A
        parameter written (torch's version counter moved) gets master
        weights equal to its values: in bf16 or fp16 all it could hold of
        what was written; one not written keeps its f32 master weights.
        Between steps only (not inside forward or backward, nor between a
        backward and step())."""
        if self._holding_all:
            raise memwall.Error("FAILED_PRECONDITION: gathered_parameters(): already inside one")
        self._check_backward_ended("gathered_parameters()")
        if self._micro_batches or any(g.forward_uses or g.acquired for g in self._groups):
            raise memwall.Error(
                "FAILED_PRECONDITION: gathered_parameters(): a step is in progress (%d backward "
                "passes since the last step); enter it between steps" % self._micro_batches)
        with self._atomic(), _collective("gathered_parameters()"):
            if self._stage == 3:
                for g in self._groups:
                    self._gather(g)
                self._record_versions()  # stage 3 takes no writes between steps
            self._holding_all = True
        try:
            self._modifying = modify
            yield self
            edited = {g.index: self._edited(g) for g in self._groups}
            if modify:
                # Every group listed: gathering its master weights is collective.
                with _collective("gathered_parameters(modify=True)"):
                    self._set_master_weights(edited)
                self._record_versions()
            elif self._stage == 3 and any(edited.values()):
                self._record_versions()
                raise memwall.Error(
                    "FAILED_PRECONDITION: gathered_parameters(): parameter '%s' was written "
                    "inside the block, which discards what it gathered at stage 3; write inside "
                    "gathered_parameters(modify=True)"
                    % next(n for e in edited.values() for n, _ in e))
        finally:
            self._modifying = False
            with self._atomic():
                self._holding_all = False
                if self._stage == 3:
                    for g in self._groups:
                        self._release(g)

    def _edited(self, g):
        """Group g's (name, parameter) pairs written since their values were
        last the engine's."""
        return [(n, p) for n, p in g.params if p._version != self._versions[id(p)]]

    @torch.no_grad()
    def _set_master_weights(self, changed):
        """For each group index in `changed` (in order; collective: its
        master weights are gathered), the master weights of its listed
        (name, parameter) pairs become the parameters' values in f32 (and
        the parameters those rounded, which they already are)."""
        for index in sorted(changed):
            masters = self._gather_state(index, 0)
            if not changed[index]:
                continue
            for name, p in changed[index]:
                begin = self._offsets[name]
                masters[begin:begin + p.numel()] = p.detach().reshape(-1).to(torch.float32)
            self._engine.set_state(index, 0, masters.data_ptr(), masters.numel())

    def full_model_state_dict(self, rank0_only=False):
        """Collective: model.state_dict() with every parameter's values, as
        copies (FSDP's full state dict; DeepSpeed's consolidated 16-bit
        state dict), in the parameters' dtype. rank0_only: the other ranks
        return {} (they still take part in the gathers)."""
        with self.gathered_parameters():
            if rank0_only and self._engine.rank != 0:
                return {}
            return {k: v.detach().clone() for k, v in self._model.state_dict().items()}

    # -- saved tensors (stage 3 and profiling) --------------------------------

    def _enter_saving(self, module, args):
        self._take_back_gradients("forward")
        self._check_backward_ended("forward")
        # Pushing torch's saved-tensor hooks and remembering them is one
        # change: an interrupt between the two would leave hooks pushed and
        # forgotten, or remembered and never pushed (popping them then
        # breaks torch's stack).
        with self._atomic():
            # A forward that a KeyboardInterrupt ended skipped the
            # always_call hooks (torch runs them for Exceptions only): its
            # saved-tensor hooks and its modules' counts are left over.
            self._pop_saving()
            if any(g.forward_uses for g in self._groups):
                for g in self._groups:
                    g.forward_uses = 0
                    if not g.backward_gathered:
                        self._release(g)
            # One pair of saved-tensor hooks serves stage 3 and the
            # profiler: nested pairs would hide the outer one.
            if self._stage != 3 and self._profile is None:
                return
            saving = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
            saving.__enter__()
            self._saving = saving
            if self._profile is not None:
                self._engine.begin_phase("forward")

    def _exit_saving(self, module, args, out):
        with self._atomic():
            self._pop_saving()

    def _pop_saving(self):
        """Pops this optimizer's saved-tensor hooks, if pushed (and ends the
        profile's forward phase with them). REQUIRES: inside _atomic."""
        if self._saving is None:
            return
        saving, self._saving = self._saving, None
        if self._profile is not None:
            self._engine.end_phase()
        saving.__exit__(None, None, None)

    def _pack(self, tensor):
        ptr = tensor.untyped_storage().data_ptr()
        # Stage 3: a tensor in gathered memory is saved as where it lies in
        # its parameter, and rebuilt from the memory gathered again in
        # backward.
        p = self._storage.get(ptr)
        if p is not None:
            return (p, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))
        released = self._released.get(ptr)
        if released is not None:
            raise memwall.Error(
                "FAILED_PRECONDITION: parameter '%s' was used while released: stage 3 gathers "
                "a module's parameters only around that module's own forward, and this one was "
                "read outside it (a parent reading child.weight?); call it through its module"
                % released)
        if self._profile is None or ptr in self._parameter_storage:
            return tensor
        owner = self._module_stack[-1] if self._module_stack else "<model>"
        return _Counted(self._profile, self._profile._count(tensor, owner), tensor)

    def _unpack(self, packed):
        if isinstance(packed, _Counted):
            return packed.value
        if not isinstance(packed, tuple):
            return packed
        p, offset, shape, stride = packed
        g = self._group_of[id(p)]
        if not g.gathered:
            with self._atomic():
                self._gather(g)
                g.backward_gathered = True
                # Released when its gradients are reduced, at the latest
                # when backward ends (or, read outside backward, at the next
                # step).
                self._open_backward()
        return p.data.as_strided(shape, stride, offset)

    def _open_backward(self):
        """Inside a backward: its end (_end_backward) is queued once. With
        a loss scale (fp16) its loss must have been scaled."""
        if self._backward_open or torch._C._current_autograd_node() is None:
            return
        scaled, self._scaled_next = self._scaled_next, False
        if not scaled and self._engine.loss_scale != 1:
            raise memwall.Error(
                "FAILED_PRECONDITION: backward: fp16 training multiplies the loss by the loss "
                "scale (%g) before backward, and the engine divides it out at the step; call "
                "opt.backward(loss), or opt.scale(loss).backward()" % self._engine.loss_scale)
        self._backward_open = True
        torch.autograd.Variable._execution_engine.queue_callback(_weak(self._end_backward))

    def _end_backward(self):
        with self._atomic():
            self._backward_open = False
            # A micro-batch counts when its backward has ended: one that an
            # exception or Ctrl-C ended early is dropped, never counted.
            self._micro_batches += 1
            for g in self._groups:
                if g.backward_gathered and g.forward_uses == 0:
                    self._release(g)
            for _, p in self._named():
                if id(p) in self._placeholders:
                    p.grad = self._placeholders[id(p)]
            self._grads_out = True

    def _end_placeholders(self):
        """Every trainable parameter's .grad is None again: (the names of
        those whose placeholder the user cleared, of those whose they
        replaced, how many there are). REQUIRES: inside _atomic, so that all
        go or none (a signal landing between two parameters would leave some
        cleared, which a retried call would take for the user's)."""
        named = [(n, p) for n, p in self._named() if id(p) in self._placeholders]
        cleared = [n for n, p in named if p.grad is None]
        replaced = [n for n, p in named
                    if p.grad is not None and p.grad is not self._placeholders[id(p)]]
        for _, p in named:
            p.grad = None
        self._grads_out = False
        return cleared, replaced, len(named)

    def _take_back_gradients(self, where):
        """Ends the p.grad placeholders of the last backward (before a
        forward, a step or zero_grad). Cleared everywhere (p.grad = None,
        model.zero_grad()): the step's gradients are dropped, as torch's
        would be; cleared for some parameters only, or replaced by a
        tensor: refused, since the engine cannot honour it."""
        if not self._grads_out:
            return
        with self._atomic():
            cleared, replaced, trainable = self._end_placeholders()
        if replaced or (cleared and len(cleared) != trainable):
            with self._atomic():
                self._abort_step()
            raise memwall.Error(
                "FAILED_PRECONDITION: %s: parameter '%s' had its .grad %s after backward; the "
                "engine holds the gradients and cannot take that: the step's gradients were "
                "dropped (opt.zero_grad() or model.zero_grad() drop them all)"
                % (where, (replaced or cleared)[0], "replaced" if replaced else "cleared"))
        if cleared:
            with self._atomic():
                self._abort_step()
    # -- gradients ----------------------------------------------------------

    def _on_gradient(self, p):
        with self._atomic():
            g = self._group_of[id(p)]
            name = self._names[id(p)]
            self._open_backward()
            if not self._sent_hyperparameters:
                # Before the first gradient of a step: an update overlapped
                # with backward (offload_optimizer.overlap_step) then runs
                # with the step's values, as a scheduler set them after the
                # last step, and from the weights as the user left them.
                self._adopt_edits(after_backward=False)
                self._send_hyperparameters()
                self._sent_hyperparameters = True
            if not g.acquired:
                self._engine.acquire_gradients(g.index)
                g.acquired = True
                g.pending = len(g.params)  # only trainable groups have gradients
            self._view(self._engine.gradient(name), p).add_(p.grad.to(self._dtype))
            p.grad = None
            g.pending -= 1
            if g.pending == 0:
                self._reduce(g)

    def _reduce(self, g):
        self._engine.reduce_gradients(g.index)
        g.acquired = False
        if self._stage == 3 and g.backward_gathered and g.forward_uses == 0:
            self._release(g)

    # -- the torch.optim.Optimizer interface ---------------------------------

    @property
    def engine(self):
        """The memwall.Engine behind this optimizer."""
        return self._engine

    @property
    def loss_scale(self):
        return self._engine.loss_scale

    @property
    def accumulation_steps(self):
        """The config's gradient_accumulation_steps: the backward passes
        each step() takes."""
        return self._accumulation

    def backward(self, loss):
        """loss.backward() with the engine's loss scale (fp16). Each backward
        that ends counts a micro-batch for step()'s accumulation check."""
        self._check_backward_ended("backward")
        if self._profile is not None:
            self._engine.begin_phase("backward")
        try:
            self.scale(loss).backward()
        except BaseException:
            # Part of this micro-batch's gradients may have reached the
            # engine: the step is forgotten, as it would be for a failure
            # in the engine.
            with self._atomic():
                self._abort_step()
            raise
        finally:
            self._scaled_next = False
            if self._profile is not None:
                self._engine.end_phase()

    def scale(self, loss):
        """The loss times the engine's loss scale (fp16; the loss itself
        otherwise), for a backward of the caller's own (as torch's
        GradScaler.scale): `opt.scale(loss).backward()`. A plain
        loss.backward() works where the scale is 1 (f32, bf16)."""
        if self._engine.loss_scale == 1:
            return loss
        self._scaled_next = True
        return loss * self._engine.loss_scale

    def profile(self, directory="memwall-profile"):
        """A Profile of the run inside the `with` block (memwall.torch.profile)."""
        return Profile(self, directory)

    def _start_profile(self, profile):
        if self._profile is not None:
            raise memwall.Error("FAILED_PRECONDITION: profile: a profile of this optimizer is "
                                "already open")
        self._profile = profile
        self._parameter_storage = {p.data.untyped_storage().data_ptr() for _, p in self._named()}
        self._parameter_storage.update(self._released)
        self._profile_hooks = watch_modules(self._model, _weak(self._enter_module),
                                            _weak(self._exit_module))

    def _stop_profile(self):
        for hook in self._profile_hooks:
            hook.remove()
        self._profile_hooks = []
        self._profile = None

    def _enter_module(self, name, block, args, kwargs):
        self._module_stack.append(name or "<model>")
        if block:
            self._engine.begin_phase(("recompute " if recompute.replaying() else "forward ")
                                     + name)

    def _exit_module(self, block):
        self._module_stack.pop()
        if block:
            self._engine.end_phase()

    def add_param_group(self, param_group):
        """torch.optim's, while the constructor builds the param_groups;
        afterwards refused (the engine's groups are fixed when it is built:
        give every param_group to ZeroOptimizer)."""
        if getattr(self, "_engine", None) is not None:
            raise memwall.Error(
                "FAILED_PRECONDITION: add_param_group: the engine's parameters and groups are "
                "fixed when the ZeroOptimizer is built; pass every param_group to it")
        super().add_param_group(param_group)

    def zero_grad(self, set_to_none=True):
        """Drops the gradients accumulated since the last step, as torch's
        zero_grad does (they live in the engine's buffers, which the step
        zeroes; the parameters' .grad is None again): after backward(),
        zero_grad(), step() changes nothing. Every rank calls it alike."""
        with self._atomic():  # every placeholder and the step's gradients, or nothing
            if self._grads_out:
                self._end_placeholders()
            if self._micro_batches or self._backward_open or \
                    any(g.acquired for g in self._groups):
                self._abort_step()

    def _check_model(self):
        current = {name: p for name, p in self._model.named_parameters()}
        for name, p in current.items():
            if id(p) not in self._group_of:
                raise memwall.Error(
                    "FAILED_PRECONDITION: the model changed after wrapping: parameter '%s' is "
                    "new; build the ZeroOptimizer after the model is final" % name)
        for name, p in self._named():
            if current.get(name) is not p:
                raise memwall.Error(
                    "FAILED_PRECONDITION: the model changed after wrapping: parameter '%s' was "
                    "removed or replaced" % name)
            if p.requires_grad != (id(p) in self._placeholders):
                raise memwall.Error(
                    "FAILED_PRECONDITION: the model changed after wrapping: parameter '%s' was "
                    "%s after the ZeroOptimizer was built, which took it as %s; set "
                    "requires_grad before building it" % (
                        name, "unfrozen" if p.requires_grad else "frozen",
                        "frozen (no optimizer state)" if p.requires_grad else
                        "trainable (its update would go on: weight decay, moments)"))
            if self._stage != 3 and p.data.data_ptr() != self._homes[id(p)]:
                raise memwall.Error(
                    "FAILED_PRECONDITION: the model changed after wrapping: parameter '%s' no "
                    "longer lies in memwall's memory (was the model moved or cast?)" % name)

    @torch.no_grad()
    def step(self, closure=None):
        """One engine step (every rank calls it): reduces what backward left,
        sends each param_group's hyperparameters (also sent before backward's
        first gradient, for an overlapped update), updates. The step
        consumes the gradients, as if zero_grad() followed it: without a
        backward since the last step it changes nothing (torch's optimizers
        do the same after zero_grad(); without one they would apply the
        last gradients again). Returns the closure's loss, if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._take_back_gradients("step()")
        self._check_model()
        if self._check_backward_ended("step()"):
            raise memwall.Error(
                "FAILED_PRECONDITION: step(): the last backward did not finish (interrupted?); "
                "this step's gradients were dropped: run its micro-batches again")
        if self._micro_batches == 0:
            # No backward since the last step: as torch's optimizers skip
            # parameters without gradients, nothing changes (no weight
            # decay, no step counted).
            return loss
        # One change of both sides: an exception (or Ctrl-C, held until the
        # end) leaves the step undone and forgotten, never half done.
        with self._atomic():
            if self._micro_batches != self._accumulation:
                # Their gradients are dropped (_atomic): the next step
                # starts afresh.
                raise memwall.Error(
                    "FAILED_PRECONDITION: step(): %d backward passes since the last step; the "
                    "config's gradient_accumulation_steps is %d"
                    % (self._micro_batches, self._accumulation))
            self._micro_batches = 0
            self._sent_hyperparameters = False
            for g in self._groups:
                if g.acquired:
                    self._reduce(g)
                if self._stage == 3:
                    g.forward_uses = 0
                    self._release(g)
            self._adopt_edits(after_backward=True)
            self._send_hyperparameters()
            if self._profile is not None:
                self._engine.begin_phase("optimizer step")
            try:
                self.last_step = self._engine.step()
            finally:
                if self._profile is not None:
                    self._engine.end_phase()
        return loss

    def _record_versions(self):
        self._versions = {id(p): p._version for _, p in self._named()}

    def _adopt_edits(self, after_backward):
        """Stages 0-2: parameters written in place since the engine last
        set them (torch's version counter moved: p.mul_, p.copy_ under
        no_grad) become their master weights, as the weights the next
        update starts from are the model's in torch. Called at a step's
        first gradient and at step() (`after_backward`: an overlapped
        update may have started from the weights before). Every rank must
        make the same writes (the groups' master weights are gathered,
        collective). REQUIRES: inside _atomic."""
        if self._stage == 3:
            return
        changed = {g.index: e for g in self._groups for e in [self._edited(g)] if e}
        if not changed:
            return
        if after_backward and self._engine.overlaps_update:
            raise memwall.Error(
                "FAILED_PRECONDITION: step(): parameter '%s' was written in place after "
                "backward began; with offload_optimizer.overlap_step the update has started "
                "from the weights before the write: write between steps"
                % changed[min(changed)][0][0])
        self._set_master_weights(changed)
        self._record_versions()

    # -- state ----------------------------------------------------------------

    def _state_names(self):
        """The names of the engine's per-element states after the master
        weights, as torch's AdamW and SGD call them (SGD's momentum is
        torch's momentum_buffer)."""
        torch_name = {"momentum": "momentum_buffer"}
        return [torch_name.get(n, n) for n in self._engine.state_names[1:]]

    def _gather_state(self, index, which):
        """State `which` of memwall group `index` (collective), f32, padded."""
        return torch.frombuffer(bytearray(self._engine.gather_state(index, which)),
                                dtype=torch.float32)

    def _gather_states(self, g):
        """Every state of memwall group g (collective), f32, padded."""
        return [self._gather_state(g.index, which) for which in range(self._engine.num_states)]

    def _slices(self):
        """(torch state index, param, memwall group, offset, numel) of every
        trainable parameter in param_groups order."""
        out, index = [], 0
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    g = self._group_of[id(p)]
                    numel = torch.Size(self._shape[id(p)]).numel()
                    out.append((index, p, g, self._offsets[self._names[id(p)]], numel))
                index += 1
        return out

    def _copy_out(self, values, shape):
        """A copy of host `values` on the model's device, shaped."""
        return values.view(shape).to(self._device, copy=True)

    def state_dict(self):
        """torch.optim.AdamW's (or SGD's) state_dict format, gathered from
        every rank (collective): per trainable parameter "step",
        "exp_avg" and "exp_avg_sq" (or "momentum_buffer"), and
        "master_weight" (the f32 master weights, which the model's own
        parameters are only in f32 runs) with "master_weight_step", the
        step they are of (an int: a torch optimizer that loads the dict
        carries both along unchanged while its "step" counts on, which is
        how load_state_dict tells master weights it trained past); frozen
        ones have no state, as in torch."""
        with _collective("state_dict()"):
            gathered = {g.index: self._gather_states(g) for g in self._groups if g.trainable}
        step = torch.tensor(float(self._engine.progress()["steps_applied"]))
        state = {}
        for index, p, g, offset, numel in self._slices():
            states = gathered[g.index]
            shape = self._shape[id(p)]
            # On the parameter's device, as torch's optimizers keep them.
            entry = {"step": step.clone(),
                     "master_weight": self._copy_out(states[0][offset:offset + numel], shape),
                     "master_weight_step": int(step)}
            for which, key in enumerate(self._state_names(), start=1):
                entry[key] = self._copy_out(states[which][offset:offset + numel], shape)
            state[index] = entry
        param_groups, index = [], 0
        for group in self.param_groups:
            saved = {k: v for k, v in group.items() if k != "params"}
            saved["params"] = list(range(index, index + len(group["params"])))
            index += len(group["params"])
            param_groups.append(saved)
        return {"state": state, "param_groups": param_groups}

    def load_state_dict(self, state_dict):
        """Loads a state_dict of this class or of torch.optim.AdamW / SGD
        (collective: every rank passes the same one). The param_groups'
        hyperparameters are taken; each parameter's moments and step are
        set, and its master weights when the dict has them and they are of
        its step (torch's own optimizers keep none, and a dict of this class
        that a torch optimizer loaded and trained on holds master weights of
        an earlier step, "master_weight_step": the model's parameters are
        the weights then, so load the model that optimizer trained).
        Everything is checked before anything changes."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError("load_state_dict: %d param_groups, this optimizer has %d"
                             % (len(groups), len(self.param_groups)))
        for i, (saved, mine) in enumerate(zip(groups, self.param_groups)):
            if len(saved["params"]) != len(mine["params"]):
                raise ValueError("load_state_dict: param_groups[%d] has %d parameters, this "
                                 "optimizer's has %d" % (i, len(saved["params"]),
                                                          len(mine["params"])))
        ids = [i for saved in groups for i in saved["params"]]
        states = state_dict["state"]
        names = ["master_weight"] + self._state_names()
        slices = self._slices()
        for index, p, _, _, _ in slices:
            entry = states.get(ids[index], {})
            for key in names[1:]:
                if key not in entry:
                    raise ValueError("load_state_dict: parameter '%s' (state %d) has no '%s'"
                                     % (self._names[id(p)], ids[index], key))
            for key in names:
                if key in entry and tuple(entry[key].shape) != self._shape[id(p)]:
                    raise ValueError("load_state_dict: '%s' of parameter '%s' has shape %s, "
                                     "expected %s" % (key, self._names[id(p)],
                                                      tuple(entry[key].shape),
                                                      self._shape[id(p)]))
        for saved, mine in zip(groups, self.param_groups):
            mine.update({k: v for k, v in saved.items() if k != "params"})
        by_group = {}
        for item in slices:
            by_group.setdefault(item[2].index, []).append(item)
        with _collective("load_state_dict()"):
            self._load_states(by_group, states, ids, names)
        self._loads += 1

    def _load_states(self, by_group, states, ids, names):
        """load_state_dict's collective part: each group's states gathered,
        the dict's entries written in, set back; the step count."""
        steps = None
        for g in self._groups:
            if g.index not in by_group:
                continue
            current = self._gather_states(g)
            for index, p, _, offset, numel in by_group[g.index]:
                entry = states[ids[index]]
                trained_past = ("step" in entry and "master_weight_step" in entry
                                and float(entry["step"]) != float(entry["master_weight_step"]))
                for which, key in enumerate(names):
                    if key == "master_weight" and trained_past:
                        continue
                    if key in entry:
                        current[which][offset:offset + numel] = \
                            entry[key].detach().reshape(-1).to(torch.float32)
                if "step" in entry:
                    steps = int(float(entry["step"]))
            for which, values in enumerate(current):
                self._engine.set_state(g.index, which, values.data_ptr(), values.numel())
        if steps is not None:
            progress = self._engine.progress()
            progress["steps_applied"] = steps
            self._engine.set_progress(progress)

    def save_checkpoint(self, directory, keep=2):
        """A memwall training checkpoint (engine/checkpoint.h: the format of
        `memwall train --save`, loadable at any world size and stage, read
        by `memwall export`) under `directory`; collective. Returns its
        path. The param_groups' hyperparameters are not in it: a schedule
        sets them again. As `memwall train --save` does, the first save
        into a directory locks it against other runs and refuses one that
        holds another run's checkpoints (unless this optimizer loaded from
        it), so pruning to the newest `keep` never deletes them."""
        with _collective("save_checkpoint()"):
            return self._engine.save_checkpoint(str(directory), keep)

    def load_checkpoint(self, path):
        """Loads the newest intact checkpoint under `path` (or that
        checkpoint); collective. Returns {"path", "steps", "skipped"}."""
        with _collective("load_checkpoint()"):
            loaded = self._engine.load_checkpoint(str(path))
        self._loads += 1
        return loaded

    def _send_hyperparameters(self):
        """Each param_group's values to its engine hyperparameter group (a
        config scheduler then schedules the lr sent as the group's own)."""
        for i, group in enumerate(self.param_groups):
            beta1, beta2 = group["betas"]
            try:
                self._engine.set_hyperparameters(
                    i, float(group["lr"]), float(beta1), float(beta2), float(group["eps"]),
                    float(group["weight_decay"]), float(group.get("momentum", 0.0)))
            except memwall.InvalidArgumentError as error:
                # "INVALID_ARGUMENT: SetHyperparameters(i): <what>" in torch's terms
                # (other errors, a failed collective say, pass as they are).
                raise ValueError("param_groups[%d]: %s"
                                 % (i, str(error).split("): ", 1)[-1])) from None

    def master_weights(self, name):
        """The f32 master weights of parameter `name`, on the model's device
        (collective; memwall.NotFoundError for a name the model does not
        have)."""
        with _collective("master_weights()"):
            values = self._engine.master_weights(name)
        shape = next(self._shape[id(p)] for n, p in self._named() if n == name)
        return torch.tensor(values).view(shape).to(self._device)

    def memory(self):
        """The engine allocator's bytes by category ({"parameter":
        {"current", "peak"}, ...}, "pinned": the pinned pool's)."""
        return self._engine.memory()


def _example_call(example):
    """example_inputs as the (args, kwargs) of a forward call: one tensor,
    a dict of keyword arguments or a sequence of positional ones."""
    if isinstance(example, torch.Tensor):
        return (example,), {}
    if isinstance(example, dict):
        return (), example
    return tuple(example), {}


def _describe(model, args, kwargs, shapes=None, dtype=None, device=None):
    """memwall.trace.describe of a meta copy of `model` called with `args`
    and `kwargs`, at their batch size and the next, attention as torch's
    kernels on `device` save it (a GPU's: what torch picks there, "auto";
    else the CPU's), floating tensors in `dtype` (None: as they are);
    (description, batch)."""
    inputs, batch = _inputs_of(model, args, kwargs)
    shadow = _meta_shadow(model, shapes or {}, dtype)
    attention = "auto" if device is not None and device.type == "cuda" else "cpu"
    description = tracing.describe(shadow, lambda b: _meta_inputs(inputs, batch, b),
                                   attention=attention, batches=(batch, batch + 1))
    return description, batch


def _inputs_of(model, args, kwargs):
    """A forward's arguments as trace() takes them (a tuple, or a dict
    when any is given by keyword) and its batch size (the first tensor's
    first dimension)."""
    if kwargs:
        signature = inspect.signature(model.forward)
        inputs = dict(signature.bind(*args, **kwargs).arguments)
        var_keyword = next((n for n, p in signature.parameters.items()
                            if p.kind is p.VAR_KEYWORD), None)
        inputs.update(inputs.pop(var_keyword, None) or {})
    else:
        inputs = tuple(args)
    first = next((t for t in _tensors(inputs) if t.dim() >= 1), None)
    if first is None:
        raise ValueError("activation_checkpointing: the model's forward took no tensor with a "
                         "batch dimension; memwall plans recomputation at the batch size of "
                         "its inputs' first dimension")
    return inputs, first.shape[0]


def _meta_inputs(value, batch, b):
    """`value` with each tensor on meta, its first dimension `b` where it
    was the batch."""
    def leaf(item):
        if not isinstance(item, torch.Tensor):
            return item
        shape = tuple(item.shape)
        if shape and shape[0] == batch:
            shape = (b,) + shape[1:]
        return torch.empty(shape, dtype=item.dtype, device="meta")
    return _map(value, leaf)


def _meta_shadow(model, shapes, dtype=None):
    """A copy of `model` on torch's meta device (parameters at their
    shapes even where stage 3 released them; floating ones in `dtype` if
    given), with no hooks: what the recomputation plan traces."""
    def cast(t):
        return dtype if dtype is not None and t.is_floating_point() else t.dtype
    memo = {}
    for p in model.parameters():
        memo[id(p)] = torch.nn.Parameter(
            torch.empty(shapes.get(id(p), tuple(p.shape)), dtype=cast(p), device="meta"),
            requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = torch.empty(tuple(b.shape), dtype=cast(b), device="meta")
    shadow = copy.deepcopy(model, memo)
    for module in shadow.modules():
        for name, value in vars(module).items():
            if name.startswith("_") and "hooks" in name and isinstance(value, dict):
                value.clear()
    return shadow


def plan(model, *, inputs=None, seq=None, batch=1, gpus=1, device_memory="32GiB",
         host_memory="512GiB", nvme="0", config=None, auto=False, hardware="",
         attention="auto", lora_rank=0, lora_targets=("q_proj", "v_proj")):
    """Does a training step of `model` fit, and with which config? memwall
    plan for a PyTorch model: traced on torch's meta device (no memory, any
    size; memwall.trace.describe) and dry-run as rank 0 of `gpus` under
    `config` (dict, JSON text or path; its precision is the trace's dtype),
    or with auto=True the fastest configuration that fits (the auto
    strategy on `hardware`, empty: by device memory).

    model: a torch.nn.Module (on meta for large ones; `inputs(batch)` then
        gives its inputs, by default Hugging Face token ids and labels of
        `seq`), or a Hugging Face config (a config.json path, a directory
        with one, a dict, a PretrainedConfig), built on meta, or a
        description memwall.trace.describe / memwall.hf.describe made
        (planned as it is: seq, attention and lora_* do not apply).
    lora_rank > 0: LoRA fine-tuning (memwall.hf.lora) of `lora_targets`.
    Returns the report as a dict: "memwall.plan/1" (fits, the device peak
    by category, host and NVMe use, ...) or with auto "memwall.plan-auto/1"
    (candidates, chosen, config, plan)."""
    import memwall.hf as hf
    text = _config_text(config)
    if isinstance(model, dict) and model.get("format") == "memwall.traced/1":
        return json.loads(memwall._memwall.plan(
            json.dumps(model), text, gpus, str(device_memory), str(host_memory), str(nvme),
            batch, auto, hardware))
    values = memwall._memwall.config_values(text)
    dtype = values["param_dtype"]
    if not isinstance(model, torch.nn.Module):
        model = hf.build(model, dtype)
    elif lora_rank or {p.dtype for p in model.parameters()} != {_DTYPES[dtype]}:
        # Casting and adapters change a module in place: the caller's stays as it was.
        model = copy.deepcopy(model).to(_DTYPES[dtype])
    if lora_rank:
        hf.lora(model, lora_rank, tuple(lora_targets))
    was_training = model.training
    model.train()
    try:
        micro = batch or values["train_micro_batch_size_per_gpu"]
        description = tracing.describe(model, inputs or hf.inputs_for(model, seq),
                                       attention=attention, batches=(micro, micro + 1))
    finally:
        model.train(was_training)
    report = memwall._memwall.plan(json.dumps(description), text, gpus, str(device_memory),
                                   str(host_memory), str(nvme), batch, auto, hardware)
    return json.loads(report)
