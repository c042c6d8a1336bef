#include "dblp/job/shard_links.h"

#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <variant>

#include "dblp/base/ipv4_endpoint.h"
#include "dblp/base/log.h"
#include "dblp/round/chunk_ranges.h"
#include "dblp/wire/chunking.h"

namespace dblp {
namespace {

// The wire refuses NaN (control.h): a NaN norm or block (a mean holding a
// NaN) travels as +inf, still non-finite for the policy and the rows.
double NoNaN(double x) { return std::isnan(x) ? INFINITY : x; }

// A listen address's IPv4 and port (0.0.0.0 for "*": the peer's address
// stands in for it).
void ListenAddress(const std::string& listen, uint32_t* ip, uint16_t* port) {
  sockaddr_in sa{};
  std::string err;
  if (ParseIpv4Endpoint(listen, true, false, "127.0.0.1:9100", &sa, &err)) {
    *ip = ntohl(sa.sin_addr.s_addr);
    *port = ntohs(sa.sin_port);
  }
}

uint32_t PeerIpv4(const std::string& peer) {
  sockaddr_in sa{};
  std::string err;
  if (!ParseIpv4Endpoint(peer, false, true, "", &sa, &err)) return 0;
  return ntohl(sa.sin_addr.s_addr);
}

}  // namespace

ShardLinks::ShardLinks(const ShardLinksConfig& cfg, ControlSidecar& sc,
                       std::function<void(const std::string&)> on_failure)
    : cfg_(cfg),
      sc_(sc),
      on_failure_(std::move(on_failure)),
      registry_(cfg.role.count, cfg.job_flags, cfg.mtu),
      bye_(cfg.role.count, false),
      handshake_(*cfg.secret) {}

std::string ShardLinks::ShardName(uint16_t k) const {
  if (k == 0)
    return "the directory (server shard 0 at " + cfg_.role.directory + ")";
  const std::string at =
      cfg_.role.index == 0 ? sc_.PeerAddress(registry_.conn(k)) : "";
  return ServerShardLabel(k) + (at.empty() ? "" : " at " + at);
}

std::string ShardLinks::ConnectDirectory(uint32_t timeout_ms) {
  std::string err;
  if (!sc_.Connect(cfg_.role.directory, timeout_ms, &directory_, &err)) {
    return "server shard " + std::to_string(cfg_.role.index) +
           " cannot reach the directory at " + cfg_.role.directory + ": " +
           err + ": start server shard 0 (" + cfg_.app +
           " --shard_index=0) and check --directory=IP:PORT";
  }
  JoinMsg j;
  j.worker_name = ServerShardLabel(cfg_.role.index);
  j.mtu = cfg_.mtu;
  j.shard_index = cfg_.role.index;
  j.shard_count = cfg_.role.count;
  handshake_.Start(&j);
  sc_.Send(directory_, j);
  return "";
}

bool ShardLinks::Owns(ConnId c) const {
  if (cfg_.role.index > 0) return c == directory_;
  return registry_.ShardOf(c) > 0;
}

void ShardLinks::OnRegistration(ConnId c, const JoinMsg& j) {
  if (std::string why = registry_.OnRegistration(c, j.shard_index);
      !why.empty()) {
    DBLP_LOG(Warning, "%s: refused %s: %s", cfg_.app.c_str(),
             sc_.PeerAddress(c).c_str(), why.c_str());
    sc_.Send(c, ErrorMsg{1, why});
    sc_.Close(c, why);
  }
}

ShardLinks::Event ShardLinks::OnMessage(ConnId c, const ControlMessage& m) {
  if (cfg_.role.index > 0) return OnDirectoryMessage(m);
  return OnShardMessage(static_cast<uint16_t>(registry_.ShardOf(c)), m);
}

// The directory's side of shard k's connection.
ShardLinks::Event ShardLinks::OnShardMessage(uint16_t k,
                                             const ControlMessage& m) {
  const ConnId c = registry_.conn(k);
  if (const auto* h = std::get_if<ShardHelloMsg>(&m)) {
    ShardHelloMsg hello = *h;
    if (hello.control_ipv4 == 0)
      hello.control_ipv4 = PeerIpv4(sc_.PeerAddress(c));
    if (std::string why = registry_.OnHello(c, hello); !why.empty()) {
      DBLP_LOG(Warning, "%s: refused %s: %s", cfg_.app.c_str(),
               ShardName(k).c_str(), why.c_str());
      sc_.Send(c, ErrorMsg{1, why});
      sc_.Close(c, why);
      return Event::kNone;
    }
    std::printf("%s: %s registered with the directory\n", cfg_.app.c_str(),
                ShardName(k).c_str());
    std::fflush(stdout);
    return registry_.complete() ? Event::kRegistered : Event::kNone;
  }
  if (const auto* p = std::get_if<PhasePartialMsg>(&m)) {
    std::lock_guard lock(mu_);
    if (!failure_.empty() || leader_ == nullptr) return Event::kNone;
    std::string why =
        leader_->Add(k, p->iteration, p->resync, p->squares, p->push_ns);
    if (!why.empty()) {
      FailLocked(why);
      return Event::kNone;
    }
    if (leader_->complete()) {
      decision_ = leader_->Decide();
      decided_ = p->iteration;
      send_decision_ = true;
      cv_.notify_all();
    }
  } else if (const auto* e = std::get_if<ErrorMsg>(&m)) {
    Fail(ShardName(k) + " failed: " + e->text);
  } else if (std::holds_alternative<ByeMsg>(m)) {
    bye_[k] = true;
  } else {
    Fail(ShardName(k) + " sent " + ControlTypeName(m) + " out of order");
  }
  SendDecisions();  // if this partial completed the phase
  return Event::kNone;
}

// Shard k > 0's side of its connection to the directory.
ShardLinks::Event ShardLinks::OnDirectoryMessage(const ControlMessage& m) {
  // Whatever answers at --directory must prove the job secret before it
  // can assign a partition, decide a p or say BYE.
  if (!directory_trusted_ && !std::holds_alternative<ChallengeMsg>(m) &&
      !std::holds_alternative<ErrorMsg>(m)) {
    Fail(ShardName(0) + " sent " + ControlTypeName(m) +
         " before proving the job secret (is --directory the job's shard "
         "0?)");
    return Event::kNone;
  }
  if (const auto* ch = std::get_if<ChallengeMsg>(&m)) {
    if (directory_trusted_) {
      Fail(ShardName(0) + " sent a second CHALLENGE");
      return Event::kNone;
    }
    if (std::string why = handshake_.AnswerChallenge(sc_, directory_, *ch);
        !why.empty()) {
      Fail(ShardName(0) + " is not trusted: " + why);
      return Event::kNone;
    }
    directory_trusted_ = true;
    ShardHelloMsg h;
    h.shard_index = cfg_.role.index;
    h.shard_count = cfg_.role.count;
    ListenAddress(cfg_.listen, &h.control_ipv4, &h.control_port);
    h.data_ipv4 = cfg_.local_ip;
    h.data_mac = cfg_.mac;
    h.udp_base_port = cfg_.udp_port;
    h.queues = cfg_.queues;
    h.mtu = cfg_.mtu;
    h.job_flags = cfg_.job_flags;
    sc_.Send(directory_, h);
    return Event::kNone;
  }
  if (const auto* a = std::get_if<ShardAssignMsg>(&m)) {
    if (assigned_ || a->shard_index != cfg_.role.index ||
        a->shard_count != cfg_.role.count || a->num_chunks == 0 ||
        a->chunk_payload == 0) {
      Fail(ShardName(0) + " sent a SHARD_ASSIGN that is not this shard's");
      return Event::kNone;
    }
    own_ = *a;
    assigned_ = true;
    std::printf(
        "%s: server shard %u of %u: chunks [%u, %llu) of %llu bytes, from "
        "%s\n",
        cfg_.app.c_str(), a->shard_index, a->shard_count, a->first_chunk,
        static_cast<unsigned long long>(uint64_t{a->first_chunk} +
                                        a->num_chunks),
        static_cast<unsigned long long>(a->model_bytes), ShardName(0).c_str());
    std::fflush(stdout);
    return Event::kAssigned;
  }
  if (const auto* d = std::get_if<PhaseDecisionMsg>(&m)) {
    if (!assigned_) {
      Fail(ShardName(0) + " sent PHASE_DECISION before SHARD_ASSIGN");
      return Event::kNone;
    }
    std::lock_guard lock(mu_);
    decision_.norm = d->norm;
    decision_.next =
        RoundTolerance{d->p, d->deadline_ns, d->min_fraction, d->critical};
    decided_ = d->iteration;
    cv_.notify_all();
    return Event::kNone;
  }
  if (const auto* e = std::get_if<ErrorMsg>(&m)) {
    Fail(ShardName(0) + (assigned_ ? " ended the job: " : " refused: ") +
         e->text);
  } else if (std::holds_alternative<ByeMsg>(m)) {
    bye_[0] = true;
  } else {
    Fail(ShardName(0) + " sent " + ControlTypeName(m) + " out of order");
  }
  return Event::kNone;
}

void ShardLinks::OnClose(ConnId c, const std::string& reason) {
  if (cfg_.role.index > 0) {
    if (!bye_[0]) Fail(ShardName(0) + " is gone: " + reason);
    return;
  }
  const int k = registry_.ShardOf(c);
  const std::string name = ShardName(static_cast<uint16_t>(k));
  if (registry_.OnClose(c) < 0) return;
  if (!ready() || leader_ == nullptr) {
    // Before the job: its place is free again (it may come back).
    DBLP_LOG(Warning, "%s: %s left before the job started (%s)",
             cfg_.app.c_str(), name.c_str(), reason.c_str());
    return;
  }
  if (!bye_[k]) Fail(name + " is gone: " + reason);
}

void ShardLinks::Flush() {
  if (cfg_.role.index == 0) {
    bool send;
    {
      std::lock_guard lock(mu_);
      send = send_decision_;
    }
    if (send) SendDecisions();
    return;
  }
  std::optional<PhasePartialMsg> p;
  {
    std::lock_guard lock(mu_);
    p.swap(partial_);
  }
  if (p) sc_.Send(directory_, *p);
}

void ShardLinks::SendDecisions() {
  PhaseDecisionMsg d;
  {
    std::lock_guard lock(mu_);
    if (!send_decision_) return;
    send_decision_ = false;
    d = PhaseDecisionMsg{decided_,
                         NoNaN(decision_.norm),
                         decision_.next.p,
                         decision_.next.deadline_ns,
                         decision_.next.min_fraction,
                         decision_.next.critical};
  }
  for (uint16_t k = 1; k < registry_.count(); ++k) {
    sc_.Send(registry_.conn(k), d);
  }
}

void ShardLinks::Finish(const std::string& error) {
  const ControlMessage m =
      error.empty()
          ? ControlMessage(ByeMsg{"done"})
          : ControlMessage(ErrorMsg{2, ServerShardLabel(cfg_.role.index) +
                                           " failed: " + error.substr(0, 900)});
  if (cfg_.role.index > 0) {
    sc_.Send(directory_, m);
    return;
  }
  for (uint16_t k = 1; k < registry_.count(); ++k) {
    if (registry_.ShardOf(registry_.conn(k)) == k)
      sc_.Send(registry_.conn(k), m);
  }
}

bool ShardLinks::ready() const {
  return cfg_.role.index > 0 ? assigned_ : registry_.complete();
}

std::string ShardLinks::Shortfall() const {
  if (cfg_.role.index > 0) {
    return assigned_ ? "" : "no partition from " + ShardName(0);
  }
  return registry_.Shortfall();
}

std::string ShardLinks::AssignPartitions(uint64_t model_bytes,
                                         uint32_t chunk_payload,
                                         const AuthBytes& job_nonce) {
  const uint16_t S = cfg_.role.count;
  const ChunkLayout whole(model_bytes, chunk_payload);
  const ChunkRanges map(whole.num_chunks(), S);
  if (map.begin(S - 1) >= whole.num_chunks()) {
    return "the gradient's " + std::to_string(whole.num_chunks()) +
           " chunks are too few for " + std::to_string(S) +
           " server shards (each owns a multiple of 64 chunks): lower "
           "--shards";
  }
  std::vector<uint32_t> blocks;
  entries_.clear();
  for (uint16_t k = 0; k < S; ++k) {
    ShardEntry e;
    if (k == 0) {
      ListenAddress(cfg_.listen, &e.control_ipv4, &e.control_port);
      e.data_ipv4 = cfg_.local_ip;
      e.data_mac = cfg_.mac;
      e.udp_base_port = cfg_.udp_port;
      e.queues = cfg_.queues;
    } else {
      const ShardHelloMsg& h = registry_.hello(k);
      e.control_ipv4 = h.control_ipv4;
      e.control_port = h.control_port;
      e.data_ipv4 = h.data_ipv4;
      e.data_mac = h.data_mac;
      e.udp_base_port = h.udp_base_port;
      e.queues = h.queues;
    }
    e.first_chunk = map.begin(k);
    e.num_chunks = map.end(k) - map.begin(k);
    entries_.push_back(e);
    blocks.push_back(PartitionNormBlocks(e.num_chunks));
    const ShardAssignMsg a{
        k,           S,        e.first_chunk, e.num_chunks, chunk_payload,
        model_bytes, job_nonce};
    if (k == 0) {
      own_ = a;
    } else {
      sc_.Send(registry_.conn(k), a);
    }
  }
  registry_.Close();
  std::lock_guard lock(mu_);
  leader_ = std::make_unique<PhaseLeader>(TolerancePolicy::Create(cfg_.policy),
                                          cfg_.resync_every, blocks);
  return "";
}

std::string ShardLinks::FillWelcome(WelcomeMsg* wm,
                                    const AuthBytes& job_nonce) {
  if (cfg_.role.index == 0 && wm->rank == 0) {
    if (std::string why =
            AssignPartitions(wm->total_bytes, wm->chunk_payload, job_nonce);
        !why.empty()) {
      Finish(why);
      return why;
    }
  }
  if (own_.chunk_payload != wm->chunk_payload) {
    return "this server shard's chunks hold " +
           std::to_string(wm->chunk_payload) + " bytes, the directory's " +
           std::to_string(own_.chunk_payload) +
           ": give every server shard the same --mtu and --frame_auth";
  }
  wm->shard_index = own_.shard_index;
  wm->shard_count = own_.shard_count;
  wm->first_chunk = own_.first_chunk;
  wm->model_bytes = own_.model_bytes;
  wm->total_bytes = PartitionBytes();
  wm->num_chunks = own_.num_chunks;
  if (own_.shard_index == 0) wm->shards = entries_;
  return "";
}

uint64_t ShardLinks::PartitionBytes() const {
  const uint64_t begin = uint64_t{own_.first_chunk} * own_.chunk_payload;
  const uint64_t end = std::min(
      own_.model_bytes,
      (uint64_t{own_.first_chunk} + own_.num_chunks) * own_.chunk_payload);
  return end - begin;
}

void ShardLinks::FailLocked(std::string why) {
  if (!failure_.empty()) return;
  failure_ = std::move(why);
  cv_.notify_all();
}

void ShardLinks::Fail(std::string why) {
  std::string first;
  {
    std::lock_guard lock(mu_);
    if (!failure_.empty()) return;
    failure_ = std::move(why);
    first = failure_;
    cv_.notify_all();
  }
  on_failure_(first);
}

PhaseDecision ShardLinks::Decide(uint64_t it, bool resync,
                                 std::span<const double> block_squares,
                                 uint64_t push_ns) {
  const bool leader = cfg_.role.index == 0;
  // A follower waits longer than the directory, whose timeout names the
  // shard that never reported.
  const uint32_t wait_ms = cfg_.round_timeout_ms * (leader ? 1 : 2);
  std::unique_lock lock(mu_);
  if (failure_.empty()) {
    if (leader) {
      if (std::string why = leader_->Add(0, it, resync, block_squares, push_ns);
          !why.empty()) {
        FailLocked(why);
      } else if (leader_->complete()) {
        decision_ = leader_->Decide();
        decided_ = it;
        send_decision_ = true;
      }
    } else {
      partial_ = PhasePartialMsg{
          it, resync, push_ns, {block_squares.begin(), block_squares.end()}};
      for (double& x : partial_->squares) x = NoNaN(x);
    }
  }
  lock.unlock();
  sc_.Wakeup();  // sends the partial or the decision
  lock.lock();
  const bool done = cv_.wait_for(lock, std::chrono::milliseconds(wait_ms), [&] {
    return !failure_.empty() || decided_ == it;
  });
  if (!done) {
    FailLocked(leader ? leader_->Missing(wait_ms)
                      : ShardName(0) + " sent no phase decision of iteration " +
                            std::to_string(it) + " within " +
                            std::to_string(wait_ms) + " ms");
  }
  if (failure_.empty()) return decision_;
  PhaseDecision failed;
  failed.failure = failure_;
  return failed;
}

}  // namespace dblp
