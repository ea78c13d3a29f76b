// Fixed-point gradient accumulation: the exact, associative sum behind deterministic training.
//
// A value v of parameter tensor t is held as the integer round(v · 2^s_t) in an int64. Integer
// addition is associative, so gradients summed sample by sample, microbatch by microbatch and
// rank by rank give the same bits however the global batch is grouped and whichever all-reduce
// algorithm runs. Each sample's contribution is rounded once, at a scale that keeps the largest
// per-sample value near 2^46: about 22 bits finer than fp32 for the largest entries.
//
// The scale comes from state every rank shares: the previous step's largest per-sample value of
// the tensor, with 16x headroom. A step whose values outgrow that (any sample, any rank) is
// detected after the backward pass and run again at the scale its own maxima give, so the
// retry always fits; the first step assumes values below 1.
#pragma once
#include <cstddef>
#include <cstdint>

namespace anvil {

// a + b with two's-complement wrap-around: a step that outgrew its scale (detected afterwards,
// then run again) may overflow, which must not be undefined behaviour; in range it is plain +.
inline int64_t fixed_point_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}

// acc[i] += round(x[i] · 2^s) (to nearest, ties to even), then x[i] = 0, for i < n. Returns
// max |x[i]| (as it was; infinity when any x[i] is NaN, so that a non-finite gradient is never
// lost in the maximum). Exact while |x[i]| · 2^s < 2^51; callers check the returned maximum
// against fixed_point_fits before trusting acc.
float fixed_point_accumulate(int64_t* acc, float* x, size_t n, int s);
// out[i] = acc[i] · 2^-s, rounded to float.
void fixed_point_to_float(float* out, const int64_t* acc, size_t n, int s);
// Σ floor(acc[i]² / 2^kSquareShift), exact in 128-bit integers: sums of squares split over
// shards add up to the same bits. (Entries below 2^-26 of the largest drop out of the norm:
// their squares are under 2^-52 of it.)
constexpr int kSquareShift = 40;
unsigned __int128 fixed_point_sum_squares(const int64_t* acc, size_t n);

// The scale exponent s for a tensor whose largest per-sample |value| is max_abs, when `samples`
// per-sample contributions are summed (the global batch): max_abs · 2^s lands 4 bits under the
// per-sample limit, which is 2^50, or less for global batches over 4096 sequences so that the
// sum stays under 2^62.
int fixed_point_scale(float max_abs, int64_t samples);
// Whether every per-sample value up to max_abs was exact at scale s (see fixed_point_accumulate).
bool fixed_point_fits(float max_abs, int s, int64_t samples);

}  // namespace anvil
