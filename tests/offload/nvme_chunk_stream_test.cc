// The NVMe tier's update pipeline: chunks of several slots through a few
// buffers, reads running ahead across slots, one sync for all, a failed
// write that commits nothing, and misuse named.
#include "offload/nvme_chunk_stream.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "catch2/catch.hpp"

namespace memwall {
namespace {

constexpr int64_t kBlock = NvmeStore::kAlignment;

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir ? dir : "/tmp";
}

// Aligned bytes, freed with the object.
struct Aligned {
  explicit Aligned(int64_t n) : data(static_cast<char*>(std::aligned_alloc(kBlock, n))) {}
  ~Aligned() { std::free(data); }
  char* data;
};

// Two slots of 3 and 2 blocks, committed with block i of slot s holding
// the byte 'a' + 8 * s + i.
struct TwoSlots {
  explicit TwoSlots(std::unique_ptr<NvmeStore> s) : store(std::move(s)) {
    a = store->AddSlot(3 * kBlock).value();
    b = store->AddSlot(2 * kBlock).value();
    Aligned bytes(3 * kBlock);
    for (int slot : {a, b}) {
      for (int i = 0; i < 3; ++i) std::memset(bytes.data + i * kBlock, Byte(slot, i), kBlock);
      REQUIRE(store->Write(slot, bytes.data).ok());
      REQUIRE(store->Commit(slot).ok());
    }
  }
  char Byte(int slot, int i) const { return static_cast<char>('a' + 8 * slot + i); }
  // Every block of both slots, one chunk each, in slot order.
  void Queue(NvmeChunkStream& stream) const {
    for (int i = 0; i < 3; ++i) stream.Add(a, i * kBlock, kBlock);
    for (int i = 0; i < 2; ++i) stream.Add(b, i * kBlock, kBlock);
  }
  // The committed copy of `slot`, block by block: its first byte each.
  std::string Committed(int slot, int blocks) {
    Aligned back(3 * kBlock);
    REQUIRE(store->Read(slot, back.data).ok());
    std::string first;
    for (int i = 0; i < blocks; ++i) first += back.data[i * kBlock];
    return first;
  }
  std::unique_ptr<NvmeStore> store;
  int a = -1, b = -1;
};

TEST_CASE("reads run ahead across slots, writes land in the spare copies, one sync for all",
          "[nvme][stream]") {
  TwoSlots t(NvmeStore::Open(TempDir(), "stream.bin").value());
  Aligned buffers(4 * kBlock);
  const int64_t read0 = t.store->bytes_read(), written0 = t.store->bytes_written();
  const int64_t syncs0 = t.store->syncs();
  {
    NvmeChunkStream stream(*t.store, buffers.data, 4, kBlock);
    t.Queue(stream);
    // Four buffers: up to two chunks ahead of the one updated.
    const std::vector<int> slots = {t.a, t.a, t.a, t.b, t.b};
    const std::vector<int64_t> read_after = {3, 4, 5, 5, 5};  // chunks read after each Next
    for (int c = 0; c < 5; ++c) {
      INFO("chunk " << c);
      CHECK(stream.next_slot() == slots[c]);
      absl::StatusOr<char*> chunk = stream.Next();
      REQUIRE(chunk.ok());
      CHECK(*chunk == buffers.data + (c % 4) * kBlock);
      CHECK(t.store->bytes_read() - read0 == read_after[c] * kBlock);
      const int i = c < 3 ? c : c - 3;
      CHECK((*chunk)[0] == t.Byte(slots[c], i));
      CHECK((*chunk)[kBlock - 1] == t.Byte(slots[c], i));
      std::memset(*chunk, static_cast<char>('A' + c), kBlock);  // the "update"
      stream.Write();
    }
    CHECK(stream.next_slot() == -1);
    CHECK(t.store->bytes_written() - written0 == 5 * kBlock);
    // Nothing committed yet: the old state reads back.
    CHECK(t.Committed(t.a, 3) == "abc");
    REQUIRE(stream.Finish().ok());
  }
  CHECK(t.store->syncs() - syncs0 == 1);
  REQUIRE(t.store->Commit(t.a).ok());
  REQUIRE(t.store->Commit(t.b).ok());
  CHECK(t.Committed(t.a, 3) == "ABC");
  CHECK(t.Committed(t.b, 2) == "DE");
}

TEST_CASE("one or two buffers: reads wait for the buffer's write", "[nvme][stream]") {
  for (int count : {1, 2}) {
    INFO(count << " buffer(s)");
    TwoSlots t(NvmeStore::Open(TempDir(), "stream_small.bin").value());
    Aligned buffers(count * kBlock);
    const int64_t read0 = t.store->bytes_read();
    NvmeChunkStream stream(*t.store, buffers.data, count, kBlock);
    t.Queue(stream);
    for (int c = 0; c < 5; ++c) {
      absl::StatusOr<char*> chunk = stream.Next();
      REQUIRE(chunk.ok());
      // No read ahead: only the chunk updated now.
      CHECK(t.store->bytes_read() - read0 == (c + 1) * kBlock);
      CHECK((*chunk)[0] == t.Byte(c < 3 ? t.a : t.b, c < 3 ? c : c - 3));
      (*chunk)[0] = static_cast<char>('A' + c);
      stream.Write();
    }
    REQUIRE(stream.Finish().ok());
    REQUIRE(t.store->Commit(t.a).ok());
    REQUIRE(t.store->Commit(t.b).ok());
    CHECK(t.Committed(t.a, 3) == "ABC");
    CHECK(t.Committed(t.b, 2) == "DE");
    // Only the first byte of each chunk changed: the rest came back whole.
    Aligned back(3 * kBlock);
    REQUIRE(t.store->Read(t.a, back.data).ok());
    CHECK(back.data[2 * kBlock + 1] == t.Byte(t.a, 2));
    CHECK(back.data[3 * kBlock - 1] == t.Byte(t.a, 2));
  }
}

TEST_CASE("a failed write surfaces and leaves every slot's committed copy", "[nvme][stream]") {
  TwoSlots t(NvmeStore::Open(TempDir(), "stream_fail.bin").value());
  Aligned buffers(4 * kBlock);
  absl::Status failed = absl::OkStatus();
  {
    NvmeChunkStream stream(*t.store, buffers.data, 4, kBlock);
    t.Queue(stream);
    // The second chunk's write fails; the stream reports it when a read
    // reuses its buffer, or at the latest in Finish.
    t.store->InjectWriteFailureAfter(kBlock);
    while (failed.ok() && stream.next_slot() >= 0) {
      absl::StatusOr<char*> chunk = stream.Next();
      if (!chunk.ok()) {
        failed = chunk.status();
        break;
      }
      std::memset(*chunk, 'Z', kBlock);
      stream.Write();
    }
    if (failed.ok()) failed = stream.Finish();
  }  // the stream waits for what is in flight
  CHECK(failed.code() == absl::StatusCode::kInternal);
  CHECK(std::string(failed.message()) ==
        "NVMe store " + t.store->path() + ": write failed: Input/output error");
  t.store->InjectWriteFailureAfter(-1);
  CHECK(t.store->Commit(t.a).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(t.store->Commit(t.b).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(t.Committed(t.a, 3) == "abc");
  CHECK(t.Committed(t.b, 2) == "ij");
}

TEST_CASE("misuse is named and commits nothing", "[nvme][stream][errors]") {
  TwoSlots t(NvmeStore::Open(TempDir(), "stream_misuse.bin").value());
  Aligned buffers(4 * kBlock);
  const std::string name = "NVMe chunk stream of " + t.store->path() + ": ";
  NvmeChunkStream stream(*t.store, buffers.data, 4, kBlock);
  const absl::StatusOr<char*> empty = stream.Next();
  CHECK(empty.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(empty.status().message() == name + "no chunk queued (0 of 0 taken)");
  t.Queue(stream);
  REQUIRE(stream.Next().ok());
  const absl::StatusOr<char*> twice = stream.Next();
  CHECK(twice.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(twice.status().message() == name + "the last chunk taken is not written (1 of 5 taken)");
  stream.Write();
  stream.Write();  // already under way: nothing more
  const absl::Status early = stream.Finish();
  CHECK(early.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(early.message() == name + "1 of 5 chunks updated");
  CHECK(t.store->Commit(t.a).code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("a virtual store's stream counts what a real one moves", "[nvme][stream][meta]") {
  TwoSlots real(NvmeStore::Open(TempDir(), "stream_real.bin").value());
  std::unique_ptr<NvmeStore> virtual_store = NvmeStore::Virtual("meta.bin");
  const int a = virtual_store->AddSlot(3 * kBlock).value();
  const int b = virtual_store->AddSlot(2 * kBlock).value();
  REQUIRE((a == real.a && b == real.b));
  Aligned buffers(4 * kBlock);
  const int64_t read0 = real.store->bytes_read(), written0 = real.store->bytes_written();
  const int64_t syncs0 = real.store->syncs();
  for (NvmeStore* store : {real.store.get(), virtual_store.get()}) {
    NvmeChunkStream stream(*store, store == virtual_store.get() ? nullptr : buffers.data, 4,
                           kBlock);
    real.Queue(stream);
    for (int c = 0; c < 5; ++c) {
      absl::StatusOr<char*> chunk = stream.Next();
      REQUIRE(chunk.ok());
      CHECK((*chunk == nullptr) == (store == virtual_store.get()));
      stream.Write();
    }
    REQUIRE(stream.Finish().ok());
  }
  CHECK(virtual_store->bytes_read() == real.store->bytes_read() - read0);
  CHECK(virtual_store->bytes_written() == real.store->bytes_written() - written0);
  CHECK(virtual_store->syncs() == real.store->syncs() - syncs0);
  CHECK(virtual_store->syncs() == 1);
}

}  // namespace
}  // namespace memwall
