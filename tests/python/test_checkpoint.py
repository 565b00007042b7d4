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


def _memwall(*args, cwd=None):
    binary = os.path.join(ROOT, "bazel-bin", "cli", "memwall")
    done = subprocess.run([binary, *map(str, args)], capture_output=True, text=True,
                          env=clean_env(), cwd=cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_export_of_a_tiled_model_writes_the_models_own_tensors(tmp_path):
    """A tiled model's checkpoint holds its tiles (`qkv_weight_tile0`,
    `wte_tile2`); export writes the model's tensors, as the untiled model's
    export names and shapes them, each the tiles' blocks put together."""
    from safetensors.torch import load_file
    tiled, untiled = "gpt-tiny:tiles=2,vocab_tiles=3", "gpt-tiny"
    for name, model, steps in [("init", untiled, 0), ("tiled-init", tiled, 0),
                               ("tiled", tiled, 2)]:
        _memwall("train", "--model", model, "--steps", steps, "--save", tmp_path / name)
        _memwall("export", "--checkpoint", tmp_path / name, "--out",
                 tmp_path / (name + ".safetensors"))
    want = load_file(str(tmp_path / "init.safetensors"))
    assert "embed.wte" in want and "block0.qkv_weight" in want
    # A tiled model starts where the untiled one does (its tiles are the
    # untiled initialisation's blocks): the same tensors, bit for bit.
    initial = load_file(str(tmp_path / "tiled-init.safetensors"))
    assert sorted(initial) == sorted(want)
    for name, tensor in want.items():
        assert torch.equal(initial[name], tensor), name
    # Trained: each tensor is its tiles' master weights, as saved.
    trained = load_file(str(tmp_path / "tiled.safetensors"))
    assert sorted(trained) == sorted(want)
    saved = {}
    for rank_file in sorted((tmp_path / "tiled" / "step-00000002").glob("rank-*.safetensors")):
        saved.update({k[:-len("/master")]: v for k, v in load_file(str(rank_file)).items()
                      if k.endswith("/master")})
    assert "embed.wte_tile2" in saved and "embed.wte" not in saved
    assert torch.equal(trained["embed.wte"], torch.cat(
        [saved["embed.wte_tile%d" % t] for t in range(3)], dim=0))
    for block in range(2):
        for weight in ["qkv_weight", "attn_proj_weight", "fc_weight", "mlp_proj_weight"]:
            name = "block%d.%s" % (block, weight)
            assert name not in saved
            whole = torch.cat([saved["%s_tile%d" % (name, t)] for t in range(2)], dim=1)
            assert torch.equal(trained[name], whole), name
    for name, tensor in trained.items():
        if name in saved:
            assert torch.equal(tensor, saved[name]), name
    # And the training moved them.
    assert not torch.equal(trained["block0.qkv_weight"], want["block0.qkv_weight"])
