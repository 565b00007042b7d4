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
import sys as _sys

try:
    import torch as _torch  # noqa: F401
except ImportError:
    pass

from memwall._memwall import Engine, Error, Parameter, abort_ranks  # noqa: E402,F401

_previous_hook = _sys.excepthook


def _abort_on_uncaught(kind, value, traceback):
    _previous_hook(kind, value, traceback)
    abort_ranks(1)


_sys.excepthook = _abort_on_uncaught

__all__ = ["Engine", "Error", "Parameter"]
