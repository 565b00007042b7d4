// Reading JSON documents users hand memwall (configs, traced model
// descriptions, checkpoint manifests and safetensors headers) with errors
// that name the key and what was expected, and without exceptions
// escaping: every typed read checks the type first.
//
// A JsonReader reads the keys of one JSON object, remembering which were
// consumed so that Finish() can reject the rest. Errors are
// kInvalidArgument: "<prefix><path>.<key>: expected <what>, got <value>"
// (the value shortened to 60 characters); the prefix names the document
// where the path alone would not ("traced model m.json: ").
#ifndef MEMWALL_RUNTIME_JSON_READER_H_
#define MEMWALL_RUNTIME_JSON_READER_H_

#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace memwall {

// `value` as JSON text, shortened to 60 characters for messages.
std::string ShowJson(const nlohmann::json& value);

class JsonReader {
 public:
  using Json = nlohmann::json;

  // A reader of `value`, which must be an object; `path` is its key path
  // ("zero_optimization.offload_param"; empty: the document itself, named
  // `document` in errors).
  static absl::StatusOr<JsonReader> Open(const Json& value, std::string path,
                                         std::string prefix = "",
                                         absl::string_view document = "config");

  // "<path>.<key>" (or `key` at the top).
  std::string Path(absl::string_view key) const;
  // The value of `key`, or null when absent; marks it consumed.
  const Json* Find(absl::string_view key);

  // Optional keys: `out` is left as it is when the key is absent.
  absl::Status Bool(absl::string_view key, bool& out);
  // An integer in [min, max]: JSON integers exactly, and numbers such as
  // 5e8 when whole and inside the range.
  absl::Status Int(absl::string_view key, int64_t min, int64_t max, int64_t& out);
  absl::Status Int32(absl::string_view key, int min, int max, int& out);
  // A finite number in [min, max] (or (min, max] when min_exclusive).
  absl::Status Float(absl::string_view key, double min, double max, bool min_exclusive,
                     const std::string& expected, float& out);
  // One of `allowed`.
  absl::Status Choice(absl::string_view key, const std::vector<std::string>& allowed,
                      std::string& out);
  // A string (non-empty when `non_empty`).
  absl::Status String(absl::string_view key, bool non_empty, std::string& out);
  // A list of integers, each in [min, max]; a list of strings.
  absl::Status Ints(absl::string_view key, int64_t min, int64_t max, std::vector<int64_t>& out);
  absl::Status Strings(absl::string_view key, std::vector<std::string>& out);
  // The object at `key`, read by a reader of its own (its path
  // "<path>.<key>"); the list at `key`, whose elements a caller opens as
  // Open(list[i], Path(key) + "[i]", prefix()). kInvalidArgument when the
  // key is absent or holds something else.
  absl::StatusOr<JsonReader> Object(absl::string_view key);
  absl::StatusOr<const Json*> List(absl::string_view key);

  // Keys a document must have: kInvalidArgument "<prefix><path>.<key>:
  // missing" naming the first absent one. The typed reads above leave
  // absent keys alone, so a reader of required keys calls this first.
  absl::Status Require(std::initializer_list<absl::string_view> keys) const;
  const std::string& prefix() const { return prefix_; }

  // kInvalidArgument for `key` holding `got` where `expected` was.
  absl::Status Error(absl::string_view key, absl::string_view expected, const Json& got) const;
  // Rejects keys nobody asked for.
  absl::Status Finish() const;

 private:
  JsonReader(const Json& object, std::string path, std::string prefix)
      : object_(&object), path_(std::move(path)), prefix_(std::move(prefix)) {}

  const Json* object_;
  std::string path_;
  std::string prefix_;
  std::set<std::string> known_;
};

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_JSON_READER_H_
