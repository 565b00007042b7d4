#include "runtime/json_reader.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/status.h"

namespace memwall {

std::string ShowJson(const nlohmann::json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

absl::StatusOr<JsonReader> JsonReader::Open(const Json& value, std::string path,
                                            std::string prefix, absl::string_view document) {
  if (!value.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, path.empty() ? std::string(document) : path, ": expected an object, got ",
        ShowJson(value)));
  }
  return JsonReader(value, std::move(path), std::move(prefix));
}

std::string JsonReader::Path(absl::string_view key) const {
  return path_.empty() ? std::string(key) : absl::StrCat(path_, ".", key);
}

const JsonReader::Json* JsonReader::Find(absl::string_view key) {
  known_.insert(std::string(key));
  auto it = object_->find(std::string(key));
  return it == object_->end() ? nullptr : &*it;
}

absl::Status JsonReader::Bool(absl::string_view key, bool& out) {
  const Json* v = Find(key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_boolean()) return Error(key, "a boolean", *v);
  out = v->get<bool>();
  return absl::OkStatus();
}

absl::Status JsonReader::Int(absl::string_view key, int64_t min, int64_t max, int64_t& out) {
  const Json* v = Find(key);
  if (v == nullptr) return absl::OkStatus();
  const std::string expected = max == INT64_MAX ? absl::StrCat("an integer >= ", min)
                                                : absl::StrCat("an integer ", min, "..", max);
  // Integers compare exactly (a double would round INT64_MAX up, past
  // the range, and the cast back would wrap); 5e8-style numbers must be
  // whole and strictly inside the range a double can say exactly.
  if (v->is_number_unsigned()) {
    const uint64_t value = v->get<uint64_t>();
    if (value > static_cast<uint64_t>(max) || static_cast<int64_t>(value) < min) {
      return Error(key, expected, *v);
    }
    out = static_cast<int64_t>(value);
    return absl::OkStatus();
  }
  if (v->is_number_integer()) {
    const int64_t value = v->get<int64_t>();
    if (value < min || value > max) return Error(key, expected, *v);
    out = value;
    return absl::OkStatus();
  }
  if (!v->is_number_float()) return Error(key, expected, *v);
  const double value = v->get<double>();
  if (value != std::floor(value) || value < double(min) || value >= 0x1p63 ||
      value > double(max)) {
    return Error(key, expected, *v);
  }
  const int64_t whole = static_cast<int64_t>(value);
  if (whole > max) return Error(key, expected, *v);
  out = whole;
  return absl::OkStatus();
}

absl::Status JsonReader::Int32(absl::string_view key, int min, int max, int& out) {
  int64_t value = out;
  MW_RETURN_IF_ERROR(Int(key, min, max, value));
  out = static_cast<int>(value);
  return absl::OkStatus();
}

absl::Status JsonReader::Float(absl::string_view key, double min, double max,
                               bool min_exclusive, const std::string& expected, float& out) {
  const Json* v = Find(key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number()) return Error(key, expected, *v);
  const double value = v->get<double>();
  if (!std::isfinite(value) || value < min || (min_exclusive && value == min) || value > max) {
    return Error(key, expected, *v);
  }
  out = static_cast<float>(value);
  return absl::OkStatus();
}

absl::Status JsonReader::Choice(absl::string_view key,
                                const std::vector<std::string>& allowed, std::string& out) {
  const Json* v = Find(key);
  if (v == nullptr) return absl::OkStatus();
  const std::string expected =
      absl::StrCat("one of \"", absl::StrJoin(allowed, "\", \""), "\"");
  if (!v->is_string()) return Error(key, expected, *v);
  const std::string value = v->get<std::string>();
  for (const std::string& a : allowed) {
    if (a == value) {
      out = value;
      return absl::OkStatus();
    }
  }
  return Error(key, expected, *v);
}

absl::Status JsonReader::Error(absl::string_view key, absl::string_view expected,
                               const Json& got) const {
  return absl::InvalidArgumentError(
      absl::StrCat(prefix_, Path(key), ": expected ", expected, ", got ", ShowJson(got)));
}

absl::Status JsonReader::Finish() const {
  for (auto it = object_->begin(); it != object_->end(); ++it) {
    if (known_.count(it.key()) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix_, Path(it.key()), ": unknown key (known here: ", absl::StrJoin(known_, ", "),
          ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status JsonReader::String(absl::string_view key, bool non_empty, std::string& out) {
  const Json* v = Find(key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_string() || (non_empty && v->get<std::string>().empty())) {
    return Error(key, non_empty ? "a non-empty string" : "a string", *v);
  }
  out = v->get<std::string>();
  return absl::OkStatus();
}

absl::Status JsonReader::Ints(absl::string_view key, int64_t min, int64_t max,
                              std::vector<int64_t>& out) {
  const Json* v = Find(key);
  if (v == nullptr) return absl::OkStatus();
  const std::string expected = max == INT64_MAX
                                   ? absl::StrCat("a list of integers >= ", min)
                                   : absl::StrCat("a list of integers ", min, "..", max);
  if (!v->is_array()) return Error(key, expected, *v);
  std::vector<int64_t> values;
  for (const Json& item : *v) {
    if (!item.is_number_integer() || (item.is_number_unsigned() && item.get<uint64_t>() > INT64_MAX)) {
      return Error(key, expected, *v);
    }
    const int64_t value = item.get<int64_t>();
    if (value < min || value > max) return Error(key, expected, *v);
    values.push_back(value);
  }
  out = std::move(values);
  return absl::OkStatus();
}

absl::Status JsonReader::Strings(absl::string_view key, std::vector<std::string>& out) {
  const Json* v = Find(key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_array()) return Error(key, "a list of strings", *v);
  std::vector<std::string> values;
  for (const Json& item : *v) {
    if (!item.is_string()) return Error(key, "a list of strings", *v);
    values.push_back(item.get<std::string>());
  }
  out = std::move(values);
  return absl::OkStatus();
}

absl::StatusOr<JsonReader> JsonReader::Object(absl::string_view key) {
  MW_RETURN_IF_ERROR(Require({key}));
  return Open(*Find(key), Path(key), prefix_);
}

absl::StatusOr<const JsonReader::Json*> JsonReader::List(absl::string_view key) {
  MW_RETURN_IF_ERROR(Require({key}));
  const Json* v = Find(key);
  if (!v->is_array()) return Error(key, "a list", *v);
  return v;
}

absl::Status JsonReader::Require(std::initializer_list<absl::string_view> keys) const {
  for (absl::string_view key : keys) {
    if (object_->find(std::string(key)) == object_->end()) {
      return absl::InvalidArgumentError(absl::StrCat(prefix_, Path(key), ": missing"));
    }
  }
  return absl::OkStatus();
}

}  // namespace memwall
