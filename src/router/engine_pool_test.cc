#include "router/engine_pool.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <mutex>
#include <thread>

namespace kvrelay::router {
namespace {

// A fake cluster: url → the /kv_info answer (or down).
class FakeEngines {
 public:
  void Set(const std::string& url, const std::string& role, uint32_t id, uint32_t tp = 1) {
    std::lock_guard<std::mutex> lock(mu_);
    EngineInfo i;
    i.engine_id = id;
    i.incarnation = 1;
    i.role = role;
    i.tp = tp;
    i.kv_host = "127.0.0.1";
    i.kv_port = static_cast<uint16_t>(id);
    i.transport = "shm";
    i.model = "kvrelay-tiny";
    i.model_shape = "tiny";
    i.max_context = 1024;
    infos_[url] = i;
  }
  void SetModel(const std::string& url, const std::string& model) {
    std::lock_guard<std::mutex> lock(mu_);
    infos_[url].model = model;
  }
  void Down(const std::string& url) {
    std::lock_guard<std::mutex> lock(mu_);
    infos_.erase(url);
  }
  int calls(const std::string& url) {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_[url];
  }
  EnginePool::Fetcher Fetcher() {
    return [this](const std::string& url) -> Result<EngineInfo> {
      std::lock_guard<std::mutex> lock(mu_);
      ++calls_[url];
      auto it = infos_.find(url);
      if (it == infos_.end()) return UnavailableError(url + ": down");
      return it->second;
    };
  }

 private:
  std::mutex mu_;
  std::map<std::string, EngineInfo> infos_;
  std::map<std::string, int> calls_;
};

const std::string kP1 = "http://127.0.0.1:1001", kP2 = "http://127.0.0.1:1002",
                  kD1 = "http://127.0.0.1:2001", kD2 = "http://127.0.0.1:2002";

bool Eventually(const std::function<bool()>& pred) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return pred();
}

TEST(EnginePoolTest, RejectsBadUrlsAndEmptyLists) {
  FakeEngines f;
  EXPECT_FALSE(EnginePool::Create({}, {kD1}, f.Fetcher()).ok());
  EXPECT_FALSE(EnginePool::Create({kP1}, {}, f.Fetcher()).ok());
  EXPECT_FALSE(EnginePool::Create({"nope"}, {kD1}, f.Fetcher()).ok());
  EXPECT_FALSE(EnginePool::Create({kP1, kP1 + "/"}, {kD1}, f.Fetcher()).ok());
  // The same engine as P and D is one entry.
  Result<std::shared_ptr<EnginePool>> both = EnginePool::Create({kP1}, {kP1}, f.Fetcher());
  ASSERT_TRUE(both.ok());
  EXPECT_EQ((*both)->size(), 1u);
}

TEST(EnginePoolTest, DiscoveryWaitsForEveryEngineThenChecksRoles) {
  FakeEngines f;
  auto pool = *EnginePool::Create({kP1}, {kD1}, f.Fetcher());
  f.Set(kP1, "prefill", 1);
  Status s = pool->DiscoverOnce();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find(kD1), std::string::npos) << s.message();
  EXPECT_FALSE(pool->Pick().ok());
  f.Set(kD1, "decode", 2);
  EXPECT_TRUE(pool->DiscoverOnce().ok());
  EXPECT_EQ(f.calls(kP1), 1);   // known engines are not asked again

  FakeEngines g;
  auto wrong = *EnginePool::Create({kP1}, {kD1}, g.Fetcher());
  g.Set(kP1, "decode", 1);
  g.Set(kD1, "decode", 2);
  s = wrong->DiscoverOnce();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("--prefill"), std::string::npos) << s.message();

  FakeEngines h;
  auto mixed = *EnginePool::Create({kP1}, {kD1}, h.Fetcher());
  h.Set(kP1, "both", 1);
  h.Set(kD1, "both", 2);
  h.SetModel(kD1, "other");
  s = mixed->DiscoverOnce();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("model"), std::string::npos) << s.message();
}

TEST(EnginePoolTest, PickSpreadsAndLeasesCount) {
  FakeEngines f;
  f.Set(kP1, "prefill", 1);
  f.Set(kP2, "prefill", 2, 2);
  f.Set(kD1, "decode", 3);
  f.Set(kD2, "decode", 4, 4);
  auto pool = *EnginePool::Create({kP1, kP2}, {kD1, kD2}, f.Fetcher());
  ASSERT_TRUE(pool->DiscoverOnce().ok());
  std::vector<EnginePool::Pair> held;
  for (int i = 0; i < 4; ++i) {
    Result<EnginePool::Pair> pair = pool->Pick();
    ASSERT_TRUE(pair.ok());
    held.push_back(std::move(*pair));
  }
  // Two each, in turn.
  EXPECT_EQ(held[0].prefill.url(), kP1);
  EXPECT_EQ(held[1].prefill.url(), kP2);
  EXPECT_EQ(held[1].prefill.info().tp, 2u);
  EXPECT_EQ(held[1].decode.info().engine_id, 4u);
  for (size_t i = 0; i < pool->size(); ++i) EXPECT_EQ(pool->outstanding(i), 2u);
  // Freeing P1's two legs makes P1 the least loaded for the next two picks.
  held[0].prefill.Release();
  held[2].prefill.Release();
  held[2].prefill.Release();   // idempotent
  EXPECT_EQ(pool->Pick()->prefill.url(), kP1);
  held.clear();
  for (size_t i = 0; i < pool->size(); ++i) EXPECT_EQ(pool->outstanding(i), 0u);
  const nlohmann::json engines = pool->EnginesJson();
  ASSERT_EQ(engines.size(), 4u);
  EXPECT_EQ(engines[1]["role"], "prefill");
  EXPECT_EQ(engines[1]["kv_info"]["tp"], 2);
  bool serving = false;
  const nlohmann::json health = pool->HealthJson(&serving);
  EXPECT_TRUE(serving);
  EXPECT_EQ(health["prefill"].size(), 2u);
}

TEST(EnginePoolTest, ConnectionFailureTakesAnEngineOutUntilItAnswersAgain) {
  FakeEngines f;
  f.Set(kP1, "prefill", 1);
  f.Set(kP2, "prefill", 2);
  f.Set(kD1, "decode", 3);
  auto pool = *EnginePool::Create({kP1, kP2}, {kD1}, f.Fetcher());
  ASSERT_TRUE(pool->DiscoverOnce().ok());
  std::thread monitor([pool] { pool->MonitorLoop(Duration::Milliseconds(20)); });

  f.Down(kP1);
  pool->ReportConnectionFailure(0);
  EXPECT_FALSE(pool->up(0));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(pool->Pick()->prefill.url(), kP2);
  // The monitor asks again at once, and then every interval while down.
  EXPECT_TRUE(Eventually([&] { return f.calls(kP1) >= 3; }));
  EXPECT_FALSE(pool->up(0));

  // Back, restarted with a new engine id: used again, with the new values.
  f.Set(kP1, "prefill", 11);
  EXPECT_TRUE(Eventually([&] { return pool->up(0); }));
  bool saw_new = false;
  for (int i = 0; i < 4; ++i) {
    Result<EnginePool::Pair> pair = pool->Pick();
    if (pair->prefill.url() == kP1) saw_new = pair->prefill.info().engine_id == 11;
  }
  EXPECT_TRUE(saw_new);

  // Back with a role that does not fit: stays out.
  f.Set(kP2, "decode", 2);
  pool->RequestRecheck(1);
  EXPECT_TRUE(Eventually([&] { return !pool->up(1); }));

  bool serving = true;
  f.Down(kD1);
  pool->ReportConnectionFailure(2);
  (void)pool->HealthJson(&serving);
  EXPECT_FALSE(serving);
  EXPECT_EQ(pool->Pick().status().code(), StatusCode::kUnavailable);
  pool->StopMonitor();
  monitor.join();
}

}  // namespace
}  // namespace kvrelay::router
