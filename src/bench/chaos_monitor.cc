// chaos_monitor.cc — see chaos_monitor.h. Plain HTTP polling of the
// engines' own debug endpoints; nothing here knows which fault runs.
#include "bench/chaos_monitor.h"


#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>

#include "http/http_client.h"

namespace kvrelay {

using nlohmann::json;

bool OldestTransfers(const std::string& body, TransferAges* ages) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("ranks")) return false;
  *ages = TransferAges{};
  for (const json& r : j["ranks"]) {
    for (const json& s : r.value("sends", json::array())) {
      ages->send_s = std::max(ages->send_s, s.value("age_s", 0.0));
    }
    for (const json& l : r.value("loads", json::array())) {
      ages->load_s = std::max(ages->load_s, l.value("age_s", 0.0));
    }
    for (const json& l : r.value("leases", json::array())) {
      ages->lease_s = std::max(ages->lease_s, l.value("held_s", 0.0));
    }
  }
  return true;
}

double MetricSum(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  double sum = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#' || line.rfind(name, 0) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != '{' && next != ' ') continue;  // a longer name with this prefix
    const size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    sum += std::strtod(line.c_str() + sp + 1, nullptr);
  }
  return sum;
}

EngineMonitor::EngineMonitor(std::vector<std::string> urls, double period_s)
    : urls_(std::move(urls)), period_s_(period_s) {
  thread_ = std::thread([this] { Run(); });
}

void EngineMonitor::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

EngineMonitor::Worst EngineMonitor::WorstOf(const std::string& url) const {
  MutexLock lock(&mu_);
  auto it = worst_.find(url);
  return it == worst_.end() ? Worst{} : it->second;
}

void EngineMonitor::Run() {
  http::ClientOptions opts;
  opts.connect_timeout = Duration::Milliseconds(300);
  opts.idle_timeout = Duration::Seconds(2);
  while (!stop_) {
    const auto next = std::chrono::steady_clock::now() +
                      std::chrono::milliseconds(static_cast<int64_t>(period_s_ * 1e3));
    for (size_t i = 0; i < urls_.size() && !stop_; ++i) {
      Result<http::ClientResponse> r = http::Get(urls_[i], "/debug/state", opts);
      TransferAges now;
      if (!r.ok() || r->status != 200 || !OldestTransfers(r->body, &now)) continue;
      MutexLock lock(&mu_);
      Worst& w = worst_[urls_[i]];
      w.send_s = std::max(w.send_s, now.send_s);
      w.load_s = std::max(w.load_s, now.load_s);
      w.lease_s = std::max(w.lease_s, now.lease_s);
    }
    while (!stop_ && std::chrono::steady_clock::now() < next) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

EngineEnd ReadEngineEnd(const std::string& name, const std::string& url) {
  EngineEnd e;
  e.name = name;
  e.url = url;
  http::ClientOptions opts;
  opts.connect_timeout = Duration::Seconds(2);
  opts.idle_timeout = Duration::Seconds(5);
  Result<http::ClientResponse> st = http::Get(url, "/debug/state", opts);
  Result<http::ClientResponse> me = http::Get(url, "/metrics", opts);
  if (!st.ok() || st->status != 200 || !me.ok() || me->status != 200) return e;
  json j = json::parse(st->body, nullptr, false);
  if (j.is_discarded() || !j["engine"].is_object()) return e;
  e.reachable = true;
  const json& eng = j["engine"];
  e.blocks_used = eng.value("blocks_used", int64_t{-1});
  e.idle = j.value("idle", false) && eng.value("state", "") == "active";
  e.prefill = j.value("role", "") == "prefill" || j.value("role", "") == "both";
  for (const json& r : j.value("ranks", json::array())) {
    e.live_sends += static_cast<uint32_t>(r.value("sends", json::array()).size());
    e.live_loads += static_cast<uint32_t>(r.value("loads", json::array()).size());
    e.live_leases += static_cast<uint32_t>(r.value("leases", json::array()).size());
  }
  TransferAges ages;
  OldestTransfers(st->body, &ages);
  e.max_send_age_s = ages.send_s;
  e.max_load_age_s = ages.load_s;
  e.max_lease_age_s = ages.lease_s;
  // A pull resent after a reconnect is received twice and answered once.
  e.pulls_received = static_cast<uint64_t>(MetricSum(me->body, "kvrelay_pulls_received_total") -
                                           MetricSum(me->body, "kvrelay_pulls_resent_total"));
  e.pulls_answered = static_cast<uint64_t>(MetricSum(me->body, "kvrelay_pulls_answered_total"));
  e.lanes_opened = static_cast<uint64_t>(MetricSum(me->body, "kvrelay_lanes_opened_total"));
  e.inline_ops = static_cast<uint64_t>(MetricSum(me->body, "kvrelay_writes_inline_total") +
                                       MetricSum(me->body, "kvrelay_reads_inline_total"));
  e.chunks_streamed =
      static_cast<uint64_t>(MetricSum(me->body, "kvrelay_prefill_chunks_streamed_total"));
  e.chunk_writes = static_cast<uint64_t>(MetricSum(me->body, "kvrelay_chunk_writes_total"));
  e.loads_failed = 0;
  {
    std::istringstream in(me->body);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("kvrelay_loads_total{outcome=\"failed\"}", 0) == 0) {
        e.loads_failed = static_cast<uint64_t>(std::strtod(line.c_str() + line.rfind(' ') + 1, nullptr));
      }
    }
  }
  return e;
}

}  // namespace kvrelay
