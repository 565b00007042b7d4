// Neural-network ops on any device, for the layers in models/: GEMM
// (OpenBLAS on host, cuBLAS on cuda) and the kernels of NnKernelTable
// (kernels/cpu/cpu_kernels.h, whose comments give each op's contract) with
// their CUDA twins. Same conventions as ops.h: work runs in `stream`'s
// order, meta computes nothing, pointers are memory of `device`, matrices
// are row-major f32, leading dimensions are row strides in elements.
#ifndef MEMWALL_KERNELS_NN_H_
#define MEMWALL_KERNELS_NN_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/device.h"

namespace memwall {
namespace kernels {

// C[m, n] = alpha * op(A) op(B) + beta * C, op(X) = X^T when trans_x; A is
// [m, k] after op, B [k, n] after op. beta 0 ignores C's contents. f32
// throughout (cuBLAS's default math: no TF32).
absl::Status Gemm(Device& device, Stream& stream, bool trans_a, bool trans_b, int64_t m,
                  int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

absl::Status GeluForward(Device& device, Stream& stream, const float* x, float* y, int64_t n);
absl::Status GeluBackward(Device& device, Stream& stream, const float* x, const float* dy,
                          float* dx, int64_t n);
absl::Status LayerNormForward(Device& device, Stream& stream, const float* x, const float* gamma,
                              const float* beta, int64_t rows, int64_t h, float* y,
                              float* stats);
absl::Status LayerNormBackward(Device& device, Stream& stream, const float* dy, const float* x,
                               const float* stats, const float* gamma, int64_t rows, int64_t h,
                               float* dx, float* dgamma, float* dbeta);
absl::Status CausalSoftmaxForward(Device& device, Stream& stream, float* x, int64_t matrices,
                                  int64_t s);
absl::Status CausalSoftmaxBackward(Device& device, Stream& stream, const float* probs, float* d,
                                   int64_t matrices, int64_t s);
absl::Status BroadcastRows(Device& device, Stream& stream, const float* b, int64_t rows,
                           int64_t cols, float* y);
absl::Status ColumnSum(Device& device, Stream& stream, const float* x, int64_t rows,
                       int64_t cols, float* sum);
// A tile of the vocabulary (memory-centric tiling of the embedding): wte
// [end - begin, h] holds the rows of tokens [begin, end) (0 and the
// vocabulary's size for the whole table). Forward writes out[r] = wte[id -
// begin] + wpe[r % seq] for the rows whose token lies in the tile and leaves
// the others alone, so the tiles in turn write every row once. Backward adds
// dout[r] into dwte[id - begin] for those rows, and into dwpe[r % seq] for
// every row unless dwpe is null (one tile of several adds it), rows in
// order: the tiles in turn add what the whole table's backward adds, in its
// order. kInvalidArgument for an empty or negative range.
// REQUIRES: ids checked by CheckIds against the vocabulary.
absl::Status EmbeddingForward(Device& device, Stream& stream, const float* ids, const float* wte,
                              int64_t begin, int64_t end, const float* wpe, int64_t rows,
                              int64_t seq, int64_t h, float* out);
absl::Status EmbeddingBackward(Device& device, Stream& stream, const float* ids, const float* dout,
                               int64_t rows, int64_t seq, int64_t h, int64_t begin, int64_t end,
                               float* dwte, float* dwpe);

// Writes dlogits (see NnKernelTable::cross_entropy) and returns the sum of
// the rows' losses, added in double in row order on the host. Waits for the
// stream; on cuda takes `rows` floats of workspace from the allocator.
// REQUIRES: targets checked by CheckIds against vocab. 0 on meta.
absl::StatusOr<double> CrossEntropy(Device& device, Stream& stream, const float* logits,
                                    const float* targets, int64_t rows, int64_t vocab,
                                    float scale, float* dlogits);

// Checks that ids[0 .. n) are integers in [0, limit); otherwise
// kInvalidArgument "<what> <index> is <value>; expected an id in
// 0..<limit - 1>" for the first bad one. Waits for the stream (on cuda the
// ids are copied to the host first). OK on meta.
absl::Status CheckIds(Device& device, Stream& stream, const float* ids, int64_t n, int64_t limit,
                      absl::string_view what);

}  // namespace kernels
}  // namespace memwall

#endif  // MEMWALL_KERNELS_NN_H_
