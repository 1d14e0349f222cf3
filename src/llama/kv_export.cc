// kv_export.cc — sequence state export/import over llama.cpp's
// llama_state_seq_* API, its parser, and the block frame.
#include "llama/kv_export.h"

#include <fcntl.h>
#include <llama.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/byte_codec.h"

namespace kvrelay::llama {
namespace {

// ---- XXH64 (Yann Collet's xxHash, 64-bit, seed 0), streaming ----------

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kP3 = 0x165667B19E3779F9ull;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ull;

inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}
inline uint32_t Load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap32(v);
  return v;
}
inline uint64_t Round(uint64_t acc, uint64_t in) {
  return std::rotl(acc + in * kP2, 31) * kP1;
}
inline uint64_t Merge(uint64_t acc, uint64_t v) {
  return (acc ^ Round(0, v)) * kP1 + kP4;
}

class Xxh64 {
 public:
  void Update(std::span<const uint8_t> in) {
    const uint8_t* p = in.data();
    size_t n = in.size();
    total_ += n;
    if (buffered_ > 0) {
      const size_t take = std::min(n, sizeof buf_ - buffered_);
      std::memcpy(buf_ + buffered_, p, take);
      buffered_ += take;
      p += take;
      n -= take;
      if (buffered_ < sizeof buf_) return;
      Stripe(buf_);
      buffered_ = 0;
    }
    // The lanes in locals: stores through v_ could alias the input bytes,
    // which would keep them out of registers (measured 4.2 GB/s, not 5.5).
    uint64_t v0 = v_[0], v1 = v_[1], v2 = v_[2], v3 = v_[3];
    for (; n >= 32; p += 32, n -= 32) {
      v0 = Round(v0, Load64(p));
      v1 = Round(v1, Load64(p + 8));
      v2 = Round(v2, Load64(p + 16));
      v3 = Round(v3, Load64(p + 24));
    }
    v_[0] = v0;
    v_[1] = v1;
    v_[2] = v2;
    v_[3] = v3;
    std::memcpy(buf_, p, n);
    buffered_ = n;
  }

  uint64_t Final() const {
    uint64_t h;
    if (total_ >= 32) {
      h = std::rotl(v_[0], 1) + std::rotl(v_[1], 7) + std::rotl(v_[2], 12) + std::rotl(v_[3], 18);
      for (uint64_t v : v_) h = Merge(h, v);
    } else {
      h = kP5;
    }
    h += total_;
    const uint8_t* p = buf_;
    size_t n = buffered_;
    for (; n >= 8; p += 8, n -= 8) h = std::rotl(h ^ Round(0, Load64(p)), 27) * kP1 + kP4;
    if (n >= 4) {
      h = std::rotl(h ^ (uint64_t{Load32(p)} * kP1), 23) * kP2 + kP3;
      p += 4;
      n -= 4;
    }
    for (; n > 0; ++p, --n) h = std::rotl(h ^ (*p * kP5), 11) * kP1;
    h ^= h >> 33;
    h *= kP2;
    h ^= h >> 29;
    h *= kP3;
    h ^= h >> 32;
    return h;
  }

 private:
  void Stripe(const uint8_t* p) {
    for (int i = 0; i < 4; ++i) v_[i] = Round(v_[i], Load64(p + 8 * i));
  }

  uint64_t v_[4] = {kP1 + kP2, kP2, 0, 0ull - kP1};
  uint8_t buf_[32] = {};
  size_t buffered_ = 0;
  uint64_t total_ = 0;
};

uint64_t Hash64(std::span<const uint8_t> bytes) {
  Xxh64 h;
  h.Update(bytes);
  return h.Final();
}

Status DataLoss(std::string m) { return Status(StatusCode::kDataLoss, std::move(m)); }

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// ---- llama.cpp's sequence state (kv_export.h, "What the bytes are") ----

constexpr uint32_t kStateMagic = 0xaf143cd8;  // llama-context.cpp's io_magic
constexpr uint32_t kMaxStreams = 256;         // LLAMA_MAX_SEQ
constexpr uint32_t kMaxLayers = 4096;
constexpr uint64_t kMaxRowBytes = uint64_t{1} << 26;
constexpr size_t kCellExtBytes = 12;          // llama_kv_cell_ext: x, y, tok

// A bounds-checked little-endian reader that skips without copying
// (ByteReader's Take copies: the KV is most of a state's bytes).
class Cursor {
 public:
  explicit Cursor(std::span<const uint8_t> in) : in_(in) {}
  uint32_t U32() { return static_cast<uint32_t>(Get(4)); }
  uint64_t U64() { return Get(8); }
  // Skips `count` × `each` bytes; false (and bad) when they are not all there.
  bool Skip(uint64_t count, uint64_t each) {
    if (bad_ || (each != 0 && count > left() / each)) return Fail();
    pos_ += static_cast<size_t>(count * each);
    return true;
  }
  size_t left() const { return in_.size() - pos_; }
  bool ok() const { return !bad_; }
  bool bad() const { return bad_; }

 private:
  uint64_t Get(int bytes) {
    if (bad_ || left() < static_cast<size_t>(bytes)) return Fail();
    const uint64_t v = GetLe(in_.data() + pos_, bytes);
    pos_ += static_cast<size_t>(bytes);
    return v;
  }
  bool Fail() {
    bad_ = true;
    return false;
  }
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  bool bad_ = false;
};

// The cells' metadata of one stream; `ext` says whether each carries
// llama_kv_cell_ext (llama.cpp writes it for M-RoPE and PLE models only).
bool ReadCells(Cursor& r, uint32_t cells, bool ext, KvStateInfo* info) {
  for (uint32_t i = 0; i < cells; ++i) {
    const auto pos = static_cast<int32_t>(r.U32());
    const uint32_t n_seq = r.U32();
    if (ext && !r.Skip(1, kCellExtBytes)) return false;
    r.U32();  // the sender's seq id
    if (r.bad() || n_seq != 1 || pos < 0) return false;
    info->pos_min = i == 0 ? pos : std::min(info->pos_min, pos);
    info->pos_max = i == 0 ? pos : std::max(info->pos_max, pos);
  }
  return true;
}

// One layer's K or V rows, not transposed: i32 type, u64 row bytes, rows.
bool ReadRows(Cursor& r, uint32_t cells, int32_t* type, uint64_t* row_bytes) {
  *type = static_cast<int32_t>(r.U32());
  *row_bytes = r.U64();
  return r.ok() && *row_bytes > 0 && *row_bytes <= kMaxRowBytes && r.Skip(cells, *row_bytes);
}

// One layer's V transposed: i32 type, u32 element bytes, u32 width, data.
bool ReadTransposed(Cursor& r, uint32_t cells, int32_t* type, uint64_t* row_bytes) {
  *type = static_cast<int32_t>(r.U32());
  const uint64_t el = r.U32();
  const uint64_t width = r.U32();
  *row_bytes = el * width;
  return r.ok() && *row_bytes > 0 && *row_bytes <= kMaxRowBytes && r.Skip(cells, *row_bytes);
}

// The KV of one non-empty stream, after its cells' metadata.
bool ReadLayers(Cursor& r, uint32_t cells, KvStateInfo* info) {
  const uint32_t v_trans = r.U32();
  const uint32_t layers = r.U32();
  if (r.bad() || v_trans > 1 || layers == 0 || layers > kMaxLayers) return false;
  info->v_trans = v_trans == 1;
  info->layers = layers;
  uint64_t per_token = 0;
  for (int v = 0; v < 2; ++v) {
    for (uint32_t l = 0; l < layers; ++l) {
      int32_t type = -1;
      uint64_t row = 0;
      const bool ok = (v == 1 && info->v_trans) ? ReadTransposed(r, cells, &type, &row)
                                                : ReadRows(r, cells, &type, &row);
      if (!ok) return false;
      if (l == 0) (v == 0 ? info->k_type : info->v_type) = type;
      per_token += row;
    }
  }
  info->bytes_per_token += per_token;
  return true;
}

// One stream of `cells` cells, trying the layout without and with cell ext.
bool ReadStream(Cursor& r, uint32_t cells, KvStateInfo* info) {
  for (const bool ext : {false, true}) {
    Cursor attempt = r;
    KvStateInfo tried = *info;
    tried.n_tokens = cells;
    tried.cell_ext = ext;
    tried.bytes_per_token = 12 + (ext ? kCellExtBytes : 0);
    if (ReadCells(attempt, cells, ext, &tried) && ReadLayers(attempt, cells, &tried)) {
      *info = tried;
      r = attempt;
      return true;
    }
  }
  return false;
}

// ---- contexts ----------------------------------------------------------

uint32_t StreamsOf(const llama_context* ctx) {
  return llama_n_ctx_seq(ctx) == llama_n_ctx(ctx) ? 1 : llama_n_seq_max(ctx);
}

Status CheckSeq(const llama_context* ctx, int32_t seq_id, const char* what) {
  const uint32_t n = llama_n_seq_max(ctx);
  if (seq_id < 0 || static_cast<uint32_t>(seq_id) >= n) {
    return InvalidArgumentError(std::string(what) + " " + std::to_string(seq_id) +
                                " is not a sequence of this context (0.." +
                                std::to_string(n - 1) + ")");
  }
  return Status::Ok();
}

llama_pos LastPos(llama_context* ctx, int32_t seq_id) {
  return llama_memory_seq_pos_max(llama_get_memory(ctx), seq_id);
}

// Checks for ExportRange / AppendSequence: a unified cache, two distinct
// valid sequences, an empty scratch one.
Status CheckScratch(llama_context* ctx, int32_t seq_id, int32_t scratch_seq) {
  if (Status s = CheckSeq(ctx, seq_id, "sequence"); !s.ok()) return s;
  if (Status s = CheckSeq(ctx, scratch_seq, "scratch sequence"); !s.ok()) return s;
  if (seq_id == scratch_seq) {
    return InvalidArgumentError("the scratch sequence must differ from sequence " +
                                std::to_string(seq_id));
  }
  if (StreamsOf(ctx) != 1) {
    return FailedPreconditionError(
        "token ranges need a unified KV cache (kv_unified): across streams llama.cpp copies "
        "whole sequences only");
  }
  if (LastPos(ctx, scratch_seq) >= 0) {
    return FailedPreconditionError("scratch sequence " + std::to_string(scratch_seq) +
                                   " is in use");
  }
  return Status::Ok();
}

// Whether `info` can go into `ctx` at all, before llama.cpp reads it.
Status CheckFits(const llama_context* ctx, const KvStateInfo& info) {
  const uint32_t layers = static_cast<uint32_t>(llama_model_n_layer(llama_get_model(ctx)));
  if (info.layers != layers) {
    return FailedPreconditionError("the state has " + std::to_string(info.layers) +
                                   " layers; this context's model has " + std::to_string(layers));
  }
  if (info.n_stream != StreamsOf(ctx)) {
    return FailedPreconditionError(
        "the state comes from a KV cache of " + std::to_string(info.n_stream) +
        " streams; this context has " + std::to_string(StreamsOf(ctx)) +
        " (kv_unified and n_seq_max must agree)");
  }
  if (info.n_tokens > llama_n_ctx_seq(ctx)) {
    return ResourceExhaustedError("the state holds " + std::to_string(info.n_tokens) +
                                  " tokens; a sequence of this context holds at most " +
                                  std::to_string(llama_n_ctx_seq(ctx)));
  }
  return Status::Ok();
}

std::string TypeName(int32_t type) {
  if (type < 0 || type >= GGML_TYPE_COUNT) return "type " + std::to_string(type);
  return ggml_type_name(static_cast<ggml_type>(type));
}

// ---- the frame ---------------------------------------------------------

constexpr uint32_t kFrameMagic = 0x5153564B;  // "KVSQ"
constexpr size_t kVersionBytes = 32;

struct FrameHeader {
  uint32_t block_bytes = 0;
  uint32_t blocks = 0;
  uint64_t state_bytes = 0;
  uint64_t state_hash = 0;
  uint32_t n_tokens = 0;
  int32_t pos_min = -1, pos_max = -1;
  KvIdentity id;
};

std::vector<uint8_t> EncodeHeader(const FrameHeader& h) {
  std::vector<uint8_t> out;
  out.reserve(kKvFrameHeaderBytes);
  ByteWriter w(&out);
  w.U32(kFrameMagic);
  w.U16(static_cast<uint16_t>(kKvFrameVersion));
  w.U16(static_cast<uint16_t>(kKvFrameHeaderBytes));
  w.U32(h.block_bytes);
  w.U32(h.blocks);
  w.U64(h.state_bytes);
  w.U64(h.state_hash);
  w.U32(h.n_tokens);
  w.U32(static_cast<uint32_t>(h.pos_min));
  w.U32(static_cast<uint32_t>(h.pos_max));
  w.U64(h.id.model_hash);
  w.U32(h.id.state_version);
  uint8_t version[kVersionBytes] = {};
  std::memcpy(version, h.id.llama_version.data(),
              std::min(kVersionBytes, h.id.llama_version.size()));
  w.Bytes(version);
  w.U64(Hash64(out));
  KV_CHECK_EQ(out.size(), kKvFrameHeaderBytes);
  return out;
}

Result<FrameHeader> DecodeHeader(std::span<const uint8_t> in) {
  ByteReader r(in.first(kKvFrameHeaderBytes));
  if (r.U32() != kFrameMagic) {
    return InvalidArgumentError("not a kvrelay KV frame (bad magic in block 0)");
  }
  const uint16_t version = r.U16();
  const uint16_t header_bytes = r.U16();
  if (version != kKvFrameVersion || header_bytes != kKvFrameHeaderBytes) {
    return FailedPreconditionError("KV frame version " + std::to_string(version) +
                                   "; this kvrelay reads version " +
                                   std::to_string(kKvFrameVersion));
  }
  FrameHeader h;
  h.block_bytes = r.U32();
  h.blocks = r.U32();
  h.state_bytes = r.U64();
  h.state_hash = r.U64();
  h.n_tokens = r.U32();
  h.pos_min = static_cast<int32_t>(r.U32());
  h.pos_max = static_cast<int32_t>(r.U32());
  h.id.model_hash = r.U64();
  h.id.state_version = r.U32();
  std::string version_text = r.GetString(kVersionBytes);
  h.id.llama_version = version_text.substr(0, version_text.find('\0'));
  const size_t hashed = r.pos();
  const uint64_t header_hash = r.U64();
  KV_CHECK(r.ok() && r.AtEnd());
  if (Hash64(in.first(hashed)) != header_hash) {
    return DataLoss("the KV frame's header is corrupted (checksum mismatch)");
  }
  return h;
}

Status CheckIdentity(const KvIdentity& sender, const KvIdentity& mine) {
  if (sender.model_hash != mine.model_hash) {
    return FailedPreconditionError("the KV was computed by another model (fingerprint " +
                                   Hex(sender.model_hash) + "; this engine's is " +
                                   Hex(mine.model_hash) + ")");
  }
  if (sender.llama_version != mine.llama_version) {
    return FailedPreconditionError("the KV was computed by llama.cpp " + sender.llama_version +
                                   "; this engine runs " + mine.llama_version);
  }
  if (sender.state_version != mine.state_version) {
    return FailedPreconditionError("the KV is in llama.cpp state format " +
                                   std::to_string(sender.state_version) + "; this engine reads " +
                                   std::to_string(mine.state_version));
  }
  return Status::Ok();
}

}  // namespace

KvIdentity LocalIdentity(uint64_t model_hash) {
  KvIdentity id;
  id.model_hash = model_hash;
  id.llama_version = llama_version();
  if (id.llama_version.size() > kVersionBytes) id.llama_version.resize(kVersionBytes);
  id.state_version = LLAMA_STATE_SEQ_VERSION;
  return id;
}

Result<uint64_t> ModelFingerprint(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return NotFoundError("model file " + path + " does not exist");
    return UnavailableError("cannot open " + path + ": " + std::strerror(err));
  }
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<uint8_t> buf(size_t{4} << 20);
  Xxh64 h;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return UnavailableError("cannot read " + path + ": " + std::strerror(err));
    }
    if (n == 0) break;
    h.Update(std::span<const uint8_t>(buf.data(), static_cast<size_t>(n)));
  }
  ::close(fd);
  return h.Final();
}

Result<KvStateInfo> DescribeState(std::span<const uint8_t> state) {
  Cursor r(state);
  KvStateInfo info;
  if (r.U32() != kStateMagic) {
    return InvalidArgumentError("not a llama.cpp sequence state (bad magic)");
  }
  info.seq_id = static_cast<int32_t>(r.U32());
  info.n_stream = r.U32();
  if (r.bad() || info.n_stream == 0 || info.n_stream > kMaxStreams) {
    return InvalidArgumentError("malformed llama.cpp sequence state (stream count)");
  }
  for (uint32_t s = 0; s < info.n_stream; ++s) {
    const uint32_t cells = r.U32();
    if (r.bad()) return InvalidArgumentError("truncated llama.cpp sequence state");
    if (cells == 0) continue;
    if (info.n_tokens != 0) {
      return InvalidArgumentError("malformed llama.cpp sequence state (two streams hold cells)");
    }
    if (!ReadStream(r, cells, &info)) {
      return InvalidArgumentError(
          "malformed llama.cpp sequence state, or a layout kv_export does not know (" +
          std::to_string(cells) + " cells)");
    }
  }
  if (info.n_tokens == 0) return InvalidArgumentError("the sequence state holds no tokens");
  if (r.left() != 0) {
    return InvalidArgumentError("malformed llama.cpp sequence state (" +
                                std::to_string(r.left()) + " bytes after its end)");
  }
  info.fixed_bytes = state.size() - uint64_t{info.n_tokens} * info.bytes_per_token;
  return info;
}

Result<std::vector<uint8_t>> ExportSequence(llama_context* ctx, int32_t seq_id) {
  std::vector<uint8_t> out;
  if (Status s = ExportSequenceInto(ctx, seq_id, &out); !s.ok()) return s;
  return out;
}

Status ExportSequenceInto(llama_context* ctx, int32_t seq_id, std::vector<uint8_t>* out) {
  if (Status s = CheckSeq(ctx, seq_id, "sequence"); !s.ok()) return s;
  if (LastPos(ctx, seq_id) < 0) {
    return FailedPreconditionError("sequence " + std::to_string(seq_id) + " holds no tokens");
  }
  const size_t size = llama_state_seq_get_size(ctx, seq_id);
  if (size == 0) {
    return InternalError("llama.cpp could not size sequence " + std::to_string(seq_id));
  }
  out->resize(size);
  const size_t n = llama_state_seq_get_data(ctx, out->data(), out->size(), seq_id);
  if (n != size) {
    return InternalError("llama.cpp wrote " + std::to_string(n) + " of the " +
                         std::to_string(size) + " bytes of sequence " + std::to_string(seq_id));
  }
  return Status::Ok();
}

Status ImportSequence(llama_context* ctx, int32_t seq_id, std::span<const uint8_t> state) {
  if (Status s = CheckSeq(ctx, seq_id, "sequence"); !s.ok()) return s;
  Result<KvStateInfo> info = DescribeState(state);
  if (!info.ok()) return info.status();
  if (Status s = CheckFits(ctx, *info); !s.ok()) return s;
  const size_t n = llama_state_seq_set_data(ctx, state.data(), state.size(), seq_id);
  if (n == 0) {
    return FailedPreconditionError(
        "llama.cpp refused the state of " + std::to_string(info->n_tokens) +
        " tokens (its log says why): the sender's cache is K " + TypeName(info->k_type) +
        ", V " + TypeName(info->v_type) + ", V " +
        (info->v_trans ? "transposed (flash attention off)"
                       : "not transposed (flash attention on)") +
        " — this context must match — or this cache has fewer free cells");
  }
  if (n != state.size()) {
    llama_memory_seq_rm(llama_get_memory(ctx), seq_id, -1, -1);
    return InternalError("llama.cpp read " + std::to_string(n) + " of the state's " +
                         std::to_string(state.size()) + " bytes");
  }
  return Status::Ok();
}

Result<std::vector<uint8_t>> ExportRange(llama_context* ctx, int32_t seq_id, int32_t p0,
                                         int32_t p1, int32_t scratch_seq) {
  if (Status s = CheckScratch(ctx, seq_id, scratch_seq); !s.ok()) return s;
  if (p0 < 0 || p1 <= p0) {
    return InvalidArgumentError("bad position range [" + std::to_string(p0) + ", " +
                                std::to_string(p1) + ")");
  }
  llama_memory_t mem = llama_get_memory(ctx);
  llama_memory_seq_cp(mem, seq_id, scratch_seq, p0, p1);
  Result<std::vector<uint8_t>> out = ExportSequence(ctx, scratch_seq);
  llama_memory_seq_rm(mem, scratch_seq, -1, -1);
  if (!out.ok() && out.status().code() == StatusCode::kFailedPrecondition) {
    return FailedPreconditionError("sequence " + std::to_string(seq_id) +
                                   " holds no tokens in [" + std::to_string(p0) + ", " +
                                   std::to_string(p1) + ")");
  }
  return out;
}

Status AppendSequence(llama_context* ctx, int32_t seq_id, int32_t scratch_seq,
                      std::span<const uint8_t> state) {
  if (Status s = CheckScratch(ctx, seq_id, scratch_seq); !s.ok()) return s;
  Result<KvStateInfo> info = DescribeState(state);
  if (!info.ok()) return info.status();
  const llama_pos next = LastPos(ctx, seq_id) + 1;
  if (info->pos_min != next ||
      static_cast<int64_t>(info->pos_max) - info->pos_min + 1 != info->n_tokens) {
    return InvalidArgumentError("the state holds positions " + std::to_string(info->pos_min) +
                                ".." + std::to_string(info->pos_max) + " in " +
                                std::to_string(info->n_tokens) + " cells; sequence " +
                                std::to_string(seq_id) + " continues at " + std::to_string(next));
  }
  if (Status s = ImportSequence(ctx, scratch_seq, state); !s.ok()) return s;
  llama_memory_t mem = llama_get_memory(ctx);
  llama_memory_seq_cp(mem, scratch_seq, seq_id, -1, -1);
  llama_memory_seq_rm(mem, scratch_seq, -1, -1);
  return Status::Ok();
}

size_t BlocksFor(size_t state_bytes, size_t block_bytes) {
  KV_CHECK_GT(block_bytes, 0u);
  return (kKvFrameHeaderBytes + state_bytes + block_bytes - 1) / block_bytes;
}

Result<std::vector<std::vector<uint8_t>>> CutIntoBlocks(const KvIdentity& id,
                                                        std::span<const uint8_t> state,
                                                        size_t block_bytes) {
  std::vector<std::vector<uint8_t>> out;
  Result<size_t> n = FrameInto(id, state, block_bytes,
                               [&](size_t b, size_t offset, std::span<const uint8_t> bytes) {
                                 if (b == out.size()) out.emplace_back(block_bytes);
                                 std::memcpy(out[b].data() + offset, bytes.data(), bytes.size());
                               });
  if (!n.ok()) return n.status();
  KV_CHECK_EQ(*n, out.size());
  return out;
}

Result<size_t> FrameInto(const KvIdentity& id, std::span<const uint8_t> state,
                         size_t block_bytes, const FrameWriter& write) {
  if (block_bytes < kKvFrameHeaderBytes || block_bytes > UINT32_MAX) {
    return InvalidArgumentError("blocks of " + std::to_string(block_bytes) +
                                " bytes: a KV frame needs " +
                                std::to_string(kKvFrameHeaderBytes) + "..4 GiB");
  }
  Result<KvStateInfo> info = DescribeState(state);
  if (!info.ok()) return info.status();
  const size_t blocks = BlocksFor(state.size(), block_bytes);
  if (blocks > UINT32_MAX) return InvalidArgumentError("too many blocks");
  FrameHeader h;
  h.block_bytes = static_cast<uint32_t>(block_bytes);
  h.blocks = static_cast<uint32_t>(blocks);
  h.state_bytes = state.size();
  h.state_hash = Hash64(state);
  h.n_tokens = info->n_tokens;
  h.pos_min = info->pos_min;
  h.pos_max = info->pos_max;
  h.id = id;
  const std::vector<uint8_t> header = EncodeHeader(h);
  write(0, 0, header);
  size_t at = 0;  // bytes of `state` placed
  for (size_t b = 0; b < blocks; ++b) {
    const size_t offset = b == 0 ? header.size() : 0;
    const size_t n = std::min(block_bytes - offset, state.size() - at);
    if (n > 0) write(b, offset, state.subspan(at, n));
    at += n;
    if (offset + n < block_bytes) {   // the last block's padding
      static const std::vector<uint8_t> zeros(4096, 0);
      for (size_t pad = offset + n; pad < block_bytes;) {
        const size_t k = std::min(zeros.size(), block_bytes - pad);
        write(b, pad, std::span<const uint8_t>(zeros.data(), k));
        pad += k;
      }
    }
  }
  KV_CHECK_EQ(at, state.size());
  return blocks;
}

Result<uint32_t> FramedBlockCount(std::span<const uint8_t> first_block) {
  if (first_block.size() < kKvFrameHeaderBytes) {
    return DataLoss("KV block 0 has " + std::to_string(first_block.size()) +
                    " bytes: shorter than a frame header");
  }
  Result<FrameHeader> h = DecodeHeader(first_block);
  if (!h.ok()) return h.status();
  return h->blocks;
}

Result<KvReceived> JoinBlocks(std::span<const std::span<const uint8_t>> blocks,
                              const KvIdentity& expected) {
  KvReceived out;
  if (Status s = JoinBlocksInto(blocks, expected, &out); !s.ok()) return s;
  return out;
}

Status JoinBlocksInto(std::span<const std::span<const uint8_t>> blocks, const KvIdentity& expected,
                      KvReceived* received) {
  KvReceived& out = *received;
  if (blocks.empty()) return DataLoss("no KV blocks");
  if (blocks[0].size() < kKvFrameHeaderBytes) {
    return DataLoss("KV block 0 has " + std::to_string(blocks[0].size()) +
                    " bytes: shorter than a frame header");
  }
  Result<FrameHeader> h = DecodeHeader(blocks[0]);
  if (!h.ok()) return h.status();
  if (Status s = CheckIdentity(h->id, expected); !s.ok()) return s;
  if (blocks.size() != h->blocks) {
    return DataLoss("got " + std::to_string(blocks.size()) + " KV blocks of the " +
                    std::to_string(h->blocks) + " sent");
  }
  if (h->blocks != BlocksFor(h->state_bytes, h->block_bytes)) {
    return DataLoss("the KV frame's header is inconsistent (blocks for its size)");
  }
  out.sender = h->id;
  out.n_tokens = h->n_tokens;
  out.pos_min = h->pos_min;
  out.pos_max = h->pos_max;
  out.state.resize(h->state_bytes);
  size_t at = 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    if (blocks[b].size() != h->block_bytes) {
      return DataLoss("KV block " + std::to_string(b) + " has " +
                      std::to_string(blocks[b].size()) + " bytes; blocks are " +
                      std::to_string(h->block_bytes));
    }
    const size_t offset = b == 0 ? kKvFrameHeaderBytes : 0;
    const size_t n = std::min(blocks[b].size() - offset, out.state.size() - at);
    if (n > 0) std::memcpy(out.state.data() + at, blocks[b].data() + offset, n);
    at += n;
  }
  if (Hash64(out.state) != h->state_hash) {
    return DataLoss("the KV state is corrupted (checksum mismatch over " +
                    std::to_string(out.state.size()) + " bytes)");
  }
  return Status::Ok();
}

}  // namespace kvrelay::llama
