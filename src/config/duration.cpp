#include "config/duration.h"

#include <cmath>
#include <regex>

#include "core/error.h"

namespace anvil {

Duration parse_duration(const std::string& text, const std::string& key) {
  static const std::regex re(R"(^\s*([0-9.eE+-]+)\s*(ba|ep|sp|tok|dur)?\s*$)", std::regex::icase);
  std::smatch m;
  ANVIL_CHECK(std::regex_match(text, m, re),
              "{}: '{}' is not a duration: expected a number with a unit ba, ep, sp, tok or dur "
              "(e.g. 100ba)", key, text);
  Duration d;
  d.text = text;
  try {
    d.value = std::stod(m[1].str());
  } catch (const std::exception&) {
    ANVIL_FAIL("{}: '{}' is not a duration: '{}' is not a number", key, text, m[1].str());
  }
  std::string unit = m[2].str();
  for (auto& c : unit) c = static_cast<char>(std::tolower(c));
  if (unit == "ba") d.unit = Duration::Unit::kBatch;
  else if (unit == "ep" || unit.empty()) d.unit = Duration::Unit::kEpoch;
  else if (unit == "sp") d.unit = Duration::Unit::kSample;
  else if (unit == "tok") d.unit = Duration::Unit::kToken;
  else d.unit = Duration::Unit::kDur;
  ANVIL_CHECK(d.value >= 0 && std::isfinite(d.value), "{}: '{}' must not be negative", key, text);
  if (d.unit == Duration::Unit::kDur)
    ANVIL_CHECK(d.value <= 1.0, "{}: '{}' is a fraction of max_duration and must be in [0, 1]", key, text);
  else
    ANVIL_CHECK(d.value == std::floor(d.value), "{}: '{}' must be a whole number of {}", key, text,
                unit.empty() ? "epochs" : unit);
  return d;
}

int64_t duration_to_batches(const Duration& d, int64_t batches_per_epoch, int64_t global_batch,
                            int64_t seq_len, int64_t total_batches, const std::string& key) {
  switch (d.unit) {
    case Duration::Unit::kBatch: return static_cast<int64_t>(d.value);
    case Duration::Unit::kEpoch: return static_cast<int64_t>(d.value) * batches_per_epoch;
    case Duration::Unit::kSample: return static_cast<int64_t>(d.value) / global_batch;
    case Duration::Unit::kToken: return static_cast<int64_t>(d.value) / (global_batch * seq_len);
    case Duration::Unit::kDur:
      ANVIL_CHECK(total_batches >= 0, "{}: 'dur' is not allowed here", key);
      return static_cast<int64_t>(std::llround(d.value * static_cast<double>(total_batches)));
  }
  return 0;
}

}  // namespace anvil
