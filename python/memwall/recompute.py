"""memwall.recompute: a recomputation plan executed on a torch model.

The planners (checkpointing/planner.h) cut a traced model's chain of
stages (memwall.trace) into segments, each kept or recomputed. A
recomputed segment is a run of consecutive blocks (items of a ModuleList
or Sequential the model calls one after another, the output of one the
input of the next); during its forward memwall keeps only what it needs to
run the segment again: the tensors its first block took (the hidden state,
the attention mask, the rotary tables...), the random-number and autocast
state, and each later block's other arguments. Everything autograd saves
inside the segment is left as a placeholder. The first placeholder that
backward asks for runs the segment's blocks again (one extra forward),
keeping what they save, and each placeholder then hands out its tensor
once. What the segment holds -- its input, and its recomputed tensors --
goes through the saved-tensor hooks that were active when the segment
started (memwall.torch's stage-3 parameter references, a memory profile,
any caller's), so recomputation composes with them. A recomputed tensor
must match what the first forward saved (its shape and dtype, in the same
order), or backward stops with an error naming the segment.

Unlike one torch.utils.checkpoint around each block, a segment of k blocks
keeps one input instead of k: the shape the planners price (a segment's
checkpoint is its input; checkpointing/plan.h).

The segment's blocks run again with their buffers as they were: a buffer
the replay writes (BatchNorm's running statistics) is put back, so a
segment's statistics move once per step, as without recomputation.
"""
import contextlib
import weakref

import torch

from memwall.trace import _map, _tensors

__all__ = ["Recomputation", "replaying", "segments_of"]

# The segments whose blocks are running again (innermost last): a profile's
# module hooks see a replay's forward inside backward.
_REPLAYING = []


def replaying():
    """The label of the segment being recomputed ("blocks.0..blocks.3"),
    or None outside any replay: for module hooks that must tell a block's
    forward from its recomputation in backward."""
    return _REPLAYING[-1] if _REPLAYING else None


def segments_of(description, report):
    """The recomputed segments of a plan report (memwall.torch.plan, or the
    plan binding's "memwall.plan/1") over the stages of `description`
    (memwall.trace.describe of the same model): [[module name, ...], ...]
    in forward order. Offload segments are refused: memwall.torch keeps
    activations in device memory (its tensors are on the CPU)."""
    stages = description["stages"]
    segments = []
    for s in report["recompute_segments"]:
        if s["mode"] == "keep":
            continue
        if s["mode"] != "recompute":
            raise ValueError(
                "activation_checkpointing: the plan puts stages %s..%s in %s mode; "
                "memwall.torch executes keep and recompute segments only: set \"offload\": "
                "false" % (stages[s["begin"]]["name"], stages[s["end"] - 1]["name"], s["mode"]))
        names = [stages[i]["name"] for i in range(s["begin"], s["end"])]
        for i in range(s["begin"], s["end"]):
            if not stages[i].get("recomputable", True):
                raise ValueError("activation_checkpointing: the plan recomputes stage '%s', "
                                 "which memwall.trace marked not recomputable" % stages[i]["name"])
        segments.append(names)
    return segments


class _Slot:
    """What autograd holds for a tensor saved inside a recomputed segment.
    Autograd drops it once the node that saved it has run: its recomputed
    tensor goes then too, even if that node never unpacked it (a tensor
    saved for an input that needs no gradient)."""
    __slots__ = ("run", "index")

    def __init__(self, run, index):
        self.run = run
        self.index = index

    def __del__(self):
        self.run.values.pop(self.index, None)


class _Run:
    """One forward of one segment, and what running it again needs."""

    def __init__(self, segment, outer):
        self.segment = segment  # _Segment
        self.outer = outer      # (pack, unpack) active when it started, or None
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng = {}      # device index -> state
        self.autocast = [(kind, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind))
                         for kind in ("cpu", "cuda")
                         if kind == "cpu" or torch.cuda.is_available()]
        self.inputs = []        # the first block's tensors, packed by `outer`
        self.input_ids = {}     # during forward: id(tensor) -> its index in inputs
        self.held = []          # during forward: those tensors (their ids stay theirs)
        self.calls = []         # (module, args template, kwargs template) per block
        self.previous = []      # during forward: weakrefs to the last block's output tensors
        self.saved = []         # (shape, dtype) of each tensor saved, in order
        self.values = {}        # index -> recomputed tensor, packed by `outer`
        self.recorded = 0       # tensors the replay in progress has saved

    def pack(self, tensor):
        return self.outer[0](tensor) if self.outer is not None else tensor

    def unpack(self, packed):
        return self.outer[1](packed) if self.outer is not None else packed


class _Segment:
    def __init__(self, names, modules):
        self.names = names
        self.modules = modules
        self.label = names[0] if len(names) == 1 else "%s..%s" % (names[0], names[-1])


class Recomputation:
    """Recomputes `segments` ([[module name, ...], ...], each a run of
    consecutive blocks of `model`, as segments_of gives them) in every
    training forward of `model` (grad enabled) until remove()."""

    def __init__(self, model, segments):
        modules = dict(model.named_modules())
        self._segments = []
        self._hooks = []
        self._open = None      # the _Run whose forward is in progress
        self._hooks_pushed = None
        for names in segments:
            missing = [n for n in names if n not in modules]
            if missing or not names:
                raise ValueError("recomputation segment %r: %s is not a module of the model"
                                 % (names, missing[0] if missing else "an empty segment"))
            segment = _Segment(list(names), [modules[n] for n in names])
            self._segments.append(segment)
            for k, module in enumerate(segment.modules):
                self._hooks.append(module.register_forward_pre_hook(
                    lambda m, args, kwargs, s=segment, k=k: self._enter(s, k, args, kwargs),
                    with_kwargs=True))
                self._hooks.append(module.register_forward_hook(
                    lambda m, args, out, s=segment, k=k: self._leave(s, k, out),
                    always_call=True))
        # A forward that raises inside a segment leaves it: its hooks pop.
        self._hooks.append(model.register_forward_hook(
            lambda m, args, out: self._close(), always_call=True))

    @property
    def segments(self):
        return [list(s.names) for s in self._segments]

    def remove(self):
        self._close()
        for h in self._hooks:
            h.remove()
        self._hooks = []

    # -- forward -----------------------------------------------------------

    def _enter(self, segment, k, args, kwargs):
        if _REPLAYING:
            return None
        run = self._open
        if k == 0:
            self._close()
            if not torch.is_grad_enabled():
                return None
            outer = torch._C._autograd._top_saved_tensors_default_hooks(False)
            run = _Run(segment, outer)
            for t in _tensors((args, kwargs)):
                if t.is_cuda and t.device.index not in run.cuda_rng:
                    run.cuda_rng[t.device.index] = torch.cuda.get_rng_state(t.device)
            template = self._template((args, kwargs), run, first=True)
            run.calls.append((segment.modules[0],) + template)
            self._open = run
            hooks = torch.autograd.graph.saved_tensors_hooks(
                lambda t, run=run: self._place(run, t), self._fetch)
            hooks.__enter__()
            self._hooks_pushed = hooks
            return None
        if run is None or run.segment is not segment:
            return None  # no grad when the segment began, or called on its own
        try:
            template = self._template((args, kwargs), run, first=False, where=segment.names[k])
        except BaseException:
            self._close()  # the segment ends here, its hooks popped
            raise
        run.calls.append((segment.modules[k],) + template)
        return None

    def _leave(self, segment, k, out):
        run = self._open
        if _REPLAYING or run is None or run.segment is not segment:
            return
        # The block's output, weakly (holding it would keep what
        # recomputation frees), for the next block's arguments.
        run.previous = [weakref.ref(t) for t in _tensors(out)]
        if k < len(segment.modules) - 1:
            return
        if len(run.calls) != len(segment.modules):
            self._close()
            raise RuntimeError(
                "memwall recomputation: segment %s ran %d of its %d blocks before its last; "
                "its blocks must run in order, each once" % (
                    segment.label, len(run.calls), len(segment.modules)))
        self._close()

    def _close(self):
        run, self._open = self._open, None
        if run is not None:
            run.input_ids, run.held, run.previous = {}, [], []
        hooks, self._hooks_pushed = self._hooks_pushed, None
        if hooks is not None:
            hooks.__exit__(None, None, None)

    def _template(self, value, run, first, where=None):
        """`value` with each tensor replaced by where the replay finds it:
        ("input", i) for the first block's i-th tensor, ("output", j) for
        the previous block's j-th output tensor."""
        def leaf(item):
            if hasattr(item, "get_seq_length") and hasattr(item, "update"):
                raise RuntimeError(
                    "memwall recomputation: segment %s takes a key/value cache (%s), which "
                    "grows when its blocks run again; train with use_cache=False "
                    "(model.config.use_cache = False), as transformers' gradient checkpointing "
                    "does" % (run.segment.label, type(item).__name__))
            if not isinstance(item, torch.Tensor):
                return item
            if first:
                index = run.input_ids.get(id(item))
                if index is None:
                    index = len(run.inputs)
                    run.input_ids[id(item)] = index
                    run.held.append(item)
                    run.inputs.append(run.pack(item))
                return _Marker("input", index)
            for j, ref in enumerate(run.previous):
                if ref() is item:
                    return _Marker("output", j)
            index = run.input_ids.get(id(item))
            if index is not None:
                return _Marker("input", index)
            raise RuntimeError(
                "memwall recomputation: block '%s' of segment %s takes a tensor of shape %s "
                "that neither the previous block returned nor the segment's first block took "
                "(made between the blocks?): the segment cannot run again; plan with this "
                "model's blocks kept (activation_checkpointing planner \"none\")"
                % (where, run.segment.label, tuple(item.shape)))
        return _map(value, leaf)

    def _place(self, run, tensor):
        run.saved.append((tuple(tensor.shape), tensor.dtype))
        return _Slot(run, len(run.saved) - 1)

    # -- backward ----------------------------------------------------------

    def _fetch(self, slot):
        run = slot.run
        if slot.index not in run.values:
            self._replay(run)
        return run.unpack(run.values.pop(slot.index))

    def _replay(self, run):
        segment = run.segment
        # Kernels such as batch_norm write running statistics without
        # moving the buffer's version counter: every buffer is put back.
        buffers = [(b, b.detach().clone()) for m in segment.modules for b in m.buffers()]
        run.recorded = 0
        run.values = {}
        _REPLAYING.append(segment.label)
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(torch.random.fork_rng(devices=sorted(run.cuda_rng)))
                torch.set_rng_state(run.cpu_rng)
                for d, state in run.cuda_rng.items():
                    torch.cuda.set_rng_state(state, d)
                for kind, enabled, dtype in run.autocast:
                    stack.enter_context(torch.autocast(kind, dtype=dtype, enabled=enabled))
                stack.enter_context(torch.enable_grad())
                stack.enter_context(torch.autograd.graph.saved_tensors_hooks(
                    lambda t: self._record(run, t), lambda _: None))
                inputs = [run.unpack(p) for p in run.inputs]
                previous = []
                for module, args, kwargs in run.calls:
                    args, kwargs = _fill((args, kwargs), inputs, previous)
                    previous = _tensors(module(*args, **kwargs))
        finally:
            _REPLAYING.pop()
            with torch.no_grad():
                for b, value in buffers:
                    b.copy_(value)
        if run.recorded != len(run.saved):
            raise RuntimeError(
                "memwall recomputation: segment %s saved %d tensors when run again, %d in its "
                "forward: its blocks do not run the same way twice" % (
                    segment.label, run.recorded, len(run.saved)))

    def _record(self, run, tensor):
        index = run.recorded
        run.recorded += 1
        if index >= len(run.saved) or (tuple(tensor.shape), tensor.dtype) != run.saved[index]:
            expected = run.saved[index] if index < len(run.saved) else "nothing"
            raise RuntimeError(
                "memwall recomputation: segment %s, run again, saved a %s tensor of shape %s "
                "as its tensor %d; its forward saved %s: its blocks do not run the same way twice"
                % (run.segment.label, tensor.dtype, tuple(tensor.shape), index, expected))
        run.values[index] = run.pack(tensor.detach())
        return None


class _Marker:
    __slots__ = ("kind", "index")

    def __init__(self, kind, index):
        self.kind = kind
        self.index = index


def _fill(value, inputs, previous):
    """A template (Recomputation._template) with the replay's tensors in."""
    def leaf(item):
        if not isinstance(item, _Marker):
            return item
        return inputs[item.index] if item.kind == "input" else previous[item.index]
    return _map(value, leaf)
