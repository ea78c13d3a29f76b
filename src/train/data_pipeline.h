// A loader config made concrete: its streams opened (indexes fetched, caches ready) and the order
// spec that goes with them.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/train_config.h"
#include "data/loader.h"
#include "data/streaming.h"
#include "data/tokenizer.h"
#include "parallel/communicator.h"

namespace anvil {

struct DataPipeline {
  std::unique_ptr<StreamingDataset> data;
  OrderSpec order;
  std::optional<FinetuningExamples> finetuning;  // a finetuning loader's
};

// Opens the loader's data. A finetuning loader that reads JSON records (hf_name) has them
// tokenized first into an MDS dataset under `prepared_dir`, which rank 0 writes while the others
// wait and later runs reuse while the records and settings stay the same; `notes` receives what
// became of the records (for the log).
DataPipeline open_data(const LoaderConfig& loader, int max_seq_len, const std::string& tokenizer,
                       const std::string& prepared_dir, Communicator& comm, std::vector<std::string>& notes);

// Refuses a dataset whose recorded tokenizer (data/tokenizer.h) is not `tokenizer` (compared by
// the files' digest) or whose vocabulary does not fit the model's vocab_size. Streams without a
// record (written by other tools) are not compared.
void check_data_tokenizer(const StreamingDataset& data, const TokenizerFiles& tokenizer, int vocab_size);

}  // namespace anvil
