#include "cli/bench_cluster.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "router/leg_bodies.h"
#include "router/transfer_id_source.h"

namespace kvrelay::cli {

using nlohmann::json;

std::string HumanBytes(uint64_t bytes) {
  char b[32];
  if (bytes >= (1ull << 30)) {
    std::snprintf(b, sizeof b, "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  } else if (bytes >= (1ull << 20)) {
    std::snprintf(b, sizeof b, "%.1f MiB", static_cast<double>(bytes) / (1ull << 20));
  } else {
    std::snprintf(b, sizeof b, "%.0f KiB", static_cast<double>(bytes) / 1024);
  }
  return b;
}

Status BenchCluster::Start(const BenchClusterOptions& o) {
  if (o.shape.empty()) {
    shape_ = o.given_shape;
  } else if (!engine::ModelShapeByName(o.shape, &shape_)) {
    return InvalidArgumentError("unknown model shape '" + o.shape + "' (tiny, small or 8b)");
  }
  ClusterOptions c;
  c.logs = o.logs;
  c.transport = o.transport;
  c.shape = o.shape;
  c.num_blocks = o.pool_blocks;
  c.num_plain = o.plain ? 1 : 0;
  c.step_per_token_us = o.step_per_token_us;
  c.control_nice = o.control_nice;
  c.control_slice_us = o.control_slice_us;
  c.engine_args = {"--tcp-streams", std::to_string(o.tcp_streams)};
  if (!o.shape.empty()) {   // the emulated model's modelled step time
    c.engine_args.insert(c.engine_args.end(),
                         {"--step-base-us", std::to_string(o.step_base_us)});
  }
  if (o.max_batch_tokens != 0) {
    c.engine_args.insert(c.engine_args.end(),
                         {"--max-batch-tokens", std::to_string(o.max_batch_tokens)});
  }
  c.engine_args.insert(c.engine_args.end(), o.engine_args.begin(), o.engine_args.end());
  if (!o.prefix_caching) c.engine_args.push_back("--no-prefix-caching");
  if (o.busy_steps) c.engine_args.push_back("--busy-steps");
  if (!o.fast_abort) c.engine_args.push_back("--no-fast-abort");
  if (o.compute_first_token) c.engine_args.push_back("--compute-first-token");
  if (o.inline_write_kib >= 0) {
    c.engine_args.push_back("--inline-write-kib");
    c.engine_args.push_back(std::to_string(o.inline_write_kib));
  }
  if (!o.local_lane) c.engine_args.push_back("--no-local-lane");
  if (o.kv_mode != "push") {
    c.engine_args.insert(c.engine_args.end(), {"--kv-mode", o.kv_mode});
    c.router_args.insert(c.router_args.end(), {"--kv-mode", o.kv_mode});
  }
  if (o.kv_read_threads != 1) {
    c.engine_args.push_back("--kv-read-threads");
    c.engine_args.push_back(std::to_string(o.kv_read_threads));
  }
  if (!o.ucx_tls.empty()) {
    c.engine_args.push_back("--ucx-tls");
    c.engine_args.push_back(o.ucx_tls);
  }
  c.twin_p_args = o.twin_p_args;
  if (Status s = cluster_.Start(c); !s.ok()) return s;
  const http::ClientOptions timeouts =
      http::ClientOptions::Timeouts(Duration::Seconds(3), Duration::Seconds(120));
  p_ = std::make_unique<http::Client>(cluster_.p_urls()[0], timeouts);
  d_ = std::make_unique<http::Client>(cluster_.d_urls()[0], timeouts);
  auto info = p_->Get("/kv_info");
  if (!info.ok() || info->status != 200) return UnavailableError("P's /kv_info did not answer");
  Result<router::EngineInfo> parsed = router::ParseEngineInfo(info->body);
  if (!parsed.ok()) return parsed.status();
  p_info_ = *parsed;
  auto pulls = d_->Get("/debug/pulls?after=0");
  if (!pulls.ok() || pulls->status != 200) return UnavailableError("D's /debug/pulls did not answer");
  cursor_ = json::parse(pulls->body).at("last_seq").get<uint64_t>();
  return Status::Ok();
}

json BenchCluster::Prompt(Prng& prng, uint32_t tokens) const {
  json ids = json::array();
  for (uint32_t i = 0; i < tokens; ++i) ids.push_back(1 + prng.Uniform(shape_.vocab - 1));
  return json{{"prompt", ids}, {"max_tokens", 1}, {"stream", false}};
}

Status BenchCluster::Prefill(const json& client, const TransferId& t) {
  auto r = p_->Post("/v1/completions", router::PrefillLegBody(client, t, 1));
  if (!r.ok()) return UnavailableError("P leg: no answer");
  if (r->status != 200 || router::JudgeCompletion(r->body).failed()) {
    return UnavailableError("P leg: " + std::to_string(r->status) + " " +
                            router::UpstreamErrorMessage(r->body));
  }
  return Status::Ok();
}

Result<BenchCluster::Pulled> BenchCluster::Transfer(Prng& prng, uint32_t tokens) {
  const json client = Prompt(prng, tokens);
  Result<TransferId> id = router::NewTransferIdFromOs();
  if (!id.ok()) return id.status();
  if (Status s = Prefill(client, *id); !s.ok()) return s;
  return Decode(client, *id);
}

Result<BenchCluster::Pulled> BenchCluster::Decode(const json& client, const TransferId& t) {
  auto r = d_->Post("/v1/completions", router::DecodeLegBody(client, t, p_info_));
  if (!r.ok()) return UnavailableError("D leg: no answer");
  if (r->status != 200 || router::JudgeCompletion(r->body).failed()) {
    return UnavailableError("D leg: " + std::to_string(r->status) + " " +
                            router::UpstreamErrorMessage(r->body));
  }
  return FindPull(t);
}

BenchCluster::SendSeen BenchCluster::SendState(const http::Client& cli, const TransferId& t) {
  auto r = cli.Get("/debug/state");
  if (!r.ok() || r->status != 200) return {};
  const json doc = json::parse(r->body, nullptr, false);
  if (doc.is_discarded() || !doc.contains("ranks")) return {};
  const std::string id = t.ToString();
  for (const json& rank : doc["ranks"]) {
    for (const json& send : rank.value("sends", json::array())) {
      if (send.value("transfer", "") == id) {
        return SendSeen{send.value("state", ""), send.value("pull_items", 0u),
                        send.value("need", 0u)};
      }
    }
  }
  return {};
}

Result<std::vector<BenchCluster::Pulled>> BenchCluster::NewPulls() {
  auto r = d_->Get("/debug/pulls?after=" + std::to_string(cursor_));
  if (!r.ok() || r->status != 200) return UnavailableError("D's /debug/pulls did not answer");
  const json doc = json::parse(r->body, nullptr, false);
  if (doc.is_discarded() || !doc.contains("samples")) {
    return UnavailableError("D's /debug/pulls: not the expected JSON");
  }
  std::vector<Pulled> out;
  for (const json& s : doc.at("samples")) {
    cursor_ = std::max(cursor_, s.at("seq").get<uint64_t>());
    Pulled p;
    if (!TransferId::Parse(s.at("transfer_id").get<std::string>(), &p.transfer)) {
      return UnavailableError("D's /debug/pulls: a sample without a transfer id");
    }
    p.blocks = s.at("blocks").get<uint32_t>();
    p.seconds = s.at("pull_to_answer_s").get<double>();
    p.result = s.at("result").get<std::string>();
    p.answered_mono_ns = s.at("answered_mono_ns").get<int64_t>();
    out.push_back(std::move(p));
  }
  return out;
}

Result<BenchCluster::Pulled> BenchCluster::FindPull(const TransferId& t) {
  for (int attempt = 0; attempt < 50; ++attempt) {
    Result<std::vector<Pulled>> pulls = NewPulls();
    if (!pulls.ok()) return pulls.status();
    for (const Pulled& p : *pulls) {
      if (p.transfer == t) return p;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return NotFoundError("D logged no answer for transfer " + t.ToString());
}

Status BenchCluster::WaitIdle(double timeout_s) {
  std::vector<std::string> urls = {p_url(), d_url()};
  if (!plain_url().empty()) urls.push_back(plain_url());
  if (!twin_p_url().empty()) urls.push_back(twin_p_url());
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1e3));
  for (const std::string& url : urls) {
    std::string last = "no answer";
    while (true) {
      Result<json> st = GetJson(url, "/debug/state");
      if (st.ok()) {
        const json& eng = (*st)["engine"];
        if (st->value("idle", false) && eng.is_object() && eng.value("blocks_used", 1) == 0) {
          break;
        }
        last = "idle=" + std::string(st->value("idle", false) ? "true" : "false") +
               " blocks_used=" +
               (eng.is_object() ? std::to_string(eng.value("blocks_used", -1)) : "?");
      } else {
        last = st.status().message();
      }
      if (std::chrono::steady_clock::now() >= until) {
        return DeadlineExceededError("engine " + url + " did not go idle within " +
                                     std::to_string(timeout_s) + " s (" + last + ")");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  return Status::Ok();
}

}  // namespace kvrelay::cli
