"""Launching Python training like every memwall job: the README's example
under `memwall launch --ranks 2`, and a failure on one rank ending them all."""
import os
import re
import subprocess
import sys

from conftest import ROOT, WORKERS, clean_env

MEMWALL = os.path.join(ROOT, "bazel-bin", "cli", "memwall")


def test_the_readme_example_trains_under_memwall_launch(tmp_path):
    """A plain torch loop (zero_grad, loss.backward(), step) at stage 3 on 2
    ranks; the weights rank 0 saves inside gathered_parameters() are the
    trained ones: from_pretrained reads them back, and their loss on the
    text is the trained model's, far below the initial model's."""
    saved = tmp_path / "gpt2"
    done = subprocess.run([MEMWALL, "launch", "--ranks", "2", "--", sys.executable,
                           os.path.join(ROOT, "examples", "torch_gpt2.py"), "30", str(saved)],
                          capture_output=True, text=True, timeout=300, env=clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    losses = [float(x) for x in re.findall(r"^step \d+ loss ([0-9.]+)$", done.stdout, re.M)]
    assert len(losses) == 3  # rank 0 prints steps 0, 10 and 20
    assert losses[2] < 0.5 * losses[0]
    import torch
    import transformers
    text = torch.tensor(list(b"memwall shards what torch trains. " * 40))
    batch = torch.stack([text[i:i + 64] for i in range(0, 32, 8)])
    torch.manual_seed(0)
    initial = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4, bos_token_id=0,
        eos_token_id=0))
    trained = transformers.GPT2LMHeadModel.from_pretrained(saved)
    with torch.no_grad():
        before = initial(batch, labels=batch).loss.item()
        after = trained(batch, labels=batch).loss.item()
    assert after < 0.5 * before, (before, after)


def test_an_uncaught_exception_on_one_rank_ends_every_rank():
    done = subprocess.run([os.path.join(ROOT, "tools", "mpirun.sh"), "2", sys.executable,
                           os.path.join(WORKERS, "fail_on_rank1.py")],
                          capture_output=True, text=True, timeout=120, env=clean_env())
    # Rank 0 waits in the step's collectives for rank 1, which never comes:
    # without the abort this run would hang until the timeout fails the
    # test. (Open MPI's own "MPI_ABORT was invoked" notice is not checked:
    # it sometimes fails to print while the job is being killed.)
    assert done.returncode != 0
    assert "ValueError: deliberate failure on rank 1" in done.stdout + done.stderr


def test_the_command_and_the_package_carry_one_version():
    done = subprocess.run([MEMWALL, "--version"], capture_output=True, text=True)
    assert done.returncode == 0
    with open(os.path.join(ROOT, "python", "pyproject.toml")) as f:
        package = re.search(r'^version = "([^"]+)"$', f.read(), re.M).group(1)
    assert done.stdout.startswith("memwall %s, " % package)


def test_torch_distributed_initialised_from_mpis_ranks(tmp_path):
    """The README's combination: mpirun starts the job, the script
    initialises torch.distributed from MPI's rank and size; the engine's
    ranks are torch's, and data-parallel training leaves the two ranks'
    weights bit-identical (each trained on its own data)."""
    from conftest import run_ranks
    results = run_ranks(2, "torch_distributed.py", tmp_path / "out", tmp_path / "rendezvous")
    assert [r["torch"] for r in results] == [[0, 2], [1, 2]]
    assert [r["memwall"] for r in results] == [[0, 2], [1, 2]]
    assert results[0]["weights"] == results[1]["weights"]
    assert len(results[0]["weights"]) == 8 * 16


def test_torch_distributed_without_an_mpi_job_is_refused(tmp_path):
    """Two processes started as torchrun starts them (no MPI job: each is
    MPI's only rank) and joined by torch.distributed: the ZeroOptimizer
    refuses at construction on both, naming both worlds, rather than
    training two unrelated single-rank copies."""
    worker = os.path.join(WORKERS, "torch_distributed.py")
    out, rendezvous = tmp_path / "out", tmp_path / "rendezvous"
    procs = [subprocess.Popen([sys.executable, worker, str(out), str(rendezvous), str(r), "2"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=clean_env()) for r in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    import json
    for r in range(2):
        with open("%s.rank%d" % (out, r)) as f:
            result = json.load(f)
        assert result["error"] == (
            "torch.distributed is rank %d of 2 and MPI, which memwall's collectives run "
            "among, rank 0 of 1: launch the job with mpirun (or memwall launch) and initialise "
            "torch.distributed from MPI's ranks (README: \"Launchers\"); torchrun alone starts "
            "no MPI job" % r)
