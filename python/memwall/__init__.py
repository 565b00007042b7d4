"""memwall for Python: the engine facade (memwall._memwall) and, in
memwall.torch, a torch.optim.Optimizer that hands a PyTorch model's
optimizer step to memwall's ZeRO engine.

torch, when installed, is imported before the extension: both link CUDA
libraries of the same sonames (libnccl.so.2, libcublas.so.13), which a
process loads once, and torch's wheel needs its own, newer builds (memwall
uses a subset of their API, so it runs on them too). Imported the other
way round, torch would fail to load with an undefined NCCL symbol.
"""
try:
    import torch as _torch  # noqa: F401
except ImportError:
    pass

from memwall._memwall import Engine, Error, Parameter  # noqa: E402,F401

__all__ = ["Engine", "Error", "Parameter"]
