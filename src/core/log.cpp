// Console lines go to stderr so that stdout stays clean for command output (ids, samples).
#include "core/log.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

#include "core/error.h"
#include "core/progress.h"

namespace anvil {
namespace {
std::mutex g_mutex;
FILE* g_file = nullptr;
int g_rank = 0, g_world = 1;

std::string timestamp() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}
}  // namespace

void log_set_rank(int rank, int world) {
  std::lock_guard lock(g_mutex);
  g_rank = rank;
  g_world = world;
}

void log_to_file(const std::string& path) {
  std::lock_guard lock(g_mutex);
  if (g_file) std::fclose(g_file);
  g_file = std::fopen(path.c_str(), "a");
  ANVIL_CHECK(g_file, "cannot open log file {} for appending", path);
}

void log_close_file() {
  std::lock_guard lock(g_mutex);
  if (g_file) std::fclose(g_file);
  g_file = nullptr;
}

void log_line(LogLevel level, const std::string& message) {
  const char* tag = level == LogLevel::kInfo ? "" : level == LogLevel::kWarn ? "warning: " : "error: ";
  std::lock_guard lock(g_mutex);
  if (g_rank != 0 && level == LogLevel::kInfo) return;
  progress_clear_line();
  if (g_world > 1 && g_rank != 0)
    std::fprintf(stderr, "[rank %d] %s%s\n", g_rank, tag, message.c_str());
  else
    std::fprintf(stderr, "%s%s\n", tag, message.c_str());
  if (g_file) {
    std::fprintf(g_file, "%s %s%s\n", timestamp().c_str(), tag, message.c_str());
    std::fflush(g_file);
  }
}

void log_file_only(const std::string& message) {
  std::lock_guard lock(g_mutex);
  if (g_file) {
    std::fprintf(g_file, "%s %s\n", timestamp().c_str(), message.c_str());
    std::fflush(g_file);
  }
}

}  // namespace anvil
