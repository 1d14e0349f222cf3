// rank_connector.h — RankConnector: the connector of one engine rank.
//
// Why: the send table (P) and load table (D) decide the transfer
// lifecycle; this class is the seam between them and the outside: it
// applies the scheduler's per-step metadata, turns peer messages into table
// inputs, resolves producer ranks to peers, and turns table actions into
// messages, writes and per-step reports. It mirrors the worker half of
// vLLM's KVConnectorBase_V1 (start_load_kv / get_finished /
// get_block_ids_with_load_errors).
//
// Reports: every transfer whose Ready (or, streamed, first Progress) this
// rank received is reported in finished_sending exactly once (at once if
// the send had already ended, else when its SendFinished comes); every LoadOp ends in exactly one
// finished_recving entry unless released; every ReleaseLoadOp ends in
// exactly one `released` entry.
//
// Ownership and threading: one per rank, owned by that rank's connector
// actor and called from its thread only. Pure.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>

#include "core/transfer_timings.h"
#include "core/connector_metadata.h"
#include "core/lease_table.h"
#include "core/load_table.h"
#include "core/messages.h"
#include "core/read_load_table.h"
#include "core/send_table.h"

namespace kvrelay {

enum class ConnectorRole : uint8_t { kProducer, kConsumer, kBoth };

// Push (Mooncake-like, the default): P writes into D's blocks (SendTable,
// LoadTable). Read (NIXL-like): D reads P's blocks under a lease
// (LeaseTable, ReadLoadTable). Every engine of a cluster uses one mode.
enum class KvMode : uint8_t { kPush, kRead };
const char* KvModeName(KvMode mode);
bool ParseKvMode(const std::string& name, KvMode* out);

struct RankConnectorOptions {
  ConnectorRole role = ConnectorRole::kBoth;
  uint32_t rank = 0;
  uint32_t tp = 1;
  KvMode mode = KvMode::kPush;
  SendTableOptions send;
  LoadTableOptions load;
  LeaseTableOptions lease;       // read mode, P
  ReadLoadTableOptions read;     // read mode, D

  // Sets every table's times from `t` (the one place they are derived).
  void ApplyTimings(const TransferTimings& t);
};

using RankAction = std::variant<OutMessage, StartWrite, StartRead>;

struct RankConnectorStats {
  uint64_t unknown_producer = 0;    // LoadOp named a rank with no peer
  uint64_t ready_refused = 0;       // send had ended before the prefill did
  uint64_t progress_refused = 0;    // ... before a chunk was handed over
  uint64_t claim_refused = 0;
  uint64_t messages_wrong_role = 0;
  uint64_t stale_incarnation = 0;
  uint64_t messages_wrong_mode = 0;  // a push message in read mode, or back
};

class RankConnector {
 public:
  explicit RankConnector(const RankConnectorOptions& options);

  // The peer of rank `rank` of engine `engine` is `peer` (set on handshake).
  // A newer incarnation replacing an older one proves the older process
  // gone: its unanswered pulls fail at once (PeerGone).
  void SetPeer(uint32_t engine, uint32_t rank, PeerId peer, Instant now);
  // `peer` (that incarnation) is gone: its unanswered pulls fail now (see
  // LoadTable::PeerGone), and so does every load started later that needs
  // it — a request admitted just before the death was known — until a
  // handshake shows it alive (Reconnected) or a new incarnation (SetPeer).
  // !fail_pulls: only the latter (new loads fail); the pulls in flight wait
  // for their answer or give-up time (a silent peer on a transport that
  // cannot refuse its late writes).
  void PeerGone(PeerId peer, Instant now, bool fail_pulls = true);
  // The connection to `peer` was re-established; see LoadTable::ResendTo.
  void Reconnected(PeerId peer, Instant now);

  // A message from an incarnation older than one already seen from the
  // same peer index is from a dead process: it is dropped and counted.

  void ApplyMetadata(const ConnectorMetadata& meta, Instant now);
  void OnMessage(PeerId from, const PeerMessage& msg, Instant now);
  void OnWriteDone(WriteId write, bool ok, Instant now);
  void OnReadDone(ReadId read, bool ok, Instant now);
  void OnTimer(Instant now);
  std::optional<Instant> NextDeadline() const;

  std::optional<RankAction> PollAction();
  // get_finished(): what ended since the last call.
  RankReport GetFinished();
  bool HasReport() const { return !report_.empty(); }

  // The tables of this rank's mode (the others are null).
  const SendTable* send_table() const { return send_.get(); }
  const LoadTable* load_table() const { return load_.get(); }
  const LeaseTable* lease_table() const { return lease_.get(); }
  const ReadLoadTable* read_table() const { return read_.get(); }
  KvMode mode() const { return options_.mode; }
  const RankConnectorStats& stats() const { return stats_; }
  uint32_t rank() const { return options_.rank; }
  void CheckInvariants() const;

 private:
  bool producer() const { return options_.role != ConnectorRole::kConsumer; }
  bool consumer() const { return options_.role != ConnectorRole::kProducer; }
  std::vector<PeerId> ProducersFor(uint32_t engine, uint32_t p_tp,
                                   bool* all_known) const;
  void Pump();  // moves table actions into actions_ / report_
  void PumpLease();
  void PumpRead();
  // Metadata for the producer table (SendTable or LeaseTable) and the
  // consumer table (LoadTable or ReadLoadTable): the same calls either way.
  template <typename Table>
  void ApplyProducer(Table& table, const ConnectorMetadata& meta, Instant now);
  template <typename Table>
  void ApplyConsumer(Table& table, const ConnectorMetadata& meta, Instant now);

  const RankConnectorOptions options_;
  std::unique_ptr<SendTable> send_;
  std::unique_ptr<LoadTable> load_;
  std::unique_ptr<LeaseTable> lease_;
  std::unique_ptr<ReadLoadTable> read_;
  // Returns false (and counts) if `from` is older than its peer index's
  // newest incarnation seen; records newer ones.
  bool AcceptIncarnation(PeerId from);
  // Fails `peer`'s unanswered pulls and reads (PeerGone without the mark).
  void FailPeer(PeerId peer, Instant now);

  std::map<std::pair<uint32_t, uint32_t>, PeerId> peers_;
  // Of the peers in peers_, those declared gone (index, generation): at
  // most one per entry of peers_.
  std::set<std::pair<uint32_t, uint32_t>> gone_;
  std::unordered_map<uint32_t, uint32_t> newest_incarnation_;
  std::deque<RankAction> actions_;
  RankReport report_;
  RankConnectorStats stats_;
};

}  // namespace kvrelay
