"""The loop a Hugging Face accelerate user writes (prepare, accumulate,
accelerator.backward, step, zero_grad), with a ZeroOptimizer through
memwall.accelerator: on 1 and 2 real MPI ranks at ZeRO stages 0 and 3 it
trains as plain torch with torch.optim.AdamW on the whole batch in one
process (workers/accelerate_loop.py). Tolerances (f32): each global
micro-batch's loss, the mean over the ranks, within 1e-5 relative; every
master weight within 2e-5 of AdamW's after 4 steps (as test_hf_trainer)."""
import pytest

import memwall
import memwall.accelerator
import memwall.torch as mt


@pytest.mark.parametrize("ranks, launcher", [(1, "mpirun"), (2, "mpirun"), (2, "torchrun")])
@pytest.mark.parametrize("stage", [0, 3])
def test_an_accelerate_loop_trains_as_torch_adamw_on_one_process(ranks_runner, tmp_path, stage,
                                                                 ranks, launcher):
    """torchrun: no MPI job and torch.distributed not initialised (the
    adapter hides the ranks from accelerate): memwall joins the ranks
    through torchrun's store."""
    if launcher == "torchrun":
        from conftest import torchrun_ranks
        results = torchrun_ranks(ranks, "accelerate_loop.py", tmp_path / "out", stage)
    else:
        results = ranks_runner(ranks, "accelerate_loop.py", stage)
    reference = results[0]["reference_losses"]
    assert len(reference) == 8
    for r, result in enumerate(results):
        assert result["steps"] == 4, r
        assert len(result["losses"]) == 8, r
        assert result["weight_error"] <= 2e-5, (r, result["weight_error"])
    for micro, want in enumerate(reference):
        mean = sum(r["losses"][micro] for r in results) / ranks
        assert mean == pytest.approx(want, rel=1e-5), micro


def test_prepare_refuses_an_accumulation_other_than_the_configs():
    import torch
    model = torch.nn.Linear(4, 2)
    opt = mt.ZeroOptimizer(model, None, {"zero_optimization": {"stage": 0},
                                         "gradient_accumulation_steps": 2})
    accelerator = memwall.accelerator.Accelerator(gradient_accumulation_steps=4)
    with pytest.raises(ValueError) as error:
        accelerator.prepare(model, opt)
    assert str(error.value) == ("Accelerator.gradient_accumulation_steps: 4, the config's "
                                "gradient_accumulation_steps is 2; they must be equal")
    with pytest.raises(ValueError) as error:
        accelerator.prepare(model, torch.optim.AdamW(model.parameters()))
    assert str(error.value) == (
        "prepare: expected one memwall.torch.ZeroOptimizer among the objects (and no other "
        "optimizer), got 0 ZeroOptimizer(s) and 1 optimizer(s)")
