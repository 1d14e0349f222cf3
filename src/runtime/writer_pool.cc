#include "runtime/writer_pool.h"

#include "os/clock.h"
#include "os/thread_priority.h"

namespace kvrelay::runtime {

WriterPool::WriterPool(uint32_t num_workers, size_t max_queued) : max_queued_(max_queued) {
  for (uint32_t i = 0; i < num_workers; ++i) threads_.emplace_back([this] {
    NameThisThread("kv-writer");
    Run();
  });
}

WriterPool::~WriterPool() { Stop(); }

void WriterPool::Stop() {
  std::deque<WriteJob> left;
  {
    MutexLock lock(&mu_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
    left.swap(queue_);
  }
  cv_.NotifyAll();
  for (auto& t : threads_) t.join();
  threads_.clear();
  for (auto& job : left) job.done(Status(StatusCode::kCancelled, "writer pool stopped"));
}

bool WriterPool::Submit(WriteJob job) {
  {
    MutexLock lock(&mu_);
    if (stopping_ || queue_.size() >= max_queued_) return false;
    queue_.push_back(std::move(job));
  }
  cv_.NotifyOne();
  return true;
}

void WriterPool::Run() {
  while (true) {
    WriteJob job;
    {
      MutexLock lock(&mu_);
      cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    RunJob(job);
  }
}

namespace {
class ReadThroughSource final : public net::Target {
 public:
  explicit ReadThroughSource(std::shared_ptr<net::Source> source) : source_(std::move(source)) {}
  Status Write(TransferId transfer, std::span<const net::Segment> segments, Instant) override {
    return source_->Read(transfer, segments);
  }
  bool CopiesInPlace() const override { return source_->CopiesInPlace(); }
  std::unique_ptr<net::PendingWrite> StartWrite(TransferId transfer,
                                                std::span<const net::Segment> segments,
                                                Instant deadline) override {
    return source_->StartRead(transfer, segments, deadline);
  }

 private:
  std::shared_ptr<net::Source> source_;
};
}  // namespace

std::shared_ptr<net::Target> ReadAsWrite(std::shared_ptr<net::Source> source) {
  return std::make_shared<ReadThroughSource>(std::move(source));
}

void WriterPool::RunJob(WriteJob& job) {
  if (MonoNow() >= job.deadline) {
    job.done(DeadlineExceededError("its deadline passed before it started (a write's pull "
                                   "deadline, a read's start deadline)"));
    return;
  }
  job.done(job.target->Write(job.transfer, job.segments, job.deadline));
}

}  // namespace kvrelay::runtime
