// Fan-in of worker output: one OutputStream per (rank, stdout|stderr).
//
// Bytes arrive in arbitrary chunks; complete lines go to the console with the rank prefix in
// one write() each (so lines of different ranks never interleave mid-line), the raw bytes go
// to the rank's log file unchanged, and the last lines are kept for the failure summary.
// Lines are never cut: a partial line waits for its newline, or for close().
// torchrun's --duplicate-stdout/stderr-filters: the console's lines that hold any of a list of
// strings are copied, prefixed, to one file shared by the attempt's ranks (FilteredLog).
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::launch {

// An attempt's filtered_stdout.log or filtered_stderr.log: owns the file, closed with the last
// stream that writes to it.
class FilteredLog {
 public:
  // Creates (truncates) `path`; throws dtrain::Error when it cannot.
  FilteredLog(const std::string& path, std::vector<std::string> needles);
  ~FilteredLog();
  FilteredLog(const FilteredLog&) = delete;
  FilteredLog& operator=(const FilteredLog&) = delete;
  // A line holding any of the needles (torchrun: `any(needle in line ...)`).
  bool matches(std::string_view line) const;
  int fd() const { return fd_; }

 private:
  int fd_;
  std::vector<std::string> needles_;
};

class OutputStream {
 public:
  // console_fd: where prefixed lines go (-1: nowhere); file_fd: raw copy (-1: none; owned
  // and closed by this object); tail_lines: how many complete lines to keep; filtered: where
  // the console's lines that match it are copied too (null: none).
  OutputStream(std::string prefix, int console_fd, int file_fd, int tail_lines,
               std::shared_ptr<FilteredLog> filtered = nullptr);
  ~OutputStream();
  OutputStream(OutputStream&&) noexcept;
  OutputStream& operator=(OutputStream&&) = delete;
  OutputStream(const OutputStream&) = delete;

  void write(std::string_view bytes);
  // Flushes a trailing partial line (with a newline added on the console) and closes the file.
  void close();
  // The last lines seen (a trailing partial line included), oldest first.
  std::deque<std::string> tail() const;

 private:
  void emit_line(std::string_view line);
  std::string prefix_;
  int console_fd_;
  int file_fd_;
  size_t tail_lines_;
  std::string partial_;
  std::deque<std::string> tail_;
  std::shared_ptr<FilteredLog> filtered_;
};

// write(2) of all bytes, retrying on EINTR/partial writes; errors (a closed console) are
// ignored: losing the console must not stop the job.
void write_all(int fd, std::string_view bytes);
// "dtrain: MSG" and a newline on stderr, in one write (the agent's own messages).
void say(const std::string& msg);

}  // namespace dtrain::launch
