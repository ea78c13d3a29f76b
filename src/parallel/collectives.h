// anvil's collectives, built on Communicator's point-to-point calls. All are in place, sum
// floats (or, for gradients in fixed point, 64-bit integers), and give every rank the same bits.
//
// Algorithms for all_reduce:
//   ring                reduce-scatter then all-gather around a ring: each rank sends 2(W-1)/W of
//                       the buffer, the bandwidth-optimal choice for large messages.
//   recursive_doubling  log2(W) exchanges of the whole buffer (non-powers of two fold the extra
//                       ranks in first): fewest messages, for small buffers.
//   rank_ordered        every element is summed in rank order 0, 1, ..., W-1 (each rank reduces
//                       its segment from all contributions, then a ring all-gather): the same
//                       bits as adding the W contributions one after another, whatever the
//                       segmenting. The deterministic mode.
//   auto                recursive doubling below 64 KiB, ring above.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/choices.h"
#include "parallel/communicator.h"

namespace anvil {

void all_reduce(Communicator& comm, float* data, size_t n, AllReduceAlgo algo = AllReduceAlgo::kAuto);
// Integer sums are exact, so every algorithm and every grouping of ranks gives the same result:
// the reduction behind deterministic training (fixed-point gradients).
void all_reduce(Communicator& comm, int64_t* data, size_t n, AllReduceAlgo algo = AllReduceAlgo::kAuto);

// Gradient all-reduce with bf16 on the wire: data + error is rounded to bf16, the rounding error
// is kept in error (n floats, zero at first) and added back next time (error feedback); partial
// sums travel as bf16 and are accumulated in fp32. Every rank ends with the same values.
void all_reduce_bf16(Communicator& comm, float* data, float* error, size_t n);

// counts[r]: the length of rank r's segment of data (segments in rank order, sum = data's
// length). reduce_scatter leaves the sum of every rank's segment r in rank r's segment r (the
// rest of data is scratch afterwards); all_gather copies each rank's segment to every rank.
// Uneven and empty segments are allowed. rank_ordered sums in rank order as all_reduce does.
void reduce_scatter(Communicator& comm, float* data, const std::vector<size_t>& counts,
                    AllReduceAlgo algo = AllReduceAlgo::kAuto);
void reduce_scatter(Communicator& comm, int64_t* data, const std::vector<size_t>& counts,
                    AllReduceAlgo algo = AllReduceAlgo::kAuto);
void all_gather(Communicator& comm, float* data, const std::vector<size_t>& counts);

// data holds W blocks of bytes_per_rank bytes; rank r's own block r is copied to every rank.
void all_gather_blocks(Communicator& comm, void* data, size_t bytes_per_rank);
// Small exact helpers: every rank's value(s), in rank order.
std::vector<double> all_gather_values(Communicator& comm, double value);
// The sum of every rank's value, added in rank order (the same bits on every rank).
double sum_in_rank_order(Communicator& comm, double value);
int64_t sum_exact(Communicator& comm, int64_t value);
int64_t max_exact(Communicator& comm, int64_t value);
void broadcast(Communicator& comm, void* data, size_t bytes, int root);
void barrier(Communicator& comm);

// The balanced split of n elements into parts (the first n % parts get one more).
std::vector<size_t> even_counts(size_t n, int parts);

}  // namespace anvil
