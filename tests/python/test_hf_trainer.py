"""Hugging Face transformers' Trainer, its own training loop, with a
ZeroOptimizer (memwall.trainer): on 1 rank and on 2 real MPI ranks at ZeRO
stages 0-3 it trains as a plain Trainer with torch.optim.AdamW on one
process does (workers/hf_trainer.py), and trainer.save_model writes the
trained weights, which from_pretrained reads back; a last batch the ranks
cannot share is refused, not dropped silently.

Tolerances (f32): the mean over ranks of each rank's logged loss equals the
reference's within 1e-5 relative; every master weight is within 2e-5 of
AdamW's after 4 steps (as test_zero_optimizer); the saved weights are the
master weights exactly."""
import pytest


def check(results):
    ranks = len(results)
    reference = results[0]["reference_losses"]
    assert len(reference) == 4
    for step, want in enumerate(reference):
        mean = sum(r["losses"][step] for r in results) / ranks
        assert mean == pytest.approx(want, rel=1e-5), "step %d" % step
    for r, result in enumerate(results):
        assert result["weight_error"] <= 2e-5, r
    assert results[0]["saved_error"] == 0.0


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_the_trainer_on_two_ranks_trains_as_one_process_with_torch_adamw(ranks_runner, tmp_path,
                                                                          stage):
    check(ranks_runner(2, "hf_trainer.py", stage, tmp_path / "saved"))


def test_the_trainer_on_one_rank(ranks_runner, tmp_path):
    check(ranks_runner(1, "hf_trainer.py", 3, tmp_path / "saved"))


def test_a_last_partial_batch_that_cannot_be_split_across_ranks_is_refused(ranks_runner,
                                                                            tmp_path):
    """30 samples are 7 global batches of 4 and 2 left over, which 2 ranks
    cannot share evenly: without dataloader_drop_last the Trainer is told
    so before training, on every rank."""
    for result in ranks_runner(2, "hf_trainer.py", 0, tmp_path / "saved", 30):
        assert result["error"] == (
            "TrainingArguments.dataloader_drop_last: 30 samples are not whole global batches of "
            "4 (2 per rank x 2 ranks), and the last one cannot be split evenly across the ranks: "
            "set dataloader_drop_last=True")
