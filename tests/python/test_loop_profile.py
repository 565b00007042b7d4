"""memwall.torch.profile of a loop that keeps torch's own optimizer
(memwall.loop_profile): its books against torch's own tools on the same
run, in one process. torch's MemTracker (torch.distributed._tools) sees the
same storages: its parameters, gradients, optimizer states and buffers
equal memwall's at the end, and its peak equals memwall's (less the batch,
which memwall counts and MemTracker does not), with the optimizer states and
the step's temporaries (both "Optstate" to MemTracker) split into
optimizer_state and workspace; torch.profiler's allocator events
("Total Allocated", counted from its start) peak where memwall's books,
less what existed before, do, to a few bytes (0-dim scalars torch makes
internally are not seen). The activations are the bytes autograd saves,
from the modules' own rules; the loop trains bit for bit as unprofiled."""
import copy
import json
import os

import pytest
import torch

import memwall
import memwall.torch as mt

BATCH, WIDTH, HIDDEN = 32, 64, 256


def mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, HIDDEN), torch.nn.GELU(),
                                torch.nn.BatchNorm1d(HIDDEN), torch.nn.Linear(HIDDEN, WIDTH))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train(model, opt, x, each_step=None):
    """3 steps; the last one's gradients are kept (no zero_grad after it)."""
    for i in range(3):
        model(x).pow(2).sum().backward()
        opt.step()
        if i < 2:
            opt.zero_grad()
        if each_step is not None:
            each_step()


def memtracker_books(x):
    from torch.distributed._tools.mem_tracker import MemTracker
    model, opt = mlp()
    tracker = MemTracker()
    tracker.track_external(model, opt)
    with tracker:
        train(model, opt, x, tracker.reset_mod_stats)

    def books(kind):
        snap = tracker.get_tracker_snapshot(kind)[torch.device("cpu")]
        return {str(k).rsplit(".", 1)[-1]: v for k, v in snap.items()}
    return books("current"), books("peak")


def profiler_peak(x, trace):
    """torch.profiler's CPU allocator: the most its "Total Allocated" reached
    (bytes allocated since it started), from its [memory] events."""
    model, opt = mlp()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        train(model, opt, x)
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    return max(e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]")


def test_a_torch_adamw_loop_against_memtracker_and_torch_profiler(tmp_path):
    x = torch.randn(BATCH, WIDTH)
    model, opt = mlp()
    with mt.profile(opt, tmp_path, model=model) as profile:
        train(model, opt, x)
    mine, peak = profile.current(), profile.peak()
    batch = BATCH * WIDTH * 4  # the input: memwall's "other" with the buffers
    current, most = memtracker_books(x)
    assert mine["parameter"] == current["PARAM"] == sum(4 * p.numel()
                                                        for p in model.parameters())
    assert mine["gradient"] == current["GRAD"]
    assert mine["optimizer_state"] == current["OPT"]
    assert mine["other"] - batch == current["BUFFER"]
    assert mine["workspace"] == mine["activation"] == 0
    assert peak["bytes"] - batch == most["Total"]
    at_peak = peak["by_category"]
    assert at_peak["optimizer_state"] + at_peak["workspace"] == most["OPT"]
    assert at_peak["optimizer_state"] == current["OPT"]
    assert peak["phase_path"] == ["optimizer step"]
    existing = sum(t.untyped_storage().nbytes()
                   for t in list(model.parameters()) + list(model.buffers()))
    assert abs(peak["bytes"] - existing - batch - profiler_peak(x, tmp_path / "t.json")) <= 64

    # The activations' own peak: GELU saves its input, BatchNorm its input
    # and the batch's mean and inverse deviation, the second Linear its
    # input, pow its base (the first Linear's input is the batch, counted
    # as other; its weight, as every weight, a parameter).
    report = json.loads((tmp_path / "rank0" / "profile.json").read_text())
    assert report["category_peaks"]["activation"] == \
        3 * BATCH * HIDDEN * 4 + 2 * HIDDEN * 4 + BATCH * WIDTH * 4
    assert report["peak"]["bytes"] == peak["bytes"]
    assert sorted(os.listdir(tmp_path / "rank0")) == ["profile.html", "profile.json",
                                                      "profile.txt", "trace.json"]
    text = (tmp_path / "rank0" / "profile.txt").read_text()
    assert text.startswith("memory profile of cpu (capacity ")
    assert "held (the framework's tensors), in phase 'optimizer step'" in text


def test_the_profiled_loop_trains_as_the_unprofiled_one(tmp_path):
    x = torch.randn(BATCH, WIDTH)
    model, opt = mlp()
    reference = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    with mt.profile(opt, tmp_path, model=model):
        train(model, opt, x)
    train(model, opt, x)  # after the block: the optimizer's own state dicts again
    train(reference, ref_opt, x)
    train(reference, ref_opt, x)
    assert type(opt.state) is type(ref_opt.state)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)
        assert torch.equal(opt.state[p]["exp_avg"], ref_opt.state[q]["exp_avg"])


def test_a_transformers_gpt2_with_its_adamw_is_profiled_by_module_and_phase(tmp_path):
    import transformers
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=0,
        eos_token_id=0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 96, (4, 16), generator=torch.Generator().manual_seed(1))
    seen = {}
    with mt.profile(opt, tmp_path, model=model) as profile:
        for _ in range(2):
            model(ids, labels=ids).loss.backward()
            seen.setdefault("after backward", profile.current())
            opt.step()
            opt.zero_grad()
    report = json.loads((tmp_path / "rank0" / "profile.json").read_text())
    phases = {p["name"] for p in report["phases"]}
    assert {"forward", "forward transformer.h.0", "forward transformer.h.1", "backward",
            "optimizer step"} <= phases
    # Gradients of every trainable parameter once (the tied embedding's
    # once), f32.
    params = {p.untyped_storage().data_ptr(): p.numel() for p in model.parameters()}
    assert seen["after backward"]["gradient"] == 4 * sum(params.values())
    assert seen["after backward"]["activation"] == 0  # backward freed what it saved
    owners = {owner for owner, category, _ in profile.owners() if category == "optimizer_state"}
    assert "transformer.h.0.attn.c_attn" in owners


def test_profiling_a_torch_loop_needs_its_model():
    model, opt = mlp()
    with pytest.raises(ValueError) as error:
        mt.profile(opt, "unused")
    assert str(error.value) == (
        "model: profiling a loop with AdamW needs the model it trains "
        "(memwall.torch.profile(opt, directory, model=model))")
    zero = mt.ZeroOptimizer(model, None, {"zero_optimization": {"stage": 0}})
    with pytest.raises(ValueError) as error:
        mt.profile(zero, "unused", model=mlp()[0])
    assert str(error.value) == "model: not the model this ZeroOptimizer wraps (leave it out)"
