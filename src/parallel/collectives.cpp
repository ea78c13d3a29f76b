// Ring, recursive-doubling and rank-ordered collectives over Communicator's point-to-point calls.
// Scratch space is kept per thread between calls, so a training step does not allocate.
#include "parallel/collectives.h"

#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/fixed_point.h"

namespace anvil {
namespace {

enum Tag : int { kTagReduceScatter = 11, kTagAllGather, kTagRecursive, kTagOrdered, kTagBf16, kTagBroadcast };

template <typename T>
std::vector<T>& scratch(size_t n) {
  thread_local std::vector<T> buf;
  if (buf.size() < n) buf.resize(n);
  return buf;
}

std::vector<size_t> offsets_of(const std::vector<size_t>& counts) {
  std::vector<size_t> off(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); i++) off[i + 1] = off[i] + counts[i];
  return off;
}

int mod(int a, int w) { return ((a % w) + w) % w; }

// Sends and receives at once (either may be empty) and waits for both.
void exchange(Communicator& comm, const void* send, size_t send_bytes, int to, void* recv, size_t recv_bytes,
              int from, int tag, const char* operation) {
  PeerRequest reqs[2];
  size_t n = 0;
  if (recv_bytes > 0) reqs[n++] = comm.irecv(recv, recv_bytes, from, tag);
  if (send_bytes > 0) reqs[n++] = comm.isend(send, send_bytes, to, tag);
  comm.wait_all(reqs, n, operation);
}

void add_into(float* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] += src[i];
}
// Fixed-point gradients: reduced before an out-of-range step is detected, so they wrap.
void add_into(int64_t* dst, const int64_t* src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = fixed_point_add(dst[i], src[i]);
}

// Ring all-gather of byte segments: segment r starts at offsets[r] and is rank r's.
void ring_all_gather_bytes(Communicator& comm, char* data, const std::vector<size_t>& counts, const char* operation) {
  const int W = comm.size(), r = comm.rank();
  if (W == 1) return;
  const std::vector<size_t> off = offsets_of(counts);
  const int right = mod(r + 1, W), left = mod(r - 1, W);
  for (int s = 0; s < W - 1; s++) {
    const int send_seg = mod(r - s, W), recv_seg = mod(r - s - 1, W);
    exchange(comm, data + off[send_seg], counts[send_seg], right, data + off[recv_seg], counts[recv_seg], left,
             kTagAllGather, operation);
  }
}

// Ring reduce-scatter: after W-1 steps rank r's segment r holds the sum.
template <typename T>
void ring_reduce_scatter(Communicator& comm, T* data, const std::vector<size_t>& counts, const char* operation) {
  const int W = comm.size(), r = comm.rank();
  const std::vector<size_t> off = offsets_of(counts);
  size_t largest = 0;
  for (size_t c : counts) largest = std::max(largest, c);
  T* tmp = scratch<T>(largest).data();
  const int right = mod(r + 1, W), left = mod(r - 1, W);
  for (int s = 0; s < W - 1; s++) {
    const int send_seg = mod(r - s - 1, W), recv_seg = mod(r - s - 2, W);
    exchange(comm, data + off[send_seg], counts[send_seg] * sizeof(T), right, tmp,
             counts[recv_seg] * sizeof(T), left, kTagReduceScatter, operation);
    add_into(data + off[recv_seg], tmp, counts[recv_seg]);
  }
}

// Rank r receives every rank's segment r and adds them in rank order 0..W-1.
template <typename T>
void ordered_reduce_scatter(Communicator& comm, T* data, const std::vector<size_t>& counts, const char* operation) {
  const int W = comm.size(), r = comm.rank();
  const std::vector<size_t> off = offsets_of(counts);
  const size_t mine = counts[r];
  T* tmp = scratch<T>(mine * W).data();  // slot j: rank j's contribution
  std::vector<PeerRequest> reqs;
  reqs.reserve(2 * W);
  for (int j = 0; j < W; j++) {
    if (j == r) continue;
    if (mine > 0) reqs.push_back(comm.irecv(tmp + j * mine, mine * sizeof(T), j, kTagOrdered));
    if (counts[j] > 0) reqs.push_back(comm.isend(data + off[j], counts[j] * sizeof(T), j, kTagOrdered));
  }
  comm.wait_all(reqs.data(), reqs.size(), operation);
  if (mine == 0) return;
  T* out = data + off[r];
  std::memcpy(tmp + r * mine, out, mine * sizeof(T));
  std::memcpy(out, tmp, mine * sizeof(T));
  for (int j = 1; j < W; j++) add_into(out, tmp + j * mine, mine);
}

template <typename T>
void recursive_doubling(Communicator& comm, T* data, size_t n) {
  const int W = comm.size(), r = comm.rank();
  const char* op = "all_reduce (recursive doubling)";
  const size_t bytes = n * sizeof(T);
  T* tmp = scratch<T>(n).data();
  int p = 1;
  while (p * 2 <= W) p *= 2;
  const int extra = W - p;
  // Ranks p.. fold into ranks 0..extra-1, wait out the exchanges, then receive the result.
  if (r >= p) {
    exchange(comm, data, bytes, r - p, nullptr, 0, -1, kTagRecursive, op);
    exchange(comm, nullptr, 0, -1, data, bytes, r - p, kTagRecursive, op);
    return;
  }
  if (r < extra) {
    exchange(comm, nullptr, 0, -1, tmp, bytes, r + p, kTagRecursive, op);
    add_into(data, tmp, n);
  }
  // Partners hold the same set of contributions and a + b == b + a in IEEE arithmetic, so both
  // end every exchange with the same bits.
  for (int mask = 1; mask < p; mask <<= 1) {
    const int partner = r ^ mask;
    exchange(comm, data, bytes, partner, tmp, bytes, partner, kTagRecursive, op);
    add_into(data, tmp, n);
  }
  if (r < extra) exchange(comm, data, bytes, r + p, nullptr, 0, -1, kTagRecursive, op);
}

template <typename T>
std::vector<T> all_gather_pod(Communicator& comm, T value) {
  std::vector<T> all(comm.size());
  all[comm.rank()] = value;
  ring_all_gather_bytes(comm, reinterpret_cast<char*>(all.data()), std::vector<size_t>(comm.size(), sizeof(T)),
                        "all_gather of scalars");
  return all;
}

}  // namespace

std::vector<size_t> even_counts(size_t n, int parts) {
  std::vector<size_t> c(parts, n / parts);
  for (size_t i = 0; i < n % parts; i++) c[i]++;
  return c;
}

namespace {

template <typename T>
void reduce_scatter_any(Communicator& comm, T* data, const std::vector<size_t>& counts, AllReduceAlgo algo) {
  ANVIL_CHECK(counts.size() == static_cast<size_t>(comm.size()), "reduce_scatter: {} counts for {} ranks",
              counts.size(), comm.size());
  if (comm.size() == 1) return;
  if (algo == AllReduceAlgo::kRankOrdered)
    ordered_reduce_scatter(comm, data, counts, "reduce_scatter (rank ordered)");
  else
    ring_reduce_scatter(comm, data, counts, "reduce_scatter (ring)");
}

template <typename T>
void all_gather_any(Communicator& comm, T* data, const std::vector<size_t>& counts) {
  ANVIL_CHECK(counts.size() == static_cast<size_t>(comm.size()), "all_gather: {} counts for {} ranks", counts.size(),
              comm.size());
  std::vector<size_t> bytes(counts);
  for (size_t& b : bytes) b *= sizeof(T);
  ring_all_gather_bytes(comm, reinterpret_cast<char*>(data), bytes, "all_gather (ring)");
}

template <typename T>
void all_reduce_any(Communicator& comm, T* data, size_t n, AllReduceAlgo algo) {
  if (comm.size() == 1 || n == 0) return;
  if (algo == AllReduceAlgo::kAuto)
    algo = n * sizeof(T) < (64u << 10) ? AllReduceAlgo::kRecursiveDoubling : AllReduceAlgo::kRing;
  if (algo == AllReduceAlgo::kRecursiveDoubling) return recursive_doubling(comm, data, n);
  const std::vector<size_t> counts = even_counts(n, comm.size());
  reduce_scatter_any(comm, data, counts, algo);
  all_gather_any(comm, data, counts);
}

}  // namespace

void all_reduce(Communicator& comm, float* data, size_t n, AllReduceAlgo algo) { all_reduce_any(comm, data, n, algo); }
void all_reduce(Communicator& comm, int64_t* data, size_t n, AllReduceAlgo algo) {
  all_reduce_any(comm, data, n, algo);
}
void reduce_scatter(Communicator& comm, float* data, const std::vector<size_t>& counts, AllReduceAlgo algo) {
  reduce_scatter_any(comm, data, counts, algo);
}
void reduce_scatter(Communicator& comm, int64_t* data, const std::vector<size_t>& counts, AllReduceAlgo algo) {
  reduce_scatter_any(comm, data, counts, algo);
}
void all_gather(Communicator& comm, float* data, const std::vector<size_t>& counts) {
  all_gather_any(comm, data, counts);
}

void all_gather_blocks(Communicator& comm, void* data, size_t bytes_per_rank) {
  if (comm.size() == 1) return;
  ring_all_gather_bytes(comm, static_cast<char*>(data), std::vector<size_t>(comm.size(), bytes_per_rank),
                        "all_gather of small arrays");
}

void all_reduce_bf16(Communicator& comm, float* data, float* error, size_t n) {
  const int W = comm.size(), r = comm.rank();
  for (size_t i = 0; i < n; i++) {
    const float x = data[i] + error[i];
    const float q = bf16_to_float(float_to_bf16(x));
    error[i] = x - q;
    data[i] = q;
  }
  if (W == 1 || n == 0) return;
  const char* op = "all_reduce (bf16)";
  const std::vector<size_t> counts = even_counts(n, W);
  const std::vector<size_t> off = offsets_of(counts);
  const size_t seg = counts[0];
  thread_local std::vector<uint16_t> wire;
  if (wire.size() < n + seg) wire.resize(n + seg);
  uint16_t* out = wire.data();
  uint16_t* in = wire.data() + seg;
  const int right = mod(r + 1, W), left = mod(r - 1, W);
  // Reduce-scatter: partial sums travel as bf16 and are added in fp32.
  for (int s = 0; s < W - 1; s++) {
    const int send_seg = mod(r - s - 1, W), recv_seg = mod(r - s - 2, W);
    for (size_t i = 0; i < counts[send_seg]; i++) out[i] = float_to_bf16(data[off[send_seg] + i]);
    exchange(comm, out, counts[send_seg] * 2, right, in, counts[recv_seg] * 2, left, kTagBf16, op);
    for (size_t i = 0; i < counts[recv_seg]; i++) data[off[recv_seg] + i] += bf16_to_float(in[i]);
  }
  // All-gather of the rounded sums, so every rank (this one included) holds the same values.
  uint16_t* all = wire.data() + seg;
  for (size_t i = 0; i < counts[r]; i++) all[off[r] + i] = float_to_bf16(data[off[r] + i]);
  std::vector<size_t> bytes(counts);
  for (size_t& b : bytes) b *= 2;
  ring_all_gather_bytes(comm, reinterpret_cast<char*>(all), bytes, op);
  for (size_t i = 0; i < n; i++) data[i] = bf16_to_float(all[i]);
}

std::vector<double> all_gather_values(Communicator& comm, double value) { return all_gather_pod(comm, value); }

double sum_in_rank_order(Communicator& comm, double value) {
  if (comm.size() == 1) return value;
  double sum = 0;
  for (double v : all_gather_values(comm, value)) sum += v;
  return sum;
}

int64_t sum_exact(Communicator& comm, int64_t value) {
  if (comm.size() == 1) return value;
  int64_t sum = 0;
  for (int64_t v : all_gather_pod(comm, value)) sum += v;
  return sum;
}

int64_t max_exact(Communicator& comm, int64_t value) {
  if (comm.size() == 1) return value;
  int64_t most = value;
  for (int64_t v : all_gather_pod(comm, value)) most = std::max(most, v);
  return most;
}

void broadcast(Communicator& comm, void* data, size_t bytes, int root) {
  const int W = comm.size();
  if (W == 1 || bytes == 0) return;
  const int vr = mod(comm.rank() - root, W);
  int mask = 1;
  while (mask < W) {
    if (vr & mask) {
      exchange(comm, nullptr, 0, -1, data, bytes, mod(vr - mask + root, W), kTagBroadcast, "broadcast");
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (vr + mask < W) exchange(comm, data, bytes, mod(vr + mask + root, W), nullptr, 0, -1, kTagBroadcast, "broadcast");
}

void barrier(Communicator& comm) { all_gather_values(comm, 0.0); }

}  // namespace anvil
