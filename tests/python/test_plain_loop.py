"""A training loop written for torch.optim.AdamW runs unchanged with a
ZeroOptimizer on 1 and 2 real MPI ranks at every stage, including what such
loops do between steps: a step() after zero_grad() with no backward,
zero_grad() dropping a backward's gradients, an in-place write to a weight (workers/plain_loop.py).
The master weights equal torch's AdamW on the whole batch in one process
within 1e-6 (f32; the ranks' gradient sums run in another order)."""
import pytest


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_torch_loop_runs_unchanged(ranks_runner, stage, ranks):
    for r, result in enumerate(ranks_runner(ranks, "plain_loop.py", stage)):
        assert result["steps"] == 3, r
        assert result["weight_error"] <= 1e-6, (r, result["weight_error"])
