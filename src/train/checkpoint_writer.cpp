// CheckpointWriter: see checkpoint_writer.h.
#include "train/checkpoint_writer.h"

#include <filesystem>

#include "core/fs.h"
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
  state_ = State::kWriting;
  thread_ = std::thread([this, tmp, shard = std::move(shard)] {
    try {
      write_checkpoint_shard(tmp, cfg_.model, shard, info_.step);
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
    join();
    barrier(comm_);  // every shard is on disk
    if (comm_.rank() == 0) start_finalize(/*background=*/false);
  }
  join();
  state_ = State::kIdle;
  return dir_;
}

}  // namespace anvil
