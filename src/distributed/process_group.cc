#include "distributed/process_group.h"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include <vector>

#include "core/env.h"
#include "core/error.h"

namespace kiln {

namespace {
std::mutex g_drains_mu;
std::vector<std::function<void()>>& drains() {
  static auto* d = new std::vector<std::function<void()>>;  // leaked: read by the exit handler
  return *d;
}
}  // namespace

void before_world_finalize(std::function<void()> drain) {
  std::lock_guard<std::mutex> lock(g_drains_mu);
  drains().push_back(std::move(drain));
}

double collective_timeout_seconds() {
  static const double t = [] {
    return env::positive_number("KILN_COLLECTIVE_TIMEOUT").value_or(300.0);
  }();
  return t;
}

namespace {

// One rank: collectives are identities.
class SingleRank final : public ProcessGroup {
 public:
  SingleRank() : ProcessGroup(0, 1) {}
  void all_reduce_sum(float*, size_t) override {}
  void all_gather(const void* in, void* out, size_t bytes) override { std::memmove(out, in, bytes); }
  void broadcast(void*, size_t, int) override {}
  void broadcast_when_ready(void*, size_t, int) override {}
  void barrier() override {}
  std::shared_ptr<ProcessGroup> duplicate() override { return std::make_shared<SingleRank>(); }
};

class Detached final : public ProcessGroup {
 public:
  Detached(int rank, int size) : ProcessGroup(rank, size) {}
  [[noreturn]] void no() { fail("distributed", describe(), " is a detached group: it cannot communicate"); }
  void all_reduce_sum(float*, size_t) override { no(); }
  void all_gather(const void*, void*, size_t) override { no(); }
  void broadcast(void*, size_t, int) override { no(); }
  void broadcast_when_ready(void*, size_t, int) override { no(); }
  void barrier() override { no(); }
  std::shared_ptr<ProcessGroup> duplicate() override { no(); }
};

int g_thread_level = 0;  // what MPI_Init_thread provided

class MpiGroup final : public ProcessGroup {
 public:
  MpiGroup(MPI_Comm comm, int rank, int size) : ProcessGroup(rank, size), comm_(comm) {}

  void all_reduce_sum(float* data, size_t count) override {
    wait("all_reduce", [&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, data, int(count), MPI_FLOAT, MPI_SUM, comm_, r);
    });
  }
  void all_gather(const void* in, void* out, size_t bytes) override {
    wait("all_gather", [&](MPI_Request* r) {
      return MPI_Iallgather(in, int(bytes), MPI_BYTE, out, int(bytes), MPI_BYTE, comm_, r);
    });
  }
  void broadcast(void* data, size_t bytes, int root) override {
    wait("broadcast", [&](MPI_Request* r) { return MPI_Ibcast(data, int(bytes), MPI_BYTE, root, comm_, r); });
  }
  void broadcast_when_ready(void* data, size_t bytes, int root) override {
    wait("broadcast", [&](MPI_Request* r) { return MPI_Ibcast(data, int(bytes), MPI_BYTE, root, comm_, r); },
         /*deadline_applies=*/false);
  }
  std::shared_ptr<ProcessGroup> duplicate() override {
    // Two threads then call MPI at once (each on its own communicator).
    KILN_CHECK(g_thread_level >= MPI_THREAD_MULTIPLE, "distributed", describe(),
               ": this MPI library does not allow calls from several threads (MPI_THREAD_MULTIPLE), which a "
               "second communicator needs");
    std::lock_guard<std::mutex> lock(mu_);
    MPI_Comm dup;
    KILN_CHECK(MPI_Comm_dup(comm_, &dup) == MPI_SUCCESS, "distributed", describe(), ": MPI_Comm_dup failed");
    return std::make_shared<MpiGroup>(dup, rank(), size());
  }
  void barrier() override {
    wait("barrier", [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
  }
  void abort(int code) override {
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  // Starts a non-blocking collective and polls it until done or the deadline, then aborts the job.
  // Without a deadline it polls every millisecond, for as long as it takes.
  template <typename Start>
  void wait(const char* what, Start start, bool deadline_applies = true) {
    std::lock_guard<std::mutex> lock(mu_);  // one collective at a time, in program order
    ++seq_;
    MPI_Request req;
    KILN_CHECK(start(&req) == MPI_SUCCESS, "distributed", describe(), ": ", what, " failed to start");
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(collective_timeout_seconds());
    int done = 0;
    for (int spins = 0;; ++spins) {
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (done) return;
      if (!deadline_applies) {
        if (spins > 1000) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr,
                     "kiln: [distributed] %s: collective #%llu (%s) did not complete within %.0f s "
                     "(KILN_COLLECTIVE_TIMEOUT): another rank died, stopped answering or issued different "
                     "collectives; aborting the job\n",
                     describe().c_str(), static_cast<unsigned long long>(seq_), what, collective_timeout_seconds());
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
        std::_Exit(1);
      }
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  MPI_Comm comm_;
  std::mutex mu_;
  unsigned long long seq_ = 0;  // collectives issued, for the timeout message
};

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

}  // namespace

std::string ProcessGroup::describe() const {
  return "rank " + std::to_string(rank_) + " of " + std::to_string(size_);
}

std::shared_ptr<ProcessGroup> ProcessGroup::detached(int rank, int size) {
  KILN_CHECK(size >= 1 && rank >= 0 && rank < size, "distributed", "rank ", rank, " of ", size, " is not a rank");
  return std::make_shared<Detached>(rank, size);
}

std::shared_ptr<ProcessGroup> ProcessGroup::world() {
  if (std::shared_ptr<ProcessGroup> rank = detail::thread_world()) return rank;
  // Leaked on purpose: queued collective kernels may still use it while the process exits.
  static auto* w = new std::shared_ptr<ProcessGroup>([]() -> std::shared_ptr<ProcessGroup> {
    if (!launched_by_mpi()) {
      // torchrun-style variables without mpirun: kiln's process group rendezvous is MPI's, so
      // say so instead of silently running N independent single-rank jobs.
      const char* ws = std::getenv("WORLD_SIZE");
      KILN_CHECK(ws == nullptr || std::string(ws) == "1", "distributed", "WORLD_SIZE=", ws ? ws : "",
                 " is set but this process was not started by mpirun; launch with mpirun -np ", ws ? ws : "",
                 " (kiln's process group is OpenMPI's)");
      return std::make_shared<SingleRank>();
    }
    int& provided = g_thread_level;
    KILN_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) == MPI_SUCCESS, "distributed",
               "MPI_Init_thread failed");
    KILN_CHECK(provided >= MPI_THREAD_SERIALIZED, "distributed",
               "this MPI library cannot be called from kiln's device thread (thread level ", provided, ")");
    std::atexit([] {
      // Queued kernels may still run collectives: let them finish first.
      std::vector<std::function<void()>> pending;
      {
        std::lock_guard<std::mutex> lock(g_drains_mu);
        pending = drains();
      }
      for (const auto& drain : pending) {
        try {
          drain();
        } catch (...) {
        }
      }
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    });
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    return std::make_shared<MpiGroup>(MPI_COMM_WORLD, rank, size);
  }());
  return *w;
}

}  // namespace kiln
