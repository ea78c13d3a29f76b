// A loader config made concrete: its streams opened (indexes fetched, caches ready) and the order
// spec that goes with them.
#pragma once
#include <memory>

#include "config/train_config.h"
#include "data/loader.h"
#include "data/streaming.h"

namespace anvil {

struct DataPipeline {
  std::unique_ptr<StreamingDataset> data;
  OrderSpec order;
};

DataPipeline open_data(const DatasetConfig& ds);

}  // namespace anvil
