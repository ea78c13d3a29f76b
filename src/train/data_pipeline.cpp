#include "train/data_pipeline.h"

#include <optional>

#include "core/error.h"

namespace anvil {

DataPipeline open_data(const DatasetConfig& ds) {
  std::vector<StreamSource> sources;
  if (ds.streams.empty()) {
    sources.push_back({"default", ds.remote, ds.local, ds.split, 1.0});
  } else {
    for (const StreamConfig& s : ds.streams) sources.push_back({s.name, s.remote, s.local, s.split, s.proportion});
  }
  StreamingOptions opt;
  opt.cache_limit = ds.cache_limit;
  opt.remote.retries = ds.download_retry;
  opt.remote.timeout_s = ds.download_timeout;
  opt.validate_hash = ds.validate_hash;
  DataPipeline p;
  p.data = std::make_unique<StreamingDataset>(sources, opt);
  p.order.shuffle = ds.shuffle;
  p.order.algo = ds.shuffle_algo;
  p.order.seed = ds.shuffle_seed;
  p.order.block_size = ds.shuffle_block_size;
  p.order.canonical_nodes = ds.num_canonical_nodes;
  p.order.epoch_size = ds.epoch_size;
  for (int s = 0; s < p.data->num_streams(); s++)
    p.order.streams.push_back({p.data->shard_samples(s), sources[static_cast<size_t>(s)].proportion});
  return p;
}

void check_data_tokenizer(const StreamingDataset& data, const TokenizerFiles& tokenizer, int vocab_size) {
  for (int s = 0; s < data.num_streams(); s++) {
    const std::optional<TokenizerRecord>& rec = data.tokenizer_record(s);
    if (!rec) continue;
    const StreamSource& src = data.source(s);
    const std::string where = src.remote.empty() ? src.local : src.remote;
    ANVIL_CHECK(rec->sha256 == tokenizer.sha256, "the data in '{}' was prepared with tokenizer {} ({}), not with "
                "tokenizer.name {} ({}): prepare it again with --tokenizer {}, or name its tokenizer in the config",
                where, rec->name, rec->kind, tokenizer.name, tokenizer_kind_name(tokenizer.kind), tokenizer.name);
    ANVIL_CHECK(rec->vocab_size <= vocab_size, "the data in '{}' holds ids of a {}-token vocabulary ({}), more than "
                "the model's vocab_size {}", where, rec->vocab_size, rec->name, vocab_size);
  }
}

}  // namespace anvil
