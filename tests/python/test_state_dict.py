"""ZeroOptimizer's state_dict is torch.optim.AdamW's: a state saved by
torch's AdamW loads into a ZeroOptimizer and the run goes on as torch's
would, and the other way round, and round again (one process, and the
three-leg round trip on 1 and 2 ranks; multi-rank resumption from memwall's
own checkpoints is in test_checkpoint.py)."""
import copy

import pytest
import torch

import memwall.torch as mt

CONFIG = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.05}}}


def model_and_data():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.LayerNorm(12),
                                torch.nn.Linear(12, 3))
    data = [(torch.randn(16, 6), torch.randn(16, 3)) for _ in range(6)]
    return model, data


def groups(model):
    return [{"params": [p for p in model.parameters() if p.dim() >= 2]},
            {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]


def train(model, opt, batches, zero):
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        if zero:
            opt.backward(loss)
        else:
            loss.backward()
        opt.step()
        opt.zero_grad()


def weights(model, opt=None):
    if opt is None:
        return {n: p.detach().clone() for n, p in model.named_parameters()}
    return {n: opt.master_weights(n) for n, _ in model.named_parameters()}


def torch_model_of(opt):
    """torch's own model holding `opt`'s master weights (f32 here, so also
    its parameters)."""
    plain, _ = model_and_data()
    with torch.no_grad():
        for name, p in plain.named_parameters():
            p.copy_(opt.master_weights(name))
    return plain


def assert_trained_alike(reference, model, opt):
    want, got = weights(reference), weights(model, opt)
    for name in want:
        assert torch.allclose(got[name], want[name], rtol=0, atol=1e-6), name


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_torch_adamw_state_loads_and_training_goes_on_as_torchs(stage):
    model, data = model_and_data()
    ref_opt = torch.optim.AdamW(groups(model), lr=1e-2, weight_decay=0.05)
    train(model, ref_opt, data[:3], zero=False)
    resumed = copy.deepcopy(model)
    opt = mt.ZeroOptimizer(resumed, groups(resumed), {**CONFIG, "zero_optimization": {"stage": stage}})
    opt.load_state_dict(ref_opt.state_dict())
    assert opt.param_groups[1]["weight_decay"] == 0.0
    train(model, ref_opt, data[3:], zero=False)
    train(resumed, opt, data[3:], zero=True)
    assert_trained_alike(model, resumed, opt)


@pytest.mark.parametrize("stage", [0, 3])
def test_a_zero_state_loads_into_torch_adamw(stage):
    model, data = model_and_data()
    opt = mt.ZeroOptimizer(model, groups(model), {**CONFIG, "zero_optimization": {"stage": stage}})
    train(model, opt, data[:3], zero=True)
    state = opt.state_dict()
    assert sorted(state["state"][0]) == ["exp_avg", "exp_avg_sq", "master_weight",
                                         "master_weight_step", "step"]
    assert state["state"][0]["master_weight_step"] == 3
    assert float(state["state"][0]["step"]) == 3.0
    assert [g["params"] for g in state["param_groups"]] == [[0, 1], [2, 3, 4, 5]]
    plain = torch_model_of(opt)
    ref_opt = torch.optim.AdamW(groups(plain), lr=1e-2, weight_decay=0.05)
    ref_opt.load_state_dict(state)
    train(plain, ref_opt, data[3:], zero=False)
    train(model, opt, data[3:], zero=True)
    assert_trained_alike(plain, model, opt)


def test_a_state_for_another_optimizer_is_refused_before_anything_changes():
    model, _ = model_and_data()
    opt = mt.ZeroOptimizer(model, groups(model), CONFIG)
    state = opt.state_dict()
    state["state"][2]["exp_avg"] = torch.zeros(3, 3)
    before = opt.state_dict()
    with pytest.raises(ValueError) as error:
        opt.load_state_dict(state)
    assert str(error.value) == ("load_state_dict: 'exp_avg' of parameter '0.bias' has shape "
                                "(3, 3), expected (12,)")
    after = opt.state_dict()
    for i in before["state"]:
        for key, value in before["state"][i].items():
            if key == "master_weight_step":
                assert after["state"][i][key] == value
            else:
                assert torch.equal(after["state"][i][key], value)
    with pytest.raises(ValueError) as error:
        opt.load_state_dict({"state": {}, "param_groups": state["param_groups"][:1]})
    assert str(error.value) == "load_state_dict: 1 param_groups, this optimizer has 2"


@pytest.mark.parametrize("stage", [0, 3])
def test_memwall_then_torch_then_memwall_trains_on_from_where_torch_stopped(stage):
    """The three-leg round trip: memwall trains, torch's AdamW loads its
    state dict and trains on (carrying memwall's master weights along
    unchanged), memwall loads torch's state dict into the model torch
    trained: the stale master weights must not replace torch's weights."""
    model, data = model_and_data()
    zero_config = {**CONFIG, "zero_optimization": {"stage": stage}}
    opt = mt.ZeroOptimizer(model, groups(model), zero_config)
    train(model, opt, data[:2], zero=True)
    plain = torch_model_of(opt)
    ref_opt = torch.optim.AdamW(groups(plain), lr=1e-2, weight_decay=0.05)
    ref_opt.load_state_dict(opt.state_dict())
    train(plain, ref_opt, data[2:4], zero=False)
    state = ref_opt.state_dict()
    assert float(state["state"][0]["step"]) == 4.0
    assert state["state"][0]["master_weight_step"] == 2  # carried along, stale
    again = copy.deepcopy(plain)
    opt2 = mt.ZeroOptimizer(again, groups(again), zero_config)
    opt2.load_state_dict(state)
    train(plain, ref_opt, data[4:], zero=False)
    train(again, opt2, data[4:], zero=True)
    assert_trained_alike(plain, again, opt2)


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("stage", [0, 3])
def test_the_round_trip_on_real_ranks_with_accumulation_through_loss_backward(ranks_runner,
                                                                              stage, ranks):
    """The three-leg round trip on 1 and 2 MPI ranks, each memwall step two
    plain loss.backward() micro-batches of each rank's share: the master
    weights after memwall, torch's AdamW and memwall again equal torch's
    AdamW alone on the whole batch within 1e-6 (workers/round_trip.py)."""
    for r, result in enumerate(ranks_runner(ranks, "round_trip.py", stage)):
        assert result["torch_step"] == 4.0 and result["master_weight_step"] == 2, r
        assert result["steps"] == 6, r
        assert result["weight_error"] <= 1e-6, (r, result["weight_error"])
