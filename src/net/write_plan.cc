#include "net/write_plan.h"

#include <algorithm>

#include "base/check.h"
#include "engine/byte_kv_memory.h"

namespace kvrelay::net {

GroupRange GroupsOfRank(uint32_t tp, uint32_t rank) {
  KV_CHECK_GT(tp, 0u);
  KV_CHECK_EQ(engine::kHeadGroups % tp, 0u);
  KV_CHECK_LT(rank, tp);
  const uint32_t per = engine::kHeadGroups / tp;
  return GroupRange{rank * per, per};
}

RegionLayout LayoutFor(const engine::ModelShape& shape, uint32_t tp, uint32_t num_blocks) {
  const GroupRange groups = GroupsOfRank(tp, 0);
  RegionLayout layout;
  layout.planes = uint64_t{shape.layers} * 2;
  layout.num_blocks = num_blocks;
  layout.block_stride_bytes = groups.count * engine::ByteKvMemory::ChunkBytes(shape);
  return layout;
}

bool BlocksFit(std::span<const BlockId> src, uint32_t src_pool, std::span<const BlockId> dst,
               uint32_t dst_pool) {
  if (src.size() != dst.size() || dst.empty()) return false;
  for (size_t i = 0; i < dst.size(); ++i) {
    if (src[i].index >= src_pool || dst[i].index >= dst_pool) return false;
  }
  return true;
}

std::vector<Segment> PlanWrite(const engine::ModelShape& shape, uint32_t p_tp, uint32_t p_rank,
                               uint32_t p_num_blocks, uint32_t d_tp, uint32_t d_rank,
                               uint32_t d_num_blocks, std::span<const BlockId> src,
                               std::span<const BlockId> dst) {
  KV_CHECK_EQ(src.size(), dst.size());
  const GroupRange p = GroupsOfRank(p_tp, p_rank);
  const GroupRange d = GroupsOfRank(d_tp, d_rank);
  const uint32_t shared_first = std::max(p.first, d.first);
  const uint32_t shared_end = std::min(p.end(), d.end());
  KV_CHECK_MSG(shared_first < shared_end, "PlanWrite between ranks that share no head group");
  for (size_t i = 0; i < src.size(); ++i) {
    KV_CHECK_LT(src[i].index, p_num_blocks);
    KV_CHECK_LT(dst[i].index, d_num_blocks);
  }

  const uint64_t chunk = engine::ByteKvMemory::ChunkBytes(shape);
  const uint64_t planes = uint64_t{shape.layers} * 2;
  const uint64_t p_stride = p.count * chunk;
  const uint64_t d_stride = d.count * chunk;
  // Offset of the first shared group's chunk within a block, on each side.
  const uint64_t p_in_block = (shared_first - p.first) * chunk;
  const uint64_t d_in_block = (shared_first - d.first) * chunk;
  const uint64_t shared_bytes = (shared_end - shared_first) * chunk;
  const bool whole_blocks = p.first == d.first && p.count == d.count;

  std::vector<Segment> out;
  if (src.empty()) return out;

  if (!whole_blocks) {
    out.reserve(planes * src.size());
    for (uint64_t plane = 0; plane < planes; ++plane) {
      const uint64_t p_plane = plane * p_num_blocks;
      const uint64_t d_plane = plane * d_num_blocks;
      for (size_t i = 0; i < src.size(); ++i) {
        out.push_back(Segment{(p_plane + src[i].index) * p_stride + p_in_block,
                              (d_plane + dst[i].index) * d_stride + d_in_block, shared_bytes});
      }
    }
    return out;
  }

  // Both ranks hold the same groups: strides are equal and a block's whole
  // stride moves. Coalesce runs of consecutive pairs.
  auto continues = [&](size_t i) {
    return src[i].index == src[i - 1].index + 1 && dst[i].index == dst[i - 1].index + 1;
  };
  size_t runs = 1;
  for (size_t i = 1; i < src.size(); ++i) runs += continues(i) ? 0 : 1;
  out.reserve(planes * runs);
  for (uint64_t plane = 0; plane < planes; ++plane) {
    const uint64_t p_plane = plane * p_num_blocks;
    const uint64_t d_plane = plane * d_num_blocks;
    size_t start = 0;
    for (size_t i = 1; i <= src.size(); ++i) {
      if (i < src.size() && continues(i)) continue;
      out.push_back(Segment{(p_plane + src[start].index) * p_stride,
                            (d_plane + dst[start].index) * d_stride, (i - start) * p_stride});
      start = i;
    }
  }
  return out;
}

}  // namespace kvrelay::net
