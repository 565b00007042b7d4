"""Ranks that set different hyperparameters are refused at the step (each
would otherwise update its shard with its own values, leaving a model that
mixes them), with nothing updated; once they agree, training goes on as
torch.optim.AdamW's does from the same weights."""
import pytest
import torch


@pytest.mark.parametrize("stage", [1, 3])
def test_ranks_with_different_param_group_values(ranks_runner, stage):
    results = ranks_runner(2, "rank_hyperparameters.py", stage)
    for rank, result in enumerate(results):
        assert result["error"] == (
            "INVALID_ARGUMENT: step: the ranks' param_groups[1] differ (rank %d of 2 has lr "
            "%g, betas (0.9, 0.999), eps 1e-08, weight_decay 0, momentum 0); every rank must set "
            "the same hyperparameters, or each would update its shard with its own; nothing was "
            "updated" % (rank, 1e-3 * (rank + 1)))
        assert result["unchanged"]
    # The refused step's gradients were dropped: the next two steps are
    # torch's first two.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    want = []
    for _ in range(2):
        opt.zero_grad()
        loss = model(torch.ones(2, 4)).sum()
        loss.backward()
        opt.step()
        want.append(loss.item())
    for result in results:
        assert result["losses"] == pytest.approx(want, rel=1e-6)
