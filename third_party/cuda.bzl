"""cuda_library: compiles .cu files with nvcc into objects a cc_library links.

Each .cu file becomes one genrule running nvcc (sm_80 and sm_90 code plus
compute_90 PTX, so newer GPUs JIT it). The objects, the cudart_static
runtime and `deps` form a cc_library. Under --config=nocuda the target is
incompatible and skipped by `bazel build //...`.

Contract for .cu sources: include only the CUDA headers, the C++ standard
library and the project headers named in `hdrs` or `textual_hdrs` (nvcc runs
outside Bazel's C++ rules, so dependencies' headers are not visible to it).
Keep Abseil out of .cu files: expose plain functions returning cudaError_t
and convert to absl::Status in a .cc file.
"""

NVCC = "/usr/local/cuda/bin/nvcc"

# Floating-point contraction is off so the CUDA twins round exactly as the
# CPU kernels (which build with -ffp-contract=off) do.
NVCC_FLAGS = " ".join([
    "-std=c++17",
    "-O3",
    "--fmad=false",
    "-Xcompiler=-fPIC",
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
])

# For C++ targets with CUDA paths behind `#if MEMWALL_HAS_CUDA`.
CUDA_LOCAL_DEFINES = select({
    "//third_party:nocuda": [],
    "//conditions:default": ["MEMWALL_HAS_CUDA=1"],
})

INCOMPATIBLE_WITHOUT_CUDA = select({
    "//third_party:nocuda": ["@platforms//:incompatible"],
    "//conditions:default": [],
})

def cuda_library(name, srcs, hdrs = [], textual_hdrs = [], deps = [], **kwargs):
    objs = []
    for src in srcs:
        obj = "_%s_%s.o" % (name, src.replace("/", "_").replace(".cu", ""))
        native.genrule(
            name = obj + "_nvcc",
            srcs = [src] + hdrs + textual_hdrs,
            outs = [obj],
            cmd = "%s %s -I. -I$(GENDIR) -c $(location %s) -o $@" % (NVCC, NVCC_FLAGS, src),
            target_compatible_with = INCOMPATIBLE_WITHOUT_CUDA,
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        textual_hdrs = textual_hdrs,
        # A select, so --config=nocuda never fetches @cuda (incompatible
        # targets still have their dependencies analysed).
        deps = deps + select({
            "//third_party:nocuda": [],
            "//conditions:default": ["@cuda//:cudart_static"],
        }),
        target_compatible_with = INCOMPATIBLE_WITHOUT_CUDA,
        **kwargs
    )
