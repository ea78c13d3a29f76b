// The gradient half of data parallelism (parallel/data_parallel.h describes the stages): where
// the model's gradient spans land, how they are summed (int64 fixed point in deterministic mode,
// fp32 otherwise), their reduction over the group as soon as the backward pass is done with a
// unit, and the reduced gradient this rank's optimizer reads, with its norm.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/buffer.h"
#include "parallel/data_parallel_context.h"

namespace anvil {

struct MemoryReport;

class GradientReduction {
 public:
  explicit GradientReduction(const DataParallelContext& ctx);

  void add_memory(MemoryReport& m) const;
  // Deterministic mode: the scratch for the model's largest spans (Model::largest_grads_span), which
  // grow with its microbatch.
  void fit_scratch();

  void begin_step();
  void begin_microbatch(bool last) { last_microbatch_ = last; }
  // The loss scale 2^log2 the step's gradients carry (exactly removed on their way to the sums).
  void set_loss_scale(double scale, int log2) {
    loss_scale_ = scale;
    loss_scale_log2_ = log2;
  }
  enum class Backward {
    kDone,      // the gradients are ready for the norm and the optimizer
    kRunAgain,  // a fixed-point gradient outgrew its scale: the scales now fit, run the step again
    kOverflow,  // a gradient is not finite under loss scaling: skip the step (no update)
  };
  // Waits for the reductions; the same answer on every rank. step: the step's number, for the
  // error a diverged run gets.
  Backward finish_backward(int64_t step);
  // The global gradient norm, the same on every rank.
  double global_norm();

  // What this rank's optimizer reads: the reduced gradient over [shards.lo, shards.hi), fp32 or
  // (deterministic) int64 with each tensor's scale exponent for this step.
  float* owned_grads();
  int64_t* owned_fixed();
  const std::vector<int>& step_scales() const { return step_scale_; }

  const std::vector<int>& scales() const { return scale_; }
  void set_scales(const std::vector<int>& scales);

  // UnitAccess's gradient half.
  float* grads(int unit, size_t offset, size_t count, int sequences);
  float* grads_to_write(int unit, size_t offset, size_t count, int sequences);
  void grain_done(int unit, size_t offset, size_t count, int sequences);
  void grain_rows(int unit, size_t offset, float* x, const int32_t* rows, const int32_t* rows_op, size_t n_rows,
                  size_t row_len);
  void grads_done(int unit);

 private:
  // A unit's working gradient under ZeRO-2/3, reduce-scattered into the shard after every microbatch.
  struct Slot {
    OpArray<float> buf;      // float mode
    OpArray<int64_t> fixed;  // deterministic mode
    int unit = -1;
    bool in_use = false;  // open in this microbatch
    uint64_t ticket = 0;  // the reduce-scatter reading it
  };
  Slot* open_slot(int unit);
  Slot* find_open_slot(int unit);
  // Deterministic training: where the unit's fixed-point gradient accumulates this microbatch,
  // opened (stages 2/3: a working slot) if it is not yet.
  int64_t* open_fixed(int unit);
  void sum_owned_squares();
  int tensor_at(int unit, size_t offset) const;  // the tensor holding the unit's element at offset

  DataParallelContext ctx_;
  const KernelImpl impl_;  // the model's: where its arrays live and what runs on them
  const std::vector<ParamUnit>& units_;
  const std::vector<ParamTensor>& tensors_;
  bool last_microbatch_ = true;
  double loss_scale_ = 1.0;
  int loss_scale_log2_ = 0;
  OpArray<float> grad_shard_;          // ZeRO-2/3 outside deterministic mode
  std::vector<float> error_feedback_;  // bf16 compression (host only)
  Slot emb_slot_, block_slots_[2];
  // Deterministic mode.
  std::vector<int> scale_;         // [tensor]: fixed-point exponent of this step
  std::vector<int> step_scale_;    // [tensor]: the exponents of the gradient AdamW reads this step
  OpArray<float> sample_max_;      // [tensor]: largest per-sequence |gradient| this step, this rank (loss-scaled)
  OpArray<unsigned __int128> owned_squares_;  // [tensor]: Σ floor(acc²/2^40) over what this rank owns
  OpArray<size_t> owned_bounds_;              // [tensor + 1]: where each tensor's part of what it owns starts
  std::vector<unsigned __int128> host_squares_;
  std::vector<int> next_scale_;  // scratch of finish_backward and global_norm
  std::vector<unsigned __int128> squares_, all_squares_;
  std::vector<float> all_max_, group_max_;
  // Pipeline stages (DataParallelOptions::pipeline): the tied embedding unit's tensors (the
  // stage's first), their maxima on the two stages that hold them, and every stage's squares and
  // scales, per tensor of the whole model ([stage · whole tensors + index]).
  size_t tied_tensors_ = 0;
  std::vector<float> tied_max_;
  struct StageSquares {
    unsigned __int128 squares;
    int64_t scale, held;  // 64-bit: no padding bytes go on the wire
  };
  std::vector<StageSquares> stage_squares_;
  // A share of a model cut among ranks (DataParallelOptions::tensor or experts): which tensors
  // are cut among the share group's ranks (the rest every rank holds whole), and every rank's
  // maxima and squares ([rank · tensors + tensor]). An expert share's whole tensors have each
  // member's gradient, summed over the group once reduced (whole_runs_: their owned runs).
  Communicator* share_group_ = nullptr;
  std::vector<bool> share_cut_;
  std::vector<float> share_max_;
  std::vector<unsigned __int128> share_squares_;
  std::vector<std::pair<size_t, size_t>> whole_runs_;  // [offset from the owned range's start, length)
  // The verdict on the step, agreed by every stage: the worst of theirs.
  Backward agreed(Backward mine);
  // A grain's contributions to a span of a unit's gradient (one sequence's, or on a GPU a span
  // per sequence of the microbatch), before rounding: the embeddings' spans, and the blocks' and
  // the final norm's.
  // Spans asked for to add to are zero; spans written (grads_to_write) are handed over as they are,
  // and leave buf[dirty_lo, dirty_hi) holding values that spans added to must have cleared first.
  struct Scratch {
    OpArray<float> buf;
    size_t origin = 0;  // the unit offset buf[0] stands for (the last span asked for)
    bool written = false;  // the last spans asked for are written
    size_t dirty_lo = 0, dirty_hi = 0;
  };
  // The scratch's spans for a grain (the checks both kinds share).
  Scratch& spans_for(int unit, size_t offset, size_t count, int sequences);
  Scratch& scratch_for(int unit) { return unit == 0 ? emb_scratch_ : block_scratch_; }
  Scratch emb_scratch_, block_scratch_;
  OpArray<int64_t> fixed_, fixed_shard_;  // stages 0/1: every gradient; 2/3: the shard
  std::vector<int64_t*> fixed_dest_;      // [unit]: where its open gradient accumulates
};

}  // namespace anvil
