// Logging: human-readable lines to stderr and, once a run directory exists, to its log file.
#pragma once
#include <fmt/format.h>
#include <string>

namespace anvil {

enum class LogLevel { kInfo, kWarn, kError };

// In a job of several ranks, only rank 0 prints information; the others print warnings and
// errors, prefixed with their rank.
void log_set_rank(int rank, int world);
void log_to_file(const std::string& path);  // also append every line to this file
void log_close_file();
void log_line(LogLevel level, const std::string& message);
void log_file_only(const std::string& message);  // to the log file, not the console

template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  log_line(LogLevel::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  log_line(LogLevel::kWarn, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace anvil
