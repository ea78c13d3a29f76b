// Composer time strings: parsed by suffix, converted to optimizer steps once the run's shape is known.
#include "config/duration.h"

#include <cmath>
#include <cctype>
#include <utility>

#include "core/error.h"

namespace anvil {

Duration parse_duration(const std::string& text, const std::string& key) {
  std::string t;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) t += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  Duration d;
  d.text = text;
  d.unit = Duration::Unit::kEpoch;  // a bare number means epochs
  std::string unit;
  for (const auto& [suffix, u] : {std::pair{"tok", Duration::Unit::kToken}, {"dur", Duration::Unit::kDur},
                                  {"ba", Duration::Unit::kBatch}, {"ep", Duration::Unit::kEpoch},
                                  {"sp", Duration::Unit::kSample}}) {
    const std::string sfx = suffix;
    if (t.size() > sfx.size() && t.compare(t.size() - sfx.size(), sfx.size(), sfx) == 0) {
      d.unit = u;
      unit = sfx;
      t.resize(t.size() - sfx.size());
      break;
    }
  }
  size_t used = 0;
  try {
    d.value = std::stod(t, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  ANVIL_CHECK(!t.empty() && used == t.size(),
              "{}: '{}' is not a duration: expected a number with a unit ba, ep, sp, tok or dur (e.g. 100ba)",
              key, text);
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
