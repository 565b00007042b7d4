// The fuzzed entry points, shared by the libFuzzer binaries (tools/fuzz.sh,
// built with clang) and the regression test that replays the corpus in the
// normal build. Each takes arbitrary bytes and must return (an error is
// fine) without crashing, leaking or reading out of bounds.
#ifndef MEMWALL_TESTS_FUZZ_TARGETS_H_
#define MEMWALL_TESTS_FUZZ_TARGETS_H_

#include <cstddef>
#include <cstdint>

namespace memwall::fuzz {

// engine/config.h ParseConfig on the bytes as a JSON config.
void Config(const uint8_t* data, size_t size);
// models/gpt.h ParseGptModel on the bytes as a --model spec.
void ModelSpec(const uint8_t* data, size_t size);
// engine/checkpoint.h VerifyCheckpoint on a checkpoint built from the
// bytes: the first byte picks whether they are the manifest (with no rank
// file), or a rank file (with a manifest that matches its size and CRC-32,
// so the safetensors header parser is reached).
void Checkpoint(const uint8_t* data, size_t size);

}  // namespace memwall::fuzz

#endif  // MEMWALL_TESTS_FUZZ_TARGETS_H_
