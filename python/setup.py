"""Builds memwall's extension with Bazel for `pip install ./python` (the
checkout's Bazel build, as tools/python_env.sh does) and packages it with
the Python glue as a platform wheel."""
import os
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class BuildWithBazel(build_py):
    def run(self):
        flags = [] if os.access("/usr/local/cuda/bin/nvcc", os.X_OK) else ["--config=nocuda"]
        subprocess.check_call(["bazel", "build"] + flags + ["//python:_memwall.so"], cwd=ROOT)
        super().run()
        target = os.path.join(self.build_lib, "memwall")
        os.makedirs(target, exist_ok=True)
        shutil.copyfile(os.path.join(ROOT, "bazel-bin", "python", "_memwall.so"),
                        os.path.join(target, "_memwall.so"))


class BinaryDistribution(Distribution):
    """The wheel carries a compiled extension: platform-specific."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithBazel}, distclass=BinaryDistribution)
