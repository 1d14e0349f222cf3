#include "server/server_metrics.h"

#include "base/check.h"
#include "server/admin_call.h"
#include "server/http_metrics.h"

namespace kvrelay::server {

namespace {
// The runtime::RankCounters exported: each summed over ranks at scrape time
// (Snapshot::rank_counters, by index here). A counter is one line.
//
// Section: where the series is registered, which keeps its family's place in
// the exposition: with the control channel's counters, or access control's.
enum class Section { kControl, kAccess };
struct RankCounterMetric {
  const char* name;
  const char* help;
  std::atomic<uint64_t> runtime::RankCounters::*member;
  Section section = Section::kControl;
  const char* label = nullptr;  // one label, {label, value}, if any
  const char* value = nullptr;
};
using RC = runtime::RankCounters;
constexpr const char* kRefusedHelp = "pull items refused (P), by reason";
constexpr RankCounterMetric kRankCounterMetrics[] = {
    {"kvrelay_control_frames_received_total", "control frames received", &RC::frames_in},
    {"kvrelay_control_frames_sent_total", "control frames sent", &RC::frames_out},
    {"kvrelay_control_frames_malformed_total", "control frames dropped: undecodable",
     &RC::malformed},
    {"kvrelay_control_unknown_sender_total", "control frames dropped: sender never handshook",
     &RC::unknown_sender},
    {"kvrelay_handshakes_refused_total",
     "handshakes refused: layout, transport or identity mismatch", &RC::handshake_refused},
    {"kvrelay_control_unroutable_total", "messages for a peer that is gone", &RC::unroutable},
    {"kvrelay_handshakes_total", "peers (re)registered", &RC::handshakes},
    {"kvrelay_peers_down_total", "peers that went silent", &RC::peers_down},
    {"kvrelay_peers_gone_total", "peers declared gone (their loads failed)", &RC::peers_gone},
    {"kvrelay_peer_reconnects_total", "silent peers that came back", &RC::reconnects},
    {"kvrelay_writes_ok_total", "data-plane writes completed (P)", &RC::writes_ok},
    {"kvrelay_writes_failed_total", "data-plane writes failed (P)", &RC::writes_failed},
    {"kvrelay_writes_inline_total",
     "of the writes, run on the rank's own thread (small shm and tcp ones) (P)",
     &RC::writes_inline},
    {"kvrelay_bytes_moved_total", "KV bytes written to D engines (P)", &RC::bytes_written},
    {"kvrelay_reads_ok_total", "data-plane reads completed (D, read mode)", &RC::reads_ok},
    {"kvrelay_reads_failed_total", "data-plane reads failed (D, read mode)", &RC::reads_failed},
    {"kvrelay_reads_inline_total",
     "of the reads, run on the rank's own thread (small shm and tcp ones) (D, read mode)",
     &RC::reads_inline},
    {"kvrelay_bytes_read_total", "KV bytes read from P engines (D, read mode)", &RC::bytes_read},
    {"kvrelay_pulls_sent_total", "pull items sent (D)", &RC::pulls_sent},
    {"kvrelay_answers_received_total", "answers received (D)", &RC::answers_received},
    {"kvrelay_lane_frames_sent_total",
     "of the control frames sent, those on a local lane (shm, same host)",
     &RC::lane_frames_out},
    {"kvrelay_lanes_opened_total", "local lanes opened (D) or attached (P)", &RC::lanes_opened},
    {"kvrelay_lanes_broken_total",
     "local lanes that broke (peer gone or bad frame); D falls back to ZeroMQ",
     &RC::lanes_broken},
    // Access control (docs/operations.md, "Access control").
    {"kvrelay_pulls_refused_total", kRefusedHelp, &RC::pulls_refused_unauthenticated,
     Section::kAccess, "reason", "unauthenticated"},
    {"kvrelay_pulls_refused_total", kRefusedHelp, &RC::pulls_refused_dst, Section::kAccess,
     "reason", "dst_out_of_region"},
    {"kvrelay_pulls_refused_total", kRefusedHelp, &RC::pulls_misaddressed, Section::kAccess,
     "reason", "misaddressed"},
    {"kvrelay_handshakes_auth_failed_total",
     "control-channel handshakes refused: no, wrong or replayed proof of the token",
     &RC::auth_failed, Section::kAccess},
};
constexpr size_t kRankCounterCount = std::size(kRankCounterMetrics);

const std::vector<double>& TransferBuckets() {
  static const std::vector<double> b = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                        0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5,
                                        5,      10,      30,     60,    120,    480};
  return b;
}
}  // namespace

ServerMetrics::ServerMetrics() {
  MetricsRegistry& r = registry_;
  http_requests = r.AddCounter("kvrelay_http_completion_requests_total",
                               "POST /v1/completions and /v1/chat/completions received");
  chat_requests = r.AddCounter("kvrelay_http_chat_requests_total",
                               "of them, POST /v1/chat/completions");
  bad_requests = r.AddCounter("kvrelay_http_bad_requests_total",
                              "requests refused with 4xx: malformed body or parameters");
  requests_rejected = r.AddCounter("kvrelay_requests_rejected_total",
                                   "valid requests the engine refused (queue full, "
                                   "duplicate transfer_id, producer unreachable)");
  requests_started = r.AddCounter("kvrelay_requests_started_total", "requests admitted");
  client_disconnects = r.AddCounter("kvrelay_client_disconnects_total",
                                    "clients that went away before their request ended "
                                    "(each aborts its request)");
  refused_releases = r.AddCounter("kvrelay_refused_handoff_releases_total",
                                  "D: hand-offs refused before admission whose P was told "
                                  "to release at once");
  fast_aborts = r.AddCounter("kvrelay_fast_aborts_total",
                             "P: sends of aborted or disconnected requests ended straight "
                             "at the ranks, one per transfer and rank, ahead of the engine");
  fast_aborts_dropped = r.AddCounter("kvrelay_fast_aborts_dropped_total",
                                     "P: fast aborts not posted because a rank's inbox was "
                                     "full or closed (the engine's own abort still follows)");
  kv_releases = r.AddCounter("kvrelay_kv_releases_total",
                             "P: transfers the router released (POST /kv_release) because "
                             "their request ended without D pulling");
  // In FinishReason's order.
  const char* reasons[] = {"length", "abort", "error", "stop"};
  for (int i = 0; i < 4; ++i) {
    finished_[i] = r.AddCounter("kvrelay_requests_finished_total", "requests ended, by reason",
                                {{"reason", reasons[i]}});
  }
  request_latency_ = r.AddHistogram("kvrelay_request_latency_seconds",
                                    "admission to last token", TransferBuckets());
  for (std::string_view path : AdminPaths()) {
    std::string call(path.substr(1));
    admin_calls_[call] = {
        r.AddCounter("kvrelay_admin_calls_total", "admin calls, by call and outcome",
                     {{"call", call}, {"outcome", "ok"}}),
        r.AddCounter("kvrelay_admin_calls_total", "admin calls, by call and outcome",
                     {{"call", call}, {"outcome", "failed"}})};
    admin_latency_[call] = r.AddHistogram("kvrelay_admin_call_latency_seconds",
                                          "call to completion", TransferBuckets(),
                                          {{"call", call}});
  }
  pull_answer_latency_ = r.AddHistogram("kvrelay_pull_answer_latency_seconds",
                                        "D: pull sent to its answer received (read mode: first lease "
                                        "request to a P rank to its reads landed or failed)",
                                        TransferBuckets());
  transfer_latency_ok_ = r.AddHistogram("kvrelay_transfer_latency_seconds",
                                        "D: load started to every producer answered",
                                        TransferBuckets(), {{"outcome", "ok"}});
  transfer_latency_failed_ = r.AddHistogram("kvrelay_transfer_latency_seconds",
                                            "D: load started to every producer answered",
                                            TransferBuckets(), {{"outcome", "failed"}});
  write_latency_ = r.AddHistogram("kvrelay_write_latency_seconds",
                                  "P: one data-plane write, start to bytes at D",
                                  TransferBuckets());
  fast_abort_wait_ = r.AddHistogram("kvrelay_fast_abort_wait_seconds",
                                    "P: a fast abort posted by the server to applied on a rank",
                                    TransferBuckets());

  RegisterHttpMetrics(r, &http_stats_);

  // State, read from the snapshot Render() takes.
  Snapshot* s = &snap_;
  auto gauge = [&](const char* name, const char* help, MetricLabels labels,
                   std::function<double()> fn) {
    r.AddGaugeFn(name, help, std::move(labels), std::move(fn));
  };
  auto counter = [&](const char* name, const char* help, MetricLabels labels,
                     std::function<uint64_t()> fn) {
    r.AddCounterFn(name, help, std::move(labels), std::move(fn));
  };
  const char* kReqHelp = "requests in the engine, by state";
  gauge("kvrelay_requests", kReqHelp, {{"state", "waiting"}}, [s] { return s->engine.waiting; });
  gauge("kvrelay_requests", kReqHelp, {{"state", "running"}}, [s] { return s->engine.running; });
  gauge("kvrelay_requests", kReqHelp, {{"state", "loading"}}, [s] { return s->engine.loading; });
  gauge("kvrelay_requests", kReqHelp, {{"state", "held_for_transfer"}},
        [s] { return s->engine.held; });
  gauge("kvrelay_requests", kReqHelp, {{"state", "releasing"}},
        [s] { return s->engine.releasing; });
  const char* kBlkHelp = "KV blocks of the pool, by use";
  gauge("kvrelay_kv_blocks", kBlkHelp, {{"use", "used"}}, [s] { return s->engine.blocks_used; });
  gauge("kvrelay_kv_blocks", kBlkHelp, {{"use", "free"}}, [s] { return s->engine.blocks_free; });
  gauge("kvrelay_kv_blocks", kBlkHelp, {{"use", "cached"}},
        [s] { return s->engine.blocks_cached; });
  gauge("kvrelay_kv_blocks", kBlkHelp, {{"use", "held_for_transfer"}}, [s] {
    double n = 0;
    for (const auto& rk : s->ranks) {
      if (rk.rank != 0) continue;  // the same blocks on every rank
      for (const auto& v : rk.sends) n += v.blocks;
      for (const auto& v : rk.loads) n += v.blocks;
    }
    return n;
  });
  gauge("kvrelay_engine_pending_ops", "lifecycle operations queued or in progress", {},
        [s] { return s->engine.pending_ops; });
  gauge("kvrelay_weights_version", "weights version loaded", {},
        [s] { return static_cast<double>(s->engine.weights_version); });
  gauge("kvrelay_engine_sleeping", "1 while asleep", {}, [s] { return s->engine.sleeping; });
  counter("kvrelay_first_tokens_from_producer_total",
          "D: requests whose first token was the one P computed, emitted without a step on "
          "the loaded KV",
          {}, [s] { return s->engine.producer_tokens; });
  counter("kvrelay_requests_queue_wait_expired_total",
          "requests ended with an error for producing no token within --max-queue-wait-s "
          "(queued behind a pause or a sleep)",
          {}, [s] { return s->engine.queue_wait_expired; });
  counter("kvrelay_prefill_chunks_streamed_total",
          "P (--stream-chunks): finished prompt chunks offered to the ranks while the "
          "prefill went on",
          {}, [s] { return s->engine.chunks_streamed; });
  counter("kvrelay_streams_preempted_total",
          "P (--stream-chunks): streaming requests preempted (their send ended, D "
          "recomputes; the blocks stayed until every rank was done)",
          {}, [s] { return s->engine.streams_parked; });
  counter("kvrelay_kv_exports_failed_total",
          "P: hand-offs ended as aborted because the model could not copy its KV into the "
          "blocks (llama.cpp engines)",
          {}, [s] { return s->engine.exports_failed; });
  counter("kvrelay_kv_imports_failed_total",
          "D: loads that landed but whose KV the model refused (another model's file, a "
          "corrupted or cut frame; llama.cpp engines): recomputed or failed by policy",
          {}, [s] { return s->engine.imports_failed; });
  counter("kvrelay_kv_exported_tokens_total",
          "P: prompt tokens whose KV the model copied into hand-off blocks (llama.cpp engines)",
          {}, [s] { return s->engine.kv_copy.exported_tokens; });
  r.AddSecondsCounterFn(
      "kvrelay_kv_export_seconds_total",
      "P: time the model spent copying KV into hand-off blocks (llama.cpp engines)", {},
      [s] { return static_cast<double>(s->engine.kv_copy.export_ns) / 1e9; });
  counter("kvrelay_kv_imported_tokens_total",
          "D: prompt tokens whose landed KV the model took in (llama.cpp engines)", {},
          [s] { return s->engine.kv_copy.imported_tokens; });
  r.AddSecondsCounterFn("kvrelay_kv_import_seconds_total",
                        "D: time the model spent taking landed KV in (llama.cpp engines)", {},
                        [s] { return static_cast<double>(s->engine.kv_copy.import_ns) / 1e9; });
  counter("kvrelay_engine_steps_total", "engine steps run", {}, [s] { return s->steps.steps; });
  r.AddSecondsCounterFn(
      "kvrelay_engine_step_work_seconds_total",
      "time the engine thread spent inside its steps (the batch's KV bytes, the model's "
      "compute); a step lasts at least its modelled compute",
      {}, [s] { return static_cast<double>(s->steps.work_ns) / 1e9; });
  r.AddSecondsCounterFn("kvrelay_engine_step_modelled_seconds_total",
                        "compute time the steps asked for: --step-base-us + --step-per-token-us "
                        "per token (0 on llama.cpp engines, whose compute is their work)",
                        {}, [s] { return static_cast<double>(s->steps.modelled_ns) / 1e9; });
  counter("kvrelay_engine_step_overruns_total",
          "steps whose work outlasted their modelled compute (emulated model): the host, "
          "not the model, set their length",
          {}, [s] { return s->steps.overruns; });
  const char* kTrHelp = "live sends (P), by state, summed over ranks";
  for (SendState st : {SendState::kWaiting, SendState::kStreaming, SendState::kReady,
                        SendState::kDone}) {
    gauge("kvrelay_transfers", kTrHelp, {{"state", SendStateName(st)}}, [s, st] {
      double n = 0;
      for (const auto& rk : s->ranks) {
        for (const auto& v : rk.sends) n += v.state == st;
      }
      return n;
    });
  }
  gauge("kvrelay_loads_in_flight", "live loads (D), summed over ranks", {}, [s] {
    double n = 0;
    for (const auto& rk : s->ranks) n += static_cast<double>(rk.loads.size());
    return n;
  });
  gauge("kvrelay_writes_in_flight", "data-plane writes in flight (P)", {}, [s] {
    double n = 0;
    for (const auto& rk : s->ranks) n += rk.writes_in_flight;
    return n;
  });
  gauge("kvrelay_pulls_queued_for_sender", "pull items waiting for a sender slot (P)", {}, [s] {
    double n = 0;
    for (const auto& rk : s->ranks) n += static_cast<double>(rk.queued_for_sender);
    return n;
  });
  counter("kvrelay_pulls_received_total", "pull items received (P)", {}, [s] {
    uint64_t n = 0;
    for (const auto& rk : s->ranks) n += rk.send_stats.pull_items;
    return n;
  });
  counter("kvrelay_chunk_writes_total",
          "writes of part of a pull item (P, --stream-chunks): the item was written chunk by "
          "chunk while the prefill went on",
          {}, [s] {
            uint64_t n = 0;
            for (const auto& rk : s->ranks) n += rk.send_stats.chunk_writes;
            return n;
          });
  counter("kvrelay_pulls_resent_total",
          "pull items received again after a reconnect (P): still live (answered once, "
          "later) or already answered (the same answer again)",
          {}, [s] {
            uint64_t n = 0;
            for (const auto& rk : s->ranks) {
              n += rk.send_stats.duplicate_items + rk.send_stats.reanswered;
            }
            return n;
          });
  for (int i = 0; i < kTransferResultCount; ++i) {
    const std::string name(TransferResultName(static_cast<TransferResult>(i)));
    counter("kvrelay_pulls_answered_total", "pull items answered (P), by outcome",
            {{"outcome", name}}, [s, i] {
              uint64_t n = 0;
              for (const auto& rk : s->ranks) n += rk.send_stats.answers[i];
              return n;
            });
    counter("kvrelay_sends_ended_total", "sends ended (P), by reason", {{"reason", name}},
            [s, i] {
              uint64_t n = 0;
              for (const auto& rk : s->ranks) n += rk.send_stats.ends[i];
              return n;
            });
  }
  counter("kvrelay_expirations_total",
          "pull items whose deadline passed before a write could start (P)", {}, [s] {
            uint64_t n = 0;
            for (const auto& rk : s->ranks) {
              n += rk.send_stats.deadline_timer + rk.send_stats.deadline_at_admission;
            }
            return n;
          });
  const char* kLoadHelp = "loads ended (D, push or read mode), by outcome";
  // A rank runs one mode: the other mode's table stays at zero.
  auto load_counter = [&](const char* outcome, uint64_t LoadTableStats::*push,
                          uint64_t ReadLoadTableStats::*read) {
    counter("kvrelay_loads_total", kLoadHelp, {{"outcome", outcome}}, [s, push, read] {
      uint64_t n = 0;
      for (const auto& rk : s->ranks) n += rk.load_stats.*push + rk.read_stats.*read;
      return n;
    });
  };
  load_counter("ok", &LoadTableStats::loads_ok, &ReadLoadTableStats::loads_ok);
  load_counter("failed", &LoadTableStats::loads_failed, &ReadLoadTableStats::loads_failed);
  load_counter("released", &LoadTableStats::loads_released, &ReadLoadTableStats::loads_released);
  load_counter("cut_short", &LoadTableStats::loads_cut_short,
               &ReadLoadTableStats::loads_cut_short);
  auto rank_counters = [&](Section section) {
    for (size_t i = 0; i < kRankCounterCount; ++i) {
      const RankCounterMetric& m = kRankCounterMetrics[i];
      if (m.section != section) continue;
      MetricLabels labels;
      if (m.label != nullptr) labels.emplace_back(m.label, m.value);
      counter(m.name, m.help, std::move(labels), [s, i] { return s->rank_counters[i]; });
    }
  };
  rank_counters(Section::kControl);
  const char* kLimitHelp = "requests and control frames refused for a configured limit, by limit";
  // Bodies over the limit are refused by the HTTP server, for every framing.
  r.AddCounterFn("kvrelay_limit_rejections_total", kLimitHelp, {{"limit", "body_bytes"}},
                 [this] { return http_stats_ ? http_stats_().refused_body_bytes : 0; });
  for (const char* limit : {"prompt_tokens", "requests_per_client"}) {
    limit_rejections_[limit] =
        r.AddCounter("kvrelay_limit_rejections_total", kLimitHelp, {{"limit", limit}});
  }
  for (int i = 0; i < kWireLimitCount; ++i) {
    counter("kvrelay_limit_rejections_total", kLimitHelp,
            {{"limit", std::string(WireLimitName(static_cast<WireLimit>(i)))}},
            [s, i] { return s->over_limit[i]; });
  }
  // Access control (docs/operations.md, "Access control"): the rank's counters
  // (refused pulls, then failed handshakes, each family in its place), then
  // the pulls the send table refused.
  rank_counters(Section::kAccess);
  counter("kvrelay_pulls_refused_total", kRefusedHelp, {{"reason", "wrong_engine"}}, [s] {
    uint64_t n = 0;
    for (const auto& rk : s->ranks) n += rk.send_stats.refused_wrong_engine;
    return n;
  });
  counter("kvrelay_pulls_refused_total", kRefusedHelp, {{"reason", "unknown_transfer"}}, [s] {
    uint64_t n = 0;
    for (const auto& rk : s->ranks) n += rk.send_stats.unknown_transfer_expired;
    return n;
  });
  for (int v = 1; v < kAdminAuthVerdicts; ++v) {
    admin_auth_refused_[v] = r.AddCounter(
        "kvrelay_admin_auth_refused_total",
        "admin and /debug requests refused (401): missing, malformed, unknown_nonce, bad_mac",
        {{"reason", AdminAuthVerdictName(static_cast<AdminAuthVerdict>(v))}});
  }
  counter("kvrelay_transport_writes_refused_total",
          "tcp receiver: writes refused (not granted or out of range)", {},
          [s] { return s->transport[0]; });
  counter("kvrelay_transport_frames_malformed_total", "tcp receiver: malformed data frames",
          {}, [s] { return s->transport[1]; });
  counter("kvrelay_transport_bytes_received_total", "tcp receiver: bytes written into KV", {},
          [s] { return s->transport[2]; });
}

void ServerMetrics::LimitRejected(std::string_view limit) {
  if (limit == "body_bytes") return;   // the HTTP server refused it, and counts it
  auto it = limit_rejections_.find(limit);
  KV_CHECK_MSG(it != limit_rejections_.end(), "an unregistered limit label");
  it->second->Inc();
}

void ServerMetrics::RequestFinished(engine::FinishReason reason, double seconds) {
  finished_[static_cast<int>(reason)]->Inc();
  request_latency_->ObserveSeconds(seconds);
}

void ServerMetrics::AdminAuthRefused(AdminAuthVerdict verdict) {
  const int v = static_cast<int>(verdict);
  if (v > 0 && v < kAdminAuthVerdicts) admin_auth_refused_[v]->Inc();
}

void ServerMetrics::AdminCall(std::string_view call, bool ok, double seconds) {
  auto it = admin_calls_.find(call);
  if (it == admin_calls_.end()) return;
  (ok ? it->second.first : it->second.second)->Inc();
  admin_latency_.find(call)->second->ObserveSeconds(seconds);
}

runtime::LatencySink ServerMetrics::LatencySink() {
  runtime::LatencySink sink;
  sink.pull_answer = [this](TransferId transfer, uint32_t rank, uint32_t blocks, double s,
                            TransferResult result, Instant answered) {
    pull_answer_latency_->ObserveSeconds(s);
    pull_log_.Add(PullSample{0, transfer, rank, blocks, s, result, answered.ns()});
  };
  sink.transfer = [this](double s, bool ok) {
    (ok ? transfer_latency_ok_ : transfer_latency_failed_)->ObserveSeconds(s);
  };
  sink.write = [this](double s) { write_latency_->ObserveSeconds(s); };
  sink.posted_to_applied = [this](double s) { fast_abort_wait_->ObserveSeconds(s); };
  return sink;
}

std::string ServerMetrics::Render(runtime::Node& node) {
  MutexLock lock(&render_mu_);
  snap_ = Snapshot{};
  snap_.rank_counters.assign(kRankCounterCount, 0);
  if (auto e = node.engine().Query([](const engine::Engine& en) { return en.Snapshot(); })) {
    snap_.engine = *e;
  }
  for (const auto& rank : node.ranks()) {
    if (auto st = rank->State()) snap_.ranks.push_back(std::move(*st));
    const runtime::RankCounters& c = rank->counters();
    for (size_t i = 0; i < kRankCounterCount; ++i) {
      snap_.rank_counters[i] += (c.*kRankCounterMetrics[i].member).load();
    }
    for (int i = 0; i < kWireLimitCount; ++i) snap_.over_limit[i] += c.over_limit[i].load();
  }
  const runtime::StepCounters& sc = node.engine().step_counters();
  snap_.steps.steps = sc.steps.load();
  snap_.steps.work_ns = sc.work_ns.load();
  snap_.steps.modelled_ns = sc.modelled_ns.load();
  snap_.steps.overruns = sc.overruns.load();
  const net::TransportStats& ts = node.transport().stats();
  snap_.transport[0] = ts.writes_refused.load();
  snap_.transport[1] = ts.frames_malformed.load();
  snap_.transport[2] = ts.bytes_received.load();
  return registry_.Render();
}

}  // namespace kvrelay::server
