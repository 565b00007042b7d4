"""SGD with momentum through ZeroOptimizer equals torch.optim.SGD (same
lr, momentum and weight decay per param_group, a StepLR schedule), at
stages 0 and 3 and with half the optimizer offloaded (one process), also
with a param_group without momentum; opt.state holds torch's SGD state (a
momentum_buffer per parameter of a param_group with momentum, nothing
else)."""
import copy

import pytest
import torch

import memwall.torch as mt


ZERO = {0: {"stage": 0}, 3: {"stage": 3},
        # Half the update on the CPU (the host slice), half on the device.
        "offload": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}}


@pytest.mark.parametrize("bias_momentum", [0.5, 0.0])
@pytest.mark.parametrize("stage", [0, 3, "offload"])
def test_sgd_with_momentum_matches_torch(stage, bias_momentum):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 3))
    reference = copy.deepcopy(model)

    def groups(m):
        return [{"params": [m[0].weight, m[2].weight], "weight_decay": 1e-3},
                {"params": [m[0].bias, m[2].bias], "lr": 0.02, "momentum": bias_momentum}]

    config = {"zero_optimization": ZERO[stage],
              "optimizer": {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}}}
    opt = mt.ZeroOptimizer(model, groups(model), config)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    ref_opt = torch.optim.SGD(groups(reference), lr=0.05, momentum=0.9)
    ref_schedule = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=2, gamma=0.5)
    for _ in range(5):
        x, y = torch.randn(12, 6), torch.randn(12, 3)
        opt.backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
        schedule.step()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        ref_schedule.step()
    for name, p in reference.named_parameters():
        assert torch.allclose(opt.master_weights(name), p.detach(), rtol=0, atol=1e-6), name
    state = opt.state_dict()
    assert sorted(state["state"][0]) == ["master_weight", "master_weight_step",
                                         "momentum_buffer", "step"]
    pairs = list(zip(model.parameters(), reference.parameters()))
    assert len(opt.state) == len(ref_opt.state) == (4 if bias_momentum else 2)
    for p, q in pairs:
        assert (p in opt.state) == (q in ref_opt.state)
        if q in ref_opt.state:
            assert sorted(opt.state[p]) == sorted(ref_opt.state[q]) == ["momentum_buffer"]
            assert torch.allclose(opt.state[p]["momentum_buffer"],
                                  ref_opt.state[q]["momentum_buffer"], rtol=0, atol=1e-6)
