#include "distributed/local_ranks.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "core/error.h"

namespace kiln {

namespace {

thread_local std::shared_ptr<ProcessGroup> t_world;

// What the ranks of one in-process world share: a reusable barrier and, per rank, the address
// its current collective reads or writes. Between two barriers every rank only reads the others'
// addresses and writes its own memory, so no collective needs more than two.
struct Shared {
  explicit Shared(int n) : size(n), slots(size_t(n), nullptr) {}
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t generation = 0;
  int arrived = 0;
  std::vector<void*> slots;
  std::string aborted;  // why, once a rank stopped: every collective then fails with it
  std::shared_ptr<Shared> duplicate;  // handed from rank 0 to the others by duplicate()
};

class LocalGroup final : public ProcessGroup {
 public:
  LocalGroup(std::shared_ptr<Shared> shared, int rank) : ProcessGroup(rank, shared->size), s_(std::move(shared)) {}

  void all_reduce_sum(float* data, size_t count) override {
    // Summed in rank order into a copy, so every rank gets the same bits.
    std::vector<float> sum(count, 0.f);
    exchange("all_reduce", data, [&] {
      for (int r = 0; r < size(); ++r) {
        const float* x = static_cast<const float*>(s_->slots[size_t(r)]);
        for (size_t i = 0; i < count; ++i) sum[i] += x[i];
      }
    });
    std::memcpy(data, sum.data(), count * sizeof(float));
  }
  void all_gather(const void* in, void* out, size_t bytes) override {
    exchange("all_gather", const_cast<void*>(in), [&] {
      for (int r = 0; r < size(); ++r)
        std::memcpy(static_cast<char*>(out) + size_t(r) * bytes, s_->slots[size_t(r)], bytes);
    });
  }
  void broadcast(void* data, size_t bytes, int root) override {
    KILN_CHECK(root >= 0 && root < size(), "distributed", describe(), ": broadcast from rank ", root);
    exchange("broadcast", data, [&] {
      if (rank() != root) std::memcpy(data, s_->slots[size_t(root)], bytes);
    });
  }
  void broadcast_when_ready(void* data, size_t bytes, int root) override {
    KILN_CHECK(root >= 0 && root < size(), "distributed", describe(), ": broadcast from rank ", root);
    exchange("broadcast", data, [&] {
      if (rank() != root) std::memcpy(data, s_->slots[size_t(root)], bytes);
    }, /*deadline_applies=*/false);
  }
  void barrier() override { arrive("barrier", true); }
  bool in_process() const override { return true; }
  std::shared_ptr<ProcessGroup> duplicate() override {
    std::shared_ptr<Shared> mine;
    exchange("duplicate", nullptr, [&] {
      std::lock_guard<std::mutex> lock(s_->mu);
      if (!s_->duplicate) s_->duplicate = std::make_shared<Shared>(size());
      mine = s_->duplicate;
    });
    arrive("duplicate", true);
    if (rank() == 0) {
      std::lock_guard<std::mutex> lock(s_->mu);
      s_->duplicate.reset();
    }
    return std::make_shared<LocalGroup>(mine, rank());
  }
  // Not the process's end (the ranks are threads): every rank's collectives fail from now on.
  void abort(int) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (s_->aborted.empty()) s_->aborted = "rank " + std::to_string(rank()) + " stopped";
    s_->cv.notify_all();
  }

 private:
  // Publishes `mine`, waits for every rank, runs `read` (reading the others' slots), and waits
  // again so no rank moves on while another still reads its memory.
  template <typename Read>
  void exchange(const char* what, void* mine, Read read, bool deadline_applies = true) {
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      s_->slots[size_t(rank())] = mine;
    }
    arrive(what, deadline_applies);
    read();
    arrive(what, deadline_applies);
  }
  void arrive(const char* what, bool deadline_applies) {
    std::unique_lock<std::mutex> lock(s_->mu);
    ++collectives_;
    const auto stopped = [&] {
      fail("distributed", describe(), ": ", what, " #", collectives_, " cannot complete: ", s_->aborted);
    };
    if (!s_->aborted.empty()) stopped();
    const uint64_t generation = s_->generation;
    if (++s_->arrived == s_->size) {
      s_->arrived = 0;
      ++s_->generation;
      s_->cv.notify_all();
      return;
    }
    const auto done = [&] { return s_->generation != generation || !s_->aborted.empty(); };
    if (deadline_applies) {
      const double seconds = collective_timeout_seconds();
      if (!s_->cv.wait_for(lock, std::chrono::duration<double>(seconds), done)) {
        s_->aborted = describe() + " waited " + std::to_string(int(seconds)) + " s (KILN_COLLECTIVE_TIMEOUT) in " +
                      what + " #" + std::to_string(collectives_) +
                      ": another rank stopped answering or issued different collectives";
        s_->cv.notify_all();
        fail("distributed", s_->aborted);
      }
    } else {
      s_->cv.wait(lock, done);
    }
    if (s_->generation == generation) stopped();
  }

  std::shared_ptr<Shared> s_;
  unsigned long long collectives_ = 0;
};

}  // namespace

namespace detail {
std::shared_ptr<ProcessGroup> thread_world() { return t_world; }
}  // namespace detail

std::vector<std::shared_ptr<ProcessGroup>> local_world(int size) {
  KILN_CHECK(size >= 1 && size <= 1024, "distributed", "a world of ", size, " ranks");
  auto shared = std::make_shared<Shared>(size);
  std::vector<std::shared_ptr<ProcessGroup>> groups;
  for (int r = 0; r < size; ++r) groups.push_back(std::make_shared<LocalGroup>(shared, r));
  return groups;
}

ScopedWorld::ScopedWorld(std::shared_ptr<ProcessGroup> group) : previous_(std::move(t_world)) {
  t_world = std::move(group);
}

ScopedWorld::~ScopedWorld() { t_world = std::move(previous_); }

void run_local_ranks(int size, const std::function<void(int rank)>& rank_main) {
  const std::vector<std::shared_ptr<ProcessGroup>> world = local_world(size);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::atomic<int> first_failure{-1};
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      const ScopedWorld scope(world[size_t(r)]);
      try {
        rank_main(r);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
        int none = -1;
        first_failure.compare_exchange_strong(none, r);
        world[size_t(r)]->abort(1);
      }
    });
  for (std::thread& t : threads) t.join();
  if (const int r = first_failure.load(); r >= 0) std::rethrow_exception(errors[size_t(r)]);
}

}  // namespace kiln
