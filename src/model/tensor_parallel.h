// Tensor parallelism's cut of a model (Megatron's): R ranks share each block. Rank r holds heads
// [r·H/R, (r+1)·H/R) of the queries and of the keys and values (the rows of qkv that compute them,
// column-parallel) and the matching columns of the attention's output product (row-parallel), and
// the same share of the MLP's hidden units: its rows of the up (and gate) product, its columns of
// the down product. Everything else (embeddings, norms, the row-parallel products' biases, the LM
// head) every rank holds and computes whole.
//
// A rank's share of a block is a block of the same kind with fewer heads and a narrower MLP, so a
// rank's model is the model of tensor_share_config, and its parameters are cut from the whole
// model's array by take_tensor_share. Model::set_tensor_exchange then makes it one rank of R:
// each row-parallel product's output, and each column-parallel product's input gradient, is the
// sum over the ranks' parts of its k, which the ranks form as a chain in k order, each adding its
// part to the partial sum the previous rank hands on (matmul_forward's accumulate). With every
// part starting at a multiple of kMatmulSumBlock the sum has the bits of one process's product,
// so the weights are one process's for any R.
#pragma once
#include <string>

#include "config/model_config.h"

namespace anvil {

// Why R ranks cannot share cfg's blocks, or empty when they can: R must divide the query heads,
// the key/value heads and the MLP width, each rank's parts of them must start at a multiple of
// kMatmulSumBlock, and the blocks must be of a kind built for it (no QK norms, no mixture of
// experts, no LoRA yet).
std::string tensor_parallel_problem(const ModelConfig& cfg, int ranks);

// The model of one rank's share: cfg with 1/R of the heads and of the MLP's width.
ModelConfig tensor_share_config(const ModelConfig& cfg, int ranks);

// Rank `rank`'s share of a whole model's parameters (model_param_layout(cfg) order) into share
// (model_param_layout(tensor_share_config(cfg, ranks)) order), and back: put_tensor_share writes
// the share's values to their places in whole, leaving the rest.
void take_tensor_share(const ModelConfig& cfg, int ranks, int rank, const float* whole, float* share);
void put_tensor_share(const ModelConfig& cfg, int ranks, int rank, const float* share, float* whole);

// Whether the tensor of this name (model_param_layout's) is cut among the ranks; if not, every
// rank holds it whole.
bool tensor_parallel_cut(const std::string& name);

}  // namespace anvil
