// CheckpointWriter: see checkpoint_writer.h.
#include "train/checkpoint_writer.h"

#include <chrono>
#include <filesystem>

#include <fmt/format.h>

#include "core/fs.h"
#include "core/log.h"
#include "core/progress.h"
#include "dist/collectives.h"

namespace anvil {
namespace fs = std::filesystem;

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();
}

bool CheckpointWriter::join() {
  if (thread_.joinable()) thread_.join();
  if (!error_) return false;
  std::exception_ptr e = error_;
  error_ = nullptr;
  if (!continue_on_failure_) {
    // The run stops: what this save wrote goes, so that nothing partial is left beside the
    // previous checkpoint.
    std::error_code ec;
    fs::remove_all(checkpoint_temp_dir(checkpoints_dir_, info_.step), ec);
    state_ = State::kIdle;
    std::rethrow_exception(e);
  }
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    log_warn("the checkpoint of step {} was not saved: {}; training goes on (save_failure: continue)", info_.step,
             x.what());
  }
  return true;
}

bool CheckpointWriter::any_rank_failed(bool mine) {
  const bool failed = sum_exact(comm_, mine ? 1 : 0) > 0;
  if (failed && comm_.rank() == 0) {
    std::error_code ec;
    fs::remove_all(checkpoint_temp_dir(checkpoints_dir_, info_.step), ec);  // never taken for a checkpoint
  }
  return failed;
}

void CheckpointWriter::save(const std::string& checkpoints_dir, const TrainConfig& cfg, CheckpointShard shard,
                            CheckpointInfo info, int keep) {
  finish();
  checkpoints_dir_ = checkpoints_dir;
  cfg_ = cfg;
  info_ = std::move(info);
  keep_ = keep;
  continue_on_failure_ = cfg.save_failure == SaveFailure::kContinue;
  const std::string tmp = checkpoint_temp_dir(checkpoints_dir, info_.step);
  bool made = true;
  if (comm_.rank() == 0) {
    try {
      fs::remove_all(tmp);  // left by a save of this step that was interrupted
      make_dirs(tmp);
    } catch (const std::exception&) {
      error_ = std::current_exception();
      made = !join();
    }
  }
  // Every rank learns that the directory exists before any writes into it.
  if (any_rank_failed(!made)) return;
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
      std::error_code ec;
      fs::remove_all(checkpoint_temp_dir(checkpoints_dir_, info_.step), ec);  // never taken for a checkpoint
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
  if (any_rank_failed(join()) || comm_.rank() != 0) {
    state_ = State::kIdle;
    return;
  }
  start_finalize(/*background=*/true);
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
    // Every shard is on disk (or one failed, and nothing is finalized) once every rank has joined.
    if (!any_rank_failed(join()) && comm_.rank() == 0) start_finalize(/*background=*/false);
  }
  join();
  state_ = State::kIdle;
  return dir_;
}

}  // namespace anvil
