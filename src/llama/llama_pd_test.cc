// P/D on llama.cpp, in one process: a producer engine and a consumer
// engine, each over its own LlamaModel and its own byte region
// (ByteKvMemory, laid out by ShapeFor), with the test carrying the blocks
// from P's region to D's as a transport would and reporting each load as
// the ranks do. D's outputs must equal llama.cpp decoding each prompt
// alone (ReferenceDecoder); KV that is corrupted, cut, or from another
// model's file is refused at import and the request recomputes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

#include "base/prng.h"
#include "engine/byte_kv_memory.h"
#include "engine/engine.h"
#include "llama/llama_model.h"
#include "llama/model_maker.h"
#include "llama/reference_decoder.h"

namespace kvrelay::llama {
namespace {

using engine::Engine;
using engine::EngineAction;
using engine::EngineOptions;
using engine::Token;

constexpr uint32_t kBlockTokens = 16;
constexpr uint32_t kBlocks = 48;
constexpr uint32_t kBatchTokens = 64;
constexpr uint32_t kRunning = 8;
constexpr uint32_t kThreads = 1;

// One engine: its model, region, memory and the actions it emitted.
struct Side {
  std::unique_ptr<LlamaModel> model;
  std::vector<uint8_t> region;
  std::unique_ptr<engine::ByteKvMemory> memory;
  std::unique_ptr<Engine> engine;
  std::vector<RankReport> next;           // reports for its next step
  std::vector<ConnectorMetadata> metas;   // every MetadataOut
  std::map<uint64_t, std::vector<Token>> tokens;
  std::map<uint64_t, engine::FinishReason> done;
};

class LlamaPdTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                     ("kvrelay-llama-pd-test-" + std::to_string(::getpid())));
    std::filesystem::create_directories(*dir_);
    for (uint64_t v : {1, 2}) {
      MakeModelOptions m;
      m.out_path = Path(v);
      m.seed = 300 + v;
      ASSERT_TRUE(MakeModel(m).ok());
    }
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::string Path(uint64_t v) {
    return (*dir_ / ("m" + std::to_string(v) + ".gguf")).string();
  }

  static void Open(Side* s, engine::Role role, const std::string& path,
                   bool producer_first_token = true,
                   engine::LoadFailurePolicy policy = engine::LoadFailurePolicy::kRecompute) {
    LlamaModelOptions lo;
    lo.model_path = path;
    lo.threads = kThreads;
    lo.context_tokens = kBlocks * kBlockTokens;
    lo.max_sequences = kRunning * 2;
    lo.batch_tokens = kBatchTokens;
    auto m = LlamaModel::Open(lo);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    s->model = std::move(*m);
    EngineOptions o;
    o.engine_id = role == engine::Role::kProducer ? 0 : 1;
    o.role = role;
    o.shape = ShapeFor(s->model->info(), kBlockTokens, lo.context_tokens);
    o.num_blocks = kBlocks;
    o.max_batch_tokens = kBatchTokens + kRunning;
    o.max_running = kRunning;
    o.prefix_caching = false;
    o.producer_first_token = producer_first_token;
    o.load_failure_policy = policy;
    s->region.assign(
        engine::ByteKvMemory::RegionBytes(o.shape, kBlocks, engine::kHeadGroups), 0);
    s->memory = std::make_unique<engine::ByteKvMemory>(o.shape, kBlocks, 0, engine::kHeadGroups,
                                                       s->region);
    s->engine = std::make_unique<Engine>(o, s->memory.get(), s->model.get());
  }

  void Step(Side* s) {
    std::vector<RankReport> reports;
    std::swap(reports, s->next);
    s->engine->Step(reports, now_);
    s->engine->CheckInvariants();
    while (std::optional<EngineAction> a = s->engine->PollAction()) {
      if (const auto* t = std::get_if<engine::TokenOut>(&*a)) {
        s->tokens[t->client].push_back(t->token);
      } else if (const auto* d = std::get_if<engine::RequestDone>(&*a)) {
        s->done[d->client] = d->reason;
      } else if (const auto* m = std::get_if<engine::MetadataOut>(&*a)) {
        s->metas.push_back(m->meta);
      }
    }
    now_ = now_ + Duration::Milliseconds(1);
  }

  static std::vector<Token> Prompt(uint64_t seed, uint32_t len) {
    Prng prng(seed);
    std::vector<Token> p;
    for (uint32_t i = 0; i < len; ++i) p.push_back(static_cast<Token>(3 + prng.Uniform(500)));
    return p;
  }

  std::vector<Token> Reference(const std::string& path, const std::vector<Token>& prompt,
                               uint32_t n, engine::Sampling s) {
    auto& ref = refs_[path];
    if (!ref) {
      ReferenceOptions ro;
      ro.model_path = path;
      ro.threads = kThreads;
      ro.context_tokens = kBlocks * kBlockTokens;
      ro.batch_tokens = kBatchTokens;
      auto r = ReferenceDecoder::Open(ro);
      KV_CHECK(r.ok());
      ref = std::move(*r);
    }
    return ref->Generate(prompt, n, s, /*ignore_eos=*/true);
  }

  struct Job {
    uint64_t client = 0;
    std::vector<Token> prompt;
    uint32_t max_tokens = 0;
    engine::Sampling sampling;
  };

  // P prefills every job and holds its KV; D loads each from P's blocks
  // (after `tamper` saw D's copy) and decodes; P's sends end. Both engines
  // must end idle with empty pools.
  template <typename Tamper>
  void HandOff(Side* p, Side* d, const std::vector<Job>& jobs, Tamper tamper,
               bool same_model = true) {
    for (const Job& j : jobs) {
      engine::RequestSpec spec;
      spec.client = j.client;
      spec.prompt = j.prompt;
      spec.max_tokens = j.max_tokens;
      spec.sampling = j.sampling;
      spec.ignore_eos = true;
      spec.kv.transfer = TransferId{7, j.client};
      spec.kv.do_remote_decode = true;
      ASSERT_TRUE(p->engine->AddRequest(spec, now_).ok());
      spec.kv.do_remote_decode = false;
      spec.kv.do_remote_prefill = true;
      spec.kv.remote_engine = 0;
      ASSERT_TRUE(d->engine->AddRequest(spec, now_).ok());
    }
    std::map<TransferId, ReadyOp> ready;
    std::map<TransferId, LoadOp> loads;
    for (int i = 0; i < 10000 && !(p->engine->Idle() && d->engine->Idle()); ++i) {
      Step(p);
      Step(d);
      for (const ConnectorMetadata& m : p->metas) {
        for (const ReadyOp& r : m.readies) ready[r.transfer] = r;
      }
      p->metas.clear();
      for (const ConnectorMetadata& m : d->metas) {
        for (const LoadOp& l : m.loads) loads[l.transfer] = l;
      }
      d->metas.clear();
      // A load whose KV P holds: copy the blocks, end both sides.
      for (auto it = loads.begin(); it != loads.end();) {
        auto r = ready.find(it->first);
        if (r == ready.end()) {
          ++it;
          continue;
        }
        const LoadOp& l = it->second;
        EXPECT_EQ(l.prompt_hash == r->second.prompt_hash, same_model)
            << "the fingerprint names the model";
        EXPECT_EQ(l.dst.size(), r->second.blocks.size());
        std::vector<std::span<uint8_t>> from, to;
        for (size_t b = 0; b < l.dst.size(); ++b) {
          p->memory->BlockBytes(r->second.blocks[b], &from);
          d->memory->BlockBytes(l.dst[b], &to);
          ASSERT_EQ(from.size(), to.size());
          for (size_t k = 0; k < from.size(); ++k) {
            std::memcpy(to[k].data(), from[k].data(), from[k].size());
          }
        }
        tamper(*d, l);
        if (d->next.empty()) d->next.emplace_back();
        d->next[0].finished_recving.push_back(LoadDone{l.request, l.transfer, /*ok=*/true,
                                                       false, TransferResult::kOk,
                                                       r->second.first_token});
        if (p->next.empty()) p->next.emplace_back();
        p->next[0].finished_sending.push_back(l.transfer);
        ready.erase(r);
        it = loads.erase(it);
      }
    }
    EXPECT_TRUE(p->engine->Idle());
    EXPECT_TRUE(d->engine->Idle());
    EXPECT_EQ(p->engine->pool().num_referenced(), 0u);
    EXPECT_EQ(d->engine->pool().num_referenced(), 0u);
  }

  static std::vector<Job> Jobs(uint64_t seed, size_t n) {
    std::vector<Job> jobs;
    const uint32_t lens[] = {1, 15, 16, 17, 31, 32, 57, 100};
    for (size_t i = 0; i < n; ++i) {
      Job j;
      j.client = i + 1;
      j.prompt = Prompt(seed * 1000 + i, lens[i % std::size(lens)]);
      j.max_tokens = 2 + static_cast<uint32_t>(i % 7);
      if (i % 3 == 2) j.sampling = engine::Sampling{0.8f, seed + i};
      jobs.push_back(std::move(j));
    }
    return jobs;
  }

  void ExpectReference(const Side& d, const std::string& path, const std::vector<Job>& jobs) {
    for (const Job& j : jobs) {
      ASSERT_EQ(d.done.count(j.client), 1u) << "client " << j.client;
      EXPECT_EQ(d.done.at(j.client), engine::FinishReason::kLength);
      EXPECT_EQ(d.tokens.at(j.client), Reference(path, j.prompt, j.max_tokens, j.sampling))
          << "client " << j.client << " prompt of " << j.prompt.size() << " tokens";
    }
  }

  static inline std::filesystem::path* dir_ = nullptr;
  Instant now_ = Instant::FromNanos(1'000'000'000);
  std::map<std::string, std::unique_ptr<ReferenceDecoder>> refs_;
};

TEST_F(LlamaPdTest, ShapeHoldsAnyPromptsFramedKv) {
  Side p;
  Open(&p, engine::Role::kProducer, Path(1));
  const ModelInfo& info = p.model->info();
  EXPECT_GT(info.kv_bytes_per_token, 0u);
  const engine::ModelShape shape = ShapeFor(info, kBlockTokens, 4096);
  const uint64_t block = shape.BlockBytesPerRank(1);
  for (uint32_t n = 1; n <= 200; ++n) {
    const uint64_t state = info.kv_fixed_bytes + n * info.kv_bytes_per_token;
    EXPECT_LE(BlocksFor(state, block), (n + kBlockTokens - 1) / kBlockTokens) << n << " tokens";
  }
}

// Greedy and seeded sampling, prompts of 1 to 100 tokens (a block's edge
// on both sides): D's every token is llama.cpp's alone, its first one P's.
TEST_F(LlamaPdTest, DOutputsEqualLlamaCppAlone) {
  Side p, d;
  Open(&p, engine::Role::kProducer, Path(1));
  Open(&d, engine::Role::kConsumer, Path(1));
  const std::vector<Job> jobs = Jobs(1, 16);
  HandOff(&p, &d, jobs, [](Side&, const LoadOp&) {});
  ExpectReference(d, Path(1), jobs);
  EXPECT_EQ(d.engine->stats().imports_failed, 0u);
  EXPECT_EQ(d.engine->stats().loads_recomputed, 0u);
  EXPECT_EQ(d.engine->Snapshot().producer_tokens, jobs.size());
  // Every copy counted, with its tokens and a time (the bench reads them).
  uint64_t tokens = 0;
  for (const Job& j : jobs) tokens += j.prompt.size();
  const engine::KvCopyCosts out = p.engine->Snapshot().kv_copy;
  const engine::KvCopyCosts in = d.engine->Snapshot().kv_copy;
  EXPECT_EQ(out.exports, jobs.size());
  EXPECT_EQ(out.exported_tokens, tokens);
  EXPECT_GT(out.export_ns, 0u);
  EXPECT_EQ(out.imports, 0u);
  EXPECT_EQ(in.imports, jobs.size());
  EXPECT_EQ(in.imported_tokens, tokens);
  EXPECT_GT(in.import_ns, 0u);
  EXPECT_EQ(in.exports, 0u);
}

// Without P's token (producer_first_token off) D recomputes the prompt's
// last position itself: still llama.cpp's tokens.
TEST_F(LlamaPdTest, DWithoutPsTokenRecomputesTheLastPosition) {
  Side p, d;
  Open(&p, engine::Role::kProducer, Path(1));
  Open(&d, engine::Role::kConsumer, Path(1), /*producer_first_token=*/false);
  const std::vector<Job> jobs = Jobs(2, 6);
  HandOff(&p, &d, jobs, [](Side&, const LoadOp&) {});
  ExpectReference(d, Path(1), jobs);
  EXPECT_EQ(d.engine->Snapshot().producer_tokens, 0u);
}

// One flipped byte in one landed block: the frame's checksum refuses it,
// the request recomputes on D, and its output is still right.
TEST_F(LlamaPdTest, ACorruptedBlockIsRefusedAndRecomputed) {
  Side p, d;
  Open(&p, engine::Role::kProducer, Path(1));
  Open(&d, engine::Role::kConsumer, Path(1));
  const std::vector<Job> jobs = Jobs(3, 4);
  HandOff(&p, &d, jobs, [](Side& side, const LoadOp& l) {
    if (l.transfer.lo != 2) return;
    std::vector<std::span<uint8_t>> pieces;
    side.memory->BlockBytes(l.dst.back(), &pieces);
    pieces[0][kKvFrameHeaderBytes + 5] ^= 0x40;
  });
  ExpectReference(d, Path(1), jobs);
  EXPECT_EQ(d.engine->stats().imports_failed, 1u);
  EXPECT_EQ(d.engine->stats().loads_recomputed, 1u);
  EXPECT_EQ(d.engine->Snapshot().kv_copy.imports, jobs.size() - 1) << "a refused copy is not one";
}

// Under the fail policy the refused load fails the request, cleanly.
TEST_F(LlamaPdTest, UnderTheFailPolicyARefusedLoadFailsItsRequest) {
  Side p, d;
  Open(&p, engine::Role::kProducer, Path(1));
  Open(&d, engine::Role::kConsumer, Path(1), true, engine::LoadFailurePolicy::kFail);
  std::vector<Job> jobs = Jobs(4, 3);
  HandOff(&p, &d, jobs, [](Side& side, const LoadOp& l) {
    if (l.transfer.lo != 1) return;
    std::vector<std::span<uint8_t>> pieces;
    side.memory->BlockBytes(l.dst[0], &pieces);
    std::memset(pieces[0].data(), 0, 8);  // the frame's magic
  });
  EXPECT_EQ(d.done.at(1), engine::FinishReason::kError);
  EXPECT_TRUE(d.tokens[1].empty());
  jobs.erase(jobs.begin());
  ExpectReference(d, Path(1), jobs);
  EXPECT_EQ(d.engine->stats().loads_failed, 1u);
}

// KV from another weights file: the engines' fingerprints differ (the
// runtime refuses the pull before a byte moves); past that, the frame's
// model hash refuses the import, and D computes with its own model.
TEST_F(LlamaPdTest, KvFromAnotherModelsFileIsRefused) {
  Side p, d;
  Open(&p, engine::Role::kProducer, Path(2));
  Open(&d, engine::Role::kConsumer, Path(1));
  EXPECT_NE(p.model->Identity(), d.model->Identity());
  const std::vector<Job> jobs = Jobs(5, 3);
  // Carry P's blocks whatever the fingerprint says (the test's transport
  // does not compare them), as a buggy or hostile one might.
  HandOff(&p, &d, jobs, [](Side&, const LoadOp&) {}, /*same_model=*/false);
  ExpectReference(d, Path(1), jobs);
  EXPECT_EQ(d.engine->stats().imports_failed, jobs.size());
}

}  // namespace
}  // namespace kvrelay::llama
