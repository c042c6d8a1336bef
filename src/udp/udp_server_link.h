// A kernel-UDP worker's link to one server: the only server of a job, or
// one server shard of a sharded job (the directory first, then every
// shard its WELCOME lists). As dblp-worker's ShardLink, a link holds
// everything the worker has per server:
//   control   its own control connection on its own sidecar thread: the
//             handshake, the WELCOME, ROUND_BEGINs for the datapath, the
//             sides' PROBE, STOP and BITMAP, push feedback's ACCEPTED;
//   datapath  the partition it serves (its layout, local seqs, and its
//             first global chunk), the push SendSide and broadcast
//             ReceiveSide over it, and its frames.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dblp/control/accepted_mail.h"
#include "dblp/control/control.h"
#include "dblp/control/control_sidecar.h"
#include "dblp/control/job_auth.h"
#include "dblp/round/receive_side.h"
#include "dblp/round/send_side.h"
#include "dblp/transport/packet_frames.h"
#include "dblp/transport/udp_transport.h"
#include "dblp/wire/chunking.h"
#include "udp/udp_common.h"

namespace dblp::udp {

class ServerLink {
 public:
  // Server shard `index` (0: the directory, or the only server), whose
  // control listener is `address`.
  ServerLink(uint16_t index, std::string address, const JobSecret& secret);
  ~ServerLink() { Stop(); }
  ServerLink(const ServerLink&) = delete;
  ServerLink& operator=(const ServerLink&) = delete;

  // "the server at A" (the directory, or the only server) or "server
  // shard k at A": how failures and stalls name it.
  std::string Name() const;

  // Connects (retrying until timeout_ms), sends `join` and starts the
  // sidecar thread. "" or why not.
  std::string Join(const JoinMsg& join, uint32_t timeout_ms);
  // Waits for its WELCOME (authenticated, then checked against the JOIN).
  // "" or why none came.
  std::string AwaitWelcome(uint32_t timeout_ms, const std::atomic<bool>* quit);
  const WelcomeMsg& welcome() const { return welcome_; }
  // This member's frame key on this link, once welcomed.
  FrameKey MemberFrameKey() const;

  // ---- datapath ----
  // The sides over this link's partition (`layout`, local seqs, from
  // global chunk `first_chunk`), frames from `gradient` (the partition's
  // bytes) to endpoint `index` of `port`; then published to the sidecar.
  void Start(UdpSocketPort* port, const ChunkLayout& layout,
             uint32_t first_chunk, const uint8_t* gradient, uint32_t burst);
  // ROUND_BEGINs: the push's is kept (go()), the broadcast's goes to its
  // side. False if none came.
  bool TakeEvents(uint64_t now);
  struct Go {
    bool have = false;
    uint32_t round = 0;
    double p = 0;
    bool critical = false;
  };
  const Go& go() const { return go_; }
  uint64_t announcements() const { return announcements_; }
  bool gone() const { return gone_.load(std::memory_order_acquire); }
  // The first cause, once gone().
  const std::string& gone_why() const { return gone_why_; }
  // Push feedback (AcceptedChannel): the ACCEPTED of push `round`.
  bool TakeAccepted(uint32_t round, Bitmap* out) {
    return accepted_.Take(round, out);
  }
  // BYE (ok) or ERROR `failure`, then waits (bounded) for the close.
  void Finish(bool ok, const std::string& failure);
  void Stop();

  const uint16_t index;
  const std::string address;
  // Datapath only, from Start on.
  ChunkLayout layout;
  uint32_t first_chunk = 0;
  std::unique_ptr<SendSide> push;
  std::unique_ptr<ReceiveSide> bcast;
  std::unique_ptr<PacketFrames<UdpSocketPort>> frames;
  std::unique_ptr<Outbox> outbox;
  std::vector<uint32_t> order;  // this push's chunks, local seqs
  Bitmap arrived;               // this iteration's broadcast, local seqs
  // Push feedback: this link's ACCEPTED of `accepted_round`, once taken.
  Bitmap accepted;
  bool have_accepted = false;
  uint32_t accepted_round = 0;

 private:
  // Sidecar thread.
  void OnMessage(const ControlMessage& m);
  void OnWakeup();
  void Gone(const std::string& why);

  ControlSidecar sidecar_;
  std::unique_ptr<SidecarThread> thread_;
  ConnId conn_ = 0;
  // Shared with the sidecar; each field's writer noted. The datapath reads
  // a text only after the flag written after it (acquire).
  WorkerHandshake handshake_;  // sidecar (Join starts it before)
  JoinMsg join_;        // Join: wo before the sidecar thread; sidecar: ro
  WelcomeMsg welcome_;  // sidecar: wo before `welcomed_`
  std::atomic<bool> welcomed_{false};
  std::string gone_why_;  // sidecar: wo (once) before `gone_`
  std::atomic<bool> gone_{false};
  std::atomic<bool> closed_{false};  // sidecar: wo
  AcceptedInbox accepted_;  // sidecar: puts; datapath (the model): takes
  // The sides are published (release) for the sidecar, which hands the
  // push side STOP and BITMAP, the broadcast side PROBE.
  std::atomic<bool> sides_live_{false};
  EventQueue<DatapathEvent> events_;     // sidecar -> datapath: ROUND_BEGIN
  EventQueue<ControlRequest> requests_;  // datapath -> sidecar
  std::vector<ControlRequest> sending_;  // sidecar only
  // The failure told with an unsuccessful FinishRequest: datapath wo
  // before the request; the sidecar reads it when handling that request.
  std::string failure_;
  // Datapath only.
  std::vector<DatapathEvent> taken_;
  Go go_;
  uint64_t announcements_ = 0;  // ROUND_BEGINs taken: they move the job
};

}  // namespace dblp::udp
