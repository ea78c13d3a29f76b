// The progress bar: redrawn at most ten times a second on a terminal, every ten seconds otherwise.
#include "core/progress.h"

#include <unistd.h>

#include <cstdio>
#include <fmt/format.h>

namespace anvil {
namespace {
bool g_bar_on_screen = false;
}

std::string format_duration(double s) {
  if (s < 0 || s != s) return "?";
  auto t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

void progress_clear_line() {
  if (g_bar_on_screen) {
    std::fputs("\r\033[K", stderr);
    g_bar_on_screen = false;
  }
}

Progress::Progress(std::string label, int64_t total, std::string unit, bool redraw)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total),
      start_(std::chrono::steady_clock::now()), last_draw_(start_),
      tty_(redraw && isatty(STDERR_FILENO) == 1 && std::getenv("CI") == nullptr) {}

Progress::~Progress() {
  if (!finished_) progress_clear_line();
}

void Progress::update(int64_t done, const std::string& status) {
  done_ = done;
  status_ = status;
  auto now = std::chrono::steady_clock::now();
  double since = std::chrono::duration<double>(now - last_draw_).count();
  if (tty_ ? since >= 0.1 : since >= 10.0) {
    last_draw_ = now;
    draw(false);
  }
}

void Progress::finish(const std::string& status) {
  if (!status.empty()) status_ = status;
  draw(true);
  finished_ = true;
}

void Progress::draw(bool final_line) {
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double frac = total_ > 0 ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
  double eta = done_ > 0 ? elapsed * (1.0 - frac) / frac : -1.0;
  // Bytes read as sizes (KiB, MiB, GiB), anything else as counts of its unit.
  const bool bytes = unit_ == "B";
  auto amount = [&](int64_t v) {
    if (!bytes) return fmt::format("{}", v);
    const double x = static_cast<double>(v);
    return x >= 1073741824.0 ? fmt::format("{:.2f} GiB", x / 1073741824.0)
           : x >= 1048576.0  ? fmt::format("{:.1f} MiB", x / 1048576.0)
                             : fmt::format("{:.1f} KiB", x / 1024.0);
  };
  const std::string of = bytes ? fmt::format("{}/{}", amount(done_), amount(total_))
                               : fmt::format("{}/{} {}", done_, total_, unit_);
  std::string line;
  if (tty_) {
    constexpr int kWidth = 24;
    int filled = static_cast<int>(frac * kWidth);
    line = fmt::format("{} [{}{}] {}", label_, std::string(filled, '#'), std::string(kWidth - filled, '.'), of);
  } else {
    line = fmt::format("{} {} ({:.0f}%)", label_, of, 100.0 * frac);
  }
  if (elapsed > 0 && done_ > 0) {
    const double rate = static_cast<double>(done_) / elapsed;
    line += bytes ? fmt::format(" | {}/s", amount(static_cast<int64_t>(rate))) : fmt::format(" | {:.2f} {}/s", rate, unit_);
  }
  if (!status_.empty()) line += " | " + status_;
  line += final_line ? fmt::format(" | {} elapsed", format_duration(elapsed))
                     : fmt::format(" | ETA {}", format_duration(eta));
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
    g_bar_on_screen = !final_line;
    if (final_line) std::fputc('\n', stderr);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

}  // namespace anvil
