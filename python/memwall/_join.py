"""memwall's ranks under torchrun: a job started without mpirun.

memwall's collectives run among MPI's ranks. torchrun starts each process
on its own, an MPI singleton (rank 0 of 1). Where this process is not part
of an MPI job and torch.distributed is initialised with several ranks, or
torchrun started it as one of several (RANK, WORLD_SIZE) without
torch.distributed initialised (memwall.trainer and memwall.accelerator hide
the ranks from accelerate), the processes join one MPI world, ranks as
torch's, before memwall's first use of MPI (memwall.rank(),
memwall.world_size(), ZeroOptimizer): rank 0 starts Open MPI's ompi-server
(singletons connect only through a server they all reach; it ends with
rank 0's process), hands its address and one MPI port per rank to the
others (through torchrun's own key-value store, or over torch.distributed
for a job torchrun did not start), and every rank joins
(`_memwall.join_world`). Under mpirun (or
srun with PMIx) MPI's job is taken as it is.
"""
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

_joined = False


def _die_with_parent():
    # PR_SET_PDEATHSIG: the server ends (SIGTERM) when the thread that
    # started it does: the thread of memwall's first MPI use, the main one
    # in a training script.
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
                shutil.rmtree(where)  # the server keeps its log open, unlinked
                return uri.strip()
        if server.poll() is not None:
            break
        time.sleep(0.02)
    server.kill()
    with open(log_path, errors="replace") as f:
        said = f.read().strip()
    shutil.rmtree(where)
    raise RuntimeError("ompi-server (%s) gave no address within 60 s%s" % (
        exe, ": " + said if said else ""))


class _Broadcast:
    """Rank 0's values to every rank over the initialised torch.distributed."""

    def __init__(self, dist):
        self._dist = dist

    def arrive(self, rank, size, timeout):
        """Nothing: the broadcast waits for every rank (torch's timeout)."""

    def share(self, key, value):
        box = [value]
        self._dist.broadcast_object_list(box, src=0)
        return box[0]


class _AgentStore:
    """Rank 0's values to every rank through torchrun's key-value store (its
    agent's TCPStore at MASTER_ADDR:MASTER_PORT, which the workers reach as
    clients), under keys of memwall's own."""

    def __init__(self, torch):
        import datetime
        store = torch.distributed.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
            timeout=datetime.timedelta(seconds=600))
        self._store = torch.distributed.PrefixStore(
            "memwall_join/%s/" % os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"), store)

    def arrive(self, rank, size, timeout):
        """This rank's arrival recorded; on rank 0, every rank's awaited for
        `timeout` seconds (TimeoutError naming those that never came: rank 0
        would otherwise wait in MPI's accept, which has no timeout)."""
        import datetime
        self._store.set("arrived/%d" % rank, "")
        if rank != 0:
            return
        keys = ["arrived/%d" % r for r in range(1, size)]
        try:
            self._store.wait(keys, datetime.timedelta(seconds=timeout or 10**9))
        except Exception:  # torch's DistStoreError, whose text varies by version
            missing = [r for r in range(1, size) if not self._store.check([keys[r - 1]])]
            if not missing:
                raise
            raise TimeoutError(
                "%s %s of %d did not reach memwall within %g s: the first memwall call "
                "(memwall.rank(), ZeroOptimizer) joins torchrun's ranks, and every rank makes it"
                % ("rank" if len(missing) == 1 else "ranks",
                   ", ".join(str(r) for r in missing), size, timeout)) from None

    def share(self, key, value):
        if value is not None:
            self._store.set(key, json.dumps(value))
        return json.loads(self._store.get(key))


def _from_rank0(channel, rank, key, make):
    """make() on rank 0, its value (or its error, raised) on every rank."""
    said = None
    if rank == 0:
        try:
            said = [None, make()]
        except Exception as e:  # every rank must get an answer
            said = [type(e).__name__, str(e)]
    error, value = channel.share(key, said)
    if error is not None:
        text = "memwall's MPI world under torch.distributed: rank 0: %s: %s" % (error, value)
        raise TimeoutError(text) if error == "TimeoutError" else RuntimeError(text)
    return value


def _torch_world(torch):
    """(rank, size, the channel to share rank 0's values over) of a
    torch-launched job this process is one of several ranks of, or None.
    Under torchrun the channel is its store, where the join's timeout
    holds, whether or not torch.distributed is initialised; elsewhere
    torch.distributed's broadcast (its process group's timeout)."""
    dist = torch.distributed
    if not dist.is_available():
        return None
    initialised = dist.is_initialized()
    if initialised:
        rank, size = dist.get_rank(), dist.get_world_size()
    elif "TORCHELASTIC_RUN_ID" in os.environ:
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    else:
        return None
    if size == 1:
        return None
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return rank, size, _AgentStore(torch)
    if initialised:
        return rank, size, _Broadcast(dist)
    raise RuntimeError(
        "torchrun started this process as rank %d of %d, and torch.distributed is not "
        "initialised: memwall joins torchrun's ranks over torch.distributed, or over "
        "torchrun's own store where the rendezvous gives one (TORCHELASTIC_USE_AGENT_STORE "
        "is %r here); call torch.distributed.init_process_group() before memwall"
        % (rank, size, os.environ.get("TORCHELASTIC_USE_AGENT_STORE")))


def join_torch_ranks(timeout=600.0):
    """Joins a torch-launched job's ranks into memwall's MPI world if they
    are not one MPI job already (see the module's text); collective over
    those ranks the first time, waiting for them at most `timeout` seconds
    (None: forever) under torchrun (_torch_world)."""
    global _joined
    if _joined:
        return
    torch = sys.modules.get("torch")
    if torch is None:
        return
    if "OMPI_COMM_WORLD_SIZE" in os.environ or "PMIX_RANK" in os.environ:
        return  # an MPI job: ZeroOptimizer checks that torch.distributed agrees
    world = _torch_world(torch)
    if world is None:
        return
    from memwall import _memwall
    rank, size, channel = world

    def start():
        channel.arrive(rank, size, timeout)
        return _start_server()
    if rank != 0:
        channel.arrive(rank, size, timeout)
    os.environ["OMPI_MCA_pmix_server_uri"] = _from_rank0(channel, rank, "server", start)
    ports = _from_rank0(channel, rank, "ports", lambda: _memwall.open_join_ports(size))
    _memwall.join_world(rank, size, ports)
    _joined = True
