// The kernel-UDP worker of a whole job (udp_job.h): per server (one, or
// every server shard of a sharded job) a link with a push SendSide and a
// broadcast ReceiveSide (udp_server_link.h), all over one UDP socket,
// around a GradientSource.
#include <arpa/inet.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "dblp/base/poll_loop.h"
#include "dblp/base/rng.h"
#include "dblp/control/accepted_mail.h"
#include "dblp/control/control.h"
#include "dblp/control/control_sidecar.h"
#include "dblp/control/job_auth.h"
#include "dblp/control/shard_claim.h"
#include "dblp/emul/rx_loss.h"
#include "dblp/job/counters.h"
#include "dblp/job/diagnosis.h"
#include "dblp/job/rows.h"
#include "dblp/job/worker_job.h"
#include "dblp/obs/run_report.h"
#include "dblp/policy/resync.h"
#include "dblp/round/receive_side.h"
#include "dblp/round/round_control.h"
#include "dblp/round/send_order.h"
#include "dblp/round/send_side.h"
#include "dblp/transport/packet_frames.h"
#include "dblp/transport/udp_transport.h"
#include "dblp/wire/chunking.h"
#include "dblp/wire/wire.h"
#include "udp/udp_common.h"
#include "udp/udp_job.h"
#include "udp/udp_server_link.h"

namespace dblp {
namespace {

using udp::NowNs;
using udp::ServerLink;

class JobWorker {
 public:
  JobWorker(const UdpJobWorkerOptions& o, GradientSource& source)
      : o_(o), source_(source) {}
  UdpJobWorkerResult Run();

  // What the model asks of the control plane (AcceptedChannel): push
  // feedback's ACCEPTED (every link's, as one bitmap of global chunks),
  // and whether a server is gone. Datapath thread.
  bool TakeAccepted(uint32_t round, Bitmap* out);
  bool server_gone() const;
  // The first link that is gone, named (unsharded: as its control says).
  std::string failure() const;

  // The WorkerJob's transport (WorkerExchanger).
  std::string Exchange(uint64_t it, std::span<const uint32_t> order);
  WorkerExchange Exchanged(uint64_t it) const;
  const Bitmap& arrived() const { return arrived_; }

 private:
  UdpJobWorkerResult Fail(int code, const std::string& msg) {
    return udp::Failed(&res_, code, msg);
  }
  std::string CheckOptions();
  JoinMsg BaseJoin(std::string* error);
  std::string JoinServers();
  std::string JoinShards(const JoinMsg& base);
  void FinishLinks(const std::string& failure);

  // Datapath thread.
  std::string SetUpJob();
  std::string StartSource();
  std::string RunIterations();
  bool TakeEvents();
  // The server's text, and what this worker measured itself (the server
  // cannot see our injector).
  std::string GoneWhy() const {
    return failure() + MeasuredCauses(0, loss_->dropped(), loss_->considered());
  }
  bool Quit() const {
    return o_.quit != nullptr && o_.quit->load(std::memory_order_relaxed);
  }
  uint64_t Progress() const;
  std::string AwaitRoundBegin(uint32_t round);
  void Split(std::span<const uint32_t> order);
  bool ExchangeDone();
  bool Receive(bool* progress);
  std::string Stalled(uint64_t it) const;
  void Report();

  const UdpJobWorkerOptions& o_;
  GradientSource& source_;
  UdpJobWorkerResult res_;  // datapath only
  UdpSocketPort port_;      // datapath only
  // Every server in shard order (the directory first); link k is the
  // port's endpoint k.
  std::vector<std::unique_ptr<ServerLink>> links_;
  std::vector<uint32_t> firsts_;  // each link's first global chunk

  // Datapath only, from SetUpJob on.
  WelcomeMsg welcome_;  // the directory's (or the only server's)
  ChunkLayout layout_;  // the whole gradient's
  // The job (the same as dblp-worker's): the model (the gradient the push
  // sends, the mean the broadcast fills), the push order, the rows.
  std::optional<WorkerJob> job_;
  std::vector<const SendSide*> push_sides_;  // every link's, for the row
  std::unique_ptr<RxLossInjector> loss_;
  std::vector<Packet> pkts_;
  std::optional<RoundPacer> pacer_;
  // What the servers announced for this iteration's push.
  double push_p_ = 0;
  bool push_critical_ = false;
  Bitmap arrived_;  // this iteration's broadcast chunks, global
  uint64_t poll_gen_ = 0, drained_gen_ = 0;
  uint64_t bcast_done_ns_ = 0;
  uint64_t bitmaps_ = 0;  // BITMAPs that started a pass or ended a round
  uint64_t unpinned_ = 0;
  // The rows, streamed as the iterations end and kept for the summary.
  RowStream row_stream_;
  RunReport report_;
};

std::string JobWorker::CheckOptions() {
  if (std::string e = udp::CheckCommon(o_.mtu, o_.round_timeout_ms);
      !e.empty()) {
    return e;
  }
  if (source_.floats() == 0) return "the gradient source has no floats";
  if (o_.burst == 0 || o_.burst > UdpSocketPort::kMaxBurst) {
    return "burst=" + std::to_string(o_.burst) + " must be in 1.." +
           std::to_string(UdpSocketPort::kMaxBurst);
  }
  std::string err;
  if (!udp::CheckCpu(o_.cpu, &err)) return "worker datapath: " + err;
  sockaddr_in server{};
  if (!ParseIpv4Endpoint(o_.server, false, false, "127.0.0.1:9100", &server,
                         &err)) {
    return "--server: " + err;
  }
  try {
    ParseLossSpec(o_.loss);
  } catch (const std::exception& e) {
    return std::string("loss: ") + e.what();
  }
  return "";
}

// The JOIN every server gets (a shard's with the claim added).
JoinMsg JobWorker::BaseJoin(std::string* error) {
  JoinMsg join;
  join.worker_name = o_.name;
  join.total_bytes = source_.floats() * sizeof(float);
  join.mtu = o_.mtu;
  try {
    join.layers = source_.Layers();
  } catch (const std::exception& e) {
    *error = std::string("the gradient source's layers: ") + e.what();
  }
  // Our data socket, which each server pins (0.0.0.0: the address it sees
  // our control connection come from).
  join.data_ipv4 = ntohl(port_.bound_addr().sin_addr.s_addr);
  join.data_udp_port = port_.bound_port();
  return join;
}

// The directory (or the only server), then, when its WELCOME lists server
// shards, every shard k > 0 with the claim the map gives (shard_claim.h),
// checking that its WELCOME confirms it.
std::string JobWorker::JoinServers() {
  std::string err;
  const JoinMsg base = BaseJoin(&err);
  if (!err.empty()) return err;
  links_.push_back(std::make_unique<ServerLink>(0, o_.server, o_.secret));
  ServerLink& dir = *links_[0];
  if (std::string e = dir.Join(base, o_.join_timeout_ms); !e.empty()) return e;
  if (std::string e = dir.AwaitWelcome(o_.join_timeout_ms, o_.quit);
      !e.empty()) {
    return e;
  }
  welcome_ = dir.welcome();
  if (!IsShardedWelcome(welcome_)) return "";
  return JoinShards(base);
}

std::string JobWorker::JoinShards(const JoinMsg& base) {
  if (std::string bad = CheckShardMap(welcome_); !bad.empty()) {
    return "the directory's shard map is inconsistent: " + bad +
           " (dblp-udp-server at " + o_.server +
           "): run every server shard and worker from the same DBLP build";
  }
  for (uint16_t k = 1; k < welcome_.shard_count; ++k) {
    const ShardEntry& entry = welcome_.shards[k];
    links_.push_back(
        std::make_unique<ServerLink>(k, ShardControlAddress(entry), o_.secret));
    ServerLink& link = *links_.back();
    const JoinMsg claim = ShardJoin(base, welcome_, k, entry);
    if (std::string e = link.Join(claim, o_.join_timeout_ms); !e.empty()) {
      return e;
    }
    if (std::string e = link.AwaitWelcome(o_.join_timeout_ms, o_.quit);
        !e.empty()) {
      return e;
    }
    if (std::string bad =
            CheckShardWelcome(welcome_, claim, entry, link.welcome());
        !bad.empty()) {
      return link.Name() +
             "'s WELCOME does not confirm the shard map's claim: " + bad +
             ": give every worker the directory's shard map (--server= the "
             "directory, shard 0)";
    }
  }
  return "";
}

// BYE when done, ERROR with the reason otherwise, to every server: none
// must mistake a finished worker for a lost one.
void JobWorker::FinishLinks(const std::string& failure) {
  for (const auto& l : links_) l->Finish(failure.empty(), failure);
  for (const auto& l : links_) l->Stop();
}

UdpJobWorkerResult JobWorker::Run() {
  if (std::string e = CheckOptions(); !e.empty()) return Fail(2, e);
  std::string err;
  // Before the JOIN: a directory that cannot take the rows fails the
  // worker now, not after the whole job.
  row_stream_.set_on_error(o_.rows_on_error);
  if (!o_.out_dir.empty() && !row_stream_.Open(o_.out_dir, &err)) {
    return Fail(2, err);
  }
  UdpPortOptions popts;
  popts.max_datagram = o_.mtu - udp::kIpUdpHeaders;
  if (!port_.Open(o_.data, popts, &err)) return Fail(1, "--data: " + err);
  // The sidecar threads start before the pinning, so they do not inherit
  // the datapath's CPU.
  std::string failure = JoinServers();
  if (!failure.empty()) {
    FinishLinks(failure);
    return Fail(1, failure);
  }
  if (!udp::PinThisThread(o_.cpu, &err)) {
    FinishLinks(err);
    return Fail(2, err);
  }
  failure = SetUpJob();
  if (failure.empty()) failure = RunIterations();
  if (!failure.empty()) {
    res_.exit_code = 1;
    res_.error = failure;
    try {
      source_.Fail(failure);
    } catch (const std::exception&) {
      // Telling the trainer is best effort: the job failed either way.
    }
  }
  FinishLinks(failure);
  Report();
  return res_;
}

// ---- datapath thread ------------------------------------------------------

// The source, the send order, and each link's sides over its partition.
std::string JobWorker::SetUpJob() {
  const WelcomeMsg& w = welcome_;
  res_.rank = w.rank;
  layout_ = ChunkLayout(links_.size() > 1 ? w.model_bytes : w.total_bytes,
                        w.chunk_payload);
  res_.chunks = layout_.num_chunks();
  if (std::string e = StartSource(); !e.empty()) return e;
  const auto* grad =
      reinterpret_cast<const uint8_t*>(job_->model().grad().data());
  uint32_t next = 0;
  for (const auto& l : links_) {
    const WelcomeMsg& lw = l->welcome();
    const uint32_t first = links_.size() > 1 ? lw.first_chunk : 0;
    const ChunkLayout part(lw.total_bytes, lw.chunk_payload);
    // The partitions, in order, tile the gradient (CheckShardMap and each
    // shard's WELCOME said so; the sides must never reach past it).
    if (first != next || next + part.num_chunks() > layout_.num_chunks()) {
      return l->Name() + " holds chunks from " + std::to_string(first) +
             ", but the partitions before it end at " + std::to_string(next);
    }
    next += part.num_chunks();
    l->Start(&port_, part, first, grad + layout_.Offset(first), o_.burst);
    firsts_.push_back(first);
    push_sides_.push_back(l->push.get());
  }
  if (next != layout_.num_chunks()) {
    return "the server shards' partitions hold " + std::to_string(next) +
           " chunks, the gradient " + std::to_string(layout_.num_chunks());
  }
  loss_ = std::make_unique<RxLossInjector>(ParseLossSpec(o_.loss), o_.bursts,
                                           HashMix(o_.seed, w.rank + 1));
  loss_->StartClock(NowNs());
  pkts_.resize(udp::kRxBurst);
  for (Packet& p : pkts_) p.bytes.reserve(o_.mtu - udp::kIpUdpHeaders);
  // Yields, not pauses, while spinning: the sidecar threads may share the
  // core.
  pacer_.emplace(512, o_.idle_sleep_us, o_.round_timeout_ms, o_.quit, nullptr,
                 o_.deep_idle, IdleBackoff::Spin::kYield);
  return "";
}

// Bind, OnJobStart, then the model around the source's buffers (its own
// when it shares them with a trainer in another process, else ours).
std::string JobWorker::StartSource() {
  const WelcomeMsg& w = welcome_;
  try {
    source_.Bind(w.rank, w.num_workers);
    source_.OnJobStart(w.resync_every);
  } catch (const std::exception& e) {
    return "the gradient source cannot start as rank " +
           std::to_string(w.rank) + " of " + std::to_string(w.num_workers) +
           ": " + e.what();
  }
  const WorkerJobSettings js{.bcast_fill = o_.bcast_fill,
                             .send_order = o_.send_order,
                             .seed = o_.seed,
                             .push_only = o_.push_only,
                             .timeout_ms = o_.round_timeout_ms,
                             .on_absorbed = o_.on_absorbed};
  if (std::string e = WorkerJob::Check(source_, w, js); !e.empty()) return e;
  job_.emplace(source_, w, layout_, js);
  job_->set_row_stream(&row_stream_);
  return "";
}

// Compute, exchange, absorb, until the iterations or the trainer end.
std::string JobWorker::RunIterations() {
  const uint64_t iterations = job_->iterations(o_.iterations);
  bool more = true;
  for (uint64_t it = 0; it < iterations; ++it) {
    if (std::string e = job_->Iterate(it, *this, *this, &more); !e.empty()) {
      return e;
    }
    if (!more) break;
    res_.rows.push_back(job_->last_row());
    if (o_.on_iteration) o_.on_iteration(job_->last_row());
  }
  return "";
}

bool JobWorker::TakeEvents() {
  const uint64_t now = NowNs();
  bool any = false;
  for (const auto& l : links_) any = l->TakeEvents(now) || any;
  return any;
}

bool JobWorker::server_gone() const {
  for (const auto& l : links_) {
    if (l->gone()) return true;
  }
  return false;
}

std::string JobWorker::failure() const {
  for (const auto& l : links_) {
    if (l->gone()) return l->gone_why();
  }
  return "";
}

bool JobWorker::TakeAccepted(uint32_t round, Bitmap* out) {
  if (links_.size() == 1) return links_[0]->TakeAccepted(round, out);
  bool all = true;
  for (const auto& l : links_) {
    if (l->have_accepted && l->accepted_round == round) continue;
    l->have_accepted = l->TakeAccepted(round, &l->accepted);
    l->accepted_round = round;
    all = all && l->have_accepted;
  }
  if (!all) return false;
  Bitmap whole(layout_.num_chunks());
  for (const auto& l : links_) {
    // A partition's ACCEPTED of another size would not fit: refused.
    if (l->accepted.size() != l->layout.num_chunks() ||
        !whole.PlaceAt(l->first_chunk, l->accepted)) {
      *out = Bitmap(0);
      return true;
    }
    l->have_accepted = false;
  }
  *out = std::move(whole);
  return true;
}

// Waits for every server to open `round` (its ROUND_BEGIN); the shards'
// phase gave them one p.
std::string JobWorker::AwaitRoundBegin(uint32_t round) {
  auto all_open = [&] {
    for (const auto& l : links_) {
      if (!l->go().have || l->go().round != round) return false;
    }
    return true;
  };
  const PollEnd end = PollUntil(
      *pacer_, NowNs,
      [&](uint64_t) {
        PollTurn t{TakeEvents()};
        if (all_open()) {
          t.then = PollTurn::Then::kDone;
        } else if (server_gone()) {
          t.then = PollTurn::Then::kFailed;
        }
        return t;
      },
      // Only the awaited ROUND_BEGIN (which ends the wait) moves it.
      [] { return uint64_t{0}; },
      // Patience 2: the server may be waiting for another worker.
      [](bool) { return 2u; }, NeverResume);
  switch (end) {
    case PollEnd::kDone:
      push_p_ = links_[0]->go().p;
      push_critical_ = links_[0]->go().critical;
      res_.p = push_p_;
      return "";
    case PollEnd::kFailed:
      return GoneWhy();
    case PollEnd::kQuit:
      return "interrupted";
    case PollEnd::kTimedOut:
      break;
  }
  for (const auto& l : links_) {
    if (l->go().have && l->go().round == round) continue;
    return (links_.size() > 1 ? l->Name() : std::string("the server")) +
           " never opened push round " + std::to_string(round) + " (waited " +
           std::to_string(pacer_->limit_ms()) + " ms)";
  }
  return "";
}

// Each link's `order`: the push order's chunks in its partition, as local
// seqs, in the same order.
void JobWorker::Split(std::span<const uint32_t> order) {
  if (links_.size() == 1) {  // unsharded: local seqs are global
    links_[0]->order.assign(order.begin(), order.end());
    return;
  }
  for (const auto& l : links_) l->order.clear();
  for (const uint32_t g : order) {
    const auto at = std::upper_bound(firsts_.begin(), firsts_.end(), g);
    ServerLink& l = *links_[static_cast<size_t>(at - firsts_.begin()) - 1];
    l.order.push_back(g - l.first_chunk);
  }
}

// The push of iteration `it` in `order` until every server's STOP, and
// (in a job) its broadcast until each of our receivers STOPped at the
// broadcast's p.
std::string JobWorker::Exchange(uint64_t it, std::span<const uint32_t> order) {
  if (!o_.push_only) {
    // Until its ROUND_BEGIN announces the broadcast's p, a receiver may
    // only STOP on a complete buffer (p = 0), which satisfies any p.
    for (const auto& l : links_) {
      l->bcast->Begin(BroadcastRound(it), 0.0, 0, 0, NowNs());
    }
  }
  const uint32_t round = PushRound(it);
  if (std::string e = AwaitRoundBegin(round); !e.empty()) return e;
  Split(order);
  for (const auto& l : links_) l->push->Begin(round, l->order, NowNs());
  bcast_done_ns_ = 0;
  std::string failure;
  const PollEnd end = PollUntil(
      *pacer_, NowNs,
      [&](uint64_t now) {
        PollTurn t{TakeEvents()};
        if (!o_.push_only) {
          bool accepted = false;
          t.work = Receive(&accepted) || t.work;
          const RxProgress rx{accepted, poll_gen_, drained_gen_};
          for (const auto& l : links_) {
            t.work = l->bcast->Step(now, rx, *l->outbox) || t.work;
          }
        }
        for (const auto& l : links_) {
          t.work = l->push->Step(now, *l->frames, *l->outbox) || t.work;
        }
        if (ExchangeDone()) {
          t.then = PollTurn::Then::kDone;
        } else if (server_gone()) {
          failure = GoneWhy();
          t.then = PollTurn::Then::kFailed;
        }
        return t;
      },
      // A PROBE retry, a resent pass or a duplicate is work but no
      // progress, so a silent server or a dead link still times the
      // round out.
      [&] { return Progress(); },
      // Our push done and nothing of the broadcast yet: the server may be
      // waiting for another worker (RoundPacer's patience).
      [&](bool moved) -> uint32_t {
        if (moved || o_.push_only) return 1;
        for (const auto& l : links_) {
          if (!l->push->done() || l->bcast->receiver().received() != 0) {
            return 1;
          }
        }
        return 2;
      },
      NeverResume);
  switch (end) {
    case PollEnd::kDone: {
      // Each BITMAP the round used started a pass after the first, or
      // showed nothing missing (ended the round without STOP).
      for (const auto& l : links_) {
        const SenderRound& s = l->push->sender();
        bitmaps_ += s.passes() - 1 + (s.stop_requested() ? 0 : 1);
      }
      return "";
    }
    case PollEnd::kQuit:
      return "interrupted";
    case PollEnd::kTimedOut:
      return Stalled(it);
    case PollEnd::kFailed:
      break;
  }
  return failure;
}

// Chunks that set a new bit, first-pass frames, BITMAPs showing more
// delivered, STOPs, ROUND_BEGINs (send_side.h, receive_side.h).
uint64_t JobWorker::Progress() const {
  uint64_t mark = 0;
  for (const auto& l : links_) {
    mark += l->push->progress() + l->bcast->progress() + l->announcements();
  }
  return mark;
}

// Every push is done and every broadcast receiver STOPped (closed here,
// its chunks snapshot: later frames count as late and are not copied).
bool JobWorker::ExchangeDone() {
  bool done = true;
  for (const auto& l : links_) {
    if (!o_.push_only && l->bcast->stopped() && l->bcast->receiver().open()) {
      bcast_done_ns_ = std::max(bcast_done_ns_, l->bcast->stop_ns());
      l->bcast->Close();
      l->bcast->receiver().SnapshotBitmap(l->arrived);
    }
    done = done && l->push->done() &&
           (o_.push_only || !l->bcast->receiver().open());
  }
  if (!done || o_.push_only) return done;
  if (links_.size() == 1) {
    std::swap(arrived_, links_[0]->arrived);  // no copy per iteration
    return true;
  }
  if (arrived_.size() != layout_.num_chunks()) {
    arrived_.Resize(layout_.num_chunks());
  }
  for (const auto& l : links_) arrived_.PlaceAt(l->first_chunk, l->arrived);
  return true;
}

// One RX poll: the servers' broadcast frames, copied into the mean.
bool JobWorker::Receive(bool* progress) {
  ++poll_gen_;
  const uint16_t n = port_.RxBurst(pkts_.data(), udp::kRxBurst);
  if (n < udp::kRxBurst) drained_gen_ = poll_gen_;
  auto* avg = reinterpret_cast<uint8_t*>(job_->model().avg().data());
  const uint64_t now = n > 0 ? NowNs() : 0;
  for (uint16_t i = 0; i < n; ++i) {
    const uint8_t* buf = pkts_[i].bytes.data();
    const size_t len = pkts_[i].bytes.size();
    if (pkts_[i].src >= links_.size()) {  // only the servers broadcast
      ++unpinned_;
      continue;
    }
    if (loss_->ShouldDrop(buf, len, now)) continue;
    ServerLink& l = *links_[pkts_[i].src];
    uint8_t* part = avg + layout_.Offset(l.first_chunk);
    auto copy = [&](const DataHeader& h, const uint8_t* payload) {
      std::memcpy(part + l.layout.Offset(h.seq), payload, h.payload_len);
    };
    if (l.bcast->OnFrame(buf, len, copy) == Verdict::kAccepted) {
      *progress = true;
    }
  }
  return n > 0;
}

// Names the first server whose push or broadcast is not done.
std::string JobWorker::Stalled(uint64_t it) const {
  const ServerLink* stuck = links_[0].get();
  for (const auto& l : links_) {
    if (!l->push->done() || (!o_.push_only && l->bcast->receiver().open())) {
      stuck = l.get();
      break;
    }
  }
  const SendSide& push = *stuck->push;
  const SenderRound& s = push.sender();
  const std::string server =
      links_.size() > 1 ? stuck->Name() : "server " + o_.server;
  std::string why = "iteration " + std::to_string(it) + ": the " +
                    (push.done() ? "broadcast" : "push") +
                    " stalled: no progress from " + server + " for " +
                    std::to_string(pacer_->limit_ms()) + " ms (push ";
  if (push.done()) {
    why += "done";
  } else {
    why +=
        std::to_string(s.passes()) + " passes, " +
        std::to_string(s.packets_sent()) + " packets sent, " +
        (s.state() == SenderRound::State::kAwaitingBitmap ? "BITMAP never came"
                                                          : "no STOP");
  }
  if (!o_.push_only) {
    why += "; broadcast " +
           std::to_string(stuck->bcast->receiver().received()) + "/" +
           std::to_string(stuck->layout.num_chunks()) + " chunks";
  }
  return why +
         "); check that the server runs and that frames pass both ways "
         "(--loss, the link), or raise --round_timeout_ms" +
         MeasuredCauses(0, loss_->dropped(), loss_->considered());
}

// The row's inputs (the push bench's delivered fraction is its push's).
WorkerExchange JobWorker::Exchanged(uint64_t it) const {
  const double n = layout_.num_chunks();
  uint64_t stop_received = 0;
  for (const auto& l : links_) stop_received += l->push->stop_received();
  return WorkerExchange{it,
                        res_.rank,
                        push_sides_,
                        o_.push_only ? 0 : bcast_done_ns_,
                        o_.push_only ? stop_received / n : arrived_.Count() / n,
                        push_p_,
                        push_critical_,
                        loss_->InBurst(it),
                        false};
}

void JobWorker::Report() {
  uint64_t probes = 0;
  std::vector<const ReceiverRound*> receivers;
  for (const auto& l : links_) {
    if (!l->push) continue;
    probes += l->push->probes_sent();
    receivers.push_back(&l->bcast->receiver());
  }
  res_.counters = {
      {"tx_frames", port_.tx_frames()},
      {"tx_eagain", port_.tx_eagain()},
      {"tx_errors", port_.tx_errors()},
      {"probes", probes},
      {"bitmaps", bitmaps_},
  };
  if (!o_.push_only) {
    // Prefixed: the push bench merges these with the server's counters.
    res_.counters["bcast_rx_frames"] = port_.rx_frames();
    res_.counters["bcast_injected_drops"] = loss_ ? loss_->dropped() : 0;
    res_.counters["bcast_unpinned_source"] = unpinned_;
    res_.counters["bcast_socket_drops"] = port_.socket_drops();
    if (!receivers.empty()) {
      NamedCounters c;
      AddReceiverCounters("bcast_", receivers, false, &c);
      res_.counters.insert(c.begin(), c.end());
    }
  }
  if (job_) report_.rows = std::move(job_->rows());
  report_.role = "worker";
  report_.rank = static_cast<int32_t>(res_.rank);
  report_.policy = welcome_.policy;
  report_.burst_iterations = o_.bursts.iterations;
  report_.info = {{"transport", "kernel-udp"},
                  {"source", source_.Describe()},
                  {"loss", o_.loss},
                  {"chunks", std::to_string(layout_.num_chunks())},
                  {"chunk_bytes", std::to_string(layout_.chunk_payload())}};
  if (links_.size() > 1) {
    report_.info.emplace_back("server_shards", std::to_string(links_.size()));
  }
  udp::FinishReport(row_stream_, std::move(report_), &res_);
}

}  // namespace

UdpJobWorkerResult RunUdpJobWorker(const UdpJobWorkerOptions& o,
                                   GradientSource& source) {
  return JobWorker(o, source).Run();
}

}  // namespace dblp
