// Fan-in of worker output: one OutputStream per (rank, stdout|stderr).
//
// Bytes arrive in arbitrary chunks; complete lines go to the console with the rank prefix in
// one write() each (so lines of different ranks never interleave mid-line), the raw bytes go
// to the rank's log file unchanged, and the last lines are kept for the failure summary.
// A partial line waits for its newline, or for close(), unless it stays partial for
// kIdleFlush: then it goes to the console as it is (a prompt such as "(Pdb) ", dots written
// one by one with a flush) and the rest of the line follows as it comes, as under torchrun,
// whose workers write to the terminal directly. A line written in several pieces in quick
// succession still goes out whole.
// A carriage return that is not part of "\r\n" (a progress bar redrawing itself, as tqdm
// does) makes its line live: what the line holds goes to the console at once, and each later
// redraw goes out as it arrives, "\r" and the prefix before it, in one write(), so a bar moves
// on the console as it does under torchrun, whose workers write to the terminal directly. The
// tail and the filtered log keep what the line shows at its end (the text after its last
// carriage return).
// Streams that share a console (the same file, e.g. one terminal for stdout and stderr) know
// who left it in the middle of a line: a line another stream (or `say`) starts then begins on
// a line of its own (a newline first), and the live line goes on below it, prefixed again, as
// tqdm.write does it; a redraw goes over whatever the line holds.
// torchrun's --duplicate-stdout/stderr-filters: the console's lines that hold any of a list of
// strings are copied, prefixed, to one file shared by the attempt's ranks (FilteredLog).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
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
  using Clock = std::chrono::steady_clock;
  // How long a partial line waits for more before it goes to the console as it is.
  static constexpr std::chrono::milliseconds kIdleFlush{200};

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
  // When a partial line (or a trailing carriage return) is due to go to the console unless
  // more comes first; nullopt when nothing waits. The owner's poll loop wakes by then and
  // calls flush_idle().
  std::optional<Clock::time_point> flush_due() const;
  // Sends a partial line that has waited kIdleFlush to the console; later text of that line
  // follows it as it arrives.
  void flush_idle(Clock::time_point now);
  // Flushes a trailing partial line (with a newline added on the console) and closes the file.
  void close();
  // The last lines seen (a trailing partial line included), oldest first.
  std::deque<std::string> tail() const;

 private:
  void emit_line(std::string_view line);
  void add_text(std::string_view text);  // to the line (and the console, when live)
  void carriage_return();                // one that is not part of "\r\n"
  void go_live();                        // the console gets the line's start now
  void end_line();                       // its newline, or close()
  enum class Start { NewLine, Redraw, Continue };
  // `text` to the console in one write, after what `start` needs where the console stands.
  void to_console(Start start, std::string_view text);
  std::string prefix_;
  int console_fd_;
  std::uint64_t id_;           // this stream, as the console's record of who is mid-line names it
  std::uint64_t console_key_;  // the console's file (device and inode), shared by its streams
  int file_fd_;
  size_t tail_lines_;
  std::string partial_;
  bool live_ = false;         // the console has this line's start (carriage returns seen)
  bool at_start_ = true;      // live: the next text starts the console's line (prefix first)
  bool cr_to_write_ = false;  // live: a carriage return the console gets with the next text
  bool cr_at_end_ = false;    // the last chunk ended in '\r': "\r\n" or not, the next byte says
  Clock::time_point last_data_{};  // when write() last got bytes
  std::deque<std::string> tail_;
  std::shared_ptr<FilteredLog> filtered_;
};

// write(2) of all bytes, retrying on EINTR/partial writes; errors (a closed console) are
// ignored: losing the console must not stop the job.
void write_all(int fd, std::string_view bytes);
// "dtrain: MSG" and a newline on stderr, in one write (the agent's own messages).
void say(const std::string& msg);
// `text` (whole lines) on stderr in one write, starting on a line of its own when a worker's
// line is mid-way there (a failure summary, the ssh driver's messages).
void say_block(const std::string& text);

}  // namespace dtrain::launch
