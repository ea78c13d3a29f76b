// anvil's collectives under mpirun (tests/parallel/run_collectives.sh runs 1, 2, 3 and 4 ranks).
// Inputs are small integers, whose sums are exact in any order, so every algorithm must give the
// exact sum, bit for bit; random inputs check that every rank ends with the same bits and that
// rank_ordered adds in rank order. `--late-rank R --timeout S` checks that a rank that never
// arrives ends the job with its name instead of a hang.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fs.h"
#include "core/rng.h"
#include "parallel/collectives.h"

namespace anvil {
namespace {

int g_failures = 0;
#define EXPECT(cond, ...)                                                                     \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      g_failures++;                                                                           \
      std::fprintf(stderr, "FAIL rank %d line %d: %s\n", comm.rank(), __LINE__, fmt::format(__VA_ARGS__).c_str()); \
    }                                                                                         \
  } while (0)

// Rank r's exact input at index i: a small integer, different per rank.
float exact_value(int r, size_t i) { return static_cast<float>(static_cast<int>((i * 7 + r * 13) % 11) - 5 + r); }
float exact_sum(int W, size_t i) {
  float s = 0;
  for (int r = 0; r < W; r++) s += exact_value(r, i);
  return s;
}
float random_value(int r, size_t i) { return static_cast<float>(uniform_at(1234, r, i) * 2.0 - 1.0) * 1e3f; }

bool same_bits(const float* a, const float* b, size_t n) { return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0; }

// Every rank's hash of the buffer is the same.
bool same_on_every_rank(Communicator& comm, const std::vector<float>& v) {
  const double h = static_cast<double>(hash64(v.data(), v.size() * sizeof(float)) >> 12);
  for (double x : all_gather_values(comm, h))
    if (x != h) return false;
  return true;
}

void test_all_reduce(Communicator& comm) {
  const int W = comm.size(), r = comm.rank();
  const size_t sizes[] = {0, 1, 2, 3, 5, 7, 64, 1000, 4099, 16384 + 3, (1u << 18) + 1};
  for (AllReduceAlgo algo : {AllReduceAlgo::kRing, AllReduceAlgo::kRecursiveDoubling, AllReduceAlgo::kRankOrdered,
                             AllReduceAlgo::kAuto}) {
    for (size_t n : sizes) {
      std::vector<float> v(n), want(n);
      for (size_t i = 0; i < n; i++) v[i] = exact_value(r, i), want[i] = exact_sum(W, i);
      all_reduce(comm, v.data(), n, algo);
      size_t bad = 0;
      while (bad < n && v[bad] == want[bad]) bad++;
      EXPECT(same_bits(v.data(), want.data(), n), "all_reduce {} n={} W={}: index {} got {} want {}",
             choice_name(algo), n, W, bad, bad < n ? v[bad] : 0.f, bad < n ? want[bad] : 0.f);

      // Random inputs: the same bits everywhere; rank_ordered equals ((x0 + x1) + x2) + ...
      for (size_t i = 0; i < n; i++) v[i] = random_value(r, i);
      all_reduce(comm, v.data(), n, algo);
      EXPECT(same_on_every_rank(comm, v), "all_reduce {} n={} W={}: ranks disagree", choice_name(algo), n, W);
      if (algo == AllReduceAlgo::kRankOrdered) {
        for (size_t i = 0; i < n; i++) {
          float s = random_value(0, i);
          for (int k = 1; k < W; k++) s += random_value(k, i);
          want[i] = s;
        }
        EXPECT(same_bits(v.data(), want.data(), n), "rank_ordered n={} W={}: not the rank-order sum", n, W);
      }
    }
  }
}

void test_scatter_gather(Communicator& comm) {
  const int W = comm.size(), r = comm.rank();
  // Uneven and empty segments.
  std::vector<std::vector<size_t>> layouts = {even_counts(10, W), even_counts(1, W), even_counts(0, W)};
  std::vector<size_t> odd(W);
  for (int k = 0; k < W; k++) odd[k] = k % 2 == 0 ? 3 * k + 1 : 0;
  layouts.push_back(odd);
  for (AllReduceAlgo algo : {AllReduceAlgo::kRing, AllReduceAlgo::kRankOrdered}) {
    for (const auto& counts : layouts) {
      size_t n = 0, mine = 0;
      for (int k = 0; k < W; k++) {
        if (k < r) mine += counts[k];
        n += counts[k];
      }
      std::vector<float> v(n);
      for (size_t i = 0; i < n; i++) v[i] = exact_value(r, i);
      reduce_scatter(comm, v.data(), counts, algo);
      bool ok = true;
      for (size_t i = mine; i < mine + counts[r]; i++) ok &= v[i] == exact_sum(W, i);
      EXPECT(ok, "reduce_scatter {} W={} n={}: rank {}'s segment is not the sum", choice_name(algo), W, n, r);
      // All-gather of the reduced segments gives the whole sum everywhere.
      all_gather(comm, v.data(), counts);
      ok = true;
      for (size_t i = 0; i < n; i++) ok &= v[i] == exact_sum(W, i);
      EXPECT(ok, "all_gather W={} n={}: not the whole sum", W, n);
    }
  }
}

void test_bf16(Communicator& comm) {
  const int W = comm.size(), r = comm.rank();
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{65537}}) {
    // Small integers are exact in bf16, and so are their sums here (|sum| < 256).
    std::vector<float> v(n), err(n, 0.0f);
    for (size_t i = 0; i < n; i++) v[i] = exact_value(r, i);
    all_reduce_bf16(comm, v.data(), err.data(), n);
    bool ok = true;
    for (size_t i = 0; i < n; i++) ok &= v[i] == exact_sum(W, i) && err[i] == 0.0f;
    EXPECT(ok, "all_reduce_bf16 W={} n={}: not the exact sum", W, n);
    // Values bf16 cannot hold: the rounding error is kept, and all ranks agree.
    for (size_t i = 0; i < n; i++) v[i] = 1.0f + 1e-3f * static_cast<float>(i % 5), err[i] = 0.0f;
    all_reduce_bf16(comm, v.data(), err.data(), n);
    ok = true;
    for (size_t i = 0; i < n; i++) {
      const float x = 1.0f + 1e-3f * static_cast<float>(i % 5);
      ok &= std::fabs(err[i]) <= 4e-3f && std::fabs(v[i] - W * x) <= 0.02f * W;
    }
    EXPECT(ok, "all_reduce_bf16 W={} n={}: error feedback or sum out of bounds", W, n);
    EXPECT(same_on_every_rank(comm, v), "all_reduce_bf16 W={} n={}: ranks disagree", W, n);
  }
}

void test_small(Communicator& comm) {
  const int W = comm.size(), r = comm.rank();
  EXPECT(sum_exact(comm, int64_t{1} << 40 | r) == (int64_t{W} << 40) + W * (W - 1) / 2, "sum_exact");
  std::vector<double> all = all_gather_values(comm, 10.0 * r);
  bool ok = all.size() == static_cast<size_t>(W);
  for (int k = 0; ok && k < W; k++) ok &= all[k] == 10.0 * k;
  EXPECT(ok, "all_gather_values");
  for (int root = 0; root < W; root++) {
    char msg[32] = {};
    if (r == root) std::snprintf(msg, sizeof msg, "from root %d", root);
    broadcast(comm, msg, sizeof msg, root);
    EXPECT(std::string(msg) == fmt::format("from root {}", root), "broadcast from {} gave '{}'", root, msg);
  }
  barrier(comm);
  std::vector<float> v(W * 3 + 1);
  for (size_t i = 0; i < v.size(); i++) v[i] = exact_value(r, i);
  comm.library_all_reduce(v.data(), v.size());
  ok = true;
  for (size_t i = 0; i < v.size(); i++) ok &= v[i] == exact_sum(W, i);
  EXPECT(ok, "library all-reduce");
}

int run(int argc, char** argv) {
  int late_rank = -1;
  double timeout = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--late-rank") late_rank = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--timeout") timeout = std::atof(argv[i + 1]);
  }
  auto owned = make_communicator(/*require_mpi=*/true);
  Communicator& comm = *owned;
  if (timeout > 0) comm.set_timeout(timeout);
  if (late_rank >= 0) {
    if (comm.rank() == late_rank) sleep(120);  // never arrives in time
    std::vector<float> v(1000, 1.0f);
    all_reduce(comm, v.data(), v.size(), AllReduceAlgo::kRing);
    std::fprintf(stderr, "rank %d: the all-reduce completed although rank %d never joined\n", comm.rank(), late_rank);
    return 1;
  }
  test_small(comm);
  test_all_reduce(comm);
  test_scatter_gather(comm);
  test_bf16(comm);
  const int64_t failures = sum_exact(comm, g_failures);
  if (comm.rank() == 0)
    std::printf("collectives on %d rank(s) (%s): %s\n", comm.size(), comm.backend().c_str(),
                failures == 0 ? "all passed" : fmt::format("{} failure(s)", failures).c_str());
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace anvil

int main(int argc, char** argv) {
  try {
    return anvil::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
