// Numbers in the configs anvil writes (the run's config.yaml, checkpoints' manifests): yaml-cpp's
// emitter writes a double with 17 significant digits (0.94999999999999996 for 0.95, and a float
// widened to double as 0.050000000000000003), so they go as the shortest decimal that reads back
// as the same value instead.
#pragma once
#include <fmt/format.h>

#include <string>
#include <type_traits>

namespace anvil {

template <class T>
std::string yaml_number(T v) requires std::is_floating_point_v<T> {
  return fmt::format("{}", v);
}

// What a config writer emits for v: yaml_number for a float or double, v itself otherwise.
template <class T>
decltype(auto) yaml_value(const T& v) {
  if constexpr (std::is_floating_point_v<T>)
    return yaml_number(v);
  else
    return (v);
}

}  // namespace anvil
