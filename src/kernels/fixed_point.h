// Fixed-point gradient accumulation: the exact, associative sum behind deterministic training.
//
// A value v of parameter tensor t is held as the integer round(v · 2^s_t) in an int64. Integer
// addition is associative, so gradients summed sample by sample, microbatch by microbatch and
// rank by rank give the same bits however the global batch is grouped, whichever all-reduce
// algorithm runs, and on the CPU or the GPU. Each sample's contribution is rounded once, at a
// scale that keeps the largest per-sample value near 2^46: about 22 bits finer than fp32 for the
// largest entries.
//
// The scale comes from state every rank shares: the previous step's largest per-sample value of
// the tensor, with 16x headroom. A step whose values outgrow that (any sample, any rank) is
// detected after the backward pass and run again at the scale its own maxima give, so the
// retry always fits; the first step assumes values below 1.
//
// The array functions are ops (kernels/op.h): their arrays, the maxima and sums included, are
// op memory, host or GPU.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/op.h"

namespace anvil {

// a + b with two's-complement wrap-around: a step that outgrew its scale (detected afterwards,
// then run again) may overflow, which must not be undefined behaviour; in range it is plain +.
inline int64_t fixed_point_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}

// Squares are summed as floor(acc² / 2^kSquareShift) (see fixed_point_squares).
constexpr int kSquareShift = 40;

// The scale exponent s for a tensor whose largest per-sample |value| is max_abs, when `samples`
// per-sample contributions are summed (the global batch): max_abs · 2^s lands 4 bits under the
// per-sample limit, which is 2^50, or less for global batches over 4096 sequences so that the
// sum stays under 2^62.
int fixed_point_scale(float max_abs, int64_t samples);
// Whether every per-sample value up to max_abs was exact at scale s (see fixed_point_accumulate).
bool fixed_point_fits(float max_abs, int s, int64_t samples);

// For each of `copies` arrays x_c = x + c · stride (several sequences' contributions, stride >= n):
// acc[i] += round(x_c[i] · 2^s) (to nearest, ties to even), then with `clear` x_c[i] = 0 (for
// contributions that are added to, not written: UnitAccess::grads_to_write), for i < n; *max_abs
// becomes the larger of itself and every |x_c[i]| as it was (infinity when one is NaN, so that a
// non-finite gradient is never lost in the maximum). Integer sums in any order are the same, so
// the copies at once give the bits of one call per copy, reading each accumulator once. Exact while
// |x_c[i]| · 2^s < 2^51; callers check the maximum against fixed_point_fits before trusting acc.
void fixed_point_accumulate(KernelImpl impl, int64_t* acc, float* x, size_t n, int copies, size_t stride, int s,
                            float* max_abs, bool clear);
// The same for the embedding rows one sequence touched, held compact: row r of x (offset
// r · row_len) goes to row rows[r] of acc (offset rows[r] · row_len), for r < n_rows. The rows
// must be distinct.
void fixed_point_accumulate_rows(KernelImpl impl, int64_t* acc, float* x, const int32_t* rows, size_t n_rows,
                                 size_t row_len, int s, float* max_abs);
// For each of `tensors` consecutive ranges of acc, range k = [bounds[k], bounds[k + 1]) (bounds[0]
// = 0, bounds[tensors] = n, non-decreasing; op memory like acc): squares[k] = Σ floor(acc[i]² /
// 2^kSquareShift) over the range, exact in 128-bit integers, so that sums of squares split over
// shards add up to the same bits. One call takes every tensor of a gradient (on a GPU, one pass
// over the array instead of a launch per tensor). At scale s the squared norm is squares[k] ·
// 2^(kSquareShift - 2s). (Entries below 2^-26 of the largest drop out of the norm: their squares
// are under 2^-52 of it.) The gradient's floats are read from acc by AdamW itself
// (kernels/optimizer.h, adamw_update_fixed).
void fixed_point_squares(KernelImpl impl, const int64_t* acc, size_t n, const size_t* bounds, size_t tensors,
                         unsigned __int128* squares);
// acc[i] += x[i] (wrapping, as fixed_point_add).
void fixed_point_add_arrays(KernelImpl impl, int64_t* acc, const int64_t* x, size_t n);

ANVIL_OP_IMPLEMENTATIONS(fixed_point_accumulate)
ANVIL_OP_IMPLEMENTATIONS(fixed_point_accumulate_rows)
ANVIL_OP_IMPLEMENTATIONS(fixed_point_squares)
ANVIL_OP_IMPLEMENTATIONS(fixed_point_add_arrays)

}  // namespace anvil
