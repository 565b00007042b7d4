"""Test macros: memwall_test (one process) and mpi_test (N real processes).

With need_gpu = True the binary reports its cases as skipped when no GPU is
present, and the targets are left out of --config=nocuda builds.
"""

load("//third_party:cuda.bzl", "INCOMPATIBLE_WITHOUT_CUDA")

def _main(mpi, need_gpu):
    name = ("mpi_" if mpi else "") + ("gpu_" if need_gpu else "") + "test_main"
    return "//tests/support:" + name

def memwall_test(name, srcs, deps = [], need_gpu = False, **kwargs):
    """A Catch2 test binary with memwall's counting main."""
    kwargs.setdefault("size", "small")
    native.cc_test(
        name = name,
        srcs = srcs,
        deps = deps + [_main(False, need_gpu)],
        target_compatible_with = INCOMPATIBLE_WITHOUT_CUDA if need_gpu else [],
        **kwargs
    )

def mpi_test(name, srcs, ranks, deps = [], tags = [], need_gpu = False, **kwargs):
    """A Catch2 test binary run under `mpirun -np R` for each R in `ranks`.

    Creates `<name>_bin` and one sh_test `<name>_np<R>` per rank count.
    """
    binary = name + "_bin"
    compatible = INCOMPATIBLE_WITHOUT_CUDA if need_gpu else []
    native.cc_binary(
        name = binary,
        srcs = srcs,
        deps = deps + [_main(True, need_gpu)],
        testonly = True,
        target_compatible_with = compatible,
        **kwargs
    )
    for r in ranks:
        native.sh_test(
            name = "%s_np%d" % (name, r),
            srcs = ["//tools:mpirun.sh"],
            args = [str(r), "$(location :%s)" % binary],
            data = [":" + binary],
            tags = tags + ["mpi"],
            # 300 s: several ranks on a 2-core machine, maybe beside another
            # busy process, need headroom that "small" (60 s) lacks.
            size = "medium",
            target_compatible_with = compatible,
        )
