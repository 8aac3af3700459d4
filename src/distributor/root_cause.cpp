// What a failed Distributor job reports: the root cause the agents agreed on (the launcher's
// failure record, or the call store's from another host), corrected by the order in which
// the ranks threw (the store's first exception), as WorkerError; and WorkerError's text.
#include <sstream>

#include "distributor/internal.h"

namespace dtrain {
namespace distributor {

// Throws the error that `out` describes (never returns).
[[noreturn]] void throw_failure(const Outcome& out, const DistributorOptions& o,
                                const std::optional<json>& exception) {
  if (out.timed_out) {
    throw TimeoutError("Distributor.run: the job did not finish within " +
                       format_seconds(o.timeout) +
                       " s (DistributorOptions::timeout); its workers were stopped");
  }
  WorkerError::Details d;
  d.exit_code = out.exit_code;
  if (out.failure) {
    const launch::Failure& f = *out.failure;
    d.rank = f.rank;
    d.local_rank = f.local_rank;
    d.host = f.host;
    d.exit_code = f.exit_code;
    d.signal = f.signal;
    d.stderr_tail = f.stderr_tail;
    if (d.rank < 0) {
      d.exception_message = f.reason;
    }
  } else if (auto why = engines::for_job(o).explain_exit(o.cluster, out.exit_code)) {
    d.exception_message = *why;
  } else if (out.exit_code > 128) {
    d.exception_message = "the launcher was stopped by " + launch::signal_name(out.exit_code - 128);
  } else {
    d.exception_message =
        "the launcher exited with code " + std::to_string(out.exit_code) +
        " and no worker reported an exception (its messages are above, on stderr)";
  }
  if (exception) {
    d.exception_type = exception->value("type", "");
    d.exception_message = exception->value("message", "");
  }
  throw WorkerError(std::move(d));
}

[[noreturn]] void throw_call_failure(Outcome out, store::StoreClient& client,
                                     const std::string& prefix, int last_attempt,
                                     const DistributorOptions& o) {
  if (!out.failure && client.check({prefix + "failure"})) {
    out.failure = launch::Failure::parse(client.get(prefix + "failure"));
    // An earlier attempt's, when the last one ended otherwise (stopped by a signal).
    if (out.failure && out.failure->exit_code != out.exit_code) out.failure.reset();
  }
  // The last attempt's first exception (peers that fail after it, e.g. in a collective
  // whose connection it closed, only report second).
  std::optional<json> first;
  for (int attempt = last_attempt; attempt >= 0 && !first; --attempt) {
    const std::string key = attempt_prefix(prefix, attempt) + "first_error";
    if (client.check({key})) first = json::parse(client.get(key));
  }
  std::optional<json> exception;
  int rank = out.failure ? out.failure->rank : -1;
  if (first && rank >= 0 && first->value("rank", -1) != rank && out.failure->signal == 0 &&
      !out.timed_out) {
    // The launcher orders failures by when it saw processes exit, which can put a peer that
    // failed because of the first thrower (its collective lost the connection) ahead of it;
    // the store orders the exceptions themselves (the first compare_set wins). So a first
    // exception that is not itself a lost peer or a timeout is the root cause. A rank killed
    // by a signal threw nothing: the launcher's pick stands then.
    const std::string type = first->value("type", "");
    if (type != "dtrain::NetworkError" && type != "dtrain::TimeoutError") {
      rank = first->value("rank", -1);
      out.failure = launch::Failure{.rank = rank, .exit_code = out.exit_code};
    }
  }
  if (first && (rank < 0 || first->value("rank", -1) == rank)) {
    exception = first;
    // No root cause from the launcher (MPI has no agent): the first rank that threw is it.
    if (rank < 0 && !out.timed_out)
      out.failure = launch::Failure{.rank = first->value("rank", -1), .exit_code = out.exit_code};
  }
  throw_failure(out, o, exception);
}

}  // namespace distributor

namespace {
std::string describe(const WorkerError::Details& d) {
  std::ostringstream s;
  if (d.rank >= 0) {
    s << "rank " << d.rank;
    if (!d.host.empty()) s << " (local rank " << d.local_rank << " on " << d.host << ")";
    s << " failed: ";
    if (!d.exception_type.empty()) {
      s << "it threw " << d.exception_type << ": " << d.exception_message << " (exit code "
        << d.exit_code << ")";
    } else if (d.signal > 0) {
      s << "it died of " << launch::signal_name(d.signal) << " (exit code " << d.exit_code << ")";
    } else if (!d.exception_message.empty()) {
      s << d.exception_message << " (exit code " << d.exit_code << ")";
    } else {
      s << "it exited with code " << d.exit_code;
    }
  } else {
    s << "the job failed: "
      << (d.exception_message.empty() ? "unknown reason" : d.exception_message) << " (exit code "
      << d.exit_code << ")";
  }
  if (d.rank >= 0) {
    if (d.stderr_tail.empty()) {
      s << "\n  its stderr was empty";
    } else {
      s << "\n  last " << d.stderr_tail.size() << " line(s) of rank " << d.rank << "'s stderr:";
      for (const auto& l : d.stderr_tail) s << "\n    " << l;
    }
  }
  return s.str();
}
}  // namespace

WorkerError::WorkerError(Details details) : Error(describe(details)), d_(std::move(details)) {}

}  // namespace dtrain
