// Byte-level training text: a file, or a built-in synthetic corpus so that
// `memwall train` runs with no download. Tokens are bytes (ids 0..255).
#ifndef MEMWALL_MODELS_CORPUS_H_
#define MEMWALL_MODELS_CORPUS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/trainer.h"
#include "runtime/device.h"

namespace memwall {

class ByteCorpus {
 public:
  // Reads a text file. Errors name the file: kNotFound if it cannot be
  // opened; kInvalidArgument if it is not a regular file (a device or a
  // pipe has no end to read to), has fewer than min_bytes bytes, or holds a
  // byte >= `vocab` (naming the first and its offset).
  static absl::StatusOr<ByteCorpus> FromFile(const std::string& path, int64_t min_bytes,
                                             int64_t vocab = 256);
  // English-like sentences from a small grammar, generated from `seed`:
  // learnable structure, identical on every rank.
  static ByteCorpus Synthetic(int64_t bytes, uint64_t seed);

  int64_t size() const { return static_cast<int64_t>(text_.size()); }
  const std::string& text() const { return text_; }

  // The micro-batch of `rank` at `step`: sequences [rank * sequences,
  // (rank + 1) * sequences) of the global batch, each a window of seq + 1
  // bytes at an offset drawn from (step, index in the global batch); input
  // [sequences, seq] and next-byte targets [sequences * seq], as f32 ids.
  // REQUIRES: size() > seq.
  absl::StatusOr<Batch> MakeBatch(Device& device, int rank, int64_t sequences, int64_t seq,
                                  int64_t step) const;

 private:
  explicit ByteCorpus(std::string text) : text_(std::move(text)) {}
  std::string text_;
};

}  // namespace memwall

#endif  // MEMWALL_MODELS_CORPUS_H_
