// The epoch order in three stages, each a pure function of the spec and the epoch:
//  1. resample: each stream contributes its share of the epoch (whole repeats of the stream plus a
//     seeded subset for the fraction), grouped into "units", one per shard and repeat;
//  2. shuffle: a permutation of the epoch's positions that keeps a unit's samples near each other
//     (py1s: within a unit; py1e: each sample scattered over a window of about block_size), with
//     the units dealt to canonical nodes so that each node's data stays in few shards;
//  3. interleave: the canonical nodes' sequences are read round-robin, so a global batch draws on
//     every node's shards evenly.
#include "data/sample_order.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/fs.h"
#include "core/rng.h"

namespace anvil {
namespace {

// Random streams of the order, one per purpose, so adding a draw in one never shifts another.
constexpr uint64_t kRunStream = 0x6f726465725f7275;    // the run-wide unit order
constexpr uint64_t kEpochStream = 0x6f726465725f6570;  // per epoch
constexpr uint64_t kChooseStream = 0x6f726465725f6368; // the subset of a stream's partial repeat

struct Unit {
  int64_t begin = 0, size = 0;  // positions [begin, begin + size) of the epoch's sample list
};

template <typename T>
void fisher_yates(T* a, int64_t n, Rng& rng) {
  for (int64_t i = n - 1; i > 0; i--) std::swap(a[i], a[rng.below(static_cast<uint64_t>(i) + 1)]);
}

// Splits units at the canonical-node boundaries N·(p+1)/NCN; returns per node its [begin, end)
// range in the returned unit list.
std::vector<std::pair<size_t, size_t>> divide_units(std::vector<Unit>& units, int64_t n, int64_t ncn) {
  std::vector<Unit> out;
  std::vector<std::pair<size_t, size_t>> nodes;
  size_t u = 0;
  int64_t used = 0, pos = 0;  // samples of units[u] already placed; samples placed overall
  for (int64_t p = 0; p < ncn; p++) {
    const int64_t end = n * (p + 1) / ncn;
    const size_t first = out.size();
    while (pos < end) {
      const int64_t take = std::min(units[u].size - used, end - pos);
      out.push_back({units[u].begin + used, take});
      used += take;
      pos += take;
      if (used == units[u].size) u++, used = 0;
    }
    nodes.emplace_back(first, out.size());
  }
  units = std::move(out);
  return nodes;
}

}  // namespace

void validate_order_spec(const OrderSpec& spec) {
  ANVIL_CHECK(!spec.streams.empty(), "a dataset needs at least one stream");
  ANVIL_CHECK(spec.algo == "none" || spec.algo == "py1s" || spec.algo == "py1e",
              "shuffle_algo '{}' is not known (expected none, py1s or py1e)", spec.algo);
  ANVIL_CHECK(spec.canonical_nodes >= 1, "num_canonical_nodes must be at least 1, got {}", spec.canonical_nodes);
  ANVIL_CHECK(spec.block_size == -1 || spec.block_size >= 1, "shuffle_block_size must be positive, got {}",
              spec.block_size);
  for (size_t s = 0; s < spec.streams.size(); s++) {
    ANVIL_CHECK(std::isfinite(spec.streams[s].proportion) && spec.streams[s].proportion > 0,
                "stream {}: proportion must be positive, got {}", s, spec.streams[s].proportion);
    int64_t n = 0;
    for (int64_t k : spec.streams[s].shard_samples) n += k;
    ANVIL_CHECK(n > 0, "stream {} has no samples", s);
  }
  ANVIL_CHECK(spec.epoch_size == -1 || spec.epoch_size >= 1, "epoch_size must be positive, got {}", spec.epoch_size);
  ANVIL_CHECK(epoch_samples(spec) >= spec.canonical_nodes, "an epoch of {} samples cannot be dealt to {} canonical "
              "nodes: lower num_canonical_nodes", epoch_samples(spec), spec.canonical_nodes);
}

int64_t total_samples(const OrderSpec& spec) {
  int64_t n = 0;
  for (const auto& s : spec.streams)
    for (int64_t k : s.shard_samples) n += k;
  return n;
}

int64_t epoch_samples(const OrderSpec& spec) { return spec.epoch_size > 0 ? spec.epoch_size : total_samples(spec); }

int64_t resolved_block_size(const OrderSpec& spec) {
  return spec.block_size > 0 ? spec.block_size : std::max<int64_t>(4'000'000 / spec.canonical_nodes, int64_t{1} << 18);
}

std::vector<int64_t> epoch_order(const OrderSpec& spec, int64_t epoch) {
  validate_order_spec(spec);
  const int64_t n = epoch_samples(spec);
  const uint64_t epoch_key = static_cast<uint64_t>(epoch);

  // 1. Resample: each stream's share of the epoch by the largest-remainder rule (the shares sum
  // to n exactly), laid out unit by unit as global sample ids.
  const size_t S = spec.streams.size();
  double psum = 0;
  for (const auto& s : spec.streams) psum += s.proportion;
  std::vector<int64_t> share(S);
  std::vector<std::pair<double, size_t>> rem;
  int64_t given = 0;
  for (size_t s = 0; s < S; s++) {
    const double exact = static_cast<double>(n) * spec.streams[s].proportion / psum;
    share[s] = static_cast<int64_t>(std::floor(exact));
    given += share[s];
    rem.emplace_back(exact - std::floor(exact), s);
  }
  std::stable_sort(rem.begin(), rem.end(), [](auto& a, auto& b) { return a.first > b.first; });
  for (int64_t k = 0; given < n; k++, given++) share[rem[static_cast<size_t>(k) % S].second]++;

  std::vector<int64_t> ids;
  ids.reserve(static_cast<size_t>(n));
  std::vector<Unit> units;
  int64_t stream_offset = 0;
  for (size_t s = 0; s < S; s++) {
    const auto& shards = spec.streams[s].shard_samples;
    const int64_t size = std::accumulate(shards.begin(), shards.end(), int64_t{0});
    const int64_t repeats = share[s] / size, partial = share[s] % size;
    // The partial repeat's subset: a seeded partial Fisher-Yates, then sorted.
    std::vector<int64_t> chosen;
    if (partial > 0) {
      std::vector<int64_t> all(static_cast<size_t>(size));
      std::iota(all.begin(), all.end(), 0);
      Rng rng(spec.seed ^ mix64(epoch_key), kChooseStream + s);
      for (int64_t i = 0; i < partial; i++)
        std::swap(all[i], all[i + static_cast<int64_t>(rng.below(static_cast<uint64_t>(size - i)))]);
      chosen.assign(all.begin(), all.begin() + partial);
      std::sort(chosen.begin(), chosen.end());
    }
    size_t c = 0;
    int64_t shard_begin = 0;
    for (int64_t k : shards) {
      for (int64_t r = 0; r < repeats; r++) {
        units.push_back({static_cast<int64_t>(ids.size()), k});
        for (int64_t i = 0; i < k; i++) ids.push_back(stream_offset + shard_begin + i);
      }
      const int64_t begin = static_cast<int64_t>(ids.size());
      while (c < chosen.size() && chosen[c] < shard_begin + k) ids.push_back(stream_offset + chosen[c++]);
      if (static_cast<int64_t>(ids.size()) > begin) units.push_back({begin, static_cast<int64_t>(ids.size()) - begin});
      shard_begin += k;
    }
    stream_offset += size;
  }

  // 2. Shuffle positions, node by node.
  const int64_t ncn = spec.canonical_nodes;
  std::vector<int64_t> perm(static_cast<size_t>(n));  // perm[k] = position in ids
  if (!spec.shuffle || spec.algo == "none") {
    std::iota(perm.begin(), perm.end(), 0);
  } else {
    Rng run_rng(spec.seed, kRunStream);
    fisher_yates(units.data(), static_cast<int64_t>(units.size()), run_rng);  // fixed for the whole run
    const auto nodes = divide_units(units, n, ncn);
    Rng rng(spec.seed ^ mix64(epoch_key + 1), kEpochStream);
    for (auto [b, e] : nodes) fisher_yates(units.data() + b, static_cast<int64_t>(e - b), rng);
    const int64_t bs = resolved_block_size(spec);
    int64_t out = 0;
    std::vector<double> key;
    std::vector<int64_t> idx;
    for (auto [b, e] : nodes) {
      const int64_t node_begin = out;
      for (size_t u = b; u < e; u++) {
        for (int64_t i = 0; i < units[u].size; i++) perm[out + i] = units[u].begin + i;
        fisher_yates(perm.data() + out, units[u].size, rng);
        out += units[u].size;
      }
      if (spec.algo == "py1e") {
        // Scatter each unit's samples over a window of 0.75–1.25 block sizes centred on the unit,
        // clipped to the node, then order the node's samples by their scattered positions.
        const int64_t m = out - node_begin;
        key.resize(static_cast<size_t>(m));
        for (int64_t i = 0; i < m; i++) key[i] = static_cast<double>(i);
        int64_t off = 0;
        const int64_t lo_w = bs * 3 / 4, hi_w = std::max(lo_w + 1, bs * 5 / 4);
        for (size_t u = b; u < e; u++) {
          const int64_t s = units[u].size;
          const int64_t w = lo_w + static_cast<int64_t>(rng.below(static_cast<uint64_t>(hi_w - lo_w)));
          const double c = std::max<double>(0.0, static_cast<double>(w - s) / 2);
          const double lo = std::max(-c, static_cast<double>(-off));
          const double hi = std::min(c, static_cast<double>(m - off - s));
          for (int64_t i = 0; i < s; i++) key[off + i] += lo + (hi - lo) * rng.uniform();
          off += s;
        }
        idx.resize(static_cast<size_t>(m));
        std::iota(idx.begin(), idx.end(), 0);
        std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b2) { return key[a] < key[b2]; });
        std::vector<int64_t> tmp(static_cast<size_t>(m));
        for (int64_t i = 0; i < m; i++) tmp[i] = perm[node_begin + idx[i]];
        std::copy(tmp.begin(), tmp.end(), perm.begin() + node_begin);
      }
    }
  }

  // 3. Interleave the canonical nodes' sequences round-robin (node p holds positions
  // [n·p/NCN, n·(p+1)/NCN) of perm); exhausted nodes are skipped.
  std::vector<int64_t> order(static_cast<size_t>(n));
  if (ncn == 1) {
    for (int64_t k = 0; k < n; k++) order[k] = ids[perm[k]];
  } else {
    int64_t k = 0;
    for (int64_t col = 0; k < n; col++)
      for (int64_t p = 0; p < ncn; p++) {
        const int64_t pos = n * p / ncn + col;
        if (pos < n * (p + 1) / ncn) order[k++] = ids[perm[pos]];
      }
  }
  return order;
}

std::string order_fingerprint(const OrderSpec& spec) {
  std::string s = fmt::format("shuffle={} algo={} seed={} block={} ncn={} epoch_size={}", spec.shuffle, spec.algo,
                              spec.seed, resolved_block_size(spec), spec.canonical_nodes, epoch_samples(spec));
  for (const auto& st : spec.streams) {
    s += fmt::format(" stream(p={:.17g}", st.proportion);
    for (int64_t k : st.shard_samples) s += fmt::format(",{}", k);
    s += ")";
  }
  return hex64(hash64(s.data(), s.size()));
}

}  // namespace anvil
