// Byte-level training text: a file, or a built-in synthetic corpus so that
// `memwall train` runs with no download. Tokens are bytes (ids 0..255).
#ifndef MEMWALL_MODELS_CORPUS_H_
#define MEMWALL_MODELS_CORPUS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/trainer.h"
#include "runtime/device.h"

namespace memwall {

class ByteCorpus {
 public:
  // A text file, mapped read-only rather than read: a corpus of any size
  // costs address space, and only the pages batches touch stay resident
  // (the kernel may drop them again), so a 20 GB file trains in a small
  // process. The check below reads it once, sequentially. Errors name the
  // file: kNotFound if it cannot be opened or mapped; kInvalidArgument if
  // it is not a regular file (a device or a pipe has no end to read to),
  // has fewer than min_bytes bytes, or holds a byte >= `vocab` (naming the
  // first and its offset).
  static absl::StatusOr<ByteCorpus> FromFile(const std::string& path, int64_t min_bytes,
                                             int64_t vocab = 256);
  // English-like sentences from a small grammar, generated from `seed`:
  // learnable structure, identical on every rank.
  static ByteCorpus Synthetic(int64_t bytes, uint64_t seed);

  int64_t size() const { return static_cast<int64_t>(text_.size()); }
  // Valid while this corpus (or a copy of it) lives.
  std::string_view text() const { return text_; }

  // The micro-batch of `rank` at `step`: sequences [rank * sequences,
  // (rank + 1) * sequences) of the global batch, each a window of seq + 1
  // bytes at an offset drawn from (step, index in the global batch); input
  // [sequences, seq] and next-byte targets [sequences * seq], as f32 ids.
  // REQUIRES: size() > seq.
  absl::StatusOr<Batch> MakeBatch(Device& device, int rank, int64_t sequences, int64_t seq,
                                  int64_t step) const;

 private:
  // `text` lies in what `storage` keeps alive (a string, or a mapping).
  ByteCorpus(std::shared_ptr<const void> storage, std::string_view text)
      : storage_(std::move(storage)), text_(text) {}
  std::shared_ptr<const void> storage_;
  std::string_view text_;
};

}  // namespace memwall

#endif  // MEMWALL_MODELS_CORPUS_H_
