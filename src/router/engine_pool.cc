#include "router/engine_pool.h"


#include <chrono>

#include "base/check.h"
#include "http/http_client.h"
#include "os/clock.h"
#include "os/log.h"
#include "router/engine_picker.h"

namespace kvrelay::router {

using nlohmann::json;
using kvrelay::Log;

Result<EngineInfo> FetchEngineInfo(const std::string& url, Duration timeout) {
  http::ClientOptions o;
  o.connect_timeout = timeout;
  o.idle_timeout = timeout;
  o.max_body_bytes = 64 * 1024;
  Result<http::ClientResponse> r = http::Get(url, "/kv_info", o);
  if (!r.ok()) {
    return UnavailableError(url + "/kv_info: no answer (" + r.status().message() + ")");
  }
  if (r->status != 200) {
    return UnavailableError(url + "/kv_info: HTTP " + std::to_string(r->status));
  }
  Result<EngineInfo> info = ParseEngineInfo(r->body);
  if (!info.ok()) return InvalidArgumentError(url + ": " + info.status().message());
  return info;
}

// --- Lease ---------------------------------------------------------------------

EnginePool::Lease::Lease(Lease&& o) noexcept
    : pool_(std::move(o.pool_)), index_(o.index_), url_(std::move(o.url_)),
      info_(std::move(o.info_)) {
  o.pool_.reset();
}

EnginePool::Lease& EnginePool::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    Release();
    pool_ = std::move(o.pool_);
    o.pool_.reset();
    index_ = o.index_;
    url_ = std::move(o.url_);
    info_ = std::move(o.info_);
  }
  return *this;
}

void EnginePool::Lease::Release() {
  if (pool_ == nullptr) return;
  pool_->Return(index_);
  pool_.reset();
}

// --- EnginePool ----------------------------------------------------------------

Result<std::shared_ptr<EnginePool>> EnginePool::Create(const std::vector<std::string>& prefill,
                                                       const std::vector<std::string>& decode,
                                                       Fetcher fetcher) {
  if (prefill.empty()) return InvalidArgumentError("at least one --prefill URL is required");
  if (decode.empty()) return InvalidArgumentError("at least one --decode URL is required");
  std::vector<Entry> engines;
  auto add = [&](const std::string& raw, bool as_prefill) -> Status {
    Result<std::string> url = NormalizeEngineUrl(raw);
    if (!url.ok()) return url.status();
    for (Entry& e : engines) {
      if (e.url != *url) continue;
      if ((as_prefill && e.prefill) || (!as_prefill && e.decode)) {
        return InvalidArgumentError("engine " + *url + " is given twice in " +
                                    (as_prefill ? "--prefill" : "--decode"));
      }
      (as_prefill ? e.prefill : e.decode) = true;
      return Status::Ok();
    }
    Entry e;
    e.url = *url;
    (as_prefill ? e.prefill : e.decode) = true;
    engines.push_back(std::move(e));
    return Status::Ok();
  };
  for (const std::string& u : prefill) {
    Status s = add(u, true);
    if (!s.ok()) return s;
  }
  for (const std::string& u : decode) {
    Status s = add(u, false);
    if (!s.ok()) return s;
  }
  return std::shared_ptr<EnginePool>(new EnginePool(std::move(engines), std::move(fetcher)));
}

EnginePool::EnginePool(std::vector<Entry> engines, Fetcher fetcher)
    : fetcher_(std::move(fetcher)), engines_(std::move(engines)) {
  for (size_t i = 0; i < engines_.size(); ++i) {
    if (engines_[i].prefill) prefill_.push_back(i);
    if (engines_[i].decode) decode_.push_back(i);
  }
}

const char* EnginePool::RoleOf(const Entry& e) const {
  return e.prefill && e.decode ? "both" : e.prefill ? "prefill" : "decode";
}

Status EnginePool::Fits(const Entry& e, const EngineInfo& info) const {
  if (e.prefill) {
    Status s = CheckRoleFits(e.url, info, LegRole::kPrefill);
    if (!s.ok()) return s;
  }
  if (e.decode) {
    Status s = CheckRoleFits(e.url, info, LegRole::kDecode);
    if (!s.ok()) return s;
  }
  if (reference_) {
    if (info.model != reference_->model || info.model_shape != reference_->model_shape) {
      return FailedPreconditionError("engine " + e.url + " serves model \"" + info.model +
                                     "\" (shape " + info.model_shape +
                                     ") but other engines serve \"" + reference_->model +
                                     "\" (shape " + reference_->model_shape + ")");
    }
    if (info.kv_mode != reference_->kv_mode) {
      return FailedPreconditionError("engine " + e.url + " runs kv mode " + info.kv_mode +
                                     " but other engines run " + reference_->kv_mode);
    }
    if (info.transport != reference_->transport) {
      return FailedPreconditionError("engine " + e.url + " uses transport " + info.transport +
                                     " but other engines use " + reference_->transport);
    }
  }
  return Status::Ok();
}

Status EnginePool::DiscoverOnce() {
  std::vector<size_t> todo;
  {
    MutexLock lock(&mu_);
    for (size_t i = 0; i < engines_.size(); ++i) {
      if (!engines_[i].info) todo.push_back(i);
    }
  }
  std::string missing;
  for (size_t i : todo) {
    Result<EngineInfo> info = fetcher_(UrlOf(i));
    if (!info.ok()) {
      if (info.status().code() == StatusCode::kInvalidArgument) return info.status();
      missing += (missing.empty() ? "" : "; ") + info.status().message();
      continue;
    }
    MutexLock lock(&mu_);
    Entry& e = engines_[i];
    Status s = Fits(e, *info);
    if (!s.ok()) return s;
    if (!reference_) reference_ = *info;
    e.info = *info;
    e.up = true;
    Log("router", "engine %s: %s, engine_id %u, incarnation %u, tp %u, kv %s:%u, %s, model %s",
        e.url.c_str(), info->role.c_str(), info->engine_id, info->incarnation, info->tp,
        info->kv_host.c_str(), info->kv_port, info->transport.c_str(), info->model.c_str());
  }
  if (!missing.empty()) return UnavailableError("no answer yet: " + missing);
  return Status::Ok();
}

Result<EnginePool::Pair> EnginePool::Pick() {
  MutexLock lock(&mu_);
  auto pick = [&](const std::vector<size_t>& list,
                  size_t* cursor) REQUIRES(mu_) -> std::optional<size_t> {
    std::vector<PickCandidate> c;
    c.reserve(list.size());
    for (size_t i : list) c.push_back({engines_[i].outstanding, engines_[i].up});
    std::optional<size_t> k = PickLeastLoaded(c, cursor);
    if (!k) return std::nullopt;
    return list[*k];
  };
  const std::optional<size_t> p = pick(prefill_, &prefill_cursor_);
  if (!p) return UnavailableError("no prefill engine is up");
  const std::optional<size_t> d = pick(decode_, &decode_cursor_);
  if (!d) return UnavailableError("no decode engine is up");
  Pair pair;
  auto lease = [&](size_t i, Lease* l) REQUIRES(mu_) {
    Entry& e = engines_[i];
    KV_CHECK(e.info.has_value());
    ++e.outstanding;
    l->pool_ = shared_from_this();
    l->index_ = i;
    l->url_ = e.url;
    l->info_ = *e.info;
  };
  lease(*p, &pair.prefill);
  lease(*d, &pair.decode);
  return pair;
}

std::optional<std::string> EnginePool::AnyDecodeUrl() {
  MutexLock lock(&mu_);
  std::optional<size_t> best;
  for (size_t i : decode_) {
    if (engines_[i].up && (!best || engines_[i].outstanding < engines_[*best].outstanding)) {
      best = i;
    }
  }
  if (!best) return std::nullopt;
  return engines_[*best].url;
}

void EnginePool::Return(size_t index) {
  MutexLock lock(&mu_);
  KV_CHECK_LT(index, engines_.size());
  KV_CHECK_GT(engines_[index].outstanding, 0u);
  --engines_[index].outstanding;
}

void EnginePool::ReportConnectionFailure(size_t index) {
  MutexLock lock(&mu_);
  Entry& e = engines_[index];
  if (e.up) Log("router", "engine %s: a leg lost its connection; down until /kv_info answers",
                e.url.c_str());
  e.up = false;
  e.recheck = true;
  monitor_cv_.NotifyAll();
}

void EnginePool::RequestRecheck(size_t index) {
  MutexLock lock(&mu_);
  engines_[index].recheck = true;
  monitor_cv_.NotifyAll();
}

void EnginePool::Recheck(bool all_down) {
  std::vector<size_t> todo;
  {
    MutexLock lock(&mu_);
    for (size_t i = 0; i < engines_.size(); ++i) {
      Entry& e = engines_[i];
      if (e.recheck || (all_down && !e.up)) todo.push_back(i);
      e.recheck = false;
    }
  }
  for (size_t i : todo) {
    Result<EngineInfo> info = fetcher_(UrlOf(i));
    MutexLock lock(&mu_);
    Entry& e = engines_[i];
    if (!info.ok()) {
      if (e.up) Log("router", "engine %s: down: %s", e.url.c_str(),
                    info.status().message().c_str());
      e.up = false;
      continue;
    }
    Status fits = Fits(e, *info);
    if (!fits.ok()) {
      if (e.up || e.info != info.value()) {
        Log("router", "engine %s: left out: %s", e.url.c_str(), fits.message().c_str());
      }
      e.info = *info;
      e.up = false;
      continue;
    }
    if (e.info != info.value()) {
      Log("router",
          "engine %s: new /kv_info: engine_id %u, incarnation %u, tp %u, kv %s:%u (was "
          "engine_id %u, incarnation %u)",
          e.url.c_str(), info->engine_id, info->incarnation, info->tp, info->kv_host.c_str(),
          info->kv_port, e.info ? e.info->engine_id : 0, e.info ? e.info->incarnation : 0);
    } else if (!e.up) {
      Log("router", "engine %s: up again", e.url.c_str());
    }
    e.info = *info;
    e.up = true;
  }
}

void EnginePool::MonitorLoop(Duration interval) {
  auto next_full = std::chrono::steady_clock::now() + std::chrono::nanoseconds(interval.ns());
  while (true) {
    bool full = false;
    {
      MutexLock lock(&mu_);
      monitor_cv_.WaitUntil(&mu_, next_full, [&]() REQUIRES(mu_) {
        if (monitor_stop_) return true;
        for (const Entry& e : engines_) {
          if (e.recheck) return true;
        }
        return false;
      });
      if (monitor_stop_) return;
      const auto now = std::chrono::steady_clock::now();
      if (now >= next_full) {
        full = true;
        next_full = now + std::chrono::nanoseconds(interval.ns());
      }
    }
    Recheck(full);
  }
}

void EnginePool::StopMonitor() {
  MutexLock lock(&mu_);
  monitor_stop_ = true;
  monitor_cv_.NotifyAll();
}

uint64_t EnginePool::outstanding(size_t index) const {
  MutexLock lock(&mu_);
  return engines_[index].outstanding;
}

bool EnginePool::up(size_t index) const {
  MutexLock lock(&mu_);
  return engines_[index].up;
}

json EnginePool::EnginesJson() const {
  MutexLock lock(&mu_);
  json out = json::array();
  for (const Entry& e : engines_) {
    out.push_back(json{{"url", e.url},
                       {"role", RoleOf(e)},
                       {"up", e.up},
                       {"outstanding", e.outstanding},
                       {"kv_info", e.info ? e.info->ToJson() : json(nullptr)}});
  }
  return out;
}

json EnginePool::HealthJson(bool* serving) const {
  MutexLock lock(&mu_);
  json p = json::array(), d = json::array();
  bool any_p = false, any_d = false;
  for (size_t i : prefill_) {
    const Entry& e = engines_[i];
    any_p = any_p || e.up;
    p.push_back(json{{"url", e.url}, {"up", e.up}, {"outstanding", e.outstanding}});
  }
  for (size_t i : decode_) {
    const Entry& e = engines_[i];
    any_d = any_d || e.up;
    d.push_back(json{{"url", e.url}, {"up", e.up}, {"outstanding", e.outstanding}});
  }
  *serving = any_p && any_d;
  return json{{"prefill", p}, {"decode", d}};
}

}  // namespace kvrelay::router
