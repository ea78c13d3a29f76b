// TensorBoard event files, written as TensorBoard reads them: a file named
// events.out.tfevents.<seconds>.<host>.<pid> of records (u64 length, masked CRC-32C of the
// length, the bytes, masked CRC-32C of the bytes), each an Event protobuf: the first carries
// file_version "brain.Event:2", the others a Summary of scalar values at a step.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace anvil {

class TensorBoardWriter {
 public:
  // Creates dir if needed and a new event file in it (a resumed run adds a file beside the old).
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event holding these (tag, value) scalars at `step`; written through to the file.
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& event);
  std::string path_;
  FILE* f_ = nullptr;
};

// CRC-32C (Castagnoli) and TensorBoard's mask of it (exposed for tests).
uint32_t crc32c(const void* data, size_t bytes);
uint32_t masked_crc32c(const void* data, size_t bytes);

}  // namespace anvil
