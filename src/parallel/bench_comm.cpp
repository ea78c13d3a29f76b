// All-reduce timing for `anvil bench comm`.
#include "parallel/bench_comm.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "parallel/collectives.h"

namespace anvil {

std::vector<BenchCommRow> bench_comm(Communicator& comm, size_t min_bytes, size_t max_bytes) {
  ANVIL_CHECK(min_bytes >= 4 && min_bytes <= max_bytes, "bench comm: sizes must satisfy 4 <= min <= max (got {} and "
              "{} bytes)", min_bytes, max_bytes);
  const int W = comm.size();
  std::vector<float> buf(max_bytes / sizeof(float), 0.0f);
  const std::pair<const char*, AllReduceAlgo> anvil_algos[] = {{"ring", AllReduceAlgo::kRing},
                                                               {"recursive_doubling", AllReduceAlgo::kRecursiveDoubling},
                                                               {"rank_ordered", AllReduceAlgo::kRankOrdered}};
  std::vector<BenchCommRow> rows;
  for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    const size_t n = bytes / sizeof(float);
    // About 256 MiB moved per measurement, between 3 and 200 calls.
    const int iters = static_cast<int>(std::clamp<size_t>((256u << 20) / bytes, 3, 200));
    for (int a = 0; a < 4; a++) {
      const std::string name = a < 3 ? anvil_algos[a].first : "mpi";
      auto once = [&] {
        if (a < 3)
          all_reduce(comm, buf.data(), n, anvil_algos[a].second);
        else
          comm.library_all_reduce(buf.data(), n);
      };
      once();  // warm-up: scratch buffers, connections
      barrier(comm);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; i++) once();
      const double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
      double slowest = 0;
      for (double t : all_gather_values(comm, mine)) slowest = std::max(slowest, t);
      BenchCommRow r;
      r.bytes = bytes;
      r.algo = name;
      r.iters = iters;
      r.seconds = slowest;
      r.algbw = static_cast<double>(bytes) / slowest / 1e9;
      r.busbw = r.algbw * 2.0 * (W - 1) / W;
      rows.push_back(r);
    }
  }
  return rows;
}

}  // namespace anvil
