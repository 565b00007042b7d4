"""memwall for Python: the engine facade (memwall._memwall) and, in
memwall.torch, a torch.optim.Optimizer that hands a PyTorch model's
optimizer step to memwall's ZeRO engine.

torch, when installed, is imported before the extension: both link CUDA
libraries of the same sonames (libnccl.so.2, libcublas.so.13), which a
process loads once, and torch's wheel needs its own, newer builds (memwall
uses a subset of their API, so it runs on them too). Imported the other
way round, torch would fail to load with an undefined NCCL symbol.

An exception that nobody catches ends every rank of a multi-rank job (after
its traceback is printed), as an error in the memwall command does: the
other ranks may be waiting in a collective this one will never join.
"""
import os as _os
import sys as _sys
import warnings as _warnings

try:
    import torch as _torch  # noqa: F401
except ImportError:
    pass

from memwall._memwall import (  # noqa: E402,F401
    Engine, Error, Parameter, Profiler, abort_ranks, blas_description)
from memwall import _memwall  # noqa: E402
from memwall._join import join_torch_ranks as _join_torch_ranks  # noqa: E402
# Error's subclasses by the engine's status code, each also the Python
# exception it means: InvalidArgumentError is a ValueError, NotFoundError a
# FileNotFoundError, OutOfMemoryError a MemoryError, DeadlineExceededError
# (a collective some rank never joined) a TimeoutError.
from memwall._memwall import (  # noqa: E402,F401
    DeadlineExceededError, InvalidArgumentError, NotFoundError, OutOfMemoryError)
from memwall._memwall import better_blas_core as _better_blas_core  # noqa: E402
from memwall._memwall import choose_blas_core as _choose_blas_core  # noqa: E402

# On a CPU OpenBLAS does not know, it loaded (with the extension) its
# generic kernels; memwall switches it in place to the kernels the CPU runs
# (Note in kernels/cpu/blas_core.h), before anything here multiplies a
# matrix. The variables that records go into os.environ too, so that child
# processes (mpirun, subprocess) inherit the choice.
_os.environ.update(_choose_blas_core())
# An OpenBLAS that cannot switch in place (not a DYNAMIC_ARCH build) is
# named, with the setting that fixes it.
_core = _better_blas_core()
if _core and "OPENBLAS_CORETYPE" not in _os.environ:
    _warnings.warn(
        "memwall: OpenBLAS does not know this CPU and runs its generic kernels (host "
        "backend GEMMs several times slower); start Python with OPENBLAS_CORETYPE=%s"
        % _core, RuntimeWarning, stacklevel=2)


def rank():
    """This process's rank among memwall's ranks: MPI's (0 of 1 without a
    launcher). Under torchrun (no MPI job; torch.distributed initialised
    with several ranks, or torchrun's RANK and WORLD_SIZE) the processes
    first join one MPI world, ranks as torch's (collective the first time;
    memwall._join)."""
    _join_torch_ranks()
    return _memwall.rank()


def world_size():
    """The number of memwall's ranks (as rank() says)."""
    _join_torch_ranks()
    return _memwall.world_size()


_previous_hook = _sys.excepthook


def _abort_on_uncaught(kind, value, traceback):
    _previous_hook(kind, value, traceback)
    abort_ranks(1)


_sys.excepthook = _abort_on_uncaught

__all__ = ["Engine", "Error", "Parameter"]
