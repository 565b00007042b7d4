"""fp16 through ZeroOptimizer: backward() multiplies the loss by the
dynamic loss scale, the engine unscales; training stays within a stated
tolerance of torch.optim.AdamW in f32, and a step with inf gradients is
skipped with the scale lowered, the weights untouched (one process)."""
import copy

import pytest
import torch

import memwall
import memwall.torch as mt

CONFIG = {"fp16": {"enabled": True, "initial_scale_power": 8, "hysteresis": 1},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}


def model_pair():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    return model, copy.deepcopy(model)


@pytest.mark.parametrize("stage", [0, 2])
def test_fp16_trains_close_to_f32(stage):
    """Over 5 steps the master weights stay within 2 x lr x steps = 0.1 of
    f32 AdamW's (Adam's normalised step may flip sign where fp16 gradients
    are tiny; seen: 7.8e-5), and the loss scale stays 2^8."""
    model, reference = model_pair()
    opt = mt.ZeroOptimizer(model, None, {**CONFIG, "zero_optimization": {"stage": stage}})
    assert model[0].weight.dtype == torch.float16
    assert opt.loss_scale == 256.0
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.0)
    for _ in range(5):
        x, y = torch.randn(16, 8), torch.randn(16, 4)
        loss = torch.nn.functional.mse_loss(model(x.half()).float(), y)
        opt.backward(loss)
        opt.step()
        assert opt.last_step["applied"]
        torch.nn.functional.mse_loss(reference(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    assert opt.loss_scale == 256.0
    for name, p in reference.named_parameters():
        error = (opt.master_weights(name) - p.detach()).abs().max().item()
        assert error <= 2 * 1e-2 * 5, name


def test_an_overflowing_step_is_skipped_and_the_scale_halved():
    model, _ = model_pair()
    opt = mt.ZeroOptimizer(model, None, CONFIG)
    before = {n: opt.master_weights(n) for n, _ in model.named_parameters()}
    x = torch.randn(4, 8).half()
    opt.backward(model(x).float().sum() * float("inf"))
    opt.step()
    assert not opt.last_step["applied"]
    assert opt.loss_scale == 128.0
    for name, weights in before.items():
        assert torch.equal(opt.master_weights(name), weights), name
    opt.backward(model(x).float().sum())  # the next step trains again
    opt.step()
    assert opt.last_step["applied"]


def test_an_unscaled_backward_is_refused_and_scale_matches_backward():
    """fp16: a plain loss.backward() would hand the engine gradients the
    loss scale too small; it is refused with the two ways to scale, and the
    step's gradients so far are dropped. opt.scale(loss).backward() trains
    exactly as opt.backward(loss)."""
    model, twin = model_pair()
    opt = mt.ZeroOptimizer(model, None, CONFIG)
    opt2 = mt.ZeroOptimizer(twin, None, CONFIG)
    x, y = torch.randn(16, 8), torch.randn(16, 4)
    with pytest.raises(memwall.Error) as error:
        torch.nn.functional.mse_loss(model(x.half()).float(), y).backward()
    assert str(error.value) == (
        "FAILED_PRECONDITION: backward: fp16 training multiplies the loss by the loss scale (256) "
        "before backward, and the engine divides it out at the step; call opt.backward(loss), or "
        "opt.scale(loss).backward()")
    for _ in range(3):
        x, y = torch.randn(16, 8), torch.randn(16, 4)
        opt.scale(torch.nn.functional.mse_loss(model(x.half()).float(), y)).backward()
        opt.step()
        opt2.backward(torch.nn.functional.mse_loss(twin(x.half()).float(), y))
        opt2.step()
    for name, _ in model.named_parameters():
        assert torch.equal(opt.master_weights(name), opt2.master_weights(name)), name
