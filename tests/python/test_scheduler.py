"""The config's `scheduler` (DeepSpeed's WarmupLR, WarmupDecayLR,
WarmupCosineLR) drives the learning rate inside the engine, for
ZeroOptimizer too: training equals torch.optim.AdamW stepped by a LambdaLR
that follows DeepSpeed's formulas (written out here), with each param_group's
own lr as WarmupCosineLR's base."""
import copy
import math

import pytest
import torch

import memwall.torch as mt

W, T = 4, 10  # warm-up steps, total steps


def cosine_ratio(k):  # WarmupCosineLR, linear warm-up, warmup_min_ratio 0.2, cos_min_ratio 0.1
    k = min(k, T - 1)
    if k < W:
        return 0.2 + 0.8 * k / W
    return max(0.0, 0.1 + 0.9 * (1 + math.cos(math.pi * (k - W + 1) / (T - W))) / 2)


def warmup_lr(k):  # WarmupLR, log warm-up from 1e-4 to 1e-2
    return 1e-4 + (1e-2 - 1e-4) * (math.log(k + 1) / math.log(W) if k < W else 1.0)


CASES = {
    "WarmupCosineLR": ({"type": "WarmupCosineLR",
                        "params": {"warmup_num_steps": W, "total_num_steps": T,
                                   "warmup_type": "linear", "warmup_min_ratio": 0.2,
                                   "cos_min_ratio": 0.1}}, lambda k, base: base * cosine_ratio(k)),
    "WarmupLR": ({"type": "WarmupLR",
                  "params": {"warmup_num_steps": W, "warmup_min_lr": 1e-4,
                             "warmup_max_lr": 1e-2}}, lambda k, base: warmup_lr(k)),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_the_engine_schedules_the_rate_each_step(kind):
    scheduler, rate = CASES[kind]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 9), torch.nn.Tanh(), torch.nn.Linear(9, 2))
    reference = copy.deepcopy(model)

    def groups(m):  # two param_groups with their own base rates
        return [{"params": [m[0].weight, m[0].bias], "lr": 1e-2},
                {"params": [m[2].weight, m[2].bias], "lr": 4e-3}]

    opt = mt.ZeroOptimizer(model, groups(model), {"scheduler": scheduler,
                                                  "zero_optimization": {"stage": 2}})
    ref_opt = torch.optim.AdamW(groups(reference), weight_decay=0.0)
    bases = [g["lr"] for g in ref_opt.param_groups]
    for k in range(T + 2):
        for group, base in zip(ref_opt.param_groups, bases):
            group["lr"] = rate(k, base)
        assert opt.engine.learning_rate(1) == pytest.approx(rate(k, 4e-3), rel=1e-6)
        x, y = torch.randn(8, 5), torch.randn(8, 2)
        opt.backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    assert opt.param_groups[1]["lr"] == 4e-3  # the base stays; the engine schedules
    for name, p in reference.named_parameters():
        assert torch.allclose(opt.master_weights(name), p.detach(), rtol=0, atol=1e-6), name
