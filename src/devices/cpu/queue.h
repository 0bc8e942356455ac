// An asynchronous in-order work queue (one worker thread). enqueue() returns at once
// with the work's sequence number; wait_for(seq) blocks the host until that work (and
// everything before it) has run. The host may run at most `max_pending` items ahead
// (backpressure), and its queued items' outputs may hold at most `max_pending_bytes` (one item
// over that is let in when the queue is empty): a host far ahead of slow kernels would otherwise
// hold many outputs that are not computed yet. An exception thrown by queued work is kept and rethrown, naming the
// op that failed, at the next wait (the asynchronous error rule).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "devices/kernel_times.h"

namespace kiln::cpu {

class Queue {
 public:
  explicit Queue(size_t max_pending = 32, size_t max_pending_bytes = ~size_t{0});
  size_t max_pending() const { return max_pending_; }
  size_t max_pending_bytes() const { return max_pending_bytes_; }
  ~Queue();
  Queue(const Queue&) = delete;
  Queue& operator=(const Queue&) = delete;

  // `what` names the work in error messages (the op name); `output_bytes`: what it writes, which
  // the host allocated for it.
  uint64_t enqueue(std::string what, std::function<void()> work, size_t output_bytes = 0);
  // Blocks until work `seq` has completed; rethrows a pending asynchronous error.
  void wait_for(uint64_t seq);
  void wait_all() { wait_for(last_enqueued()); }
  uint64_t last_enqueued() const;
  uint64_t completed() const;
  bool on_worker_thread() const { return std::this_thread::get_id() == worker_.get_id(); }
  // Wall seconds and count of the work run so far, by the `what` it was enqueued with.
  std::map<std::string, std::pair<double, uint64_t>> time_by_name() const;
  void reset_time_by_name();

 private:
  struct Item {
    uint64_t seq;
    std::string what;
    std::function<void()> work;
    size_t output_bytes = 0;
  };
  void run();

  const size_t max_pending_, max_pending_bytes_;
  size_t pending_bytes_ = 0;  // of the items queued and running
  mutable std::mutex mu_;
  std::condition_variable cv_work_, cv_done_, cv_space_;
  std::deque<Item> items_;
  KernelTimes time_by_name_;
  uint64_t next_seq_ = 1;
  uint64_t completed_ = 0;
  std::string error_;  // first asynchronous failure, cleared when reported
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace kiln::cpu
