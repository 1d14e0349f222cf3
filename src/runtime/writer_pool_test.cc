#include "runtime/writer_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>

#include "os/clock.h"

namespace kvrelay::runtime {
namespace {

// Counts the writes it is asked for; moves no bytes.
class CountingTarget final : public net::Target {
 public:
  Status Write(TransferId, std::span<const net::Segment>, Instant) override {
    ++writes;
    return Status::Ok();
  }
  std::atomic<int> writes{0};
};

WriteJob JobFor(std::shared_ptr<CountingTarget> target, Instant deadline, Status* out) {
  WriteJob job;
  job.target = std::move(target);
  job.segments = {net::Segment{0, 0, 16}};
  job.bytes = 16;
  job.deadline = deadline;
  job.done = [out](const Status& s) { *out = s; };
  return job;
}

TEST(WriterPoolTest, RunJobWritesBeforeTheDeadline) {
  auto target = std::make_shared<CountingTarget>();
  Status got = InternalError("not called");
  WriteJob job = JobFor(target, MonoNow() + Duration::Seconds(60), &got);
  WriterPool::RunJob(job);
  EXPECT_TRUE(got.ok()) << got.ToString();
  EXPECT_EQ(target->writes, 1);
}

TEST(WriterPoolTest, RunJobPastItsDeadlineTouchesNoByte) {
  auto target = std::make_shared<CountingTarget>();
  Status got = Status::Ok();
  WriteJob job = JobFor(target, MonoNow() - Duration::Milliseconds(1), &got);
  WriterPool::RunJob(job);
  EXPECT_EQ(got.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(target->writes, 0);
}

TEST(WriterPoolTest, WorkersApplyTheSameDeadlineRule) {
  auto target = std::make_shared<CountingTarget>();
  WriterPool pool(2, 8);
  std::promise<Status> late, on_time;
  WriteJob a;
  a.target = target;
  a.deadline = MonoNow() - Duration::Milliseconds(1);
  a.done = [&late](const Status& s) { late.set_value(s); };
  WriteJob b;
  b.target = target;
  b.deadline = MonoNow() + Duration::Seconds(60);
  b.done = [&on_time](const Status& s) { on_time.set_value(s); };
  ASSERT_TRUE(pool.Submit(std::move(a)));
  ASSERT_TRUE(pool.Submit(std::move(b)));
  EXPECT_EQ(late.get_future().get().code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(on_time.get_future().get().ok());
  pool.Stop();
  EXPECT_EQ(target->writes, 1);
}

TEST(WriterPoolTest, OnlyALocalCopyMayRunInline) {
  // The default: a target that may wait on a peer is never run inline.
  CountingTarget t;
  EXPECT_FALSE(t.CopiesInPlace());
}

}  // namespace
}  // namespace kvrelay::runtime
