// RoPE's frequencies as a model gives them: the base theta and transformers' rope_scaling, read by
// the config (the model section's rope_theta and rope_scaling) and formed into each pair's
// frequency by the kernels (kernels/rope.h), on the host and on the device from this one
// definition.
#pragma once
#include <cmath>

#include "core/host_device.h"

namespace anvil {

// transformers' rope_type: default (none), linear (every frequency divided by factor: position
// interpolation) and llama3 (Llama 3.1's: long wavelengths divided by factor, short ones kept, the
// band between blended; _compute_llama3_parameters).
enum class RopeScalingKind { kNone, kLinear, kLlama3 };

struct RopeFrequencies {
  float theta = 10000.0f;
  RopeScalingKind scaling = RopeScalingKind::kNone;
  float factor = 1.0f;  // linear and llama3
  // llama3's: wavelengths above original_max_position / low_freq_factor are divided by factor,
  // those below original_max_position / high_freq_factor kept.
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position = 8192;

  // Spelled out: the GPU compilers build this header as C++17.
  bool operator==(const RopeFrequencies& o) const {
    return theta == o.theta && scaling == o.scaling && factor == o.factor && low_freq_factor == o.low_freq_factor &&
           high_freq_factor == o.high_freq_factor && original_max_position == o.original_max_position;
  }
};

// The frequency of pair i of a head of HS channels. theta^(-2i/HS) is computed in double and
// rounded to fp32, as transformers' fp32 inv_freq (they agree to an ulp); the scaling is applied to
// that fp32 value in double and rounded once more (transformers computes it in fp32: an ulp again).
ANVIL_HOST_DEVICE inline float rope_inv_freq(const RopeFrequencies& f, int i, int HS) {
  const double base = static_cast<float>(::pow(static_cast<double>(f.theta), -2.0 * i / HS));
  switch (f.scaling) {
    case RopeScalingKind::kNone: return static_cast<float>(base);
    case RopeScalingKind::kLinear: return static_cast<float>(base / f.factor);
    case RopeScalingKind::kLlama3: break;
  }
  const double wavelength = 6.283185307179586 / base;
  const double low_wavelength = static_cast<double>(f.original_max_position) / f.low_freq_factor;
  const double high_wavelength = static_cast<double>(f.original_max_position) / f.high_freq_factor;
  if (wavelength > low_wavelength) return static_cast<float>(base / f.factor);
  if (wavelength < high_wavelength) return static_cast<float>(base);
  const double smooth =
      (f.original_max_position / wavelength - f.low_freq_factor) / (f.high_freq_factor - f.low_freq_factor);
  return static_cast<float>((1 - smooth) * base / f.factor + smooth * base);
}

}  // namespace anvil
