"""memwall.torch.profile: the activation bytes memwall's profiler attributes
to each module equal an independent count of that module's saved tensors,
taken from the autograd graph itself (each node's _saved_* tensors, the
nodes found by walking back from a module's outputs to its inputs), and
the reports are memwall's.

Left out of both counts: Python numbers autograd keeps as 0-dim double
tensors (`0.5 * x` saves 0.5), which never pass through saved-tensor hooks;
8 bytes each."""
import json

import pytest
import torch
import transformers

import memwall.torch as mt


def storages_of(value):
    if not isinstance(value, torch.Tensor):
        return []
    if value.dim() == 0 and value.dtype == torch.float64:  # a wrapped Python number
        return []
    return [value]


class GraphCount:
    """Per module (innermost), the bytes of the distinct storages the
    autograd nodes created in its forward save, parameters excluded, each
    storage counted for the first module (in forward order) that saves it."""

    def __init__(self, model):
        self.inputs, self.nodes, self.order = {}, {}, []
        self.handles = []
        for name, module in model.named_modules():
            self.handles.append(module.register_forward_pre_hook(
                lambda m, args, kwargs, name=name: self._pre(name, args, kwargs),
                with_kwargs=True))
            self.handles.append(module.register_forward_hook(
                lambda m, args, out, name=name: self._post(name, out)))
        self.model = model

    @staticmethod
    def _tensors(value):
        if isinstance(value, torch.Tensor):
            return [value]
        if isinstance(value, (list, tuple)):
            return [t for v in value for t in GraphCount._tensors(v)]
        if isinstance(value, dict):
            return [t for v in value.values() for t in GraphCount._tensors(v)]
        if hasattr(value, "to_tuple"):  # transformers' ModelOutput
            return GraphCount._tensors(value.to_tuple())
        return []

    def _pre(self, name, args, kwargs):
        self.inputs[name] = {t.grad_fn for t in self._tensors((args, kwargs))
                             if t.grad_fn is not None}
        self.order.append(name)

    def _post(self, name, out):
        seen, stack = set(), [t.grad_fn for t in self._tensors(out) if t.grad_fn is not None]
        while stack:
            node = stack.pop()
            if node is None or node in seen or node in self.inputs[name]:
                continue
            seen.add(node)
            stack.extend(next_node for next_node, _ in node.next_functions)
        self.nodes[name] = seen

    def bytes_per_module(self):
        # Reading a saved tensor unpacks it (at stage 3 re-gathering its
        # parameters, which stay gathered until the step): collect them all
        # first, then tell parameters (where they lie now) from the rest.
        saved = []
        for name in self.order:
            inner = set(self.nodes[name])
            for other in self.order:  # minus the nodes of modules inside it
                if other != name and other.startswith(name + "." if name else ""):
                    inner -= self.nodes[other]
            # Nodes in the order they were created, so that a storage goes
            # to the first module that saved it.
            for node in sorted(inner, key=lambda n: n._sequence_nr() if hasattr(n, "_sequence_nr") else 0):
                for attr in dir(node):
                    if not attr.startswith("_saved_"):
                        continue
                    for t in storages_of(getattr(node, attr)):
                        saved.append((name or "<model>", t))
        parameters = {p.untyped_storage().data_ptr() for p in self.model.parameters()}
        counted, result = set(), {}
        for owner, t in saved:
            storage = t.untyped_storage()
            key = (storage.data_ptr(), storage.nbytes())
            if storage.data_ptr() in parameters or key in counted:
                continue
            counted.add(key)
            result[owner] = result.get(owner, 0) + storage.nbytes()
        return result


def profiled_activations(opt):
    return {owner: bytes_ for owner, category, bytes_ in opt.engine.owners()
            if category == "activation"}


@pytest.mark.parametrize("stage", [0, 3])
def test_an_mlps_activation_bytes_per_module_match_its_saved_tensors(stage, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                torch.nn.Linear(32, 8))
    opt = mt.ZeroOptimizer(model, None, {"zero_optimization": {"stage": stage}})
    x = torch.randn(4, 16)
    with mt.profile(opt, tmp_path) as prof:
        count = GraphCount(model)
        loss = model(x).square().mean()
        profiled = profiled_activations(opt)
        # Linear saves its input; GELU its input; LayerNorm its input, mean
        # and rstd; the last Linear its input (the LayerNorm's output).
        assert profiled == count.bytes_per_module()
        assert profiled == {"0": 4 * 16 * 4, "1": 4 * 32 * 4, "2": 4 * 32 * 4 + 2 * 4 * 4,
                            "3": 4 * 32 * 4}
        opt.backward(loss)
        assert profiled_activations(opt) == {}  # backward released every saved tensor
        opt.step()
    report = json.loads((tmp_path / "rank0" / "profile.json").read_text())
    forward = next(p for p in report["phases"] if p["name"] == "forward")
    assert forward["peak_by_category"]["activation"] == sum(profiled.values())
    assert prof.peak()["bytes"] == report["peak"]["bytes"]
    phases = {p["name"] for p in report["phases"]}
    assert {"forward", "forward 0", "forward 3", "backward", "optimizer step"} <= phases
    for name in ("profile.txt", "trace.json", "profile.html"):
        assert (tmp_path / "rank0" / name).stat().st_size > 0


@pytest.mark.parametrize("stage", [0, 3])
def test_a_gpt2s_activation_bytes_per_module_match_its_saved_tensors(stage, tmp_path):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2,
                                     n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    opt = mt.ZeroOptimizer(model, None, {"zero_optimization": {"stage": stage}})
    tokens = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    with mt.profile(opt, tmp_path):
        count = GraphCount(model)
        loss = model(tokens, labels=tokens).loss
        profiled = profiled_activations(opt)
        expected = count.bytes_per_module()
        assert profiled == expected
        assert any(owner.startswith("transformer.h.1.") for owner in profiled)
        opt.backward(loss)
        opt.step()
    report = json.loads((tmp_path / "rank0" / "profile.json").read_text())
    phases = {p["name"] for p in report["phases"]}
    assert {"forward transformer.h.0", "forward transformer.h.1"} <= phases
