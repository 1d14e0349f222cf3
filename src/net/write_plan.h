// write_plan.h — which bytes a P rank copies into a D rank's region for one
// hand-off: pure functions from (model shape, tp sizes, block lists) to
// Segments.
//
// Why: P and D may run different tp sizes. A P rank holds head groups
// [r·G/p_tp, (r+1)·G/p_tp) of every block and a D rank its own range (see
// engine/model.h); a P rank writes only the groups both ranks hold, into
// the same groups of D's blocks. Regions are laid out as ByteKvMemory lays
// them out ([layer][K|V][block][group] chunks), so the shared groups of one
// block of one plane are contiguous on both sides, and when both ranks hold
// exactly the same groups a run of consecutive blocks on both sides is one
// contiguous range per plane.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/block_id.h"
#include "engine/model.h"
#include "net/transport.h"

namespace kvrelay::net {

// Head groups [first, first + count) of rank `rank` of `tp` ranks.
struct GroupRange {
  uint32_t first = 0;
  uint32_t count = 0;
  uint32_t end() const { return first + count; }
};
// REQUIRES: tp divides engine::kHeadGroups, rank < tp.
GroupRange GroupsOfRank(uint32_t tp, uint32_t rank);

// The layout of ByteKvMemory's region for one rank of `tp` ranks (holding
// kHeadGroups/tp groups) with `num_blocks` blocks: planes = layers × 2,
// block_stride_bytes = groups × ByteKvMemory::ChunkBytes(shape).
// REQUIRES: tp divides kHeadGroups; shape.kv_heads % kHeadGroups == 0.
RegionLayout LayoutFor(const engine::ModelShape& shape, uint32_t tp, uint32_t num_blocks);

// Block ids that came from a peer, checked before planning (a bad id is the
// peer's error, answered as a failed job, never a crash): as many sources
// as destinations, at least one, each inside its pool.
bool BlocksFit(std::span<const BlockId> src, uint32_t src_pool, std::span<const BlockId> dst,
               uint32_t dst_pool);

// The segments that copy P rank `p_rank`'s blocks src[i] (of a region laid
// out by LayoutFor(shape, p_tp, p_num_blocks)) into D rank `d_rank`'s
// blocks dst[i] (LayoutFor(shape, d_tp, d_num_blocks)), for the head groups
// both ranks hold. Per plane (layer, K|V) in order: one segment per block
// pair covering the shared groups' chunks; when both ranks hold exactly the
// same groups, one segment per run of pairs whose src and dst indices both
// step by +1. Block generations are ignored (only indices address bytes).
// REQUIRES (bugs, KV_CHECKed): the ranks share at least one group;
// src.size() == dst.size(); every src index < p_num_blocks and dst index <
// d_num_blocks — the caller validates block ids that came from a peer.
std::vector<Segment> PlanWrite(const engine::ModelShape& shape, uint32_t p_tp, uint32_t p_rank,
                               uint32_t p_num_blocks, uint32_t d_tp, uint32_t d_rank,
                               uint32_t d_num_blocks, std::span<const BlockId> src,
                               std::span<const BlockId> dst);

}  // namespace kvrelay::net
