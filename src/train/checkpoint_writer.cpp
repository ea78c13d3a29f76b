// CheckpointWriter: see checkpoint_writer.h.
#include "train/checkpoint_writer.h"

#include <chrono>
#include <filesystem>

#include <fmt/format.h>

#include "core/fs.h"
#include "core/progress.h"
#include "dist/collectives.h"

namespace anvil {
namespace fs = std::filesystem;

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();
}

void CheckpointWriter::join() {
  if (thread_.joinable()) thread_.join();
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    state_ = State::kIdle;
    std::rethrow_exception(e);
  }
}

void CheckpointWriter::save(const std::string& checkpoints_dir, const TrainConfig& cfg, CheckpointShard shard,
                            CheckpointInfo info, int keep) {
  finish();
  checkpoints_dir_ = checkpoints_dir;
  cfg_ = cfg;
  info_ = std::move(info);
  keep_ = keep;
  const std::string tmp = checkpoint_temp_dir(checkpoints_dir, info_.step);
  if (comm_.rank() == 0) {
    fs::remove_all(tmp);  // left by a save of this step that was interrupted
    make_dirs(tmp);
  }
  barrier(comm_);  // the directory exists before any rank writes into it
  written_ = false;
  bytes_written_ = 0;
  shard_bytes_ = static_cast<int64_t>(3 * shard.params.size() * sizeof(float));
  state_ = State::kWriting;
  thread_ = std::thread([this, tmp, shard = std::move(shard)] {
    try {
      write_checkpoint_shard(tmp, cfg_.model, shard, info_.step, &bytes_written_);
    } catch (...) {
      error_ = std::current_exception();
    }
    written_ = true;
  });
}

void CheckpointWriter::start_finalize(bool background) {
  auto work = [this] {
    try {
      dir_ = finalize_checkpoint(checkpoints_dir_, comm_.size(), cfg_, info_);
      prune_checkpoints(checkpoints_dir_, keep_);
    } catch (...) {
      error_ = std::current_exception();
    }
  };
  state_ = State::kFinalizing;
  if (background)
    thread_ = std::thread(work);
  else
    work();
}

void CheckpointWriter::poll() {
  if (state_ != State::kWriting) return;
  // Every rank is writing the same checkpoint, so every rank takes part in this count.
  if (sum_exact(comm_, written_ ? 1 : 0) < comm_.size()) return;
  join();
  if (comm_.rank() == 0)
    start_finalize(/*background=*/true);
  else
    state_ = State::kIdle;
}

std::string CheckpointWriter::finish() {
  if (state_ == State::kWriting) {
    if (comm_.rank() == 0 && !written_) {
      // Training waits here for the rest of the save: show its progress (this rank's shard).
      Progress bar("save", shard_bytes_, "B");
      while (!written_) {
        bar.update(bytes_written_, fmt::format("step {}", info_.step));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      bar.finish(fmt::format("step {}", info_.step));
    }
    join();
    barrier(comm_);  // every shard is on disk
    if (comm_.rank() == 0) start_finalize(/*background=*/false);
  }
  join();
  state_ = State::kIdle;
  return dir_;
}

}  // namespace anvil
