"""In-place writes to the parameters after wrapping (p.mul_, p.copy_ under
no_grad, as weight surgery, clipping or EMA code does) take effect as in
torch: at stages 0-2 they become the master weights the next update starts
from, in f32 with the optimizer offloaded (master weights apart from the
parameters) and in bf16; at stage 3 a write inside gathered_parameters()
without modify is refused rather than discarded."""
import copy

import pytest
import torch

import memwall
import memwall.torch as mt

CONFIG = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.05}}}


def model_and_data():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))
    data = [(torch.randn(16, 6), torch.randn(16, 3)) for _ in range(4)]
    return model, data


def train(model, opt, batches):
    for x, y in batches:
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def edit(model):
    with torch.no_grad():
        model[0].weight.mul_(0.5)
        model[2].bias.copy_(torch.arange(3.0))


@pytest.mark.parametrize("zero", [
    {"stage": 0},
    {"stage": 2},
    {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 1}},
    # The host part updates during backward: a write between steps is taken
    # at the step's first gradient, before that update starts.
    {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 1, "overlap_step": True}},
])
def test_an_inplace_write_trains_on_as_in_torch(zero):
    model, data = model_and_data()
    reference = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.05)
    opt = mt.ZeroOptimizer(model, None, {**CONFIG, "zero_optimization": zero})
    train(reference, ref_opt, data[:2])
    train(model, opt, data[:2])
    edit(reference)
    edit(model)
    train(reference, ref_opt, data[2:])
    train(model, opt, data[2:])
    for name, p in reference.named_parameters():
        assert torch.allclose(opt.master_weights(name), p.detach(), rtol=0, atol=1e-6), name


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_an_inplace_write_in_bf16_becomes_the_master_weights(stage):
    """lr 0 and no decay: the step changes nothing, so the master weights
    after it are the written bf16 values, exactly (torch's f32 reference,
    written the same way, rounds to them); the parameters not written keep
    their f32 master weights, the reference's own."""
    model, data = model_and_data()
    reference = copy.deepcopy(model)
    opt = mt.ZeroOptimizer(model, None, {
        "optimizer": {"type": "AdamW", "params": {"lr": 0.0, "weight_decay": 0.0}},
        "bf16": {"enabled": True}, "zero_optimization": {"stage": stage}})
    edit(reference)
    edit(model)
    x, y = data[0]
    torch.nn.functional.mse_loss(model(x.to(torch.bfloat16)).float(), y).backward()
    opt.step()
    for name, p in reference.named_parameters():
        want = p.detach()
        if name in ("0.weight", "2.bias"):
            want = want.to(torch.bfloat16).to(torch.float32)
        assert torch.equal(opt.master_weights(name), want), name


def test_a_write_inside_gathered_parameters_without_modify_is_refused_at_stage_3():
    model, data = model_and_data()
    opt = mt.ZeroOptimizer(model, None, {**CONFIG, "zero_optimization": {"stage": 3}})
    train(model, opt, data[:1])
    before = opt.master_weights("0.weight")
    with pytest.raises(memwall.Error) as error:
        with opt.gathered_parameters():
            edit(model)
    assert str(error.value) == (
        "FAILED_PRECONDITION: gathered_parameters(): parameter '0.weight' was written inside "
        "the block, which discards what it gathered at stage 3; write inside "
        "gathered_parameters(modify=True)")
    assert torch.equal(opt.master_weights("0.weight"), before)
    with opt.gathered_parameters(modify=True):
        edit(model)
    assert torch.equal(opt.master_weights("0.weight"), before * 0.5)


def test_with_the_update_overlapped_a_write_after_backward_is_refused():
    """offload_optimizer.overlap_step updates the host part during backward:
    a write after backward would come after that update started, and is
    refused, dropping the step's gradients."""
    zero = {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 1, "overlap_step": True}}
    model, data = model_and_data()
    opt = mt.ZeroOptimizer(model, None, {**CONFIG, "zero_optimization": zero})
    train(model, opt, data[:1])
    x, y = data[3]
    torch.nn.functional.mse_loss(model(x), y).backward()
    edit(model)
    with pytest.raises(memwall.Error) as error:
        opt.step()
    assert str(error.value) == (
        "FAILED_PRECONDITION: step(): parameter '0.weight' was written in place after backward "
        "began; with offload_optimizer.overlap_step the update has started from the weights "
        "before the write: write between steps")
