// Progress bar for long operations (training, data preparation): one line redrawn in place on a
// terminal; on a pipe or file, a plain line every few seconds so logs stay readable.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace anvil {

class Progress {
 public:
  // redraw: a bar redrawn in place on a terminal (else plain lines, as on a pipe).
  Progress(std::string label, int64_t total, std::string unit, bool redraw = true);
  ~Progress();
  // done: units completed so far; status: free text shown after the bar (loss, lr, ...).
  void update(int64_t done, const std::string& status = "");
  void finish(const std::string& status = "");

 private:
  void draw(bool final_line);
  std::string label_, unit_, status_;
  int64_t total_, done_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool tty_, finished_ = false;
};

std::string format_duration(double seconds);  // "1h02m", "3m07s", "12s"
void progress_clear_line();                   // erase a bar in progress before a log line

}  // namespace anvil
