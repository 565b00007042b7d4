// The CPU kernels built for the avx2 ISA (see BUILD.bazel for its flags).
#define MW_CPU_ISA_NAMESPACE avx2
#include "kernels/cpu/cpu_kernels_impl.h"
