"""memwall.torch.profile of a training loop that keeps torch's own optimizer
(torch.optim.AdamW, SGD, any torch.optim.Optimizer): memwall's memory
reports of the steps run inside the `with` block, as `memwall profile`
writes them for memwall's engine. Tested on plain models in one process;
DTensor parameters (FSDP2) are not unwrapped.

    with memwall.torch.profile(opt, "memwall-profile", model=model) as p:
        for batch in data:              # the user's loop, unchanged
            loss = model(batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
    p.peak()                            # and <directory>/rank<r>/profile.*

Every tensor storage the run holds is counted once, from when it is first
seen to when torch frees it (a weak reference's callback), by category:

- parameter: the model's parameters; other: its buffers and the tensors
  handed to its forward that the run did not make (the batch);
- gradient: a parameter's .grad (from the moment autograd accumulates it);
- optimizer_state: the tensors in optimizer.state (once its step made them);
- activation: what autograd saves for backward (saved_tensors_hooks), by
  the innermost module whose forward saved it first;
- workspace: every other tensor an operator makes (a dispatch mode sees
  each one): the temporaries, by module (forward), "backward" or
  "optimizer step".

A storage is categorised when first seen and moves once, from workspace to
what it turns out to be (a forward's output autograd saves, a gradient
autograd accumulates, a state the optimizer keeps), so the books sum to
what the run holds at every moment. The optimizer's states are counted
as the optimizer stores them in optimizer.state, which the profile lends it
a watching dict for (its own comes back at the end). Phases: "forward", with
"forward <block>" for each block (the items of a ModuleList or
Sequential), "backward" (from the first gradient or saved tensor read after
a forward), "optimizer step".

Not counted: memory outside tensors (torch's allocator caches, CUDA's
context, the Python objects), and tensors made before the block that no
forward or optimizer touches inside it.
"""
import collections
import os
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

import memwall
from memwall import _groups
from memwall.recompute import replaying
from memwall.trace import _tensors, watch_modules


class _Held:
    """One storage in the books."""

    __slots__ = ("category", "owner", "bytes")

    def __init__(self, category, owner, nbytes):
        self.category, self.owner, self.bytes = category, owner, nbytes


class _Operators(TorchDispatchMode):
    """Sees every operator's outputs: a storage not yet in the books is a
    temporary of whatever runs now."""

    def __init__(self, profile):
        super().__init__()
        self._profile = profile

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._profile._seen(out)
        return out


class _StateEntry(dict):
    """One parameter's optimizer state, as the profile lends it to the
    optimizer: a tensor stored in it is counted as optimizer_state as it is
    stored (in the first step, before the update uses it)."""

    def __init__(self, profile, owner, values=()):
        super().__init__(values)
        self._profile, self._owner = profile, owner

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        for t in _tensors(value):
            self._profile._hold(t, "optimizer_state", self._owner)


class _State(collections.defaultdict):
    """optimizer.state while the profile is open (_StateEntry per
    parameter)."""

    def __init__(self, profile, state):
        super().__init__(dict)
        self._profile = profile
        for p, entry in state.items():
            super().__setitem__(p, _StateEntry(profile, profile._owner_of(p), entry))

    def __missing__(self, p):
        entry = self[p] = _StateEntry(self._profile, self._profile._owner_of(p))
        return entry


class LoopProfile:
    """The profile of a torch loop (see the module's comment); made by
    memwall.torch.profile(optimizer, directory, model=model)."""

    def __init__(self, model, optimizer, directory):
        if not isinstance(model, torch.nn.Module):
            raise TypeError("model: expected the torch.nn.Module the optimizer trains, got %s"
                            % type(model).__name__)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError("optimizer: expected a torch.optim.Optimizer, got %s"
                            % type(optimizer).__name__)
        self._model, self._opt = model, optimizer
        self.directory = str(directory)
        self.active = False
        self._books = WeakIdKeyDictionary()  # storage -> _Held
        self._refs = {}  # id(_Held) -> the weak reference whose callback releases it
        self._owner = _groups.owners(model)  # id(parameter) -> its module's name
        self._stack = []  # modules in forward, innermost last
        self._forward_depth = 0
        self._in_backward = False
        self._in_step = False
        self._hooks = []

    # -- the books -------------------------------------------------------------

    def _hold(self, tensor, category, owner):
        """Counts `tensor`'s storage as `category` of `owner`: new, or moved
        there from workspace."""
        if tensor.device.type == "meta":
            return
        storage = tensor.untyped_storage()
        nbytes = storage.nbytes()
        if nbytes == 0:
            return
        held = self._books.get(storage)
        if held is None:
            held = _Held(category, owner, nbytes)
            self._books[storage] = held
            self._refs[id(held)] = weakref.ref(storage, lambda _, h=held: self._release(h))
            self._profiler.record(category, owner, nbytes)
        elif held.category == "workspace" and category != "workspace":
            self._profiler.record(held.category, held.owner, -held.bytes)
            held.category, held.owner = category, owner
            self._profiler.record(category, owner, nbytes)

    def _release(self, held):
        self._refs.pop(id(held), None)
        if self.active:
            self._profiler.record(held.category, held.owner, -held.bytes)

    def _seen(self, out):
        if self._in_step:
            owner = "optimizer step"
        elif self._stack:
            owner = self._stack[-1]
        else:
            owner = "backward" if self._in_backward else "<outside forward>"
        for t in _tensors(out):
            self._hold(t, "workspace", owner)

    def _owner_of(self, p):
        return self._owner.get(id(p), "<optimizer>") or "<model>"

    def _hold_states(self):
        for p, state in self._opt.state.items():
            for value in state.values():
                for t in _tensors(value):
                    self._hold(t, "optimizer_state", self._owner_of(p))

    # -- phases and hooks ------------------------------------------------------

    def _end_backward(self):
        if self._in_backward:
            self._in_backward = False
            self._profiler.end_phase()

    def _begin_backward(self):
        if not self._in_backward and self._forward_depth == 0 and not self._in_step:
            self._in_backward = True
            self._profiler.begin_phase("backward")

    def _enter(self, name, block, args, kwargs):
        if replaying() is not None:  # a recomputed block, inside backward
            self._stack.append(name or "<model>")
            if block:
                self._profiler.begin_phase("recompute " + name)
            return
        if self._forward_depth == 0:
            self._end_backward()
            self._profiler.begin_phase("forward")
            for t in _tensors((args, kwargs)):
                self._hold(t, "other", "input")
        self._forward_depth += 1
        self._stack.append(name or "<model>")
        if block:
            self._profiler.begin_phase("forward " + name)

    def _leave(self, block):
        self._stack.pop()
        if block:
            self._profiler.end_phase()
        if replaying() is not None:
            return
        self._forward_depth -= 1
        if self._forward_depth == 0:
            self._profiler.end_phase()

    def _pack(self, tensor):
        owner = self._stack[-1] if self._stack else "<model>"
        self._hold(tensor, "activation", owner)
        return tensor

    def _unpack(self, tensor):
        self._begin_backward()
        return tensor

    def _gradient(self, p):
        self._begin_backward()
        if p.grad is not None:
            self._hold(p.grad, "gradient", self._owner.get(id(p), "<model>"))

    def _step_begins(self, optimizer, args, kwargs):
        self._end_backward()
        self._in_step = True
        self._profiler.begin_phase("optimizer step")

    def _step_ends(self, optimizer, args, kwargs):
        self._hold_states()
        self._in_step = False
        self._profiler.end_phase()

    def __enter__(self):
        # The reports' directory is made now: a path that cannot hold them
        # fails here, not after the training it was to profile.
        if os.path.exists(self.directory) and not os.path.isdir(self.directory):
            raise NotADirectoryError("profile directory %s: not a directory" % self.directory)
        self._where = os.path.join(self.directory, "rank%d" % memwall.rank())
        os.makedirs(self._where, exist_ok=True)
        for full, p in self._model.named_parameters():
            if type(p.data) is not torch.Tensor:
                raise TypeError("parameter '%s' is a %s (FSDP2's DTensor?): the loop profile "
                                "counts plain tensors' storages" % (full, type(p.data).__name__))
        devices = {p.device for p in self._model.parameters()} or {torch.device("cpu")}
        if len(devices) != 1:
            raise ValueError("model: parameters on %s; a profile covers one device"
                             % ", ".join(sorted(str(d) for d in devices)))
        device = devices.pop()
        if device.type == "cuda":
            capacity = torch.cuda.get_device_properties(device).total_memory
        else:
            capacity = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        self._profiler = memwall.Profiler(str(device), capacity)
        self.active = True
        for full, p in self._model.named_parameters():
            self._hold(p, "parameter", self._owner[id(p)] or "<model>")
            if p.grad is not None:
                self._hold(p.grad, "gradient", self._owner[id(p)] or "<model>")
        for full, b in self._model.named_buffers():
            self._hold(b, "other", full.rpartition(".")[0] or "<model>")
        self._hold_states()
        me = weakref.proxy(self)
        # The optimizer's states are counted as it stores them (a torch
        # optimizer makes them in its first step); its own dicts come back
        # at the end.
        self._opt.state = _State(me, self._opt.state)
        self._hooks = watch_modules(self._model, me._enter, me._leave)
        for p in self._model.parameters():
            if p.requires_grad:
                self._hooks.append(p.register_post_accumulate_grad_hook(me._gradient))
        self._hooks.append(self._opt.register_step_pre_hook(me._step_begins))
        self._hooks.append(self._opt.register_step_post_hook(me._step_ends))
        self._saved = torch.autograd.graph.saved_tensors_hooks(me._pack, me._unpack)
        self._saved.__enter__()
        self._mode = _Operators(me)
        self._mode.__enter__()
        return self

    def __exit__(self, kind, value, traceback):
        self._mode.__exit__(kind, value, traceback)
        self._saved.__exit__(kind, value, traceback)
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if isinstance(self._opt.state, _State):
            self._opt.state = collections.defaultdict(
                dict, {p: dict(entry) for p, entry in self._opt.state.items()})
        self._end_backward()
        self.active = False
        if kind is None:
            self._profiler.write_reports(self._where)
        return False

    def peak(self):
        """The profiler's peak: bytes, phase, phase_path, by_category,
        top_owners."""
        return self._profiler.peak()

    def current(self):
        """The bytes held now (at the block's end, when it has ended), by
        category."""
        return self._profiler.current()

    def owners(self):
        """Live bytes: [(owner, category, bytes)], largest first."""
        return self._profiler.owners()

    def report(self):
        """The terminal report (profile.txt's text)."""
        return self._profiler.terminal_report()
