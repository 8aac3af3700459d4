// Distributor: run a C++ training function, or a program, on N processes and get its result
// (TorchDistributor for C++).
//
//     int main(int argc, char** argv) {
//       dtrain::init(argc, argv);   // in a worker: runs the requested function, then exits
//       dtrain::Distributor d({.num_processes = 2});
//       double acc = d.run(train, 1e-3, true);                       // function mode
//       d.run("/path/to/train_binary", {"--lr=0.001"});              // program mode
//     }
//
// How it works. run() starts the `dtrain` launcher (the same agent as `dtrain run`: rank
// prefixed logs, teardown on the first failure, no orphans) with this very binary as the
// worker program. Each worker's dtrain::init() sees the task in its environment, connects to
// a small store the driver hosts for this call, reads the arguments, calls the function and
// sends its result back; the driver decodes rank 0's (or, with run_all, every rank's).
// The function is found in the worker by its offset in the loaded binary, checked against
// the binary's build id: no registration, no fork of a process running libtorch threads.
//
// Rules for the function: a plain function or a lambda without captures (captures cannot
// cross processes: pass them as arguments); its parameters and result must be encodable
// (dtrain/codec.h; checked at compile time). It runs with the worker environment of
// `dtrain run` (RANK, WORLD_SIZE, MASTER_ADDR, ...), so dtrain::init_process_group() just
// works; a default group it leaves behind is destroyed after it returns.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/codec.h"
#include "dtrain/distributor_options.h"
#include "dtrain/error.h"

namespace dtrain {

// Call first thing in main(). In a process the Distributor started as a worker it runs the
// requested function and exits (it never returns); anywhere else it only records argv and
// returns at once.
void init(int argc, char** argv);

// A worker failed: it threw, exited non-zero, or died of a signal. what() says which rank,
// what happened, and ends with the tail of that rank's stderr.
class WorkerError : public Error {
 public:
  struct Details {
    int rank = -1;  // -1: not one worker (the launcher itself failed)
    int local_rank = -1;
    std::string host;
    int exit_code = 1;           // 128 + signal for a signal
    int signal = 0;              // > 0: the worker died of this signal
    std::string exception_type;  // function mode, when the worker threw
    std::string exception_message;
    std::vector<std::string> stderr_tail;
  };
  explicit WorkerError(Details details);
  const Details& details() const { return d_; }
  int rank() const { return d_.rank; }
  int exit_code() const { return d_.exit_code; }
  int signal() const { return d_.signal; }
  const std::string& exception_type() const { return d_.exception_type; }
  const std::string& exception_message() const { return d_.exception_message; }
  const std::vector<std::string>& stderr_tail() const { return d_.stderr_tail; }

 private:
  Details d_;
};

namespace detail {

// What a worker needs to find a function of this binary: the loaded object it lives in
// (by name; the main program is ""), its offset there, and that object's build id.
struct CodeRef {
  bool main_program = true;
  std::string object;
  std::uintptr_t offset = 0;
  std::string build_id;
};
CodeRef locate_code(const void* address);

// Runs in the worker: decodes the arguments, calls the function, encodes its result.
using Trampoline = void (*)(void* fn, Decoder& args, Encoder& result);

template <class T>
concept PlainFunction = std::is_pointer_v<T> && std::is_function_v<std::remove_pointer_t<T>>;

template <class F, class = void>
struct Decays {
  using type = void;
};
template <class F>
struct Decays<F, std::void_t<decltype(+std::declval<F>())>> {
  using type = decltype(+std::declval<F>());
};

template <class R, class... P>
void trampoline(void* fn, Decoder& in, Encoder& out) {
  using Fn = R (*)(P...);
  // Braced initialisation decodes the arguments left to right.
  std::tuple<std::decay_t<P>...> args{in.get<std::decay_t<P>>()...};
  auto call = [&](auto&... a) -> decltype(auto) {
    return reinterpret_cast<Fn>(fn)(std::forward<P>(a)...);
  };
  if constexpr (std::is_void_v<R>) {
    std::apply(call, args);
  } else {
    out.put<std::decay_t<R>>(std::apply(call, args));
  }
}

// The resolved plan for a run: processes and per-job device list (tested with injected
// devices; the Distributor passes the CUDA devices it sees).
struct DevicePlan {
  int num_processes = 1;
  std::string cuda_visible_devices;  // empty: leave CUDA_VISIBLE_DEVICES alone
  std::string warning;               // non-empty: print once
};
// `devices` are the CUDA devices visible here (as CUDA_VISIBLE_DEVICES names them).
// Throws UsageError: num_processes <= 0; use_gpu with no device.
DevicePlan plan_devices(int num_processes, bool local_mode, bool use_gpu,
                        const std::vector<std::string>& devices);

}  // namespace detail

class Distributor {
 public:
  // Validates the options (UsageError with what to change); with use_gpu in local mode and
  // fewer GPUs than processes, lowers num_processes to the GPUs present with one warning.
  explicit Distributor(DistributorOptions options = {});

  const DistributorOptions& options() const { return options_; }
  int num_processes() const { return options_.num_processes; }

  // Function mode: runs fn(args...) on every worker; returns rank 0's result.
  // Throws WorkerError when a worker fails (the others are stopped), TimeoutError after
  // options().timeout, UsageError for a misuse (init() not called, nested run in a worker).
  template <class F, class... Args>
  requires(!std::is_convertible_v<F, std::string>) auto run(F&& fn, Args&&... args) {
    return call<false>(std::forward<F>(fn), std::forward<Args>(args)...);
  }

  // Function mode: every rank's result, by rank (void functions: returns nothing).
  template <class F, class... Args>
  requires(!std::is_convertible_v<F, std::string>) auto run_all(F&& fn, Args&&... args) {
    return call<true>(std::forward<F>(fn), std::forward<Args>(args)...);
  }

  // Program mode: runs `program args...` on every worker, exactly as `dtrain run` would (a
  // .py through python3). Returns when all succeeded; throws WorkerError with the failing
  // rank, its exit code or signal and its stderr tail otherwise.
  void run(const std::string& program, const std::vector<std::string>& args = {});

  // The address the workers of a cluster job (local_mode = false) reach this driver at:
  // ClusterOptions::driver_addr, else as documented there. "127.0.0.1" in local mode.
  // UsageError when no reachable address can be found (the message says to set it).
  std::string driver_address() const;

 private:
  template <bool All, class F, class... Args>
  auto call(F&& fn, Args&&... args) {
    using Fp = typename detail::Decays<F>::type;
    static_assert(detail::PlainFunction<Fp>,
                  "dtrain::Distributor::run: the training function must be a plain function "
                  "or a lambda without captures (captures cannot cross process boundaries: "
                  "pass those values as arguments)");
    if constexpr (detail::PlainFunction<Fp>) {
      return call_with<All>(+fn, std::forward<Args>(args)...);
    }
  }

  template <bool All, class R, class... P, class... Args>
  auto call_with(R (*fn)(P...), Args&&... args) {
    static_assert(sizeof...(P) == sizeof...(Args),
                  "dtrain::Distributor::run: give exactly as many arguments as the function "
                  "takes");
    if constexpr (sizeof...(P) == sizeof...(Args)) {
      static_assert((std::is_convertible_v<Args&&, std::decay_t<P>> && ...),
                    "dtrain::Distributor::run: an argument does not convert to the type of the "
                    "function's parameter in that position");
      static_assert((Encodable<std::decay_t<P>> && ...),
                    "dtrain::Distributor::run: a parameter type of the function is not "
                    "encodable (see dtrain/codec.h for what is)");
      static_assert(std::is_void_v<R> || Encodable<std::decay_t<R>>,
                    "dtrain::Distributor::run: the function's return type is not encodable "
                    "(see dtrain/codec.h for what is)");
      Encoder encoded;
      (encoded.put<std::decay_t<P>>(static_cast<std::decay_t<P>>(std::forward<Args>(args))), ...);
      auto results = run_function(reinterpret_cast<const void*>(fn),
                                  reinterpret_cast<const void*>(&detail::trampoline<R, P...>),
                                  encoded.take(), All);
      if constexpr (std::is_void_v<R>) {
        return;
      } else if constexpr (All) {
        std::vector<std::decay_t<R>> out;
        out.reserve(results.size());
        for (auto& r : results) out.push_back(decode<std::decay_t<R>>(r));
        return out;
      } else {
        return decode<std::decay_t<R>>(results.at(0));
      }
    }
  }

  // Runs the job; returns the encoded results (rank 0's, or every rank's when all_ranks).
  std::vector<std::string> run_function(const void* fn, const void* trampoline, std::string args,
                                        bool all_ranks);

  DistributorOptions options_;
  std::string cuda_visible_devices_;
  int nproc_per_node_ = 0;          // 0: each host's slots (ssh host file)
  std::vector<std::string> hosts_;  // ssh: the hosts, node 0 first
  detail::ElasticPlan elastic_;     // ClusterOptions::{min_nodes, max_nodes} resolved
};

}  // namespace dtrain
