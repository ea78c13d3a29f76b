// CheckpointWriter: see checkpoint_writer.h.
#include "train/checkpoint_writer.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/progress.h"
#include "data/remote.h"
#include "parallel/collectives.h"

namespace anvil {
namespace fs = std::filesystem;

void upload_checkpoint(const std::string& dir, const std::string& remote, bool show_progress) {
  const std::unique_ptr<Remote> r = open_remote(remote, RemoteOptions{});
  const std::string name = fs::path(dir).filename().string();
  std::vector<fs::path> files;
  int64_t total = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) {
      files.push_back(e.path());
      total += static_cast<int64_t>(e.file_size());
    }
  std::sort(files.begin(), files.end());
  std::optional<Progress> bar;
  if (show_progress) bar.emplace("upload", total, "B");
  int64_t sent = 0;
  for (const fs::path& f : files) {
    r->store(f.string(), name + "/" + f.filename().string());
    sent += static_cast<int64_t>(fs::file_size(f));
    if (bar) bar->update(sent, name);
  }
  const std::string latest = dir + ".latest-upload";
  write_file_atomic(latest, name + "\n");
  try {
    r->store(latest, "latest");
  } catch (...) {
    std::error_code ignored;  // the upload's error is the one to report
    fs::remove(latest, ignored);
    throw;
  }
  fs::remove(latest);
  if (bar) bar->finish(name);
  log_info("checkpoint {} uploaded to {}", name, r->url(name));
}

std::string download_latest_checkpoint(const std::string& remote, const std::string& checkpoints_dir) {
  const std::unique_ptr<Remote> r = open_remote(remote, RemoteOptions{});
  if (!r->exists("latest")) return "";
  make_dirs(checkpoints_dir);
  const std::string pointer = checkpoints_dir + "/.latest-download";
  r->fetch("latest", pointer);
  std::string name = read_file(pointer, "checkpoint pointer");
  fs::remove(pointer);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  ANVIL_CHECK(name.rfind("step-", 0) == 0 && name.find('/') == std::string::npos, "{}: 'latest' holds '{}', not a "
              "checkpoint's name", r->url("latest"), name);
  const std::string tmp = checkpoints_dir + "/." + name + ".download", dir = checkpoints_dir + "/" + name;
  fs::remove_all(tmp);
  make_dirs(tmp);
  r->fetch(name + "/manifest.json", tmp + "/manifest.json");
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(read_file(tmp + "/manifest.json", "checkpoint manifest"));
    for (const auto& shard : manifest.at("shards")) {
      const std::string file = shard.at("file").get<std::string>();
      ANVIL_CHECK(file.find('/') == std::string::npos, "{}: a shard named '{}'", r->url(name + "/manifest.json"),
                  file);
      r->fetch(name + "/" + file, tmp + "/" + file);
    }
  } catch (const nlohmann::json::exception& e) {
    ANVIL_FAIL("{} is not a checkpoint manifest: {}", r->url(name + "/manifest.json"), e.what());
  }
  fs::remove_all(dir);
  fs::rename(tmp, dir);
  write_file_atomic(checkpoints_dir + "/latest", name + "\n");
  log_info("autoresume: downloaded {} from {}", name, r->url(name));
  return dir;
}

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
  auto work = [this, background] {
    try {
      dir_ = finalize_checkpoint(checkpoints_dir_, comm_.size(), cfg_, info_);
      prune_checkpoints(checkpoints_dir_, keep_);
      if (const std::string remote = checkpoints_remote(cfg_); !remote.empty())
        upload_checkpoint(dir_, remote, /*show_progress=*/!background);
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
