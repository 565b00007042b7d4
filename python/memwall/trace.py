"""memwall.trace: what a torch model's training step holds, unit by unit,
measured by running it (issue 17's first part: the trace the planner will
read).

    model = transformers.LlamaForCausalLM(config)      # under torch.device("meta")
    t = memwall.trace.trace(model, {"input_ids": ids, "labels": ids})

runs one forward and backward of `model` on whatever device its tensors are
on: on torch's meta device that costs no memory and no arithmetic, so a 70B
model traces on a laptop; on the CPU it is a real step. It records, per
unit (the parts the engine gathers: each item of a ModuleList or
Sequential, e.g. a transformer block, and each other module holding
parameters of its own, e.g. the embeddings, the final norm, the head;
what runs outside any unit, such as the loss, is "<model>"):

- parameters: elements and bytes, trainable and frozen, each shared
  parameter counted once (for the unit meeting it first);
- saved: the bytes of the storages autograd saves for backward during the
  unit's forward, each storage once (the first unit to save it), parameters
  excluded -- the activations a training step keeps;
- output: bytes of the unit's output tensors;
- forward_flops: torch's flop counter over the unit's forward.

Attention kernels: torch's scaled_dot_product_attention picks a kernel by
device; on meta (and in this trace) it runs the math path, which saves the
attention matrix that GPU flash / memory-efficient kernels do not. Models
built with attn_implementation="eager" save it everywhere; planning for a
flash kernel is issue 17's open part.

Python numbers autograd keeps as 0-dim double tensors bypass saved-tensor
hooks and are not counted (8 bytes each).
"""
import torch

__all__ = ["Trace", "Unit", "trace"]


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


class Trace:
    """The units in forward order, and totals."""

    def __init__(self, units):
        self.units = units

    def unit(self, name):
        return next(u for u in self.units if u.name == name)

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


def _units_of(model):
    """{module: unit name} for every module, the innermost unit winning, in
    named_modules order."""
    blocks = block_ids(model)
    unit_of = {}

    def visit(module, name, current):
        if id(module) in blocks or (current is None and any(
                p is not None for p in module._parameters.values())):
            current = name
        unit_of[id(module)] = current
        for child_name, child in module.named_children():
            visit(child, "%s.%s" % (name, child_name) if name else child_name, current)

    visit(model, "", None)
    return unit_of


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


def trace(model, inputs, loss=None):
    """Traces one training step of `model` on `inputs` (a dict of keyword
    arguments, or a tuple of positional ones). `loss(output)` makes the
    scalar to differentiate; by default the output's `.loss` if it has one,
    else the sum of its first tensor. Returns a Trace."""
    unit_of = _units_of(model)
    units, order = {}, []

    def unit(name):
        name = name or "<model>"
        if name not in units:
            units[name] = Unit(name)
            order.append(name)
        return units[name]

    seen_parameters, parameter_storages = set(), set()
    for module in model.modules():
        for p in module._parameters.values():
            if p is None or id(p) in seen_parameters:
                continue
            seen_parameters.add(id(p))
            parameter_storages.add(p.untyped_storage()._cdata)
            u = unit(unit_of[id(module)])
            u.parameters += p.numel()
            u.parameter_bytes += p.numel() * p.element_size()
            if p.requires_grad:
                u.trainable += p.numel()

    stack = []  # unit names of the modules in forward, innermost last
    saved_storages = set()

    def pack(t):
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in parameter_storages and key not in saved_storages:
            saved_storages.add(key)
            unit(stack[-1] if stack else None).saved += storage.nbytes()
        return t

    handles = []
    for module in model.modules():
        name = unit_of[id(module)]
        handles.append(module.register_forward_pre_hook(
            lambda m, args, name=name: stack.append(name)))

        def post(m, args, out, name=name):
            stack.pop()
            # A unit's output: what its outermost module returns.
            if name is not None and (not stack or stack[-1] != name):
                unit(name).output += sum(t.untyped_storage().nbytes() for t in _tensors(out))
        handles.append(module.register_forward_hook(post, always_call=True))
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    try:
        with counter, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
    finally:
        for h in handles:
            h.remove()
    flops = counter.get_flop_counts()
    root = type(model).__name__
    for name in order:
        if name == "<model>":
            continue
        key = "%s.%s" % (root, name)
        units[name].forward_flops = int(sum(flops.get(key, {}).values()))
    if loss is not None:
        value = loss(out)
    elif getattr(out, "loss", None) is not None:
        value = out.loss
    else:
        value = _tensors(out)[0].sum()
    value.backward()
    return Trace([units[name] for name in order])
