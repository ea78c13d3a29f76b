// A loader config made concrete: its streams opened (indexes fetched, caches ready) and the order
// spec that goes with them.
#pragma once
#include <memory>

#include "config/train_config.h"
#include "data/loader.h"
#include "data/streaming.h"
#include "data/tokenizer.h"

namespace anvil {

struct DataPipeline {
  std::unique_ptr<StreamingDataset> data;
  OrderSpec order;
};

DataPipeline open_data(const DatasetConfig& ds);

// Refuses a dataset whose recorded tokenizer (data/tokenizer.h) is not `tokenizer` (compared by
// the files' digest) or whose vocabulary does not fit the model's vocab_size. Streams without a
// record (written by other tools) are not compared.
void check_data_tokenizer(const StreamingDataset& data, const TokenizerFiles& tokenizer, int vocab_size);

}  // namespace anvil
