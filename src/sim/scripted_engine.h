// scripted_engine.h — ScriptedEngine: a minimal engine for the simulator.
//
// Why: the transfer core must be proven before the real emulated engine
// stands on it. This engine does only what the connector needs to be
// exercised the way a real scheduler exercises it: admit legs, allocate
// blocks (waiting under pool pressure), "prefill" for a random time and
// hand the blocks to the connector (P), allocate and load remote KV, verify
// every byte against the prompt, "decode" and finish (D), abort at any
// moment, and free blocks exactly when the connector says so. Everything
// goes through ConnectorScheduler and the ranks' metadata/reports, as in a
// real engine.
//
// Effects go to the Host (the simulator). One engine per simulated engine
// process incarnation; a crash destroys it.
//
// Thread safety: none; owned by the simulator.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "base/prng.h"
#include "core/block_pool.h"
#include "core/connector_scheduler.h"
#include "sim/coverage.h"
#include "sim/sim_memory.h"

namespace kvrelay::sim {

// How a leg ended, as its client sees it.
enum class LegOutcome : uint8_t { kOk, kError, kAborted };

class EngineHost {
 public:
  virtual ~EngineHost() = default;
  // Apply this step's connector metadata to every rank of `engine`.
  virtual void ApplyToRanks(uint32_t engine, const ConnectorMetadata& meta) = 0;
  // Call back OnPrefillDone / OnDecodeDone after `delay`.
  virtual void ScheduleWork(uint32_t engine, uint32_t request, bool prefill,
                            Duration delay) = 0;
  virtual void ScheduleStep(uint32_t engine) = 0;
  virtual void LegEnded(uint32_t engine, uint32_t request, LegOutcome outcome) = 0;
  // D blocks are about to be freed: no write may be in flight into them.
  virtual void BlocksFreed(uint32_t engine, std::span<const BlockId> blocks) = 0;
  virtual void Violation(const std::string& what) = 0;
  virtual void Hit(Mark m) = 0;
  virtual Prng& prng() = 0;
};

struct LegSpec {
  uint32_t request = 0;        // the client request's index
  KvTransferParams params;
  uint32_t prompt_blocks = 1;
  uint32_t remote_tp = 1;      // the other side's tp (for content checks)
};

class ScriptedEngine {
 public:
  struct Config {
    uint32_t engine = 0;
    uint32_t incarnation = 1;
    ConnectorRole role = ConnectorRole::kProducer;
    uint32_t tp = 1;
    uint32_t pool_blocks = 16;
    bool recompute_on_failure = true;
    Duration prefill_time_max = Duration::Milliseconds(10);
    Duration decode_time_max = Duration::Milliseconds(10);
  };

  ScriptedEngine(const Config& config, EngineHost* host, SimMemory* memory);

  void OnLeg(const LegSpec& leg, Instant now);
  void OnAbort(uint32_t request, Instant now);
  void OnPrefillDone(uint32_t request, Instant now);
  void OnDecodeDone(uint32_t request, Instant now);
  // One engine step: drain rank reports, allocate, emit metadata.
  void Step(std::vector<RankReport> reports, Instant now);
  // abort_transfers() through the connector.
  void AbortTransfers();
  // Ends every leg (the process died).
  void Crash();

  bool Idle() const { return requests_.empty() && connector_.Idle(); }
  const BlockPool& pool() const { return pool_; }
  const ConnectorScheduler& connector() const { return connector_; }
  size_t live_requests() const { return requests_.size(); }
  void CheckInvariants() const;

 private:
  enum class Phase : uint8_t {
    kWaitBlocks, kPrefilling, kHeld,             // P
    kLoading, kDecoding, kReleasing,             // D
  };
  struct Req {
    LegSpec leg;
    RequestId id;
    Phase phase = Phase::kWaitBlocks;
    std::vector<BlockId> blocks;
  };

  bool producer() const { return config_.role == ConnectorRole::kProducer; }
  bool TryAllocate(Req& r);
  void FreeBlocks(Req& r);
  void End(uint32_t request, LegOutcome outcome);
  void Finish(uint32_t request, LegOutcome outcome);
  void ApplyFinished(const EngineFinished& f);
  void WriteLocalKv(const Req& r);   // what a local prefill/recompute writes
  bool VerifyKv(const Req& r);       // D: every byte is this prompt's
  Req* Find(RequestId id);

  const Config config_;
  EngineHost* const host_;
  SimMemory* const memory_;
  BlockPool pool_;
  ConnectorScheduler connector_;
  std::map<uint32_t, Req> requests_;   // by client request index
  std::deque<uint32_t> waiting_;       // FIFO for block allocation
};

}  // namespace kvrelay::sim
