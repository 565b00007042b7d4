"""Test macros: memwall_test (one process) and mpi_test (N real processes)."""

def memwall_test(name, srcs, deps = [], **kwargs):
    """A Catch2 test binary with memwall's counting main."""
    native.cc_test(
        name = name,
        srcs = srcs,
        deps = deps + ["//tests/support:test_main"],
        **kwargs
    )

def mpi_test(name, srcs, ranks, deps = [], tags = [], **kwargs):
    """A Catch2 test binary run under `mpirun -np R` for each R in `ranks`.

    Creates `<name>_bin` and one sh_test `<name>_np<R>` per rank count.
    """
    binary = name + "_bin"
    native.cc_binary(
        name = binary,
        srcs = srcs,
        deps = deps + ["//tests/support:mpi_test_main"],
        testonly = True,
        **kwargs
    )
    for r in ranks:
        native.sh_test(
            name = "%s_np%d" % (name, r),
            srcs = ["//tests:mpi_test.sh"],
            args = [str(r), "$(location :%s)" % binary],
            data = [":" + binary],
            tags = tags + ["mpi"],
        )
