"""A training loop written for torch.optim.AdamW runs unchanged with a
ZeroOptimizer on 1 and 2 real MPI ranks at every stage, including what such
loops do between steps: a step() after zero_grad() with no backward,
zero_grad() dropping a backward's gradients, an in-place write to a weight (workers/plain_loop.py).
The master weights equal torch's AdamW on the whole batch in one process
within 1e-6 (f32; the ranks' gradient sums run in another order). In one
process: how the gradients behave where torch's calls meet memwall's engine
(zero_grad, model.zero_grad, p.grad)."""
import copy
import json

import pytest
import torch

import memwall
import memwall.torch as mt


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_torch_loop_runs_unchanged(ranks_runner, stage, ranks):
    for r, result in enumerate(ranks_runner(ranks, "plain_loop.py", stage)):
        assert result["steps"] == 3, r
        assert result["weight_error"] <= 1e-6, (r, result["weight_error"])
        # opt.state holds torch's keys, its step count and its moments.
        assert all(result["state_keys"]), (r, result["state_keys"])
        assert result["state_steps"] == result["torch_steps"] == [3.0] * 4, r
        assert result["state_error"] <= 1e-6, (r, result["state_error"])


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_hybrid_sharding_runs_the_loop_as_torch_on_the_whole_batch(ranks_runner, stage):
    """zero_optimization.mics_shard_size 1 on 2 ranks: each rank a shard
    group of its own holding the whole states, the gradients all-reduced
    with the replica on the other rank (hybrid sharding's two steps): the
    same loop, torch's AdamW on the whole batch within 1e-6, as the stages
    sharded across both ranks are."""
    for r, result in enumerate(ranks_runner(2, "plain_loop.py", stage, 1)):
        assert result["steps"] == 3, r
        assert result["weight_error"] <= 1e-6, (r, result["weight_error"])
        assert result["state_steps"] == result["torch_steps"] == [3.0] * 4, r
        assert result["state_error"] <= 1e-6, (r, result["state_error"])


@pytest.mark.parametrize("stage, shard, zero", [
    (1, 1, {}), (2, 1, {}), (3, 1, {}), (3, -1, {}),
    (3, 1, {"offload_optimizer": {"device": "cpu", "ratio": 1}}),
    (2, 1, {"offload_optimizer": {"device": "cpu", "ratio": 1, "overlap_step": True}})])
def test_a_head_trained_in_one_of_two_micro_batches_steps_as_torch(ranks_runner, stage, shard,
                                                                   zero):
    """gradient_accumulation_steps 2 on 2 ranks, one head getting gradients
    in only one micro-batch of each step (workers/partial_accumulation.py):
    with hybrid sharding (mics_shard_size 1) its shard is summed with its
    replica at that micro-batch or at step(), on the device or offloaded
    to the host (streamed there, with the update overlapped too); with
    stage 3 across both ranks as the control. Torch's AdamW on the whole
    batch within 1e-6 after 3 steps."""
    for r, result in enumerate(ranks_runner(2, "partial_accumulation.py", stage, shard,
                                            json.dumps(zero))):
        assert result["steps"] == 3, r
        assert result["weight_error"] <= 1e-6, (r, result["weight_error"])


def with_reference(stage, weight_decay, frozen_bias=False):
    """An MLP under a ZeroOptimizer, and its copy under torch's AdamW
    (lr 0.1, the same weight decay); with frozen_bias the last bias is
    frozen first."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model[2].bias.requires_grad_(not frozen_bias)
    reference = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=0.1, weight_decay=weight_decay)
    opt = mt.ZeroOptimizer(model, None, {
        "zero_optimization": {"stage": stage},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.1, "weight_decay": weight_decay}}})
    return model, opt, reference, ref_opt


def assert_weights_match(opt, reference):
    for name, p in reference.named_parameters():
        assert torch.allclose(opt.master_weights(name), p.detach(), rtol=0, atol=1e-6), name


@pytest.mark.parametrize("stage", [0, 3])
def test_a_step_without_backward_changes_nothing_as_in_torch(stage):
    """torch's AdamW skips parameters without gradients: no weight decay,
    no step counted. So does ZeroOptimizer."""
    model, opt, reference, ref_opt = with_reference(stage, weight_decay=0.5)
    ref_opt.step()
    opt.step()
    assert opt.engine.progress()["steps_applied"] == 0
    assert ref_opt.state_dict()["state"] == {}
    for name, p in reference.named_parameters():
        assert torch.equal(opt.master_weights(name), p.detach()), name


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_zero_grad_drops_the_accumulated_gradients_as_in_torch(stage):
    """backward, zero_grad, backward, step: only the second backward's
    gradients update, in torch and in memwall alike."""
    model, opt, reference, ref_opt = with_reference(stage, weight_decay=0.0)
    first, second = torch.randn(3, 4), torch.randn(3, 4)
    for m, o in ((reference, ref_opt), (model, opt)):
        m(first).pow(2).sum().backward()
        o.zero_grad()
        m(second).sum().backward()
        o.step()
    assert opt.engine.progress()["steps_applied"] == 1
    assert_weights_match(opt, reference)


GRAD_MESSAGE = (
    "FAILED_PRECONDITION: p.grad: memwall's engine holds the gradients (reduced across ranks at "
    "the step, sharded at stages 2-3), not the parameters' .grad: clip them with the config's "
    "gradient_clipping (the global norm, applied at the step; opt.last_step['grad_norm'] "
    "reports it), and drop them with opt.zero_grad()")


@pytest.mark.parametrize("stage", [0, 3])
def test_p_grad_after_backward_refuses_use_instead_of_reading_as_nothing(stage):
    """torch.nn.utils.clip_grad_norm_ over .grad that is None clips nothing
    and returns 0; after a backward memwall's .grad placeholders raise,
    naming gradient_clipping. The step goes on, as without the call."""
    model, opt, reference, ref_opt = with_reference(stage, weight_decay=0.0)
    x = torch.randn(3, 4)
    model(x).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    with pytest.raises(memwall.Error) as error:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    assert str(error.value) == GRAD_MESSAGE
    with pytest.raises(memwall.Error) as error:
        model[0].weight.grad.norm()
    assert str(error.value) == GRAD_MESSAGE
    opt.step()
    assert all(p.grad is None for p in model.parameters())
    reference(x).sum().backward()
    ref_opt.step()
    assert_weights_match(opt, reference)


def test_model_zero_grad_drops_the_gradients_and_a_partial_clear_is_refused():
    model, opt, reference, _ = with_reference(0, weight_decay=0.0)
    model(torch.randn(3, 4)).sum().backward()
    model.zero_grad()  # torch: the gradients are gone, the step changes nothing
    opt.step()
    assert opt.engine.progress()["steps_applied"] == 0
    for name, p in reference.named_parameters():
        assert torch.equal(opt.master_weights(name), p.detach()), name
    model(torch.randn(3, 4)).sum().backward()
    model[0].weight.grad = None
    with pytest.raises(memwall.Error) as error:
        opt.step()
    assert str(error.value) == (
        "FAILED_PRECONDITION: step(): parameter '0.weight' had its .grad cleared after backward; "
        "the engine holds the gradients and cannot take that: the step's gradients were dropped "
        "(opt.zero_grad() or model.zero_grad() drop them all)")
    opt.step()
    assert opt.engine.progress()["steps_applied"] == 0


@pytest.mark.parametrize("stage", [0, 3])
def test_opt_state_is_torchs_and_refuses_writes(stage):
    """opt.state as torch's AdamW keeps it: empty before the first step,
    then per trainable parameter "step", "exp_avg" and "exp_avg_sq" of its
    shape, frozen parameters without state; read after each step. Its
    tensors are copies of the engine's states, so writes into them (or a
    view of them) and into the mapping are refused."""
    model, opt, reference, ref_opt = with_reference(stage, weight_decay=0.01, frozen_bias=True)
    frozen, ref_frozen = model[2].bias, reference[2].bias
    assert len(opt.state) == len(ref_opt.state) == 0
    x = torch.randn(5, 4)
    for step in (1, 2):
        for m, o in ((reference, ref_opt), (model, opt)):
            m(x * step).pow(2).sum().backward()
            o.step()
            o.zero_grad()
        assert len(opt.state) == len(ref_opt.state) == 3
        assert frozen not in opt.state and ref_frozen not in ref_opt.state
        for p, q in zip(model.parameters(), reference.parameters()):
            if p is frozen:
                continue
            mine, torchs = opt.state[p], ref_opt.state[q]
            assert sorted(mine) == sorted(torchs)
            assert torch.equal(mine["step"], torchs["step"])
            for key in ("exp_avg", "exp_avg_sq"):
                assert mine[key].shape == torchs[key].shape
                assert torch.allclose(mine[key], torchs[key], rtol=0, atol=1e-6), key
    # Read anyway, a parameter without state shows an empty one (torch's
    # defaultdict(dict) inserts it; the engine's state cannot grow one).
    assert dict(opt.state[frozen]) == ref_opt.state[ref_frozen] == {}
    state = opt.state[model[0].weight]
    message = ("FAILED_PRECONDITION: opt.state: the optimizer states are the engine's; these "
               "tensors are copies of them, so %s would change nothing: set states with "
               "opt.load_state_dict()")
    with pytest.raises(memwall.Error) as error:
        state["exp_avg"].zero_()
    assert str(error.value) == message % "zero_"
    with pytest.raises(memwall.Error) as error:
        state["exp_avg_sq"][0].mul_(2)  # a view of it
    assert str(error.value) == message % "mul_"
    with pytest.raises(memwall.Error) as error:
        opt.state[model[0].weight] = {}
    assert str(error.value) == ("FAILED_PRECONDITION: opt.state: the optimizer states are the "
                                "engine's; set them with opt.load_state_dict()")
    # Reading: plain results, the engine's states unchanged.
    assert type(state["exp_avg"] * 2) is torch.Tensor
    assert torch.equal(opt.state[model[0].weight]["exp_avg"], state["exp_avg"])


@pytest.mark.parametrize("frozen_bias", [False, True])
def test_freezing_or_unfreezing_after_wrapping_is_refused_at_the_step(frozen_bias):
    """torch's AdamW skips a parameter frozen after it was built (no
    gradient) and updates one unfrozen; the engine fixed which parameters
    train when it was built, so the step refuses the change by name."""
    model, opt, _, _ = with_reference(0, weight_decay=0.01, frozen_bias=frozen_bias)
    model[2].bias.requires_grad_(frozen_bias)
    model(torch.randn(3, 4)).sum().backward()
    with pytest.raises(memwall.Error) as error:
        opt.step()
    change, taken = (("unfrozen", "frozen (no optimizer state)") if frozen_bias else
                     ("frozen", "trainable (its update would go on: weight decay, moments)"))
    assert str(error.value) == (
        "FAILED_PRECONDITION: the model changed after wrapping: parameter '2.bias' was %s after "
        "the ZeroOptimizer was built, which took it as %s; set requires_grad before building it"
        % (change, taken))
