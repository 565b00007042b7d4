#include "sharding/flat_layout.h"

#include <algorithm>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace memwall {

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

// "block3.attn.qkv" for "block3.attn.qkv.weight"; the name itself without '.'.
absl::string_view LayerOf(absl::string_view name) {
  const size_t dot = name.rfind('.');
  return dot == absl::string_view::npos ? name : name.substr(0, dot);
}

}  // namespace

int64_t FlatGroup::padding_in_shard(int rank) const {
  const int64_t begin = shard_begin(rank), end = begin + shard_numel;
  return end - std::clamp(numel, begin, end);
}

absl::StatusOr<FlatLayout> BuildFlatLayout(const std::vector<ParameterSpec>& parameters,
                                          int world_size, int64_t bucket_elements,
                                          int64_t alignment_elements) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world size: expected >= 1, got ", world_size));
  }
  if (bucket_elements < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket size: expected >= 1 element, got ", bucket_elements));
  }
  if (alignment_elements < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("alignment: expected >= 1 element, got ", alignment_elements));
  }
  if (parameters.empty()) {
    return absl::InvalidArgumentError("parameters: none registered");
  }
  FlatLayout layout;
  layout.world_size = world_size;
  std::set<std::string> names;
  const int64_t quantum = alignment_elements * world_size;
  auto close_group = [&](FlatGroup& group) {
    group.padded_numel = (group.numel + quantum - 1) / quantum * quantum;
    group.shard_numel = group.padded_numel / world_size;
    group.trainable = parameters[group.parameters.front()].trainable;
    const std::string& first = parameters[group.parameters.front()].name;
    const std::string& last = parameters[group.parameters.back()].name;
    const std::string& unit = parameters[group.parameters.front()].group;
    group.name = !unit.empty()                  ? unit
                 : group.parameters.size() == 1 ? first
                                                : absl::StrCat(first, "..", last);
    layout.numel += group.numel;
    layout.padded_numel += group.padded_numel;
    layout.groups.push_back(std::move(group));
  };
  // Validate, then cut the parameter list into layers.
  std::vector<std::pair<size_t, size_t>> layers;  // [begin, end) into parameters
  std::set<std::string> units_closed;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const ParameterSpec& p = parameters[i];
    if (p.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", i, ": the name is empty"));
    }
    if (!names.insert(p.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", p.name, "': registered twice"));
    }
    for (size_t d = 0; d < p.shape.size(); ++d) {
      if (p.shape[d] < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "parameter '", p.name, "': shape[", d, "] is ", p.shape[d], "; expected >= 1"));
      }
    }
    const std::string* previous = i == 0 ? nullptr : &parameters[i - 1].group;
    if (i > 0 && !p.group.empty() && p.group == *previous &&
        p.trainable != parameters[i - 1].trainable) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter '", p.name, "': group '", p.group, "' mixes trainable and frozen parameters ('",
          (p.trainable ? parameters[i - 1] : p).name, "' is frozen); put frozen ones in a group of their own"));
    }
    const bool new_layer =
        i == 0 || p.group != *previous || p.trainable != parameters[i - 1].trainable ||
        (p.group.empty() && LayerOf(p.name) != LayerOf(parameters[i - 1].name));
    if (new_layer) {
      if (previous != nullptr && !previous->empty()) units_closed.insert(*previous);
      if (units_closed.count(p.group) > 0) {
        return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name, "': group '",
                                                       p.group,
                                                       "' already ended; a group's parameters "
                                                       "must be registered consecutively"));
      }
      layers.push_back({i, i});
    }
    layers.back().second = i + 1;
  }
  FlatGroup current;
  for (const auto& [begin, end] : layers) {
    int64_t layer_numel = 0;
    for (size_t i = begin; i < end; ++i) layer_numel += NumElements(parameters[i].shape);
    // An explicit unit is a group of its own: it closes what came before it
    // and nothing joins it. A change of trainability closes a group too.
    const bool closes = !parameters[begin].group.empty() ||
                      (!current.parameters.empty() &&
                       (!parameters[current.parameters.front()].group.empty() ||
                        parameters[current.parameters.front()].trainable !=
                            parameters[begin].trainable));
    if (!current.parameters.empty() && (closes || current.numel + layer_numel > bucket_elements)) {
      close_group(current);
      current = FlatGroup();
    }
    for (size_t i = begin; i < end; ++i) {
      const int64_t numel = NumElements(parameters[i].shape);
      layout.placements.push_back(
          {static_cast<int>(layout.groups.size()), current.numel, numel});
      current.parameters.push_back(static_cast<int>(i));
      current.numel += numel;
    }
  }
  close_group(current);
  return layout;
}

}  // namespace memwall
