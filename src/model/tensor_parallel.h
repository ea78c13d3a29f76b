// Tensor parallelism's cut of a model (Megatron's): R ranks share each block. Rank r holds heads
// [r·H/R, (r+1)·H/R) of the queries and of the keys and values (the rows of qkv that compute them,
// column-parallel) and the matching columns of the attention's output product (row-parallel), and
// the same share of the MLP's hidden units: its rows of the up (and gate) product, its columns of
// the down product. The vocabulary is cut too (vocabulary-parallel): rank r holds the rows of the
// token embeddings and of the LM head for its token ids (tensor_vocab_slice), looks up its tokens'
// rows, forms its columns of the logits and takes its part in a cross-entropy whose per-row max
// and sums the ranks exchange (kernels/crossentropy.h's slice steps). The rest of the parameters
// (positional embeddings, norms, the row-parallel products' biases) every rank holds whole. The
// residual stream is cut by rows (sequence parallelism): rank r holds rows [N·r/R, N·(r+1)/R) of
// a pass's N, and runs the norms and residual sums over them (Decoder's held rows); a norm's
// output is gathered whole for the product it feeds, and a row-parallel product's output goes to
// each row's holder.
//
// A rank's share of a block is a block of the same kind with fewer heads and a narrower MLP, and
// its share of the vocabulary a smaller vocabulary starting at vocab_first, so a rank's model is
// the model of tensor_share_config, and its parameters are cut from the whole model's array by
// take_tensor_share. Model::set_tensor_exchange then makes it one rank of R: each row-parallel
// product's output, and each column-parallel product's input gradient (the LM head's too, whose k
// is the vocabulary), is the sum over the ranks' parts of its k, which the ranks form as a chain in
// k order, each adding its part to the partial sum the previous rank hands on (matmul_forward's
// accumulate) in the GEMM's own k blocks (tensor_k_chain: a block that straddles several ranks'
// parts is added whole by one of them); a norm's weight gradient over rows held by several ranks is a
// chain of them in row order. So each product's sum has the bits of one process's, and with every
// vocabulary slice starting at a multiple of kCrossentropySumBlock the loss and its gradient have
// one process's bits: the weights are one process's for any R.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/model_config.h"

namespace anvil {

// Why R ranks cannot share cfg's blocks, or empty when they can: R must divide the query heads,
// the key/value heads and the MLP width, the vocabulary must span at least R of the
// cross-entropy's sum blocks, and the
// blocks must be of a kind built for it (no mixture of experts, no LoRA yet).
std::string tensor_parallel_problem(const ModelConfig& cfg, int ranks);

// Rank `rank`'s token ids: whole sum blocks (kCrossentropySumBlock) of the vocabulary, as many to
// each rank as they divide (the first ranks take one more where they do not), the last block,
// perhaps partial, the last rank's.
struct VocabSlice {
  int first = 0, size = 0;
};
VocabSlice tensor_vocab_slice(int vocab, int ranks, int rank);

// Sequence parallelism's cut of a pass's N token rows: rank r of a share's R ranks holds rows
// [N·r/R, N·(r+1)/R) of the residual stream; a whole model (cfg not a share) holds all N. A
// pipeline stage's output and input gradient carry the rank's rows alone, which its peer in the
// neighbouring stage (a share of the same rank) holds too.
struct HeldRows {
  int first = 0, n = 0;
};
HeldRows tensor_held_rows(const ModelConfig& cfg, int rank, int N);

// A product whose k is cut among the ranks (a row-parallel product's forward pass, a
// column-parallel one's input gradient) is summed as one process's GEMM sums it: in blocks of
// kMatmulSumBlock of the whole k, each block's chain started from zero and added to the output in
// order. The ranks hold runs of the whole k (KSegment: rank's k [local, local + len)), in the
// whole k's order. A block within one rank's run is that rank's to add; a block that straddles
// ranks is added by the rank holding its end, which the others send their columns of it to. So
// the ranks' parts need not be whole blocks.
struct KSegment {
  int rank = 0, local = 0, len = 0;
};
// The pieces the ranks add to the output in turn, in order: a run of whole blocks of one rank's
// own k (one segment), or one block assembled from several ranks' segments, added by the rank of
// its last (`rank`).
struct KChainPiece {
  int rank = 0;
  std::vector<KSegment> segments;
  bool assembled() const { return segments.size() > 1; }
};
std::vector<KChainPiece> tensor_k_chain(const std::vector<KSegment>& whole_k);

// The model of rank's share: cfg with 1/R of the heads and of the MLP's width, and its slice of
// the vocabulary.
ModelConfig tensor_share_config(const ModelConfig& cfg, int ranks, int rank);

// Expert parallelism's cut of a mixture of experts: R ranks share its experts, rank r running
// and holding experts [r·E/R, (r+1)·E/R) (ModelConfig::first_expert, held_experts); the rest of
// the parameters, the router's included, every rank holds whole.
ModelConfig expert_share_config(const ModelConfig& cfg, int ranks, int rank);

// A share of whole's model (tensor_share_config's or expert_share_config's, share) from the
// whole model's parameters (model_param_layout(whole) order) into the share's
// (model_param_layout(share) order), and back: put_share writes the share's values to their
// places in the whole array, leaving the rest.
void take_share(const ModelConfig& whole, const ModelConfig& share, const float* from, float* to);
void put_share(const ModelConfig& whole, const ModelConfig& share, const float* from, float* to);
// The same into a range [lo, hi) of the whole array alone: out[i - lo] = whole[i] for the share's
// elements i in it.
void put_share_range(const ModelConfig& whole, const ModelConfig& share, const float* from, size_t lo, size_t hi,
                     float* out);

// Elements [lo, hi) of the share's part of the whole model's initial values (model_init_params
// with seed) into out, formed alone: the whole model is never built.
void init_share(const ModelConfig& whole, const ModelConfig& share, uint64_t seed, size_t lo, size_t hi, float* out);

// Whether the tensor of this name (model_param_layout's) is cut among the share's ranks; if not,
// every rank holds it whole.
bool share_cut(const ModelConfig& share, const std::string& name);

}  // namespace anvil
