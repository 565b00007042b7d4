#include "models/corpus.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace memwall {

absl::StatusOr<ByteCorpus> ByteCorpus::FromFile(const std::string& path, int64_t min_bytes,
                                                int64_t vocab) {
  // A regular file has a size to read exactly; a device (/dev/zero) or a
  // pipe would be read without end.
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat("data file ", path, ": cannot be opened"));
  }
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data file ", path, ": not a regular file; expected a text file"));
  }
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("data file ", path, ": cannot be opened"));
  if (static_cast<int64_t>(size) < min_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("data file ", path, ": ", size,
                                                   " bytes; expected at least ", min_bytes,
                                                   " (one sequence plus its next byte)"));
  }
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("data file ", path, ": cannot be opened"));
  void* mapped = size > 0 ? ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
  const int mmap_errno = errno;
  ::close(fd);  // the mapping keeps the file
  if (mapped == MAP_FAILED) {
    return absl::NotFoundError(absl::StrCat("data file ", path,
                                            ": cannot be mapped: ", std::strerror(mmap_errno)));
  }
  std::shared_ptr<const void> storage(mapped, [size](const void* p) {
    if (p != nullptr) ::munmap(const_cast<void*>(p), size);
  });
  const std::string_view bytes(static_cast<const char*>(mapped), size);
  // Checked now rather than when training reaches the byte, steps later
  // (every byte is a token of a 256-token vocabulary). Chunk by chunk,
  // each dropped from the process after it is read, so the check's
  // resident memory stays one chunk.
  constexpr size_t kScanChunk = size_t{64} << 20;  // bytes; a multiple of the page size
  for (size_t begin = 0; vocab < 256 && begin < bytes.size(); begin += kScanChunk) {
    const size_t end = std::min(bytes.size(), begin + kScanChunk);
    for (size_t i = begin; i < end; ++i) {
      const int64_t token = static_cast<uint8_t>(bytes[i]);
      if (token >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat(
            "data file ", path, ": byte ", token, " at offset ", i,
            " is outside the model's vocabulary of ", vocab, " tokens (byte-level: ids 0..",
            vocab - 1, ")"));
      }
    }
    ::madvise(static_cast<char*>(mapped) + begin, end - begin, MADV_DONTNEED);
  }
  // Batches read windows anywhere in the file.
  ::madvise(mapped, size, MADV_RANDOM);
  return ByteCorpus(std::move(storage), bytes);
}

ByteCorpus ByteCorpus::Synthetic(int64_t bytes, uint64_t seed) {
  static const char* const kSubjects[] = {"the model", "a rank", "the optimizer", "each layer",
                                          "the allocator", "the planner", "a gradient"};
  static const char* const kVerbs[] = {"shards", "gathers", "reduces", "frees", "keeps",
                                       "recomputes", "offloads"};
  static const char* const kObjects[] = {"the parameters", "its activations", "every bucket",
                                         "the optimizer states", "a checkpoint", "the memory"};
  static const char* const kEnds[] = {" before the step.", " after backward.", " on every rank.",
                                      " within the budget.", "."};
  std::mt19937_64 rng(seed);
  auto pick = [&rng](auto& list) { return list[rng() % (sizeof(list) / sizeof(list[0]))]; };
  std::string text;
  text.reserve(bytes + 64);
  while (static_cast<int64_t>(text.size()) < bytes) {
    // One draw per statement: C++ leaves the order of a call's argument
    // evaluation open, so a sentence built inside one call would differ
    // between compilers. Drawn last part first, the order GCC's build used
    // until this was pinned, so the corpus and recorded runs stay the same.
    const char* end = pick(kEnds);
    const char* object = pick(kObjects);
    const char* verb = pick(kVerbs);
    const char* subject = pick(kSubjects);
    absl::StrAppend(&text, subject, " ", verb, " ", object, end, "\n");
  }
  text.resize(bytes);
  auto storage = std::make_shared<const std::string>(std::move(text));
  return ByteCorpus(storage, *storage);
}

absl::StatusOr<Batch> ByteCorpus::MakeBatch(Device& device, int rank, int64_t sequences,
                                            int64_t seq, int64_t step) const {
  if (sequences < 1 || seq < 1 || sequences > std::numeric_limits<int64_t>::max() / seq) {
    return absl::InvalidArgumentError(absl::StrCat(
        "micro-batch: ", sequences, " sequences of ", seq,
        " tokens; expected both >= 1 and their product within 64 bits"));
  }
  const int64_t n = sequences * seq;
  // The device's room is checked (and an out-of-memory report made) before
  // any host memory of that size is touched.
  Batch b;
  MW_ASSIGN_OR_RETURN(b.input, Tensor::Empty(device, DType::kF32, {sequences, seq},
                                             MemoryCategory::kOther, "data.input"));
  MW_ASSIGN_OR_RETURN(b.target,
                      Tensor::Empty(device, DType::kF32, {n}, MemoryCategory::kOther, "data.target"));
  if (!device.holds_bytes()) return b;
  std::vector<float> input, target;
  {
    input.resize(n);
    target.resize(n);
    const uint64_t windows = static_cast<uint64_t>(size() - seq);
    for (int64_t j = 0; j < sequences; ++j) {
      const uint64_t global = static_cast<uint64_t>(rank * sequences + j);
      // splitmix64 of (step, sequence): a fixed, well-spread window per slot.
      uint64_t z = (static_cast<uint64_t>(step) << 32) ^ global;
      z += 0x9e3779b97f4a7c15ull;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      const int64_t offset = static_cast<int64_t>(z % windows);
      for (int64_t i = 0; i < seq; ++i) {
        input[j * seq + i] = float(uint8_t(text_[offset + i]));
        target[j * seq + i] = float(uint8_t(text_[offset + i + 1]));
      }
    }
  }
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device.CreateStream());
  MW_RETURN_IF_ERROR(device.CopyAsync(b.input.data(), input.data(), n * sizeof(float), *stream));
  MW_RETURN_IF_ERROR(device.CopyAsync(b.target.data(), target.data(), n * sizeof(float), *stream));
  MW_RETURN_IF_ERROR(stream->Synchronize());
  return b;
}

}  // namespace memwall
