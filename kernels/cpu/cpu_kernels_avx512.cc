// The CPU kernels, element-wise and neural-network, built for the avx512 ISA
// (see BUILD.bazel for its flags).
#define MW_CPU_ISA_NAMESPACE avx512
#include "kernels/cpu/cpu_kernels_impl.h"
#include "kernels/cpu/nn_kernels_impl.h"
