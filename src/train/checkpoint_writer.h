// Checkpoints saved in the background while training goes on: each rank writes its shard on its
// own thread, rank 0 completes the checkpoint (ckpt/checkpoint.h describes the format).
#pragma once
#include <atomic>
#include <exception>
#include <string>
#include <thread>

#include "ckpt/checkpoint.h"
#include "config/train_config.h"
#include "parallel/communicator.h"

namespace anvil {

// A complete checkpoint directory uploaded to `remote` (an s3:// save_folder): its files under its
// name, then `latest` naming it, so that whoever reads `latest` finds the checkpoint whole.
// show_progress: a progress bar of the bytes sent.
void upload_checkpoint(const std::string& dir, const std::string& remote, bool show_progress);
// Autoresume from an s3:// save_folder: the checkpoint its `latest` names, downloaded into
// checkpoints_dir (under a temporary name, renamed once whole); its directory, or "" when the
// folder holds no checkpoint.
std::string download_latest_checkpoint(const std::string& remote, const std::string& checkpoints_dir);

// Asynchronous saves. Every rank calls save at the same step with its own shard (a copy: training
// waits for nothing more) and poll after every step; the shards are written on background
// threads, and once all are, rank 0 completes the checkpoint on its own background thread and
// prunes the run's checkpoints to the newest `keep` (-1: all), then uploads it to an s3://
// save_folder (where none is pruned, as Composer keeps remote checkpoints). A pending save makes poll a small
// collective; finish (or the next save) completes it. Errors are rethrown there, or with
// save_failure: continue logged, the save abandoned on every rank and its temporary directory
// removed: the newest complete checkpoint stays `latest`.
class CheckpointWriter {
 public:
  explicit CheckpointWriter(Communicator& comm) : comm_(comm) {}
  ~CheckpointWriter();
  void save(const std::string& checkpoints_dir, const TrainConfig& cfg, CheckpointShard shard, CheckpointInfo info,
            int keep);
  void poll();
  // Returns the directory of the last checkpoint completed (on rank 0; empty on the others).
  std::string finish();

 private:
  enum class State { kIdle, kWriting, kFinalizing };
  // Waits for this rank's background work; its error is rethrown (save_failure: stop) or logged
  // (continue), and then true is returned.
  bool join();
  // Collective: whether the save failed on any rank (mine: on this one); rank 0 then removes the
  // temporary directory.
  bool any_rank_failed(bool mine);
  void start_finalize(bool background);

  Communicator& comm_;
  State state_ = State::kIdle;
  std::thread thread_;
  std::atomic<bool> written_{false};
  std::atomic<int64_t> bytes_written_{0};  // of this rank's shard, for the progress of a save waited for
  int64_t shard_bytes_ = 0;
  bool continue_on_failure_ = false;  // save_failure: continue
  std::exception_ptr error_;
  std::string checkpoints_dir_, dir_;
  TrainConfig cfg_;
  CheckpointInfo info_;
  int keep_ = -1;
};

}  // namespace anvil
