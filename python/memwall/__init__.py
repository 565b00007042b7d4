"""memwall for Python: the engine facade (memwall._memwall) and, in
memwall.torch, a torch.optim.Optimizer that hands a PyTorch model's
optimizer step to memwall's ZeRO engine.

The extension links MPI; its libraries are loaded with RTLD_GLOBAL so that
Open MPI's plugins, which it opens itself, find MPI's symbols when the
interpreter runs under mpirun (as mpi4py does).
"""
import os as _os
import sys as _sys

_flags = _sys.getdlopenflags()
_sys.setdlopenflags(_flags | _os.RTLD_GLOBAL)
try:
    from memwall._memwall import Engine, Error, Parameter  # noqa: F401
finally:
    _sys.setdlopenflags(_flags)

__all__ = ["Engine", "Error", "Parameter"]
