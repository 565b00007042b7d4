"""memwall.trace: what a torch model's training step holds, measured by
running it, and the chain the planner takes from it (issue 17).

    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    t = memwall.trace.trace(model, {"input_ids": ids, "labels": ids})
    d = memwall.trace.describe(model, lambda b: {...inputs of b samples...})

trace() runs one forward and backward of `model` on whatever device its
tensors are on: on torch's meta device that costs no memory and no
arithmetic, so a 70B model traces on a laptop; on the CPU it is a real
step. It records, per unit (the parts the engine gathers: each item of a
ModuleList or Sequential, e.g. a transformer block, and each other module
holding parameters of its own, e.g. the embeddings, the final norm, the
head; what runs outside any unit, such as the loss, is "<model>"; the
innermost unit wins):

- parameters: elements and bytes, trainable and frozen, each shared
  parameter counted once (for the unit meeting it first);
- saved: the bytes of the storages autograd saves for backward during the
  unit's forward, each storage once (the first unit to save it), parameters
  excluded -- the activations a training step keeps;
- output: bytes of the unit's output tensors;
- forward_flops: torch's FLOP formulas (torch.utils.flop_counter, and one
  for the grouped matrix products of mixture-of-experts layers) over the
  operators the unit's forward runs.

and the step's chain: stages in forward order, one per outermost unit (a
block's nested units are part of it; what runs outside every unit joins the
stage before it, or the first stage), each with the bytes of saved storages
it creates (an operator's fresh output, watched by a dispatch mode) besides
its output (what it makes that the next stage takes; the last stage's
is the loss), its output, its input's gradient, whether autograd saves its
input, whether memwall.torch can recompute it (Stage.recomputable), its
FLOPs, its parameters, and its transient peaks: in forward above
what it keeps and hands on, in backward above its output's and input's
gradients (tensor lifetimes followed by weakref; parameter gradients are
dropped once accumulated, as memwall.torch does). Their kept bytes and
saved outputs sum to every saved byte of the step but the inputs' (token
ids the embedding saves: the engine holds the batch itself).

describe() traces at two micro-batch sizes and writes the description
memwall's C++ side reads (models/traced.h, "memwall.traced/1"): figures
as [fixed, per sample].

Attention kernels: torch's scaled_dot_product_attention picks a kernel by
device; on meta it runs the math path, which saves the attention matrix
that a GPU's flash and memory-efficient kernels do not. `attention`
chooses what the trace accounts: "math" (what runs), "flash" or
"efficient" (the GPU kernels: what torch's own flash / efficient operators
save -- query, key, value, output, the log-sum-exp and their random-number
state; a test checks against the operators on meta), or "auto" (what
torch picks on a GPU: flash for 16-bit inputs without an explicit mask,
else efficient), or "cpu" (what torch runs on a CPU, asked of torch for each
call: its CPU flash kernel, which saves query, key, value, output, the f32
log-sum-exp [batch, heads, L] and an explicit mask, traced as "cpu-flash";
math with dropout). Models built with attn_implementation="eager" compute
attention themselves; the trace then says "none".

Python numbers autograd keeps as 0-dim double tensors bypass saved-tensor
hooks and are not counted (8 bytes each).
"""
import sys
import weakref

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from memwall import _groups

__all__ = ["ATTENTION_KERNELS", "SavedMeter", "Stage", "Trace", "Unit", "block_ids", "describe",
           "trace", "watch_modules"]

ATTENTION_KERNELS = ("auto", "flash", "efficient", "math", "cpu")
_DTYPE_NAMES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


class Unit:
    """One unit's figures (see the module docstring)."""

    def __init__(self, name):
        self.name = name
        self.parameters = 0          # elements
        self.parameter_bytes = 0
        self.trainable = 0           # elements
        self.saved = 0               # bytes
        self.output = 0              # bytes
        self.forward_flops = 0

    def __repr__(self):
        return ("Unit(%r, parameters=%d, trainable=%d, saved=%d, output=%d, flops=%d)"
                % (self.name, self.parameters, self.trainable, self.saved, self.output,
                   self.forward_flops))


class Stage:
    """One stage of the chain (see the module docstring). parameters:
    [(full name, parameter, group label)] it owns; shared: full names of
    other stages' parameters it uses."""

    def __init__(self, unit, name):
        self.unit = unit             # the outermost unit's name; None before any
        self.name = name
        self.parameters = []
        self.shared = []
        self.kept = 0                # bytes
        self.output = 0              # bytes
        self.output_grad = 0         # bytes of its floating outputs that need a gradient
        self.input_grad = 0          # bytes
        self.reads_input = True
        # Whether memwall.torch can run it again in backward: a block (an
        # item of a ModuleList or Sequential) run once, and no operator
        # outside every unit while it is the current stage (the mask-making
        # before the first block, the loss after the head, a residual the
        # model adds between blocks), so its module's forward alone makes
        # all it keeps and the next stage reads its output as returned.
        self.recomputable = False
        self.forward_flops = 0
        self.forward_peak = 0        # bytes live above the stage's start, at most
        self.workspace = 0           # bytes: forward_peak less kept and output
        self.backward_peak = 0       # bytes live above its backward's start, at most
        self.backward_workspace = 0  # bytes: backward_peak less the input gradient
        self._outputs = []           # (storage tag, bytes, gradient bytes) it hands on
        self._arguments = {}         # storage tag -> bytes: what its unit's forward took
        self._glue = False           # an operator ran outside every unit while current
        self._start = 0

    def __repr__(self):
        return ("Stage(%r, kept=%d, output=%d, workspace=%d, input_grad=%d, reads_input=%s, "
                "recomputable=%s, flops=%d)"
                % (self.name, self.kept, self.output, self.workspace, self.input_grad,
                   self.reads_input, self.recomputable, self.forward_flops))


class Trace:
    """The units and the stages in forward order, and totals.
    inputs_saved: bytes of saved storages the step did not create (its
    inputs); attention: the kernel accounted, or "none" if the model never
    called scaled_dot_product_attention; recompute_inputs: see __init__."""

    def __init__(self, units, stages, inputs_saved, attention, recompute_inputs):
        self.units = units
        self.stages = stages
        self.inputs_saved = inputs_saved
        self.attention = attention
        # Bytes of the tensors recomputable stages take, besides what
        # stages hand on, that autograd does not save: what recomputing
        # them holds (the attention mask, position ids); each storage once.
        self.recompute_inputs = recompute_inputs

    def unit(self, name):
        return next(u for u in self.units if u.name == name)

    def stage(self, name):
        return next(s for s in self.stages if s.name == name)

    @property
    def parameters(self):
        return sum(u.parameters for u in self.units)

    @property
    def trainable(self):
        return sum(u.trainable for u in self.units)

    @property
    def saved(self):
        return sum(u.saved for u in self.units)


def block_ids(model):
    """ids of the modules that are items of a ModuleList or Sequential: a
    model's repeated blocks (traced as units, profiled as phases)."""
    blocks = set()
    for module in model.modules():
        if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            blocks.update(id(child) for child in module.children())
    return blocks


def watch_modules(model, enter, leave):
    """Forward hooks on every module of `model` for a profile's module
    stack and phases: enter(name, block, args, kwargs) before a module's
    forward, leave(block) after it (also when it raises); `block` says the
    module is one of block_ids'. Returns the hooks' handles."""
    blocks = block_ids(model)
    handles = []
    for name, module in model.named_modules():
        block = id(module) in blocks
        handles.append(module.register_forward_pre_hook(
            lambda m, args, kwargs, name=name, block=block: enter(name, block, args, kwargs),
            with_kwargs=True))
        handles.append(module.register_forward_hook(
            lambda m, args, out, block=block: leave(block), always_call=True))
    return handles


def _structure(model):
    """{id(module): innermost unit name}, {id(module): outermost unit
    name}, {id(module): its name}; None outside every unit."""
    blocks = block_ids(model)
    inner, outer, names = {}, {}, {}

    def visit(module, name, current, outermost):
        if id(module) in blocks or (current is None and any(
                p is not None for p in module._parameters.values())):
            current = name
            if outermost is None:
                outermost = name
        inner[id(module)] = current
        outer[id(module)] = outermost
        names[id(module)] = name
        for child_name, child in module.named_children():
            visit(child, "%s.%s" % (name, child_name) if name else child_name, current, outermost)

    visit(model, "", None, None)
    return inner, outer, names


def _tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if hasattr(value, "to_tuple"):  # transformers' ModelOutput
        return _tensors(value.to_tuple())
    return []


def _map(value, leaf):
    """`value` with every item that is not a tuple, list or dict (tensors
    and the rest) replaced by leaf(item), the containers rebuilt."""
    if isinstance(value, tuple):
        items = [_map(v, leaf) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, list):
        return [_map(v, leaf) for v in value]
    if isinstance(value, dict):
        return {k: _map(v, leaf) for k, v in value.items()}
    return leaf(value)


def _key(t):
    return t.untyped_storage()._cdata


class SavedMeter:
    """The bytes autograd holds for backward, as saved-tensor hooks see
    them: each saved storage once while any saved reference to it lives,
    storages in `skip` (keys of tensors: parameters, buffers, the batch)
    left out. `bytes` now, `peak` the most so far.

        meter = SavedMeter(skip={t.untyped_storage()._cdata for t in model.parameters()})
        with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
            loss = model(x).sum()
        meter.bytes   # held for backward once forward ended

    Hooks pushed inside these (torch.utils.checkpoint's recomputation)
    hide what they save from it."""

    def __init__(self, skip=()):
        self.skip, self.live, self.bytes, self.peak = set(skip), {}, 0, 0

    def pack(self, t):
        key = _key(t)
        if key in self.skip:
            return t
        entry = self.live.setdefault(key, [0, t.untyped_storage().nbytes()])
        if entry[0] == 0:
            self.bytes += entry[1]
            self.peak = max(self.peak, self.bytes)
        entry[0] += 1
        return _Held(self, key, t)

    @staticmethod
    def unpack(held):
        return held.tensor if isinstance(held, _Held) else held


class _Held:
    """A saved reference SavedMeter counts, until autograd drops it."""

    def __init__(self, meter, key, tensor):
        self.meter, self.key, self.tensor = meter, key, tensor

    def __del__(self):
        entry = self.meter.live[self.key]
        entry[0] -= 1
        if entry[0] == 0:  # a storage made later may take its address (its key)
            self.meter.bytes -= entry[1]
            del self.meter.live[self.key]


class _Watch(TorchDispatchMode):
    """Sees every operator the forward runs: on_op(func, args, kwargs, out)."""

    def __init__(self, on_op):
        super().__init__()
        self.on_op = on_op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.on_op(func, args, kwargs, out)
        return out


def _flops(func, args, kwargs, out):
    """An operator's FLOPs: torch's formulas (torch.utils.flop_counter), and
    the grouped matrix product mixture-of-experts layers run (Mixtral's
    experts in transformers), which they lack: 2 x output elements x the
    shared dimension."""
    # Imported here, not with the module: torch.utils.flop_counter imports
    # triton (some 70 MiB of every rank's memory), which only a trace needs.
    from torch.utils.flop_counter import flop_registry
    packet = func._overloadpacket
    if packet in flop_registry:
        return flop_registry[packet](*args, **kwargs, out_val=out)
    if packet is torch.ops.aten._grouped_mm:
        return 2 * out.numel() * args[0].shape[-1]
    return 0


def _fresh_outputs(func, out):
    """The tensors `func` returned in memory of their own (not views or
    in-place results of its inputs)."""
    returns = func._schema.returns
    values = list(out) if isinstance(out, (list, tuple)) and len(returns) > 1 else [out]
    fresh = []
    for r, v in zip(returns, values):
        if r.alias_info is not None:
            continue
        fresh.extend(t for t in _tensors(v))
    return fresh


# Non-zero while the trace must count an operator's FLOPs but not its
# memory (see _Attention).
_MUTED = [0]


class _Attention(torch.autograd.Function):
    """scaled_dot_product_attention saving what a GPU kernel saves: query,
    key, value (as given: a kernel with grouped-query support keeps the
    key/value heads unexpanded), output, the f32 log-sum-exp (flash:
    [batch, heads, L]; efficient: L rounded up to 32) and the kernel's
    random-number state (flash: a 2-element and a 0-dim uint64; efficient:
    two 0-dim int64), plus an explicit mask (efficient). Its output is
    computed by torch's own SDPA; its backward recomputes it with autograd,
    so gradients are exact on a real device."""

    @staticmethod
    def forward(ctx, kernel, sdpa, q, k, v, attn_mask, dropout_p, is_causal, scale, gqa):
        kwargs = {"scale": scale}
        if gqa:
            kwargs["enable_gqa"] = True
        # The values come from torch's own SDPA (math on meta and CPU),
        # whose FLOPs count but whose transients (the attention matrix) are
        # not the GPU kernel's: muted, then the kernel's one output.
        _MUTED[0] += 1
        try:
            computed = sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                            is_causal=is_causal, **kwargs)
        finally:
            _MUTED[0] -= 1
        if computed.dim() == 4:
            # The GPU kernels write their output as [batch, L, heads, D] and
            # return it transposed, so the transpose(1, 2).contiguous() that
            # follows attention in transformers copies nothing.
            b, h, length, d = computed.shape
            out = torch.empty((b, length, h, d), dtype=computed.dtype,
                              device=computed.device).transpose(1, 2)
            out.copy_(computed)
        else:
            out = computed.clone()
        del computed
        batch, heads, length = q.shape[0], q.shape[-3] if q.dim() > 3 else 1, q.shape[-2]
        if kernel == "cpu-flash":
            lse = torch.empty((batch, heads, length), dtype=torch.float32, device=q.device)
            rng = ()
        elif kernel == "flash":
            lse = torch.empty((batch, heads, length), dtype=torch.float32, device=q.device)
            rng = (torch.empty(2, dtype=torch.uint64, device=q.device),
                   torch.empty((), dtype=torch.uint64, device=q.device))
        else:
            lse = torch.empty((batch, heads, (length + 31) // 32 * 32), dtype=torch.float32,
                              device=q.device)
            rng = (torch.empty((), dtype=torch.int64, device=q.device),
                   torch.empty((), dtype=torch.int64, device=q.device))
        extra = (attn_mask,) if attn_mask is not None and kernel != "flash" else ()
        ctx.save_for_backward(q, k, v, out, lse, *rng, *extra)
        ctx.args = (sdpa, attn_mask, dropout_p, is_causal, kwargs)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v = ctx.saved_tensors[:3]
        sdpa, attn_mask, dropout_p, is_causal, kwargs = ctx.args
        # As in forward: the math path's transients are muted; what the
        # kernel's backward allocates is the gradients of q, k and v.
        _MUTED[0] += 1
        try:
            with torch.enable_grad():
                inputs = [t.detach().requires_grad_(t.requires_grad) for t in (q, k, v)]
                out = sdpa(*inputs, attn_mask=attn_mask, dropout_p=dropout_p,
                           is_causal=is_causal, **kwargs)
                wanted = [t for t in inputs if t.requires_grad]
                computed = torch.autograd.grad(out, wanted, grad)
        finally:
            _MUTED[0] -= 1
        grads = iter([g.clone() for g in computed])
        del computed
        return (None, None) + tuple(next(grads) if t.requires_grad else None
                                    for t in inputs) + (None,) * 5


def _sdpa_arguments(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                    scale=None, enable_gqa=False):
    """scaled_dot_product_attention's arguments, by name, however given."""
    return query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa


def _cpu_kernel(q, attn_mask, dropout_p, is_causal):
    """What torch's CPU scaled_dot_product_attention runs for a call
    like this one ("cpu-flash" or "math"), asked of torch on one-element
    CPU tensors of the same dtype, head size and masking."""
    probe = torch.zeros((1, 1, 1, q.shape[-1]), dtype=q.dtype, requires_grad=q.requires_grad)
    mask = (None if attn_mask is None else
            torch.zeros((1, 1, 1, 1), dtype=attn_mask.dtype))
    choice = torch._fused_sdp_choice(probe, probe, probe, mask, dropout_p, is_causal)
    flash = torch.nn.attention.SDPBackend.FLASH_ATTENTION.value
    return "cpu-flash" if choice == flash else "math"


class _KernelMode(TorchFunctionMode):
    """Routes scaled_dot_product_attention through _Attention for the
    chosen kernel while tracing, whatever name the model calls it by (a
    torch function mode, not a patch of torch); counts the calls."""

    def __init__(self, kernel):
        super().__init__()
        self.kernel = kernel
        self.used = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not torch.nn.functional.scaled_dot_product_attention:
            return func(*args, **kwargs)
        q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa = \
            _sdpa_arguments(*args, **kwargs)
        chosen = self.kernel
        if chosen == "auto":
            chosen = ("flash" if q.dtype in (torch.float16, torch.bfloat16) and
                      attn_mask is None else "efficient")
        elif chosen == "cpu":
            chosen = _cpu_kernel(q, attn_mask, dropout_p, is_causal)
        self.used.add(chosen)
        if chosen == "math":
            return func(*args, **kwargs)
        return _Attention.apply(chosen, func, q, k, v, attn_mask, dropout_p, is_causal, scale,
                                enable_gqa)


class _UnpackedPositions:
    """transformers (5.x) checks the position ids for packed sequences
    (several in one row) when a forward has no attention mask and no cache
    (use_cache=False, as training sets): it reads their values, which meta
    tensors have not. Positions the model made itself count 0, 1, 2, ... in
    every row, one sequence, which is what the check answers for them (no
    packing); the caller's own meta position ids are refused by name, since
    only their values could say."""

    def __init__(self, inputs):
        self.given = isinstance(inputs, dict) and inputs.get("position_ids") is not None
        self.module = sys.modules.get("transformers.masking_utils")

    def __enter__(self):
        module = self.module
        if module is None or not hasattr(module, "find_packed_sequence_indices"):
            return self
        self.original = original = module.find_packed_sequence_indices
        given = self.given

        def find_packed_sequence_indices(position_ids):
            if not position_ids.is_meta:
                return original(position_ids)
            if given:
                raise ValueError(
                    "position_ids: on meta with no attention mask and no cache, transformers "
                    "asks their values whether sequences are packed; pass an attention_mask, "
                    "or leave position_ids out (the model's own count 0, 1, 2, ...)")
            return None
        module.find_packed_sequence_indices = find_packed_sequence_indices
        return self

    def __exit__(self, *exc):
        if hasattr(self, "original"):
            self.module.find_packed_sequence_indices = self.original
        return False


def trace(model, inputs, loss=None, attention="math"):
    """Traces one training step of `model` on `inputs` (a dict of keyword
    arguments, or a tuple of positional ones). `loss(output)` makes the
    scalar to differentiate; by default the output's `.loss` if it has one,
    else the sum of its first tensor. `attention`: one of ATTENTION_KERNELS
    (see the module docstring). Returns a Trace."""
    if attention not in ATTENTION_KERNELS:
        raise ValueError("attention: expected one of %s, got %r"
                         % (", ".join(ATTENTION_KERNELS), attention))
    return _Tracer(model, attention).run(inputs, loss)


class _Tracer:
    """One traced training step: the forward under hooks on every module
    (units and stages), the operators watched (the storages they make and
    how long they live, FLOPs), autograd's saved tensors packed (what each
    unit keeps), then the backward (each stage's transient peak). A tracer
    runs once."""

    def __init__(self, model, attention):
        self.model = model
        self.attention = _KernelMode(attention)
        self.inner_of, self.outer_of, self.name_of = _structure(model)
        self.blocks = {self.name_of[i] for i in block_ids(model)}
        self.units, self.order = {}, []
        self.stages = [Stage(None, None)]  # what runs before the first unit joins it
        self.stages[0]._start = 0
        self.seen_units = {}
        self.unit_stack = []
        # Storages the step makes, by key and generation (a key is an
        # address, reused once a storage dies): the stage whose operator
        # made each, and how many tensors on it are alive
        # (weakref.finalize: torch keeps a tensor's Python object while
        # autograd holds the tensor).
        self.generation = {}
        self.created = {}     # key -> (stage, generation)
        self.alive = {}       # key -> [tensors, bytes]
        self.live = self.peak = 0
        self.saved_storages = set()  # (key, generation)
        self.saved_created = []      # (stage, (key, generation), bytes) of saved storages it made
        self.inputs_saved = 0
        self.recompute_inputs = 0
        self.phase = "forward"
        # Backward: the stage whose gradient arrived last, and what was
        # live then.
        self.backward_stage, self.backward_start = None, 0
        self._count_parameters()

    def run(self, inputs, loss):
        value = self._forward(inputs, loss)
        self._place_parameters()
        self._close_stages()
        self._backward(value)
        used = sorted(self.attention.used)
        return Trace([self.units[name] for name in self.order], self.stages, self.inputs_saved,
                     "+".join(used) if used else "none", self.recompute_inputs)

    def _unit(self, name):
        name = "<model>" if name is None or name == "" else name
        if name not in self.units:
            self.units[name] = Unit(name)
            self.order.append(name)
        return self.units[name]

    def _count_parameters(self):
        """Each parameter counted once, for the module named_parameters
        meets first (its owner); groups as memwall.torch.ZeroOptimizer
        forms them."""
        self.owner = _groups.owners(self.model)
        self.parameter_storages = set()
        for module in self.model.modules():
            for p in module._parameters.values():
                if p is None or self.owner[id(p)] != self.name_of[id(module)]:
                    continue
                self.parameter_storages.add(_key(p))
                u = self._unit(self.inner_of[id(module)])
                u.parameters += p.numel()
                u.parameter_bytes += p.numel() * p.element_size()
                if p.requires_grad:
                    u.trainable += p.numel()

    # -- the storages the step makes, and how long they live ------------

    def _release(self, key, gen):
        entry = self.alive.get(key)
        if entry is None or self.generation.get(key) != gen:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self.alive[key]

    def _on_op(self, func, args, kwargs, out):
        stage = self.stages[-1]
        if self.phase == "forward" and all(name is None for name in self.unit_stack):
            stage._glue = True
        for t in _fresh_outputs(func, out) if not _MUTED[0] else ():
            key = _key(t)
            self.generation[key] = self.generation.get(key, 0) + 1
            if self.phase == "forward":
                self.created[key] = (stage, self.generation[key])
            else:
                self.created.pop(key, None)
            self.alive[key] = [0, t.untyped_storage().nbytes()]
        for t in _tensors(out) if not _MUTED[0] else ():
            key = _key(t)
            entry = self.alive.get(key)
            if entry is None:
                continue
            if entry[0] == 0:
                self.live += entry[1]
            entry[0] += 1
            weakref.finalize(t, self._release, key, self.generation[key])
        self.peak = max(self.peak, self.live)
        flops = _flops(func, args, kwargs, out) if self.phase == "forward" else 0
        if flops:
            stage.forward_flops += flops
            for name in set(self.unit_stack):
                if name is not None:
                    self._unit(name).forward_flops += flops

    def _pack(self, t):
        key = _key(t)
        tag = (key, self.generation.get(key, 0))
        if key not in self.parameter_storages and tag not in self.saved_storages:
            self.saved_storages.add(tag)
            nbytes = t.untyped_storage().nbytes()
            self._unit(self.unit_stack[-1] if self.unit_stack else None).saved += nbytes
            if key in self.created and self.created[key][1] == tag[1]:
                self.saved_created.append((self.created[key][0], tag, nbytes))
            else:
                self.inputs_saved += nbytes
        return t

    # -- forward: units and stages --------------------------------------

    def _hand_on(self, stage, tensors):
        """Closes `stage`'s forward: what it hands on (tensors it made),
        and its transient peak above what was live when it started. The
        gradient reaching what it hands on starts its backward."""
        def made_here(t):
            key = _key(t)
            return key in self.created and self.created[key][0] is stage and \
                self.created[key][1] == self.generation[key]
        handed = [t for t in tensors if made_here(t)]
        stage._outputs = [((_key(t), self.generation[_key(t)]), t.untyped_storage().nbytes(),
                           t.numel() * t.element_size()
                           if t.is_floating_point() and t.requires_grad else 0)
                          for t in handed]
        for t in handed:
            if t.requires_grad:
                t.register_hook(lambda grad, stage=stage: self._reach(stage))
        stage.forward_peak = self.peak - stage._start
        self.peak = self.live

    def _enter(self, m, args, kwargs):
        inner, outer = self.inner_of[id(m)], self.outer_of[id(m)]
        self.unit_stack.append(inner)
        if outer is None or self.stages[-1].unit == outer:
            return
        count = self.seen_units.get(outer, 0) + 1
        self.seen_units[outer] = count
        name = (outer or "<model>") + ("" if count == 1 else "#%d" % count)
        previous = self.stages[-1]
        if previous.unit is None:
            previous.unit, previous.name = outer, name
            self._note_arguments(previous, args, kwargs)
            return
        self._hand_on(previous, _tensors((args, kwargs)))
        self.stages.append(Stage(outer, name))
        self.stages[-1]._start = self.live
        self._note_arguments(self.stages[-1], args, kwargs)

    def _note_arguments(self, stage, args, kwargs):
        """The storages the step made that the stage's unit takes."""
        for t in _tensors((args, kwargs)):
            key = _key(t)
            if key in self.created and self.created[key][1] == self.generation[key]:
                stage._arguments[(key, self.generation[key])] = t.untyped_storage().nbytes()

    def _leave(self, m, args, out):
        name = self.unit_stack.pop()
        # A unit's output: what its outermost module returns.
        if name is not None and (not self.unit_stack or self.unit_stack[-1] != name):
            self._unit(name).output += sum(t.untyped_storage().nbytes() for t in _tensors(out))

    def _forward(self, inputs, loss):
        """Runs the forward and the loss under the hooks; returns the
        scalar to differentiate."""
        model = self.model
        handles = []
        for module in model.modules():
            handles.append(module.register_forward_pre_hook(self._enter, with_kwargs=True))
            handles.append(module.register_forward_hook(self._leave, always_call=True))
        try:
            with self.attention, _UnpackedPositions(inputs), _Watch(self._on_op), \
                    torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
                out = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
                if loss is not None:
                    value = loss(out)
                elif getattr(out, "loss", None) is not None:
                    value = out.loss
                else:
                    value = _tensors(out)[0].sum()
        finally:
            for h in handles:
                h.remove()
        if self.stages[-1].unit is None and len(self.stages) == 1:
            self.stages[0].name = "<model>"
        self._hand_on(self.stages[-1], [value])
        return value

    def _place_parameters(self):
        """Parameters by stage: each owned one in the stage of its owner's
        outermost unit (units that never ran: the last stage), in module
        order, trainable before frozen as ZeroOptimizer groups them; a
        stage also lists the parameters it uses that another stage owns."""
        model, stages, outer_of = self.model, self.stages, self.outer_of
        module_of_name = {self.name_of[id(m)]: m for m in model.modules()}
        full_name = {id(p): full for full, p in model.named_parameters()}
        first_stage = {}
        for s in stages:
            first_stage.setdefault(s.unit, s)
        for module, label, members, _ in _groups.module_groups(model):
            stage = first_stage.get(outer_of[id(module)], stages[-1])
            stage.parameters.extend((full, p, label) for full, p in members)
        for module in model.modules():
            name = self.name_of[id(module)]
            stage = first_stage.get(outer_of[id(module)], stages[-1])
            for p in module._parameters.values():
                if p is None or self.owner[id(p)] == name:
                    continue
                owner = module_of_name[self.owner[id(p)]]
                home = first_stage.get(outer_of[id(owner)], stages[-1])
                if home is not stage and full_name[id(p)] not in stage.shared:
                    stage.shared.append(full_name[id(p)])
        for s in stages[1:]:
            if s.unit in first_stage and first_stage[s.unit] is not s:
                s.shared.extend(full for full, _, _ in first_stage[s.unit].parameters
                                if full not in s.shared)

    def _close_stages(self):
        """Each stage's output, what it keeps for backward and its
        workspace, from what the forward recorded."""
        stages, saved = self.stages, self.saved_storages
        output_keys = {}
        for s in stages:
            keys = {}
            for tag, nbytes, _ in s._outputs:
                keys.setdefault(tag, nbytes)
            # Held to the next stage's backward: what autograd saves of it
            # (the rest, a mask say, lives only while the forward uses it);
            # if it saves none, all of it, freed after the next stage's
            # forward.
            held = {k: n for k, n in keys.items() if k in saved}
            output_keys[id(s)] = held or keys
            s.output = sum((held or keys).values())
            s.output_grad = sum(grad for _, _, grad in s._outputs)
            s._outputs = []
        for stage, tag, nbytes in self.saved_created:
            if tag not in output_keys[id(stage)]:
                stage.kept += nbytes
        for s in stages:
            # The transient peak above what the stage keeps and hands on.
            s.workspace = max(0, s.forward_peak - s.kept - s.output)
        for s in stages:
            s.recomputable = (s.unit in self.blocks and self.seen_units.get(s.unit) == 1
                              and not s._glue)
        handed_on = set().union(*(output_keys[id(s)] for s in stages))
        arguments = {}
        for s in stages:
            if s.recomputable:
                arguments.update((tag, n) for tag, n in s._arguments.items()
                                 if tag not in saved and tag not in handed_on)
            s._arguments = {}
        self.recompute_inputs = sum(arguments.values())
        for previous, s in zip(stages, stages[1:]):
            s.reads_input = any(k in saved for k in output_keys[id(previous)]) or \
                not output_keys[id(previous)]
            s.input_grad = previous.output_grad

    # -- backward ---------------------------------------------------------
    # Stages in reverse; each one's transient peak above what was live when
    # its output's gradient arrived (parameter gradients included until
    # dropped: autograd makes them, the front end adds them into the
    # engine's buffers and frees them).

    def _close_backward(self):
        if self.backward_stage is not None:
            self.backward_stage.backward_peak = self.peak - self.backward_start

    def _reach(self, stage):
        current = self.backward_stage
        if current is not None and self.stages.index(stage) >= self.stages.index(current):
            return
        self._close_backward()
        self.backward_stage, self.backward_start = stage, self.live
        self.peak = self.live

    @staticmethod
    def _drop_grad(p):
        p.grad = None

    def _backward(self, value):
        grad_hooks = [p.register_post_accumulate_grad_hook(self._drop_grad)
                      for p in self.model.parameters() if p.requires_grad]
        self.phase = "backward"
        try:
            with _Watch(self._on_op):
                self._reach(self.stages[-1])
                value.backward()
                self._close_backward()
        finally:
            for h in grad_hooks:
                h.remove()
        for s in self.stages:
            s.backward_workspace = max(0, s.backward_peak - s.input_grad)


def _dtype_of(model):
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if len(dtypes) != 1 or next(iter(dtypes)) not in _DTYPE_NAMES:
        raise ValueError("describe: the model's parameters must share one dtype of f32, bf16 "
                         "or f16; got %s" % ", ".join(sorted(str(d) for d in dtypes)))
    return _DTYPE_NAMES[next(iter(dtypes))]


def describe(model, make_inputs, loss=None, attention="auto", batches=(1, 2)):
    """The description of `model`'s training step memwall's planner reads
    (models/traced.h), as a dict: traced at the two micro-batch sizes
    `batches` (make_inputs(b) gives the inputs of b samples, as trace()
    takes them), each figure [fixed, per sample]: exact at those two
    sizes, and at others as far as the model's memory is linear in the
    batch (a test checks a third size; Hugging Face's GPT-2 saves 4 KiB more
    per block at micro-batch 1 than the line through 2 and 3 says, so plan
    a micro-batch by tracing at it: memwall.torch.plan and memwall.hf do).
    The inputs' first tensor gives one sample's input shape."""
    b1, b2 = batches
    if not 0 < b1 < b2:
        raise ValueError("batches: expected two increasing sizes >= 1, got %r" % (batches,))
    traces = [trace(model, make_inputs(b), loss, attention) for b in batches]
    names = [[s.name for s in t.stages] for t in traces]
    if names[0] != names[1] or [s.reads_input for s in traces[0].stages] != \
            [s.reads_input for s in traces[1].stages]:
        raise ValueError("describe: the model's stages differ between micro-batches %d and %d "
                         "(%s against %s): its forward depends on the batch size"
                         % (b1, b2, names[0], names[1]))
    first = _tensors(make_inputs(1))[0]

    def figure(field, i):
        return _fit([getattr(t.stages[i], field) for t in traces], batches)

    stages = []
    for i, s in enumerate(traces[0].stages):
        prefix = s.unit + "." if s.unit else ""
        stages.append({
            "name": s.name,
            "parameters": [{"name": full[len(prefix):] if full.startswith(prefix) else full,
                            "shape": list(p.shape), "trainable": bool(p.requires_grad),
                            "group": label} for full, p, label in s.parameters],
            "shared": list(s.shared),
            "kept": figure("kept", i),
            "output": figure("output", i),
            "input_grad": figure("input_grad", i),
            "forward_flops": figure("forward_flops", i),
            "workspace": figure("workspace", i),
            "backward_workspace": figure("backward_workspace", i),
            "reads_input": s.reads_input,
            "recomputable": all(t.stages[i].recomputable for t in traces),
        })
    return {
        "format": "memwall.traced/1",
        "model": type(model).__name__,
        "dtype": _dtype_of(model),
        "attention": traces[0].attention,
        "input": list(first.shape[1:]),
        "parameters": traces[0].parameters,
        "trainable": traces[0].trainable,
        "inputs_saved": _fit([t.inputs_saved for t in traces], batches),
        "recompute_inputs": _fit([t.recompute_inputs for t in traces], batches),
        "stages": stages,
    }


def _fit(values, batches):
    """[fixed, per sample]: the line through values at the two batches."""
    (x1, x2), (b1, b2) = values, batches
    per = (x2 - x1) / (b2 - b1)
    return [x1 - per * b1, per]
