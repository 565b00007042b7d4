"""A memwall checkpoint saved by ZeroOptimizer on 2 ranks at stage 2 resumes
on 1 rank at stage 0 and on 4 ranks at stage 3, and training goes on as the
uninterrupted run (torch.optim.AdamW from the start, in the same process:
the tolerances of test_zero_optimizer.py); `memwall export` reads it."""
import os
import subprocess

import pytest
import torch

from conftest import ROOT, clean_env

SAVED_STEPS, MORE_STEPS = 3, 3


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from conftest import run_ranks
    base = tmp_path_factory.mktemp("checkpoint")
    results = run_ranks(2, "train_gpt2.py", base / "saving", 2, "--steps", SAVED_STEPS,
                        "--save", base / "ckpt")
    return base / "ckpt", base / "saving.reference.pt"


@pytest.mark.parametrize("ranks, stage", [(1, 0), (4, 3)])
def test_resumes_at_another_world_size_and_stage(saved, ranks_runner, ranks, stage):
    directory, _ = saved
    results = ranks_runner(ranks, "train_gpt2.py", stage, "--steps", MORE_STEPS,
                           "--resume", directory)
    reference = results[0]["reference_losses"]
    assert len(reference) == MORE_STEPS
    for step, want in enumerate(reference):
        mean = sum(r["losses"][step] for r in results) / ranks
        assert mean == pytest.approx(want, rel=1e-5), "step %d" % (SAVED_STEPS + step)
    for r, result in enumerate(results):
        worst = max(result["weight_error"].items(), key=lambda kv: kv[1])
        assert worst[1] <= 2e-5, "rank %d: %s" % (r, worst)


def test_memwall_export_reads_it(saved, tmp_path):
    from safetensors.torch import load_file
    directory, reference_path = saved
    binary = os.path.join(ROOT, "bazel-bin", "cli", "memwall")
    out = tmp_path / "model.safetensors"
    done = subprocess.run([binary, "export", "--checkpoint", str(directory), "--out", str(out)],
                          capture_output=True, text=True, env=clean_env())
    assert done.returncode == 0, done.stderr
    tensors = load_file(str(out))
    # Every parameter by its torch name (the tied lm_head is wte), with the
    # weights of the uninterrupted torch AdamW run.
    reference = torch.load(str(reference_path))
    del reference["lm_head.weight"]
    assert sorted(tensors) == sorted(reference)
    for name, want in reference.items():
        assert torch.allclose(tensors[name], want, rtol=0, atol=2e-5), name
