"""Launching Python training like every memwall job: the README's example
under `memwall launch --ranks 2`, and a failure on one rank ending them all."""
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, WORKERS, clean_env, torchrun, torchrun_ranks

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


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
def test_an_uncaught_exception_on_one_rank_ends_every_rank(launcher):
    if launcher == "mpirun":
        done = subprocess.run([os.path.join(ROOT, "tools", "mpirun.sh"), "2", sys.executable,
                               os.path.join(WORKERS, "fail_on_rank1.py")],
                              capture_output=True, text=True, timeout=120, env=clean_env())
    else:  # the joined world's MPI_Abort, or torchrun ending the other worker
        done = torchrun(2, "fail_on_rank1.py", "unused", timeout=120)
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


def _trained_by_torch(world):
    """The worker's model after its 3 steps as torch trains it on one
    process: AdamW on the mean loss over all ranks' batches (what
    data-parallel averaging computes)."""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    data = [torch.Generator().manual_seed(1 + r) for r in range(world)]
    for _ in range(3):
        x = torch.cat([torch.randn(4, 8, generator=g) for g in data])
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().reshape(-1).tolist() for p in model.parameters()]


def _largest_difference(a, b):
    return max(abs(x - y) for pa, pb in zip(a, b) for x, y in zip(pa, pb))


def test_torch_distributed_initialised_from_mpis_ranks(tmp_path):
    """The README's combination: mpirun starts the job, the script
    initialises torch.distributed from MPI's rank and size; the engine's
    ranks are torch's, and data-parallel training leaves the two ranks'
    weights bit-identical and equal to torch's AdamW on the whole batch."""
    from conftest import run_ranks
    results = run_ranks(2, "torch_distributed.py", tmp_path / "out", tmp_path / "rendezvous")
    assert [r["torch"] for r in results] == [[0, 2], [1, 2]]
    assert [r["memwall"] for r in results] == [[0, 2], [1, 2]]
    assert results[0]["weights"] == results[1]["weights"]
    assert [len(w) for w in results[0]["weights"]] == [8 * 16, 16, 16, 1]
    assert _largest_difference(results[0]["weights"], _trained_by_torch(2)) < 1e-6


@pytest.mark.parametrize("ranks", [2, 4])
def test_torchrun_alone_joins_its_ranks_into_memwalls_world(tmp_path, ranks):
    """torchrun starts each process as its own MPI singleton; memwall joins
    them into one MPI world, ranks as torch.distributed's, on one node
    (same host name): stage 3 trains every rank to the same weights, those
    of torch's AdamW on the whole batch, and on 2 ranks to the bits of
    the same job under mpirun."""
    results = torchrun_ranks(ranks, "torch_distributed.py", tmp_path / "out",
                             tmp_path / "rendezvous", "--stage", "3")
    assert [r["torch"] for r in results] == [[r, ranks] for r in range(ranks)]
    assert [r["memwall"] for r in results] == [[r, ranks] for r in range(ranks)]
    assert [r["nodes"] for r in results] == [1] * ranks
    assert all(r["weights"] == results[0]["weights"] for r in results)
    assert _largest_difference(results[0]["weights"], _trained_by_torch(ranks)) < 1e-6
    if ranks == 2:
        from conftest import run_ranks
        under_mpirun = run_ranks(2, "torch_distributed.py", tmp_path / "mpi",
                                 tmp_path / "rendezvous", "--stage", "3")
        assert under_mpirun[0]["weights"] == results[0]["weights"]


def test_a_torch_distributed_world_without_mpi_or_torchrun_joins_over_its_broadcast(tmp_path):
    """Two plain processes (neither mpirun nor torchrun) that initialise
    torch.distributed themselves (a file rendezvous): memwall joins them
    over torch.distributed's broadcast, and stage 3 trains as torch's AdamW
    on the whole batch, to the bits of the torchrun-launched job."""
    worker = os.path.join(WORKERS, "torch_distributed.py")
    out, rendezvous = tmp_path / "out", tmp_path / "rendezvous"
    procs = [subprocess.Popen([sys.executable, worker, str(out), str(rendezvous), "--stage", "3",
                               "--as", str(r), "2"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=clean_env()) for r in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    results = []
    for r in range(2):
        with open("%s.rank%d" % (out, r)) as f:
            results.append(json.load(f))
    assert [r["memwall"] for r in results] == [[0, 2], [1, 2]]
    assert results[0]["weights"] == results[1]["weights"]
    assert _largest_difference(results[0]["weights"], _trained_by_torch(2)) < 1e-6
    under_torchrun = torchrun_ranks(2, "torch_distributed.py", tmp_path / "torchrun",
                                    tmp_path / "rendezvous2", "--stage", "3")
    assert under_torchrun[0]["weights"] == results[0]["weights"]


def test_torchrun_without_ompi_server_says_what_is_missing(tmp_path):
    """The join needs Open MPI's ompi-server on rank 0: without it every
    rank fails with rank 0's reason, none waits forever."""
    env = dict(clean_env(), PATH=str(tmp_path))  # a directory without ompi-server
    done = torchrun(2, "torch_distributed.py", tmp_path / "out", tmp_path / "rendezvous",
                    env=env)
    assert done.returncode != 0
    said = ("RuntimeError: memwall's MPI world under torch.distributed: rank 0: RuntimeError: "
            "ompi-server: not found on PATH; processes started without mpirun (torchrun) join "
            "memwall's MPI world through Open MPI's ompi-server (Debian: openmpi-bin)")
    assert (done.stdout + done.stderr).count(said) == 2, done.stderr[-3000:]


def test_an_ompi_server_that_gives_no_address_is_named_with_what_it_said(tmp_path):
    """An ompi-server that exits at once (here a stand-in that prints a
    line and fails): every rank fails with rank 0's reason, the server's
    own words included, without waiting out the 60 s."""
    fake = tmp_path / "ompi-server"
    fake.write_text("#!/bin/sh\necho 'cannot open a listening socket' >&2\nexit 1\n")
    fake.chmod(0o755)
    env = dict(clean_env(), PATH="%s:%s" % (tmp_path, os.environ["PATH"]))
    done = torchrun(2, "torch_distributed.py", tmp_path / "out", tmp_path / "rendezvous",
                    env=env, timeout=50)
    assert done.returncode != 0
    said = ("RuntimeError: memwall's MPI world under torch.distributed: rank 0: RuntimeError: "
            "ompi-server (%s) gave no address within 60 s: cannot open a listening socket" % fake)
    assert (done.stdout + done.stderr).count(said) == 2, done.stderr[-3000:]


def _rank0_error(worker, tmp_path):
    """The error WORKER's rank 0 wrote (OUT.rank0) under torchrun on 2
    ranks, every rank having exited 0."""
    done = torchrun(2, worker, tmp_path / "out")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open("%s.rank0" % (tmp_path / "out")) as f:
        return json.load(f)["error"]


def test_a_collective_only_rank_0_makes_under_torchrun_times_out(tmp_path):
    """The joined world's collectives keep their timeout: rank 0 alone in
    state_dict() fails after 3 s rather than waiting for rank 1. Which rank
    is missing is not known there: MPI offers no one-sided window across
    separately started processes (the board, runtime/mpi_communicator.h)."""
    assert _rank0_error("torchrun_timeout.py", tmp_path) == (
        "DEADLINE_EXCEEDED: state_dict() is collective: every rank calls it, in the same "
        "order, and not every rank did (MPI_Iallreduce (agreement check) on rank 0 of 2: not "
        "every rank joined within 3s (a rank failed, is stuck or stopped calling collectives); "
        "which ranks never arrived is unknown (MPI offered no one-sided window to read them); "
        "the communicator is unusable now: end the job and resume from the last checkpoint)")


def test_a_rank_that_never_reaches_memwall_under_torchrun_is_named(tmp_path):
    """torchrun's store as the join's channel: rank 0 waits for the other
    ranks' arrival at most the ZeroOptimizer's collective_timeout (3 s),
    then fails naming rank 1, rather than waiting forever in MPI's accept."""
    assert _rank0_error("torchrun_absent_rank.py", tmp_path) == (
        "TimeoutError: memwall's MPI world under torch.distributed: rank 0: TimeoutError: rank 1 "
        "of 2 did not reach memwall within 3 s: the first memwall call (memwall.rank(), "
        "ZeroOptimizer) joins torchrun's ranks, and every rank makes it")


def test_a_torch_distributed_world_other_than_mpis_is_refused(tmp_path):
    """Under mpirun, each process initialising torch.distributed as a world
    of its own (rank 0 of 1): the ZeroOptimizer refuses at construction on
    both, naming both worlds, rather than training with ranks torch and
    memwall disagree on."""
    from conftest import run_ranks
    results = run_ranks(2, "torch_distributed.py", tmp_path / "out", tmp_path / "rendezvous",
                        "--as", "0", "1")
    for r in range(2):
        assert results[r]["error"] == (
            "torch.distributed is rank 0 of 1 and MPI, which memwall's collectives run among, "
            "rank %d of 2: under mpirun (or memwall launch) initialise torch.distributed from "
            "MPI's ranks, or launch with torchrun alone (README: \"Launchers\")" % r)
