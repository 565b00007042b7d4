"""The memwall.torch part of the GPU bundle (tools/gpu_bundle.sh), rehearsed
on this machine as the issue's device script must be: tools/gpu_python_pack.sh
packs the objects Bazel compiled for the extension with its link line and
the headers memwall_module.cc includes; tools/gpu_python.sh compiles
memwall_module.cc for a given Python and links it as Bazel did (there: the
GPU image's Python 3.12; here: this suite's). The extension it built is the
one a fresh process imports from the packed package, and the packed
test_cuda.py passes with it (CPU mode: the host backend)."""
import os
import re
import subprocess
import sys

from conftest import ROOT, clean_env


def test_the_packed_extension_builds_imports_and_trains(tmp_path):
    pack = tmp_path / "py"
    done = subprocess.run([os.path.join(ROOT, "tools", "gpu_python_pack.sh"), str(pack)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    # The packed link line names the extension's own object and output
    # at the fixed names gpu_python.sh builds them under.
    params = (pack / "link" / "link.params").read_text().split("\n")
    assert params[params.index("-o") + 1] == "_memwall.so"
    assert "memwall_module.pic.o" in params
    built = subprocess.run([os.path.join(ROOT, "tools", "gpu_python.sh"), str(pack)],
                           capture_output=True, text=True, timeout=900,
                           env=dict(clean_env(), PYTHON=sys.executable))
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-3000:]
    assert built.stdout.strip().endswith("for Python %d.%d.%d" % sys.version_info[:3])
    env = dict(clean_env(), PYTHONPATH=str(pack / "package"), MEMWALL_TEST_DEVICE="cpu")
    where = subprocess.run(
        [sys.executable, "-c", "import memwall._memwall as m; print(m.__file__)"],
        capture_output=True, text=True, timeout=300, env=env)
    assert where.stdout.strip() == str(pack / "package" / "memwall" / "_memwall.so"), where.stderr
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/python/test_cuda.py", "-k", "test_matches_torch_adamw and f32"],
        capture_output=True, text=True, timeout=600, env=env, cwd=str(pack))
    assert tests.returncode == 0, tests.stdout[-3000:]
    assert re.search(r"^4 passed, \d+ deselected", tests.stdout, re.M), tests.stdout
