"""Helpers for the Python front end's tests: multi-rank runs are real MPI
processes (tools/mpirun.sh NP python WORKER ...), never ranks faked in one
process."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKERS = os.path.join(ROOT, "tests", "python", "workers")


def clean_env():
    """This process's environment without what Open MPI added to it when an
    in-process test started MPI (a singleton rank): a child mpirun that saw
    those would take itself for that rank's child and fail."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "OPAL_"))}


def run_ranks(ranks, worker, out, *args, timeout=600):
    """Runs WORKER on `ranks` MPI processes with OUT and ARGS; returns each
    rank's JSON result (OUT.rank<r>), after checking every rank exited 0."""
    command = [os.path.join(ROOT, "tools", "mpirun.sh"), str(ranks), sys.executable,
               os.path.join(WORKERS, worker), str(out)] + [str(a) for a in args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env=clean_env())
    assert done.returncode == 0, "%s failed (%d):\n%s\n%s" % (
        " ".join(command), done.returncode, done.stdout[-4000:], done.stderr[-4000:])
    results = []
    for r in range(ranks):
        with open("%s.rank%d" % (out, r)) as f:
            results.append(json.load(f))
    return results


def torchrun(ranks, worker, out, *args, env=None, timeout=600):
    """Runs WORKER under torch's own launcher (torchrun --standalone: no MPI
    job; memwall joins the ranks) with OUT and ARGS; returns the finished
    process."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", str(ranks), os.path.join(WORKERS, worker),
               str(out)] + [str(a) for a in args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env=env or clean_env())


def torchrun_ranks(ranks, worker, out, *args, timeout=600):
    """As run_ranks, under torchrun."""
    done = torchrun(ranks, worker, out, *args, timeout=timeout)
    assert done.returncode == 0, "torchrun %s failed (%d):\n%s\n%s" % (
        worker, done.returncode, done.stdout[-4000:], done.stderr[-4000:])
    results = []
    for r in range(ranks):
        with open("%s.rank%d" % (out, r)) as f:
            results.append(json.load(f))
    return results


@pytest.fixture
def ranks_runner(tmp_path):
    def run(ranks, worker, *args, name="result"):
        return run_ranks(ranks, worker, tmp_path / name, *args)
    return run
