#!/usr/bin/env bash
# Runs BINARY as NP real MPI processes on this machine:
#   tools/mpirun.sh NP BINARY [ARGS...]
# Used by the multi-rank tests (an sh_test per rank count) and tools/train.sh.
# OpenMPI's session directory goes to a short path under /tmp (Bazel's test
# temp dirs are too long for its Unix sockets); shared-memory transport
# without single-copy (CMA needs ptrace rights containers often lack).
set -euo pipefail
np=$1
binary=$2
shift 2
session=$(mktemp -d /tmp/memwall-mpi.XXXXXX)
trap 'rm -rf "$session"' EXIT
export TMPDIR=$session
export OMPI_MCA_btl=self,vader
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1
# One BLAS thread per rank unless asked: ranks already share the cores.
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
exec mpirun --allow-run-as-root --oversubscribe -np "$np" "$binary" "$@"
