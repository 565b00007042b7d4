// memwall's version: what `memwall --version` prints. The Python package
// (python/pyproject.toml) carries the same number; a test compares them.
#ifndef MEMWALL_ENGINE_VERSION_H_
#define MEMWALL_ENGINE_VERSION_H_

namespace memwall {

inline constexpr char kVersion[] = "0.2.0";

}  // namespace memwall

#endif  // MEMWALL_ENGINE_VERSION_H_
