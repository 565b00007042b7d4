"""`import memwall` on a CPU OpenBLAS does not know switches OpenBLAS to the
kernels the CPU runs (Note in kernels/cpu/blas_core.h), as the memwall
command does, and never overrides the user's OPENBLAS_CORETYPE.

The unknown CPU is made real, not pretended: the child process loads
OpenBLAS with OPENBLAS_CORETYPE=Prescott (its generic kernel, what Debian's
0.3.21 falls back to on a processor newer than its table), then unsets the
variable before importing memwall, which finds that same OpenBLAS already
loaded and running Prescott with no user setting."""
import json
import os
import subprocess
import sys

import pytest

CHILD = r"""
import ctypes, json, os, subprocess, sys, warnings
import torch

blas = ctypes.CDLL("libopenblas.so.0")
blas.openblas_get_corename.restype = ctypes.c_char_p
core = lambda: blas.openblas_get_corename().decode()

def sgemm():
    # Small integers: every sum is exact, so any correct kernel set gives
    # torch's product bit for bit.
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-8, 8, (67, 45), generator=g).float()
    b = torch.randint(-8, 8, (45, 93), generator=g).float()
    c = torch.zeros(67, 93)
    f, i = ctypes.c_float, ctypes.c_int
    p = lambda t: ctypes.c_void_p(t.data_ptr())
    # cblas_sgemm(RowMajor, NoTrans, NoTrans, M, N, K, 1, A, K, B, N, 0, C, N)
    blas.cblas_sgemm(101, 111, 111, i(67), i(93), i(45), f(1.0), p(a), i(45), p(b), i(93),
                     f(0.0), p(c), i(93))
    return torch.equal(c, a @ b)

loaded, loaded_sgemm = core(), sgemm()
if sys.argv[1] == "unset":
    del os.environ["OPENBLAS_CORETYPE"]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import memwall
child = subprocess.run([sys.executable, "-c", "import os; print(os.getenv('OPENBLAS_CORETYPE'))"],
                       capture_output=True, text=True, check=True).stdout.strip()
print(json.dumps({"loaded": loaded, "loaded_sgemm": loaded_sgemm, "core": core(),
                  "sgemm": sgemm(), "description": memwall.blas_description(),
                  "child": child, "warnings": [str(w.message) for w in caught]}))
"""


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def expected_core(flags):
    """The newest OpenBLAS kernel set whose instructions the CPU has."""
    if {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"} <= flags:
        return "Cooperlake" if "avx512_bf16" in flags else "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    return "Sandybridge" if "avx" in flags else None


def run_child(mode):
    env = {k: v for k, v in os.environ.items()
           if k not in ("MEMWALL_BLAS_CORE_FROM", "MEMWALL_BLAS_PRETEND_DETECTED")}
    env["OPENBLAS_CORETYPE"] = "Prescott"
    done = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_import_switches_a_generic_openblas_to_the_cpus_kernels():
    better = expected_core(cpu_flags())
    if better is None:
        pytest.skip("this CPU has no kernel set better than OpenBLAS's generic one")
    result = run_child("unset")
    assert result["loaded"] == "Prescott" and result["loaded_sgemm"]
    assert result["core"] == better
    assert result["sgemm"]
    assert result["description"].endswith(
        "core %s (chosen by memwall from the CPU's instruction sets: OpenBLAS's detection "
        "gave Prescott)" % better)
    assert result["child"] == better
    assert result["warnings"] == []


def test_import_keeps_the_users_openblas_coretype():
    result = run_child("keep")
    assert result["core"] == "Prescott"
    assert result["description"].endswith("core Prescott (OPENBLAS_CORETYPE=Prescott set by "
                                          "the user)")
    assert result["child"] == "Prescott"
    assert result["warnings"] == []
