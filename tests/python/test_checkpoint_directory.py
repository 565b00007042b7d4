"""ZeroOptimizer.save_checkpoint treats a directory as `memwall train --save`
does: it never prunes or overwrites another run's checkpoints (it refuses
the directory), two runs never save into one directory at once, `keep` is
checked before anything is written, and a run may go on saving where it
saved before or where it resumed from."""
import gc
import hashlib
import os
import subprocess

import pytest
import torch

import memwall
import memwall.torch as mt
from conftest import ROOT, clean_env

MEMWALL = os.path.join(ROOT, "bazel-bin", "cli", "memwall")


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def trained(steps=1):
    model = mlp()
    opt = mt.ZeroOptimizer(model, None, {"zero_optimization": {"stage": 1}})
    for _ in range(steps):
        opt.backward(model(torch.ones(2, 4)).sum())
        opt.step()
    return opt


def contents(directory):
    """Every file under `directory` (path -> SHA-256), lock file aside."""
    found = {}
    for parent, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(parent, name)
            if name != ".memwall.lock":
                with open(path, "rb") as f:
                    found[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return found


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """A `memwall train --save` run's directory: two checkpoints."""
    directory = tmp_path_factory.mktemp("cli") / "run"
    done = subprocess.run([MEMWALL, "train", "--steps", "2", "--save_every", "1", "--save",
                           str(directory)], capture_output=True, text=True, env=clean_env())
    assert done.returncode == 0, done.stderr
    return directory


@pytest.mark.parametrize("keep", [1, 2])
def test_another_runs_checkpoints_are_refused_not_pruned(cli_run, keep):
    before = contents(cli_run)
    assert sorted(os.listdir(cli_run)) == [".memwall.lock", "step-00000001", "step-00000002"]
    opt = trained(steps=2)  # at step 2: its save would be step-00000002
    with pytest.raises(memwall.Error) as error:
        opt.save_checkpoint(cli_run, keep=keep)
    assert str(error.value) == (
        "FAILED_PRECONDITION: save_checkpoint %s: holds 2 checkpoint(s) of another run (the "
        "newest %s/step-00000002); continue that run with load_checkpoint %s, or save this one "
        "elsewhere" % (cli_run, cli_run, cli_run))
    assert contents(cli_run) == before


def test_keep_is_checked_before_anything_is_written(tmp_path):
    opt = trained()
    for keep in (0, -3):
        with pytest.raises(memwall.Error) as error:
            opt.save_checkpoint(tmp_path / "ck", keep=keep)
        assert str(error.value) == "INVALID_ARGUMENT: checkpoint keep: expected >= 1, got %d" % keep
    assert not (tmp_path / "ck").exists()
    with pytest.raises(memwall.Error) as error:
        opt.save_checkpoint("")
    assert str(error.value) == "INVALID_ARGUMENT: save_checkpoint: expected a directory, got ''"


def test_a_run_owns_the_directory_it_saves_into(tmp_path):
    directory = tmp_path / "ck"
    first = trained()
    assert first.save_checkpoint(directory, keep=1) == str(directory / "step-00000001")
    model = mlp()
    second = mt.ZeroOptimizer(model, None, {"zero_optimization": {"stage": 1}})
    with pytest.raises(memwall.Error) as error:  # the first run still holds the directory
        second.save_checkpoint(directory)
    assert str(error.value).startswith(
        "FAILED_PRECONDITION: save_checkpoint %s: another run saves there (it holds %s, process %d"
        % (directory, directory / ".memwall.lock", os.getpid()))
    del first
    gc.collect()  # the first run ends: its lock goes with its engine
    with pytest.raises(memwall.Error) as error:
        second.save_checkpoint(directory)
    assert "holds 1 checkpoint(s) of another run" in str(error.value)
    # Resumed from it, the second run continues that run there, its own
    # later saves pruning the older ones.
    assert second.load_checkpoint(directory)["steps"] == 1
    for _ in range(2):
        second.backward(model(torch.ones(2, 4)).sum())
        second.step()
        second.save_checkpoint(directory, keep=1)
    assert sorted(os.listdir(directory)) == [".memwall.lock", "step-00000003"]
