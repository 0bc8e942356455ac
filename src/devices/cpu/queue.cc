#include "devices/cpu/queue.h"

#include <chrono>

#include "core/error.h"
#include "core/thread_count.h"

namespace kiln::cpu {

Queue::Queue(size_t max_pending, size_t max_pending_bytes)
    : max_pending_(max_pending ? max_pending : 1), max_pending_bytes_(max_pending_bytes) {
  worker_ = std::thread([this] { run(); });
}

Queue::~Queue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  worker_.join();
}

uint64_t Queue::enqueue(std::string what, std::function<void()> work, size_t output_bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_space_.wait(lock, [&] {
    return items_.size() < max_pending_ &&
           (pending_bytes_ == 0 || pending_bytes_ + output_bytes <= max_pending_bytes_);
  });
  const uint64_t seq = next_seq_++;
  pending_bytes_ += output_bytes;
  items_.push_back(Item{seq, std::move(what), std::move(work), output_bytes});
  lock.unlock();
  cv_work_.notify_one();
  return seq;
}

void Queue::wait_for(uint64_t seq) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_done_.wait(lock, [&] { return completed_ >= seq || !error_.empty(); });
  if (!error_.empty()) {
    // Everything queued after a failure is skipped; report once, then the queue is usable again.
    cv_done_.wait(lock, [&] { return items_.empty() && completed_ + 1 >= next_seq_; });
    std::string msg = std::move(error_);
    error_.clear();
    throw Error(msg);
  }
}

uint64_t Queue::last_enqueued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_seq_ - 1;
}

uint64_t Queue::completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_;
}

void Queue::run() {
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_work_.wait(lock, [&] { return stop_ || !items_.empty(); });
      if (items_.empty()) return;  // stop requested and drained
      item = std::move(items_.front());
      items_.pop_front();
    }
    cv_space_.notify_one();
    std::string failure;
    bool skip;
    {
      std::lock_guard<std::mutex> lock(mu_);
      skip = !error_.empty();
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (!skip) {
      try {
        apply_thread_count();  // --threads
        item.work();
      } catch (const std::exception& e) {
        failure = std::string("[async] ") + item.what + " failed on the device: " + e.what() +
                  " (later queued work was skipped)";
      }
    }
    const auto t1 = std::chrono::steady_clock::now();
    item.work = nullptr;  // drop buffer references before reporting completion
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!skip) time_by_name_.add(item.what, t1 - t0);
      if (!failure.empty() && error_.empty()) error_ = std::move(failure);
      completed_ = item.seq;
      pending_bytes_ -= item.output_bytes;
    }
    cv_space_.notify_one();  // room for one more item (and its output's bytes)
    cv_done_.notify_all();
  }
}

std::map<std::string, std::pair<double, uint64_t>> Queue::time_by_name() const { return time_by_name_.snapshot(); }

void Queue::reset_time_by_name() { time_by_name_.reset(); }

}  // namespace kiln::cpu
