"""memwall's ranks under torchrun: a job started without mpirun.

memwall's collectives run among MPI's ranks. torchrun starts each process
on its own, an MPI singleton (rank 0 of 1), and initialises
torch.distributed among them. Where torch.distributed is initialised with
several ranks and this process is not part of an MPI job, the processes
join one MPI world, ranks as torch.distributed's, before memwall's first
use of MPI (memwall.rank(), memwall.world_size(), ZeroOptimizer): rank 0
starts Open MPI's ompi-server (singletons connect only through a server
they all reach; it ends with rank 0's process), hands its address and one
MPI port per rank over torch.distributed, and every rank joins
(`_memwall.join_world`). Under mpirun (or srun with PMIx) MPI's job is
taken as it is.
"""
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import time

_joined = False


def _die_with_parent():
    # PR_SET_PDEATHSIG: the server ends with the process that started it.
    ctypes.CDLL(None, use_errno=True).prctl(1, 15)


def _start_server():
    """ompi-server started, its address returned (RuntimeError naming it
    otherwise)."""
    exe = shutil.which("ompi-server")
    if exe is None:
        raise RuntimeError(
            "ompi-server: not found on PATH; processes started without mpirun (torchrun) join "
            "memwall's MPI world through Open MPI's ompi-server (Debian: openmpi-bin)")
    where = tempfile.mkdtemp(prefix="memwall-ompi-server-")
    uri_path, log_path = os.path.join(where, "uri"), os.path.join(where, "log")
    env = dict(os.environ)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    with open(log_path, "wb") as log:
        server = subprocess.Popen([exe, "--no-daemonize", "-r", uri_path], env=env,
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                  preexec_fn=_die_with_parent)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if os.path.exists(uri_path):
            with open(uri_path) as f:
                uri = f.read()
            if uri.endswith("\n"):
                return uri.strip()
        if server.poll() is not None:
            break
        time.sleep(0.02)
    server.kill()
    with open(log_path, errors="replace") as f:
        said = f.read().strip()
    raise RuntimeError("ompi-server (%s) gave no address within 60 s%s" % (
        exe, ": " + said if said else ""))


def _from_rank0(dist, make):
    """make() on rank 0, its value (or its error, raised) on every rank."""
    box = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = ("value", make())
        except Exception as e:  # every rank must leave the broadcast
            box[0] = ("error", "%s: %s" % (type(e).__name__, e))
    dist.broadcast_object_list(box, src=0)
    kind, value = box[0]
    if kind == "error":
        raise RuntimeError("memwall's MPI world under torch.distributed: rank 0: " + value)
    return value


def join_torch_ranks():
    """Joins torch.distributed's ranks into memwall's MPI world if they are
    not one MPI job already (see the module's text); collective over
    torch.distributed's ranks the first time."""
    global _joined
    if _joined:
        return
    torch = sys.modules.get("torch")
    if torch is None or not torch.distributed.is_available():
        return
    dist = torch.distributed
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    if "OMPI_COMM_WORLD_SIZE" in os.environ or "PMIX_RANK" in os.environ:
        return  # an MPI job: ZeroOptimizer checks the two agree
    from memwall import _memwall
    rank, size = dist.get_rank(), dist.get_world_size()
    os.environ["OMPI_MCA_pmix_server_uri"] = _from_rank0(dist, _start_server)
    ports = _from_rank0(dist, lambda: _memwall.open_join_ports(size))
    _memwall.join_world(rank, size, ports)
    _joined = True
