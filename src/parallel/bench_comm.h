// `anvil bench comm`: all-reduce bandwidth of each anvil algorithm beside the MPI library's own
// MPI_Allreduce, size by size, in one run (nccl-tests' definitions: algbw = bytes / time,
// busbw = algbw · 2(W-1)/W, the time being the slowest rank's average).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace anvil {

struct BenchCommRow {
  size_t bytes = 0;
  std::string algo;  // ring | recursive_doubling | rank_ordered | mpi
  int iters = 0;
  double seconds = 0;  // per all-reduce
  double algbw = 0, busbw = 0;  // GB/s
};

// Sizes double from min_bytes to max_bytes (multiples of 4 bytes). Every rank calls it.
std::vector<BenchCommRow> bench_comm(Communicator& comm, size_t min_bytes, size_t max_bytes);

}  // namespace anvil
