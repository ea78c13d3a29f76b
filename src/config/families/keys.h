// What the families' readers share: the checks of a key whose value anvil honours only in part.
#pragma once
#include <string>

#include <yaml-cpp/yaml.h>

#include "config/map_reader.h"
#include "core/error.h"

namespace anvil {

// A dropout probability: in [0, 1).
inline void read_pdrop(MapReader& m, const char* key, float& out) {
  double p = out;
  m.get(key, p);
  ANVIL_CHECK(p >= 0 && p < 1, "{}: {} = {} must be in [0, 1)", m.source(key), m.full(key), p);
  out = static_cast<float>(p);
}

// A number that must be positive.
inline void read_positive(MapReader& m, const char* key, float& out) {
  double v = out;
  m.get(key, v);
  ANVIL_CHECK(v > 0, "{}: {} = {} must be positive", m.source(key), m.full(key), v);
  out = static_cast<float>(v);
}

// A key whose only value anvil honours is the dialect's default: any other is an error.
template <class T>
void only(MapReader& m, const char* key, const T& honoured, const char* why) {
  T v = honoured;
  m.get(key, v);
  ANVIL_CHECK(v == honoured, "{}: {} = {} is not supported ({}); expected {}", m.source(key), m.full(key),
              m.raw(key).Scalar(), why, YAML::Node(honoured).Scalar());
}

// A key that must be absent or null (Foundry's "not set").
inline void unset(MapReader& m, const char* key, const char* why) {
  ANVIL_CHECK(!m.has(key), "{}: {} is not supported ({}); leave it unset", m.source(key), m.full(key), why);
}

// A key whose value changes nothing anvil computes: read so that it is not an unknown key.
template <class T>
void ignored(MapReader& m, const char* key) {
  T v{};
  m.get(key, v);
}

// The sizes every family spells as GPT-2 does.
inline void read_sizes(MapReader& m, ModelConfig& c) {
  m.get("n_layers", c.n_layers);
  m.get("n_heads", c.n_heads);
  m.get("d_model", c.d_model);
  m.get("vocab_size", c.vocab_size);
  m.get("max_seq_len", c.max_seq_len);
}

}  // namespace anvil
