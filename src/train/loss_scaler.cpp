#include "train/loss_scaler.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace anvil {

LossScaler::LossScaler(const LossScalerConfig& cfg, bool enabled) : cfg_(cfg), enabled_(enabled) {
  if (!enabled_) return;
  scale_ = cfg.init_scale;
  hysteresis_left_ = cfg.hysteresis;
}

void LossScaler::update(bool overflow, int64_t step) {
  if (!enabled_) return;
  if (!overflow) {
    if (cfg_.consecutive_hysteresis) hysteresis_left_ = cfg_.hysteresis;
    if (++good_steps_ < cfg_.growth_interval) return;
    good_steps_ = 0;
    hysteresis_left_ = cfg_.hysteresis;
    if (scale_ < 0x1p60) scale_ *= 2;  // the fixed-point unscaling needs an exponent in int range
    return;
  }
  good_steps_ = 0;
  if (hysteresis_left_ > 1) {
    hysteresis_left_--;
    return;
  }
  ANVIL_CHECK(scale_ > cfg_.min_scale, "step {}: fp16 gradients overflow at the minimum loss scale {:g}: this "
              "model's values exceed fp16's range; use precision amp_bf16, or lower optimizer.lr", step, scale_);
  scale_ = std::max(scale_ / 2, cfg_.min_scale);
}

std::string LossScaler::to_json() const {
  return nlohmann::json{{"scale", scale_}, {"good_steps", good_steps_}, {"hysteresis_left", hysteresis_left_}}.dump();
}

void LossScaler::restore(const std::string& json, const std::string& where) {
  try {
    const nlohmann::json j = nlohmann::json::parse(json);
    const double scale = j.at("scale").get<double>();
    int e = 0;
    ANVIL_CHECK(scale > 0 && std::frexp(scale, &e) == 0.5, "{}: loss_scaler.scale {} is not a power of two", where,
                scale);
    scale_ = scale;
    good_steps_ = j.at("good_steps").get<int>();
    hysteresis_left_ = j.at("hysteresis_left").get<int>();
  } catch (const nlohmann::json::exception& e) {
    ANVIL_FAIL("{}: malformed loss_scaler state: {}", where, e.what());
  }
}

}  // namespace anvil
