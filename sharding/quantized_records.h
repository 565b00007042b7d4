// Block-quantized parts as ZeRO++'s collectives move them (qwZ's parameter
// gathers, qgZ's gradient all-to-alls): a part of `n` elements travels as
// one record of 4-byte words, its n int8 levels (padded to a word) then its
// blocks' f32 scales (kernels/ops.h QuantizeInt8). Records of the same n
// lie one after another in a buffer, so a collective moves them as f32
// words (it only moves bytes).
#ifndef MEMWALL_SHARDING_QUANTIZED_RECORDS_H_
#define MEMWALL_SHARDING_QUANTIZED_RECORDS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/ops.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace memwall {

class QuantizedRecords {
 public:
  QuantizedRecords(int64_t n, int64_t block)
      : n_(n), block_(block), level_words_((n + 3) / 4),
        words_(level_words_ + (n + block - 1) / block) {}

  // 4-byte words of one record.
  int64_t words() const { return words_; }

  // Record k of `base` from `x`'s n elements of `dtype`.
  absl::Status Quantize(Device& device, Stream& stream, const void* x, DType dtype, void* base,
                        int k) const {
    return kernels::QuantizeInt8(device, stream, x, dtype, n_, block_, levels(base, k),
                                 scales(base, k));
  }
  // Record k of `base` dequantized into `out`'s n elements of `dtype`.
  absl::Status Dequantize(Device& device, Stream& stream, void* base, int k, void* out,
                          DType dtype) const {
    return kernels::DequantizeInt8(device, stream, levels(base, k), scales(base, k), n_, block_,
                                   out, dtype);
  }

 private:
  char* record(void* base, int k) const { return static_cast<char*>(base) + k * words_ * 4; }
  int8_t* levels(void* base, int k) const { return reinterpret_cast<int8_t*>(record(base, k)); }
  float* scales(void* base, int k) const {
    return reinterpret_cast<float*>(record(base, k) + level_words_ * 4);
  }

  const int64_t n_, block_, level_words_, words_;
};

}  // namespace memwall

#endif  // MEMWALL_SHARDING_QUANTIZED_RECORDS_H_
