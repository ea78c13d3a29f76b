// The microbatches of a step through the pipeline stages (parallel/pipeline.h), in the 1F1B
// order: stage s runs the forward passes of its first P - s - 1 microbatches, then alternates one
// forward and one backward pass, then finishes the backward passes; so it holds at most P - s
// microbatches' activations at once (one stage model per microbatch in flight, sharing the
// stage's parameters through the data-parallel unit access), and the last stage runs each
// microbatch's backward pass right after its forward pass. Activations go to the next stage and
// their gradients back as they are ready, without waiting for the send; a stage waits for what it
// receives, and for a buffer's last send before it fills the buffer again. Each microbatch's
// passes are the whole model's cut at the stages' ends (Model::stage_forward), and the backward
// passes reach the gradient sums in microbatch order, so the step's gradients are one process's.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "model/model.h"
#include "parallel/communicator.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline.h"

namespace anvil {

// The share of a step's microbatch slots a stage idles: 1F1B keeps each of P stages idle for
// P - 1 of the M + P - 1 slots of M microbatches (0 for one stage).
double pipeline_bubble(int stages, int microbatches);

class PipelineSchedule {
 public:
  // slots: the stage's models, one per microbatch it may hold at once; the first is the one dp
  // was built on, the others hold no parameters of their own and reach the stage's through dp.
  PipelineSchedule(const PipelineGroups& groups, std::vector<std::unique_ptr<Model>> slots, Model& first_slot,
                   DataParallel& dp);
  // A send still in flight (an error ended a pass) keeps its buffer: MPI may read it until the
  // job ends, which the error does.
  ~PipelineSchedule();
  int slots() const { return static_cast<int>(slots_.size()); }
  void set_compute_dtype(ComputeDtype dtype);
  size_t activation_bytes() const;
  // The last stage's bytes at data, copied to every stage (a collective of the pipeline group).
  void share_from_last(void* data, size_t bytes);
  // The sums of n counts over the stages, in place on every stage (a collective of the pipeline
  // group): each stage's share of what its blocks report (a mixture of experts' accounting).
  void sum_over_stages(int64_t* counts, size_t n);

  // What the last stage hands over after each microbatch's pass: its per-token losses (n
  // sequences of T) and their sum.
  using TakeLosses = std::function<void(const float* losses, int n, double sum)>;
  // What every stage of a mixture of experts hands over after each microbatch's backward pass: its
  // blocks' accounting of the pass.
  using TakeMoeStats = std::function<void(const Model::MoeStats& stats)>;
  // One step's passes over this rank's batch of B sequences of T tokens (its pipeline's: every
  // stage's ranks with this d hold the same), cut into microbatches of `microbatch`, the loss
  // weighted by dloss; dropout as set_dropout_position(at) for the batch's first sequence.
  // dp.begin_microbatch is called before each backward pass. take: on the last stage; take_moe:
  // on every stage, where the model has experts.
  void train(const int32_t* tokens, const int32_t* targets, const int32_t* positions, int B, int T, int microbatch,
             float dloss, const Model::DropoutPosition& at, const TakeLosses& take, const TakeMoeStats& take_moe);
  // An evaluation pass of B sequences (at most the microbatch the models hold); take: on the last stage.
  void evaluate(const int32_t* tokens, const int32_t* targets, int B, int T, const TakeLosses& take);

 private:
  // A buffer of rows sent to a neighbour (crossing_floats), and whether its send is in flight.
  struct Outbox {
    std::vector<float> rows;
    PeerRequest send;
    bool pending = false;
  };
  // The floats a stage's output or input gradient carries for a pass of this many token rows:
  // the rank's rows (tensor_held_rows) of d_model floats.
  size_t crossing_floats(int rows) const;
  void receive(std::vector<float>& rows, size_t n, int peer, int tag, const char* what);
  float* ready(Outbox& box, size_t n);  // the box's rows, once its last send is done
  void post(Outbox& box, size_t n, int peer, int tag);
  void finish_sends();

  const PipelineGroups& groups_;
  Communicator& comm_;  // the pipeline group: rank = stage
  DataParallel& dp_;
  std::vector<std::unique_ptr<Model>> owned_;
  std::vector<Model*> slots_;
  // Per slot: the activations received and the gradients received, and the outboxes.
  std::vector<std::vector<float>> inputs_, output_grads_;
  std::vector<Outbox> outputs_, input_grads_;
};

}  // namespace anvil
