// ControlSidecar over real loopback TCP (127.0.0.1, ephemeral ports).
//
// Every sidecar runs Run() on its own std::thread; the test thread talks to
// it the way the datapath will: a queue plus Wakeup() (Node::Call). Every
// wait has a timeout, and joining a sidecar thread is guarded by a watchdog,
// so a bug fails the test instead of hanging it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dblp/control/control.h"
#include "dblp/control/control_sidecar.h"
#include "dblp/security/hmac.h"

namespace dblp {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr milliseconds kWait{5000};  // generous: 2 shared cores

// When a Node's owner calls Trust() on an accepted connection.
enum class TrustOn {
  kNever,
  kAccept,  // at once: for tests whose peers send more than strangers may
  kJoin,    // after a JOIN, as dblp-server does after the handshake
};

// One sidecar, its thread, and everything its callbacks saw.
class Node {
 public:
  explicit Node(uint32_t max_frame = kMaxControlFrame, uint32_t tick_ms = 0,
                ControlLimits limits = {}, TrustOn trust = TrustOn::kNever)
      : trust_(trust), sc_(MakeCallbacks(tick_ms), max_frame, limits) {}
  ~Node() { Stop(); }

  ControlSidecar& sc() { return sc_; }

  void Start() {
    thread_ = std::thread([this] { sc_.Run(); });
  }

  // RequestStop + join, aborting the whole binary if Run() does not return:
  // a hang here would otherwise hang the test run.
  void Stop() {
    if (!thread_.joinable()) return;
    sc_.RequestStop();
    std::promise<void> joined;
    std::thread watchdog([f = joined.get_future()] {
      if (f.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
        std::fprintf(stderr, "FATAL: ControlSidecar::Run did not return\n");
        std::abort();
      }
    });
    thread_.join();
    joined.set_value();
    watchdog.join();
  }

  // Runs fn on the sidecar thread (the only thread allowed to Send/Close)
  // and waits for it.
  template <class F>
  auto Call(F fn) -> decltype(fn(std::declval<ControlSidecar&>())) {
    using R = decltype(fn(sc_));
    auto task = std::make_shared<std::packaged_task<R()>>(
        [this, fn = std::move(fn)]() mutable { return fn(sc_); });
    auto fut = task->get_future();
    {
      std::lock_guard lock(mu_);
      tasks_.push_back([task] { (*task)(); });
    }
    sc_.Wakeup();
    if (fut.wait_for(kWait) != std::future_status::ready) {
      std::fprintf(stderr, "FATAL: sidecar task not run within timeout\n");
      std::abort();  // the task still references locals of the caller
    }
    return fut.get();
  }

  bool Send(ConnId id, const ControlMessage& m) {
    return Call([&](ControlSidecar& sc) { return sc.Send(id, m); });
  }

  // Waits until pred() holds (evaluated under the lock).
  template <class P>
  bool WaitFor(P pred, milliseconds timeout = kWait) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return pred(); });
  }

  // Copies taken under the lock: the sidecar thread may still append.
  auto accepted() {
    std::lock_guard l(mu_);
    return accepted_;
  }
  auto messages() {
    std::lock_guard l(mu_);
    return messages_;
  }
  auto closed() {
    std::lock_guard l(mu_);
    return closed_;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<ConnId> accepted_;
  std::vector<std::pair<ConnId, ControlMessage>> messages_;
  std::vector<std::pair<ConnId, std::string>> closed_;
  std::vector<size_t> messages_at_close_;  // messages_.size() at each close
  std::vector<std::string> logs_;
  int wakeups_ = 0;
  int ticks_ = 0;

 private:
  ControlSidecar::Callbacks MakeCallbacks(uint32_t tick_ms) {
    ControlSidecar::Callbacks cb;
    cb.on_accept = [this](ConnId id) {
      if (trust_ == TrustOn::kAccept) sc_.Trust(id);
      Record([&] { accepted_.push_back(id); });
    };
    cb.on_message = [this](ConnId id, const ControlMessage& m) {
      if (trust_ == TrustOn::kJoin && std::holds_alternative<JoinMsg>(m)) {
        sc_.Trust(id);
      }
      Record([&] { messages_.emplace_back(id, m); });
    };
    cb.on_log = [this](const std::string& line) {
      Record([&] { logs_.push_back(line); });
    };
    cb.on_close = [this](ConnId id, const std::string& reason) {
      Record([&] {
        closed_.emplace_back(id, reason);
        messages_at_close_.push_back(messages_.size());
      });
    };
    cb.on_wakeup = [this] {
      std::deque<std::function<void()>> tasks;
      {
        std::lock_guard lock(mu_);
        ++wakeups_;
        tasks.swap(tasks_);
      }
      cv_.notify_all();
      for (auto& t : tasks) t();
    };
    cb.on_tick = [this] { Record([&] { ++ticks_; }); };
    cb.tick_ms = tick_ms;
    return cb;
  }

  template <class F>
  void Record(F f) {
    {
      std::lock_guard lock(mu_);
      f();
    }
    cv_.notify_all();
  }

  std::deque<std::function<void()>> tasks_;
  TrustOn trust_;
  ControlSidecar sc_;
  std::thread thread_;
};

std::string Addr(uint16_t port) { return "127.0.0.1:" + std::to_string(port); }

// A listening server and a connected client, both running.
struct Pair {
  explicit Pair(uint32_t server_max_frame = kMaxControlFrame,
                uint32_t client_max_frame = kMaxControlFrame)
      : server(server_max_frame), client(client_max_frame) {
    std::string err;
    EXPECT_TRUE(server.sc().Listen("127.0.0.1:0", &err)) << err;
    EXPECT_NE(server.sc().bound_port(), 0);
    EXPECT_TRUE(client.sc().Connect(Addr(server.sc().bound_port()), 2000,
                                    &client_conn, &err))
        << err;
    server.Start();
    client.Start();
    EXPECT_TRUE(server.WaitFor([&] { return !server.accepted_.empty(); }));
    std::lock_guard lock(server.mu_);
    if (!server.accepted_.empty()) server_conn = server.accepted_[0];
  }
  Node server;
  Node client;
  ConnId client_conn = 0;
  ConnId server_conn = 0;
};

std::vector<ControlMessage> AllMessages() {
  std::vector<ControlMessage> v;
  JoinMsg j;
  j.session = 42;
  j.worker_name = "worker-0";
  j.total_bytes = 1 << 20;
  j.mtu = 1500;
  j.layers = {{"conv1.weight", {16, 1, 3, 3}}, {"fc.bias", {10}}};
  v.push_back(j);
  WelcomeMsg w;
  w.session = 42;
  w.rank = 2;
  w.num_workers = 3;
  w.mtu = 1500;
  w.chunk_payload = 1440;
  w.num_chunks = 729;
  w.total_bytes = 1 << 20;
  w.udp_base_port = 40000;
  w.lanes = 2;
  w.server_ipv4 = 0x7f000001;
  w.server_mac = {0x02, 0, 0, 0, 0, 1};
  w.policy = "dblp";
  w.layers = j.layers;
  v.push_back(w);
  v.push_back(RoundBeginMsg{.round = 0xFFFFFFFF,
                            .iteration = 7,
                            .direction = Direction::kBroadcast,
                            .p = 0.408,
                            .deadline_ns = 123456789,
                            .min_fraction = 0.5});
  v.push_back(ProbeMsg{.round = 3, .direction = Direction::kPush, .pass = 2});
  v.push_back(BitmapMsg{.round = 3,
                        .direction = Direction::kPush,
                        .num_bits = 70,
                        .words = {~0ull, 0x3f}});
  v.push_back(StopMsg{.round = 3,
                      .direction = Direction::kPush,
                      .received = 700,
                      .reason = StopReason::kThreshold});
  v.push_back(ByeMsg{.reason = "done"});
  v.push_back(ErrorMsg{.code = 503, .text = "session mismatch"});
  return v;
}

BitmapMsg RandomBitmap(uint32_t num_bits, uint32_t seed) {
  std::mt19937_64 rng(seed);
  BitmapMsg b{.round = seed,
              .direction = Direction::kPush,
              .num_bits = num_bits,
              .words = {}};
  b.words.resize((num_bits + 63) / 64);
  for (auto& w : b.words) w = rng();
  if (num_bits % 64 != 0) b.words.back() &= (1ull << (num_bits % 64)) - 1;
  return b;
}

// --- raw sockets: a peer that is not a ControlSidecar -----------------------

int RawConnect(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_GE(fd, 0);
  timeval tv{};
  tv.tv_sec = 5;  // reads time out instead of hanging the test
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  return fd;
}

// From source address 127.0.0.`host` (the whole of 127/8 is loopback).
int RawConnectFrom(uint8_t host, uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_GE(fd, 0);
  timeval tv{};
  tv.tv_sec = 5;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in src{};
  src.sin_family = AF_INET;
  src.sin_addr.s_addr = htonl(0x7F000000u | host);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src), 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  return fd;
}

// Nothing to read and no EOF: the server still holds the connection open.
bool RawStillOpen(int fd) {
  uint8_t b;
  const ssize_t n = recv(fd, &b, 1, MSG_DONTWAIT | MSG_PEEK);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

void RawWrite(int fd, const std::vector<uint8_t>& bytes) {
  ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
}

// Reads one frame; false on EOF / timeout / bad frame.
bool RawReadMessage(int fd, ControlDecoder& dec, ControlMessage* m) {
  for (;;) {
    const auto st = dec.Next(*m);
    if (st == ControlDecoder::Status::kMessage) return true;
    if (st == ControlDecoder::Status::kError) return false;
    uint8_t buf[4096];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return false;
    dec.Feed(buf, static_cast<size_t>(n));
  }
}

// True if the peer closes (EOF or reset) before the 5 s read timeout.
bool RawSeesClose(int fd) {
  uint8_t buf[4096];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
  }
}

// A port nobody listens on (bound then released; nothing rebinds it here).
uint16_t ClosedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  socklen_t len = sizeof sa;
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  close(fd);
  return ntohs(sa.sin_port);
}

size_t OpenFds() {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)e;
    ++n;
  }
  return n;
}

// --- tests
// --------------------------------------------------------------------

TEST(ControlSidecar, EveryMessageTypeBothWays) {
  Pair p;
  const auto all = AllMessages();
  for (const auto& m : all) EXPECT_TRUE(p.client.Send(p.client_conn, m));
  ASSERT_TRUE(p.server.WaitFor(
      [&] { return p.server.messages_.size() == all.size(); }));
  for (const auto& m : all) EXPECT_TRUE(p.server.Send(p.server_conn, m));
  ASSERT_TRUE(p.client.WaitFor(
      [&] { return p.client.messages_.size() == all.size(); }));
  const auto got_s = p.server.messages(), got_c = p.client.messages();
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(got_s[i].first, p.server_conn);
    EXPECT_EQ(got_s[i].second, all[i]) << ControlTypeName(all[i]);
    EXPECT_EQ(got_c[i].first, p.client_conn);
    EXPECT_EQ(got_c[i].second, all[i]) << ControlTypeName(all[i]);
  }
  EXPECT_EQ(p.server.sc().messages_in(), all.size());
  EXPECT_EQ(p.server.sc().messages_out(), all.size());
  EXPECT_EQ(p.client.sc().messages_in(), all.size());
  EXPECT_EQ(p.client.sc().messages_out(), all.size());
  EXPECT_EQ(p.server.sc().protocol_errors(), 0u);
  const std::string peer = p.server.Call(
      [&](ControlSidecar& sc) { return sc.PeerAddress(p.server_conn); });
  EXPECT_EQ(peer.rfind("127.0.0.1:", 0), 0u) << peer;
}

TEST(ControlSidecar, BurstArrivesInOrder) {
  Pair p;
  constexpr uint32_t kN = 20000;
  // One task queues the whole burst: most of it lands in the output buffer
  // behind EAGAIN and goes out on EPOLLOUT.
  ASSERT_TRUE(p.client.Call([&](ControlSidecar& sc) {
    for (uint32_t i = 0; i < kN; ++i) {
      if (!sc.Send(
              p.client_conn,
              ProbeMsg{.round = 1, .direction = Direction::kPush, .pass = i})) {
        return false;
      }
    }
    return true;
  }));
  ASSERT_TRUE(
      p.server.WaitFor([&] { return p.server.messages_.size() == kN; }));
  const auto got = p.server.messages();
  for (uint32_t i = 0; i < kN; ++i) {
    const auto* probe = std::get_if<ProbeMsg>(&got[i].second);
    ASSERT_NE(probe, nullptr);
    ASSERT_EQ(probe->pass, i);
  }
}

TEST(ControlSidecar, LargeMessagesSurvivePartialWrites) {
  // Server side decoder must accept the big WELCOME, and the connection
  // must be trusted to send it.
  Node server(/*max_frame=*/32u << 20, /*tick_ms=*/0, ControlLimits{},
              TrustOn::kAccept);
  std::string err;
  ASSERT_TRUE(server.sc().Listen("127.0.0.1:0", &err)) << err;
  Node client;
  ConnId conn = 0;
  ASSERT_TRUE(
      client.sc().Connect(Addr(server.sc().bound_port()), 2000, &conn, &err))
      << err;

  std::vector<ControlMessage> msgs;
  msgs.push_back(RandomBitmap(100000, 1));
  WelcomeMsg w;
  w.policy = "fixed";
  for (int i = 0; i < 40000; ++i) {
    w.layers.push_back(
        {std::string(100, static_cast<char>('a' + i % 26)) + std::to_string(i),
         {i, 1, 2, 3, 4, 5, 6, 7}});
  }
  msgs.push_back(w);  // ~7 MB: far beyond the loopback socket buffers
  for (uint32_t s = 2; s < 40; ++s) msgs.push_back(RandomBitmap(1'000'003, s));
  msgs.push_back(RandomBitmap(100000, 99));

  // The server does not read yet, so the client's writes hit EAGAIN and the
  // rest must wait in its output buffer for EPOLLOUT. Send must not block.
  const auto t0 = Clock::now();
  for (const auto& m : msgs) ASSERT_TRUE(client.sc().Send(conn, m));
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(3)) << "Send blocked?";
  client.Start();
  std::this_thread::sleep_for(milliseconds(100));
  server.Start();
  ASSERT_TRUE(
      server.WaitFor([&] { return server.messages_.size() == msgs.size(); },
                     milliseconds(30000)));
  const auto got = server.messages();
  for (size_t i = 0; i < msgs.size(); ++i) {
    ASSERT_TRUE(got[i].second == msgs[i]) << "message " << i;
  }
  EXPECT_EQ(server.sc().protocol_errors(), 0u);
}

TEST(ControlSidecar, GarbageGetsErrorFrameAndCloseServerKeepsServing) {
  Pair p;
  const int raw = RawConnect(p.server.sc().bound_port());
  ASSERT_TRUE(p.server.WaitFor([&] { return p.server.accepted_.size() == 2; }));
  const ConnId raw_id = p.server.accepted()[1];
  // A plausible length, then a type byte that is no ControlType.
  RawWrite(raw, {0, 0, 0, 5, 0xEE, 1, 2, 3, 4, 0xAA, 0xBB});

  ControlDecoder dec;
  ControlMessage m;
  ASSERT_TRUE(RawReadMessage(raw, dec, &m)) << "no ERROR frame";
  const auto* e = std::get_if<ErrorMsg>(&m);
  ASSERT_NE(e, nullptr) << ControlTypeName(m);
  EXPECT_EQ(e->code, kErrorCodeProtocol +
                         static_cast<uint16_t>(ControlError::kUnknownType));
  EXPECT_NE(e->text.find("unknown message type"), std::string::npos) << e->text;
  EXPECT_TRUE(RawSeesClose(raw));
  close(raw);

  ASSERT_TRUE(p.server.WaitFor([&] { return p.server.closed_.size() == 1; }));
  EXPECT_EQ(p.server.closed()[0].first, raw_id);
  EXPECT_NE(p.server.closed()[0].second.find("unknown message type"),
            std::string::npos)
      << p.server.closed()[0].second;
  EXPECT_EQ(p.server.sc().protocol_errors(), 1u);

  // The client connected before, and a new one, are still served.
  EXPECT_TRUE(p.client.Send(p.client_conn, ByeMsg{.reason = "still here"}));
  Node late;
  ConnId late_conn = 0;
  std::string err;
  ASSERT_TRUE(late.sc().Connect(Addr(p.server.sc().bound_port()), 2000,
                                &late_conn, &err))
      << err;
  late.Start();
  EXPECT_TRUE(late.Send(
      late_conn,
      ProbeMsg{.round = 1, .direction = Direction::kPush, .pass = 0}));
  ASSERT_TRUE(p.server.WaitFor([&] { return p.server.messages_.size() == 2; }));
  EXPECT_EQ(p.server.messages()[0].second,
            ControlMessage(ByeMsg{.reason = "still here"}));
  EXPECT_TRUE(std::holds_alternative<ProbeMsg>(p.server.messages()[1].second));
  EXPECT_EQ(p.server.sc().protocol_errors(), 1u);
}

TEST(ControlSidecar, ValidFramesBeforeGarbageAreDelivered) {
  Pair p;
  const int raw = RawConnect(p.server.sc().bound_port());
  auto bytes = EncodeControl(
      ProbeMsg{.round = 5, .direction = Direction::kPush, .pass = 1});
  bytes.insert(bytes.end(), {0, 0, 0, 0});  // length 0: no type byte
  RawWrite(raw, bytes);
  ControlDecoder dec;
  ControlMessage m;
  ASSERT_TRUE(RawReadMessage(raw, dec, &m));
  ASSERT_TRUE(std::holds_alternative<ErrorMsg>(m));
  EXPECT_EQ(
      std::get<ErrorMsg>(m).code,
      kErrorCodeProtocol + static_cast<uint16_t>(ControlError::kEmptyFrame));
  EXPECT_TRUE(RawSeesClose(raw));
  close(raw);
  ASSERT_TRUE(p.server.WaitFor([&] { return p.server.closed_.size() == 1; }));
  ASSERT_EQ(p.server.messages().size(), 1u);
  EXPECT_TRUE(std::holds_alternative<ProbeMsg>(p.server.messages()[0].second));
}

TEST(ControlSidecar, OversizeDeclaredLengthRejectedQuickly) {
  // Trusted: the decoder's max_frame; untrusted: the smaller
  // max_untrusted_frame, checked by the sidecar.
  for (const TrustOn trust : {TrustOn::kAccept, TrustOn::kNever}) {
    SCOPED_TRACE(trust == TrustOn::kAccept ? "trusted" : "untrusted");
    Node server(/*max_frame=*/64 * 1024, 0, ControlLimits{}, trust);
    std::string err;
    ASSERT_TRUE(server.sc().Listen("127.0.0.1:0", &err)) << err;
    server.Start();
    const int raw = RawConnect(server.sc().bound_port());
    const auto t0 = Clock::now();
    // Only the header: the server must not wait for 4 GiB of body.
    RawWrite(raw, {0xFF, 0xFF, 0xFF, 0xFF});
    ControlDecoder dec;
    ControlMessage m;
    ASSERT_TRUE(RawReadMessage(raw, dec, &m));
    EXPECT_LT(Clock::now() - t0, milliseconds(1000));
    ASSERT_TRUE(std::holds_alternative<ErrorMsg>(m));
    const auto& e = std::get<ErrorMsg>(m);
    EXPECT_EQ(e.code, kErrorCodeProtocol +
                          static_cast<uint16_t>(ControlError::kFrameTooLarge));
    const char* limit =
        trust == TrustOn::kAccept ? "> max_frame" : "> max_untrusted_frame";
    EXPECT_NE(e.text.find(limit), std::string::npos) << e.text;
    EXPECT_TRUE(RawSeesClose(raw));
    close(raw);
    ASSERT_TRUE(server.WaitFor([&] { return server.closed_.size() == 1; }));
    EXPECT_EQ(server.sc().protocol_errors(), 1u);
  }
}

TEST(ControlSidecar, PeerCloseCallsOnCloseOnceOnBothSides) {
  Pair p;
  p.client.Call([&](ControlSidecar& sc) {
    sc.Close(p.client_conn, "worker finished");
    sc.Close(p.client_conn, "again");  // no-op
    EXPECT_FALSE(sc.Send(p.client_conn, ByeMsg{}));
  });
  ASSERT_TRUE(p.server.WaitFor([&] { return !p.server.closed_.empty(); }));
  ASSERT_TRUE(p.client.WaitFor([&] { return !p.client.closed_.empty(); }));
  std::this_thread::sleep_for(milliseconds(100));  // no second call may follow
  ASSERT_EQ(p.server.closed().size(), 1u);
  EXPECT_EQ(p.server.closed()[0].first, p.server_conn);
  EXPECT_NE(p.server.closed()[0].second.find("peer closed"), std::string::npos)
      << p.server.closed()[0].second;
  ASSERT_EQ(p.client.closed().size(), 1u);
  EXPECT_EQ(p.client.closed()[0],
            std::make_pair(p.client_conn, std::string("worker finished")));
}

TEST(ControlSidecar, PeerResetIsReported) {
  Pair p;
  const int raw = RawConnect(p.server.sc().bound_port());
  ASSERT_TRUE(p.server.WaitFor([&] { return p.server.accepted_.size() == 2; }));
  linger lg{1, 0};  // close() sends RST
  setsockopt(raw, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  close(raw);
  ASSERT_TRUE(p.server.WaitFor([&] { return p.server.closed_.size() == 1; }));
  EXPECT_NE(p.server.closed()[0].second.find("reset"), std::string::npos)
      << p.server.closed()[0].second;
}

TEST(ControlSidecar, CloseFlushesQueuedOutputFirst) {
  Pair p;
  const auto big = RandomBitmap(4'000'000, 7);  // 500 KB, beyond one write
  p.server.Call([&](ControlSidecar& sc) {
    EXPECT_TRUE(sc.Send(p.server_conn, big));
    EXPECT_TRUE(sc.Send(p.server_conn, ByeMsg{.reason = "shutting down"}));
    sc.Close(p.server_conn, "server done");
  });
  ASSERT_TRUE(p.client.WaitFor([&] { return !p.client.closed_.empty(); }));
  ASSERT_EQ(p.client.messages().size(), 2u);
  EXPECT_TRUE(p.client.messages()[0].second == ControlMessage(big));
  EXPECT_EQ(p.client.messages()[1].second,
            ControlMessage(ByeMsg{.reason = "shutting down"}));
  ASSERT_TRUE(p.server.WaitFor([&] { return !p.server.closed_.empty(); }));
  EXPECT_EQ(p.server.closed()[0].second, "server done");
}

TEST(ControlSidecar, SendRejectsInvalidMessageAndUnknownConnection) {
  Pair p;
  p.client.Call([&](ControlSidecar& sc) {
    std::string err;
    BitmapMsg bad{.round = 1,
                  .direction = Direction::kPush,
                  .num_bits = 65,
                  .words = {1}};
    EXPECT_FALSE(sc.Send(p.client_conn, bad, &err));
    EXPECT_NE(err.find("words"), std::string::npos) << err;
    err.clear();
    EXPECT_FALSE(sc.Send(12345, ByeMsg{}, &err));
    EXPECT_NE(err.find("closed"), std::string::npos) << err;
    // The connection itself is unharmed.
    EXPECT_TRUE(sc.Send(p.client_conn, ByeMsg{.reason = "ok"}));
  });
  ASSERT_TRUE(p.server.WaitFor([&] { return p.server.messages_.size() == 1; }));
  EXPECT_TRUE(p.server.closed().empty());
}

TEST(ControlSidecar, SendingToVanishedPeerDoesNotRaiseSigpipe) {
  // SIG_DFL for SIGPIPE kills the process: this test dies if a write lacks
  // MSG_NOSIGNAL.
  auto old = std::signal(SIGPIPE, SIG_DFL);
  {
    Pair p;
    const int raw = RawConnect(p.server.sc().bound_port());
    ASSERT_TRUE(
        p.server.WaitFor([&] { return p.server.accepted_.size() == 2; }));
    const ConnId raw_id = p.server.accepted()[1];
    // All inside one task that starts before the peer closes, so the loop
    // cannot notice the FIN first and avoid writing: the first Send lands on
    // a CLOSE_WAIT socket and draws a RST, after which the kernel reports
    // EPIPE to the next write.
    std::atomic<bool> in_task{false};
    std::thread closer([&] {
      while (!in_task.load()) std::this_thread::sleep_for(milliseconds(1));
      close(raw);
    });
    const bool second_failed = p.server.Call([&](ControlSidecar& sc) {
      in_task.store(true);
      std::this_thread::sleep_for(milliseconds(100));
      EXPECT_TRUE(sc.Send(raw_id, RandomBitmap(10000, 3)));
      std::this_thread::sleep_for(milliseconds(50));
      std::string err;
      const bool ok = sc.Send(raw_id, RandomBitmap(10000, 4), &err);
      EXPECT_NE(err.find("write"), std::string::npos) << err;
      return !ok;
    });
    closer.join();
    EXPECT_TRUE(second_failed);
    ASSERT_TRUE(p.server.WaitFor([&] { return p.server.closed_.size() == 1; }));
  }
  std::signal(SIGPIPE, old);
}

// A worker that fails sends ERROR and exits; if our write meets its reset
// socket first, the ERROR it sent before must still be delivered, and
// before the close: otherwise the worker would look merely lost.
TEST(ControlSidecar, WhatAPeerSentBeforeItsResetIsDeliveredBeforeTheClose) {
  Pair p;
  const int raw = RawConnect(p.server.sc().bound_port());
  ASSERT_TRUE(p.server.WaitFor([&] { return p.server.accepted_.size() == 2; }));
  const ConnId raw_id = p.server.accepted()[1];
  const ErrorMsg why{.code = 2, .text = "no data for step 2"};
  // One task, so the loop cannot read the ERROR before our write fails.
  const std::string err = p.server.Call([&](ControlSidecar& sc) {
    RawWrite(raw, EncodeControl(why));
    EXPECT_TRUE(sc.Send(raw_id, RandomBitmap(10000, 3)));  // left unread
    linger lg{1, 0};
    setsockopt(raw, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(raw);  // RST
    std::this_thread::sleep_for(milliseconds(50));
    std::string e;
    EXPECT_FALSE(sc.Send(raw_id, RandomBitmap(10000, 4), &e));
    EXPECT_FALSE(sc.Send(raw_id, ByeMsg{}));  // still refused, no crash
    return e;
  });
  EXPECT_NE(err.find("failed on write"), std::string::npos) << err;
  ASSERT_TRUE(p.server.WaitFor([&] { return p.server.closed_.size() == 1; }));
  const auto msgs = p.server.messages();
  ASSERT_EQ(msgs.size(), 1u);
  EXPECT_EQ(msgs[0], std::make_pair(raw_id, ControlMessage(why)));
  EXPECT_EQ(p.server.messages_at_close_[0], 1u) << "closed before the ERROR";
  EXPECT_EQ(p.server.closed()[0].first, raw_id);
  EXPECT_NE(p.server.closed()[0].second.find("reset"), std::string::npos)
      << p.server.closed()[0].second;
  // The other connection is unharmed.
  EXPECT_TRUE(p.client.Send(p.client_conn, ByeMsg{.reason = "still here"}));
  ASSERT_TRUE(p.server.WaitFor([&] { return p.server.messages_.size() == 2; }));
}

TEST(ControlSidecar, WakeupFromManyThreadsCoalescesAndStaysResponsive) {
  Node n;
  n.Start();
  constexpr int kThreads = 4, kPerThread = 20000;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < kPerThread; ++i) n.sc().Wakeup();
    });
  }
  for (auto& t : ts) t.join();
  ASSERT_TRUE(n.WaitFor([&] { return n.wakeups_ >= 1; }));
  EXPECT_TRUE(n.WaitFor([&] { return n.wakeups_ <= kThreads * kPerThread; }));
  // Still responsive: a posted task runs promptly.
  const auto t0 = Clock::now();
  EXPECT_EQ(n.Call([](ControlSidecar&) { return 7; }), 7);
  EXPECT_LT(Clock::now() - t0, milliseconds(1000));
}

TEST(ControlSidecar, OnTickFires) {
  Node n(kMaxControlFrame, /*tick_ms=*/10);
  n.Start();
  EXPECT_TRUE(n.WaitFor([&] { return n.ticks_ >= 5; }));
}

TEST(ControlSidecar, ConnectToClosedPortTimesOutWithClearError) {
  Node n;
  const uint16_t port = ClosedPort();
  ConnId id = 0;
  std::string err;
  const auto t0 = Clock::now();
  EXPECT_FALSE(n.sc().Connect(Addr(port), 300, &id, &err));
  const auto took = Clock::now() - t0;
  EXPECT_GE(took, milliseconds(290));
  EXPECT_LT(took, milliseconds(3000));
  EXPECT_NE(err.find(Addr(port)), std::string::npos) << err;
  EXPECT_NE(err.find("dblp-server"), std::string::npos) << err;
  EXPECT_NE(err.find("--server"), std::string::npos) << err;
  EXPECT_NE(err.find("refused"), std::string::npos) << err;
}

// dblp-udp-worker and dblp-udp-server: the fixes name their server and its
// --control, not dblp-server's --listen.
TEST(ControlSidecar, ErrorsNameTheCallersServerApp) {
  const ServerApp udp{"dblp-udp-server", "--control"};
  Node n;
  ConnId id = 0;
  std::string err;
  EXPECT_FALSE(n.sc().Connect(Addr(ClosedPort()), 0, &id, &err, udp));
  EXPECT_NE(err.find("dblp-udp-server"), std::string::npos) << err;
  EXPECT_NE(err.find("--control"), std::string::npos) << err;
  EXPECT_EQ(err.find("--listen"), std::string::npos) << err;
  Node a, b;
  ASSERT_TRUE(a.sc().Listen("127.0.0.1:0", &err, udp)) << err;
  EXPECT_FALSE(b.sc().Listen(Addr(a.sc().bound_port()), &err, udp));
  EXPECT_NE(err.find("another dblp-udp-server"), std::string::npos) << err;
  EXPECT_NE(err.find("--control"), std::string::npos) << err;
  EXPECT_EQ(err.find("--listen"), std::string::npos) << err;
}

TEST(ControlSidecar, ConnectRetriesUntilServerStarts) {
  const uint16_t port = ClosedPort();
  Node server;
  std::thread starter([&] {
    std::this_thread::sleep_for(milliseconds(300));
    std::string err;
    EXPECT_TRUE(server.sc().Listen(Addr(port), &err)) << err;
    server.Start();
  });
  Node client;
  ConnId id = 0;
  std::string err;
  const bool ok = client.sc().Connect(Addr(port), 5000, &id, &err);
  starter.join();
  ASSERT_TRUE(ok) << err;
  client.Start();
  EXPECT_TRUE(client.Send(id, ByeMsg{.reason = "hi"}));
  EXPECT_TRUE(server.WaitFor([&] { return server.messages_.size() == 1; }));
}

TEST(ControlSidecar, BadAddressesAreClearErrors) {
  Node n;
  for (const std::string bad :
       {"", "nonsense", "127.0.0.1", "127.0.0.1:", "127.0.0.1:99999",
        "127.0.0.1:12ab", "127.0.0.1:-1", "300.1.1.1:80", "example.com:80",
        "::1:80", "127.0.0.1:9100:1"}) {
    std::string err;
    EXPECT_FALSE(n.sc().Listen(bad, &err)) << bad;
    EXPECT_NE(err.find("'" + bad + "'"), std::string::npos) << err;
    EXPECT_NE(err.find("e.g."), std::string::npos) << err;
    err.clear();
    ConnId id = 0;
    EXPECT_FALSE(n.sc().Connect(bad, 100, &id, &err)) << bad;
    EXPECT_FALSE(err.empty());
  }
  std::string err;
  ConnId id = 0;
  EXPECT_FALSE(n.sc().Connect("127.0.0.1:0", 100, &id, &err));
  EXPECT_FALSE(n.sc().Connect(":9100", 100, &id, &err));
  EXPECT_NE(err.find("no host"), std::string::npos) << err;
  // Not an address of this host.
  EXPECT_FALSE(n.sc().Listen("192.0.2.1:0", &err));
  EXPECT_NE(err.find("not an address of this host"), std::string::npos) << err;
  EXPECT_EQ(n.sc().bound_port(), 0);
}

TEST(ControlSidecar, ListenOnPortInUseNamesTheFix) {
  Node a, b;
  std::string err;
  ASSERT_TRUE(a.sc().Listen("127.0.0.1:0", &err)) << err;
  const std::string addr = Addr(a.sc().bound_port());
  EXPECT_FALSE(b.sc().Listen(addr, &err));
  EXPECT_NE(err.find("already in use"), std::string::npos) << err;
  EXPECT_NE(err.find("--listen"), std::string::npos) << err;
  EXPECT_FALSE(a.sc().Listen("127.0.0.1:0", &err));
  EXPECT_NE(err.find("already listening"), std::string::npos) << err;
  // Wildcard forms parse.
  Node c;
  EXPECT_TRUE(c.sc().Listen("*:0", &err)) << err;
}

TEST(ControlSidecar, RequestStopReturnsRunPromptly) {
  Node n(kMaxControlFrame, /*tick_ms=*/0);
  std::string err;
  ASSERT_TRUE(n.sc().Listen("127.0.0.1:0", &err));
  n.Start();
  std::this_thread::sleep_for(milliseconds(50));  // let it block in epoll_wait
  const auto t0 = Clock::now();
  n.Stop();
  EXPECT_LT(Clock::now() - t0, milliseconds(500));

  // Requested before Run even started: not lost.
  ControlSidecar sc(ControlSidecar::Callbacks{});
  sc.RequestStop();
  std::thread t([&] { sc.Run(); });
  const auto t1 = Clock::now();
  t.join();
  EXPECT_LT(Clock::now() - t1, milliseconds(500));
}

TEST(ControlSidecar, RequestStopFromCallback) {
  Node n;
  n.Start();
  n.Call([](ControlSidecar& sc) { sc.RequestStop(); });
  n.Stop();  // watchdog aborts if Run did not return
}

TEST(ControlSidecar, NoFdLeaks) {
  const size_t before = OpenFds();
  {
    Pair p;
    for (const auto& m : AllMessages())
      EXPECT_TRUE(p.client.Send(p.client_conn, m));
    // Garbage client (server closes it) and a polite one.
    const int raw = RawConnect(p.server.sc().bound_port());
    RawWrite(raw, {0, 0, 0, 1, 0});
    EXPECT_TRUE(RawSeesClose(raw));
    close(raw);
    Node other;
    ConnId id = 0;
    std::string err;
    ASSERT_TRUE(
        other.sc().Connect(Addr(p.server.sc().bound_port()), 2000, &id, &err));
    other.Start();
    other.Call([&](ControlSidecar& sc) { sc.Close(id, "bye"); });
    ASSERT_TRUE(p.server.WaitFor([&] { return p.server.closed_.size() == 2; }));
    // A failed connect must not leak its socket either.
    Node n;
    EXPECT_FALSE(n.sc().Connect(Addr(ClosedPort()), 50, &id, &err));
    EXPECT_FALSE(n.sc().Listen("bogus", &err));
    // p's connection is still open: the destructors must close it.
  }
  EXPECT_EQ(OpenFds(), before);
}

// --- limits (ControlLimits) --------------------------------------------------

// Every limit off but the ones a test sets: each test sees one limit act.
ControlLimits NoLimits() {
  ControlLimits l;
  l.max_connections = 0;
  l.max_unauthenticated = 0;
  l.max_unauthenticated_per_source = 0;
  l.join_deadline = milliseconds(0);
  l.max_untrusted_frame = kMaxControlFrame;
  l.partial_message_timeout = milliseconds(0);
  l.idle_timeout = milliseconds(0);
  return l;
}

// A listening server node, running.
std::unique_ptr<Node> StartServer(ControlLimits limits,
                                  TrustOn trust = TrustOn::kJoin) {
  auto n = std::make_unique<Node>(kMaxControlFrame, 0, limits, trust);
  std::string err;
  EXPECT_TRUE(n->sc().Listen("127.0.0.1:0", &err)) << err;
  n->Start();
  return n;
}

std::vector<uint8_t> LengthPrefix(uint32_t len) {
  return {static_cast<uint8_t>(len >> 24), static_cast<uint8_t>(len >> 16),
          static_cast<uint8_t>(len >> 8), static_cast<uint8_t>(len)};
}

// The ERROR the server sent before closing (code 0 and the text "none" if
// there was none).
ErrorMsg ReadError(int fd) {
  ControlDecoder dec;
  ControlMessage m;
  if (!RawReadMessage(fd, dec, &m)) return ErrorMsg{0, "none"};
  if (const auto* e = std::get_if<ErrorMsg>(&m)) return *e;
  return ErrorMsg{0, std::string("a ") + ControlTypeName(m)};
}

JoinMsg Join(const std::string& name) {
  JoinMsg j;
  j.worker_name = name;
  return j;
}

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(ControlSidecarLimits, DefaultsAreSafe) {
  const ControlLimits l;
  EXPECT_GT(l.max_connections, 0u);
  // Strangers can never hold every slot: there is room beyond their budget.
  EXPECT_GT(l.max_unauthenticated, 0u);
  EXPECT_LT(l.max_unauthenticated, l.max_connections);
  EXPECT_GT(l.max_unauthenticated_per_source, 0u);
  EXPECT_LE(l.max_unauthenticated_per_source, l.max_unauthenticated);
  EXPECT_GT(l.join_deadline.count(), 0);
  EXPECT_LT(l.max_untrusted_frame, kMaxControlFrame);
  EXPECT_GE(l.max_untrusted_frame, 16u << 10);  // a JOIN with layers fits
  EXPECT_GT(l.partial_message_timeout.count(), 0);
  EXPECT_EQ(l.idle_timeout.count(), 0);  // jobs may be quiet for long
}

// Refused only when every open connection is trusted (else a newcomer
// evicts an untrusted one: the tests below).
TEST(ControlSidecarLimits, MaxConnectionsRefusesCountsAndLogsOnce) {
  ControlLimits l = NoLimits();
  l.max_connections = 3;
  auto server = StartServer(l, TrustOn::kJoin);
  const uint16_t port = server->sc().bound_port();
  std::vector<int> admitted;
  for (int i = 0; i < 3; ++i) {
    admitted.push_back(RawConnect(port));
    RawWrite(admitted.back(), EncodeControl(Join("w" + std::to_string(i))));
  }
  ASSERT_TRUE(server->WaitFor([&] { return server->messages_.size() == 3; }));
  EXPECT_EQ(server->sc().open_connections(), 3u);
  EXPECT_EQ(server->sc().open_unauthenticated(), 0u);

  constexpr int kExtra = 5;
  for (int i = 0; i < kExtra; ++i) {
    const int fd = RawConnect(port);
    const ErrorMsg e = ReadError(fd);
    EXPECT_EQ(e.code, kErrorCodeLimit) << e.text;
    EXPECT_TRUE(Contains(e.text, "max_connections")) << e.text;
    EXPECT_TRUE(RawSeesClose(fd));
    close(fd);
  }
  EXPECT_EQ(server->sc().connections_refused(), uint64_t{kExtra});
  // Refused connections never reach the owner.
  EXPECT_EQ(server->accepted().size(), 3u);
  EXPECT_TRUE(server->closed().empty());
  // One log line for the burst, naming the limit and the fix.
  const auto logs = [&] {
    std::lock_guard lock(server->mu_);
    return server->logs_;
  }();
  ASSERT_EQ(logs.size(), 1u);
  EXPECT_TRUE(Contains(logs[0], "max_connections")) << logs[0];
  EXPECT_TRUE(Contains(logs[0], "--control_max_connections")) << logs[0];

  // A slot freed by a close is usable again.
  close(admitted[0]);
  ASSERT_TRUE(server->WaitFor([&] { return server->closed_.size() == 1; }));
  const int again = RawConnect(port);
  ASSERT_TRUE(server->WaitFor([&] { return server->accepted_.size() == 4; }));
  EXPECT_EQ(server->sc().connections_refused(), uint64_t{kExtra});
  EXPECT_EQ(server->sc().open_connections(), 3u);
  close(again);
  for (size_t i = 1; i < admitted.size(); ++i) close(admitted[i]);
}

// Issue #21, item 4: a source over its bound of unauthenticated
// connections gives way to its newest, oldest first; other sources and
// trusted connections are untouched.
TEST(ControlSidecarLimits, ASourceOverItsBoundLosesItsOldestUnauthenticated) {
  ControlLimits l = NoLimits();
  l.max_unauthenticated_per_source = 3;
  auto server = StartServer(l, TrustOn::kJoin);
  const uint16_t port = server->sc().bound_port();
  const int member = RawConnectFrom(2, port);
  RawWrite(member, EncodeControl(Join("w0")));
  ASSERT_TRUE(server->WaitFor([&] { return server->messages_.size() == 1; }));
  std::vector<int> from2;
  for (int i = 0; i < 3; ++i) {
    from2.push_back(RawConnectFrom(2, port));
    ASSERT_TRUE(server->WaitFor(
        [&] { return server->accepted_.size() == from2.size() + 1; }));
  }
  const int other = RawConnectFrom(3, port);
  ASSERT_TRUE(server->WaitFor([&] { return server->accepted_.size() == 5; }));
  EXPECT_EQ(server->sc().connections_evicted(), 0u);
  const int newest = RawConnectFrom(2, port);
  const ErrorMsg e = ReadError(from2[0]);
  EXPECT_EQ(e.code, kErrorCodeLimit) << e.text;
  EXPECT_TRUE(Contains(e.text, "evicted")) << e.text;
  EXPECT_TRUE(Contains(e.text, "max_unauthenticated_per_source")) << e.text;
  EXPECT_TRUE(RawSeesClose(from2[0]));
  ASSERT_TRUE(server->WaitFor([&] { return server->accepted_.size() == 6; }));
  EXPECT_EQ(server->sc().connections_evicted(), 1u);
  for (int fd : {from2[1], from2[2], other, newest, member}) {
    EXPECT_TRUE(RawStillOpen(fd));
  }
  EXPECT_EQ(server->sc().open_unauthenticated(), 4u);  // 3 from .2, 1 from .3
  // The newest can still authenticate: it was not the one to go.
  RawWrite(newest, EncodeControl(Join("w1")));
  ASSERT_TRUE(server->WaitFor([&] { return server->messages_.size() == 2; }));
  EXPECT_EQ(server->sc().open_unauthenticated(), 3u);
  for (int fd : from2) close(fd);
  for (int fd : {other, newest, member}) close(fd);
}

// Over the total budget the most-represented source gives way, quiet
// connections before ones that sent something: a flood from other
// addresses never evicts a newcomer from this one.
TEST(ControlSidecarLimits, OverTheBudgetTheMostRepresentedSourceGivesWay) {
  ControlLimits l = NoLimits();
  l.max_unauthenticated = 4;
  auto server = StartServer(l, TrustOn::kNever);
  const uint16_t port = server->sc().bound_port();
  std::vector<int> flood;
  for (int i = 0; i < 4; ++i) {
    flood.push_back(RawConnectFrom(2, port));
    ASSERT_TRUE(server->WaitFor(
        [&] { return server->accepted_.size() == flood.size(); }));
  }
  // The first flood connection spoke: the second (quiet) goes first.
  RawWrite(flood[0], EncodeControl(Join("x")));
  ASSERT_TRUE(server->WaitFor([&] { return server->messages_.size() == 1; }));
  const int worker = RawConnectFrom(3, port);
  EXPECT_TRUE(Contains(ReadError(flood[1]).text, "max_unauthenticated"));
  EXPECT_TRUE(RawSeesClose(flood[1]));
  // Each newcomer from .2 evicts .2's oldest quiet one, never the worker.
  for (int i = 0; i < 6; ++i) {
    flood.push_back(RawConnectFrom(2, port));
    ASSERT_TRUE(server->WaitFor(
        [&] { return server->sc().connections_evicted() == uint64_t(i) + 2; }));
  }
  // The last newcomer is added after its eviction is counted.
  ASSERT_TRUE(server->WaitFor([&] { return server->accepted_.size() == 11; }));
  EXPECT_TRUE(RawStillOpen(worker));
  EXPECT_TRUE(RawStillOpen(flood[0]));  // spoke: the quiet went before it
  EXPECT_EQ(server->sc().open_unauthenticated(), 4u);
  EXPECT_EQ(server->sc().connections_refused(), 0u);
  const auto logs = [&] {
    std::lock_guard lock(server->mu_);
    return server->logs_;
  }();
  ASSERT_EQ(logs.size(), 1u);  // one line per period, not per eviction
  EXPECT_TRUE(Contains(logs[0], "--control_max_unauthenticated")) << logs[0];
  close(worker);
  for (int fd : flood) close(fd);
}

TEST(ControlSidecarLimits, JoinDeadlineClosesUntrustedButNotTrusted) {
  ControlLimits l = NoLimits();
  l.join_deadline = milliseconds(150);
  auto server = StartServer(l, TrustOn::kJoin);
  const uint16_t port = server->sc().bound_port();
  const auto t0 = Clock::now();
  const int stranger = RawConnect(port);
  const int member = RawConnect(port);
  RawWrite(member, EncodeControl(Join("w0")));
  ASSERT_TRUE(server->WaitFor([&] { return server->messages_.size() == 1; }));
  const ConnId member_id = server->messages()[0].first;
  EXPECT_TRUE(server->Call(
      [&](ControlSidecar& sc) { return sc.IsTrusted(member_id); }));

  const ErrorMsg e = ReadError(stranger);
  const auto took = Clock::now() - t0;
  EXPECT_EQ(e.code, kErrorCodeLimit) << e.text;
  EXPECT_TRUE(Contains(e.text, "join_deadline")) << e.text;
  EXPECT_TRUE(RawSeesClose(stranger));
  EXPECT_GE(took, milliseconds(140));
  EXPECT_LT(took, milliseconds(3000));
  close(stranger);
  ASSERT_TRUE(server->WaitFor([&] { return server->closed_.size() == 1; }));
  EXPECT_TRUE(Contains(server->closed()[0].second, "join deadline"))
      << server->closed()[0].second;
  EXPECT_NE(server->closed()[0].first, member_id);
  EXPECT_EQ(server->sc().join_timeouts(), 1u);

  // The trusted one outlives the deadline several times and is served.
  std::this_thread::sleep_for(milliseconds(500));
  RawWrite(member, EncodeControl(ByeMsg{.reason = "still here"}));
  ASSERT_TRUE(server->WaitFor([&] { return server->messages_.size() == 2; }));
  EXPECT_EQ(server->closed().size(), 1u);
  EXPECT_EQ(server->sc().join_timeouts(), 1u);
  close(member);
}

TEST(ControlSidecarLimits, PartialFrameTimesOutTrustedOrNot) {
  ControlLimits l = NoLimits();
  l.partial_message_timeout = milliseconds(150);
  auto server = StartServer(l, TrustOn::kJoin);
  const uint16_t port = server->sc().bound_port();
  // Untrusted: a length prefix and a few bytes of the body, then silence.
  const int untrusted = RawConnect(port);
  auto bytes = LengthPrefix(1000);
  bytes.insert(bytes.end(), {static_cast<uint8_t>(ControlType::kBye), 0, 5});
  const auto t0 = Clock::now();
  RawWrite(untrusted, bytes);
  // Trusted (after its JOIN): the same truncated message.
  const int trusted = RawConnect(port);
  RawWrite(trusted, EncodeControl(Join("w0")));
  RawWrite(trusted, bytes);
  // A frame completed in pieces within the timeout is fine, and an idle
  // connection (no frame begun) is not touched.
  const int slow = RawConnect(port);
  const int idle = RawConnect(port);
  const auto bye = EncodeControl(ByeMsg{.reason = "in pieces"});
  RawWrite(slow, std::vector<uint8_t>(bye.begin(), bye.begin() + 3));
  std::this_thread::sleep_for(milliseconds(50));
  RawWrite(slow, std::vector<uint8_t>(bye.begin() + 3, bye.end()));

  for (const int fd : {untrusted, trusted}) {
    const ErrorMsg e = ReadError(fd);
    EXPECT_EQ(e.code, kErrorCodeLimit) << e.text;
    EXPECT_TRUE(Contains(e.text, "partial_message_timeout")) << e.text;
    EXPECT_TRUE(RawSeesClose(fd));
  }
  EXPECT_GE(Clock::now() - t0, milliseconds(140));
  ASSERT_TRUE(server->WaitFor([&] { return server->closed_.size() == 2; }));
  for (const auto& [id, reason] : server->closed()) {
    EXPECT_TRUE(Contains(reason, "partial message timeout")) << reason;
  }
  EXPECT_EQ(server->sc().partial_timeouts(), 2u);
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(server->closed().size(), 2u) << "slow or idle connection closed";
  const auto msgs = server->messages();
  ASSERT_EQ(msgs.size(), 2u);  // the JOIN and the BYE sent in pieces
  EXPECT_EQ(msgs[1].second, ControlMessage(ByeMsg{.reason = "in pieces"}));
  for (const int fd : {untrusted, trusted, slow, idle}) close(fd);
}

TEST(ControlSidecarLimits, UntrustedFrameLimitOnThePrefixTrustedGetsMaxFrame) {
  ControlLimits l = NoLimits();
  l.max_untrusted_frame = 1024;
  auto server = StartServer(l, TrustOn::kJoin);
  const uint16_t port = server->sc().bound_port();

  // Exactly the limit (type + body = 1024 bytes) passes untrusted.
  const int edge = RawConnect(port);
  const ByeMsg at_limit{.reason = std::string(1024 - 3, 'x')};
  const auto at_limit_bytes = EncodeControl(at_limit);
  ASSERT_EQ(at_limit_bytes.size(), kControlFrameHeader + 1024);
  RawWrite(edge, at_limit_bytes);
  ASSERT_TRUE(server->WaitFor([&] { return server->messages_.size() == 1; }));

  // One byte more is refused on the length prefix alone, at once.
  const int big = RawConnect(port);
  const auto t0 = Clock::now();
  RawWrite(big, LengthPrefix(1025));
  const ErrorMsg e = ReadError(big);
  EXPECT_LT(Clock::now() - t0, milliseconds(1000));
  EXPECT_EQ(e.code, kErrorCodeProtocol +
                        static_cast<uint16_t>(ControlError::kFrameTooLarge));
  EXPECT_TRUE(Contains(e.text, "max_untrusted_frame")) << e.text;
  EXPECT_TRUE(RawSeesClose(big));
  ASSERT_TRUE(server->WaitFor([&] { return server->closed_.size() == 1; }));
  EXPECT_TRUE(Contains(server->closed()[0].second, "max_untrusted_frame"))
      << server->closed()[0].second;
  EXPECT_EQ(server->sc().protocol_errors(), 1u);

  // A JOIN and a large frame in one write: the JOIN's callback trusts the
  // connection before the large frame's prefix is checked.
  const int member = RawConnect(port);
  auto bytes = EncodeControl(Join("w0"));
  const auto bitmap = RandomBitmap(64 * 1024, 5);  // 8 KiB of words
  const auto bitmap_bytes = EncodeControl(bitmap);
  bytes.insert(bytes.end(), bitmap_bytes.begin(), bitmap_bytes.end());
  RawWrite(member, bytes);
  ASSERT_TRUE(server->WaitFor([&] { return server->messages_.size() == 3; }));
  EXPECT_TRUE(server->messages()[2].second == ControlMessage(bitmap));
  EXPECT_EQ(server->closed().size(), 1u);
  EXPECT_EQ(server->sc().protocol_errors(), 1u);
  for (const int fd : {edge, big, member}) close(fd);
}

TEST(ControlSidecarLimits, IdleTimeoutClosesOnlyQuietConnections) {
  ControlLimits l = NoLimits();
  l.idle_timeout = milliseconds(150);
  auto server = StartServer(l, TrustOn::kJoin);
  const uint16_t port = server->sc().bound_port();
  const int quiet = RawConnect(port);
  const int chatty = RawConnect(port);
  RawWrite(chatty, EncodeControl(Join("w0")));
  // Keeps talking for 3x the timeout: never idle that long.
  const auto t0 = Clock::now();
  while (Clock::now() - t0 < milliseconds(450)) {
    RawWrite(chatty, EncodeControl(ByeMsg{.reason = "tick"}));
    std::this_thread::sleep_for(milliseconds(30));
  }
  const ErrorMsg e = ReadError(quiet);
  EXPECT_EQ(e.code, kErrorCodeLimit) << e.text;
  EXPECT_TRUE(Contains(e.text, "idle_timeout")) << e.text;
  EXPECT_TRUE(RawSeesClose(quiet));
  ASSERT_TRUE(server->WaitFor([&] { return server->closed_.size() >= 1; }));
  EXPECT_EQ(server->closed().size(), 1u) << "the chatty one was closed too";
  EXPECT_EQ(server->sc().idle_timeouts(), 1u);
  // Once it stops, it is idle as well (trusted or not).
  const ErrorMsg e2 = ReadError(chatty);
  EXPECT_TRUE(Contains(e2.text, "idle_timeout")) << e2.text;
  ASSERT_TRUE(server->WaitFor([&] { return server->closed_.size() == 2; }));
  EXPECT_TRUE(Contains(server->closed()[1].second, "idle timeout"))
      << server->closed()[1].second;
  EXPECT_EQ(server->sc().idle_timeouts(), 2u);
  close(quiet);
  close(chatty);
}

TEST(ControlSidecarLimits, ConnectedConnectionsStartTrusted) {
  // A client's connection to its server is not subject to the join deadline
  // or the untrusted frame limit (its peer is the one it chose).
  ControlLimits l = NoLimits();
  l.join_deadline = milliseconds(50);
  l.max_untrusted_frame = 64;
  Node server(kMaxControlFrame, 0, ControlLimits{}, TrustOn::kAccept);
  std::string err;
  ASSERT_TRUE(server.sc().Listen("127.0.0.1:0", &err)) << err;
  Node client(kMaxControlFrame, 0, l);
  ConnId conn = 0;
  ASSERT_TRUE(
      client.sc().Connect(Addr(server.sc().bound_port()), 2000, &conn, &err))
      << err;
  EXPECT_TRUE(client.sc().IsTrusted(conn));
  server.Start();
  client.Start();
  ASSERT_TRUE(server.WaitFor([&] { return server.accepted_.size() == 1; }));
  std::this_thread::sleep_for(milliseconds(200));
  const auto bitmap = RandomBitmap(8192, 9);  // 1 KiB > 64
  EXPECT_TRUE(server.Send(server.accepted()[0], bitmap));
  ASSERT_TRUE(client.WaitFor([&] { return client.messages_.size() == 1; }));
  EXPECT_TRUE(client.messages()[0].second == ControlMessage(bitmap));
  EXPECT_TRUE(client.closed().empty());
  EXPECT_EQ(client.sc().join_timeouts(), 0u);
}

TEST(ControlSidecarLimits, ManyStalledConnectionsAllClosedAndFreed) {
  // Many strangers, half silent and half holding a partial frame just under
  // the untrusted limit: every one is closed by a limit and its socket
  // released (no fd leak), and the counters add up.
  ControlLimits l = NoLimits();
  l.max_connections = 64;
  l.join_deadline = milliseconds(300);
  l.partial_message_timeout = milliseconds(150);
  l.max_untrusted_frame = 32 * 1024;
  const size_t fds_before = OpenFds();
  {
    auto server = StartServer(l, TrustOn::kNever);
    const uint16_t port = server->sc().bound_port();
    std::vector<int> fds;
    for (int i = 0; i < 40; ++i) {
      const int fd = RawConnect(port);
      if (i % 2 == 1) {
        auto bytes = LengthPrefix(32 * 1024);
        bytes.push_back(static_cast<uint8_t>(ControlType::kBye));
        bytes.resize(bytes.size() + 30 * 1024, 0);
        RawWrite(fd, bytes);
      }
      fds.push_back(fd);
    }
    for (const int fd : fds) {
      EXPECT_EQ(ReadError(fd).code, kErrorCodeLimit);
      EXPECT_TRUE(RawSeesClose(fd));
      close(fd);
    }
    ASSERT_TRUE(server->WaitFor([&] { return server->closed_.size() == 40; }));
    EXPECT_EQ(server->sc().partial_timeouts(), 20u);
    EXPECT_EQ(server->sc().join_timeouts(), 20u);
    EXPECT_EQ(server->sc().open_connections(), 0u);
  }
  EXPECT_EQ(OpenFds(), fds_before);
}

}  // namespace
}  // namespace dblp

// ---- authenticated channels (Authenticate, TAG) ----------------------------

namespace dblp {
namespace {

ChannelKeys Keys(uint8_t s, uint8_t r) {
  ChannelKeys k;
  k.send.fill(s);
  k.recv.fill(r);
  return k;
}

// A message and its TAG as a peer holding `key` would send it.
std::vector<uint8_t> Tagged(const ControlMessage& m, uint8_t key_fill,
                            uint64_t seq) {
  std::vector<uint8_t> frame = EncodeControl(m);
  AuthBytes key;
  key.fill(key_fill);
  uint8_t seq_be[8];
  for (int i = 0; i < 8; ++i) {
    seq_be[i] = static_cast<uint8_t>(seq >> (56 - 8 * i));
  }
  std::vector<uint8_t> out = frame;
  EncodeControl(TagMsg{seq, HmacSha256(key, "dblp/4 tag", {seq_be, frame})},
                out);
  return out;
}

TEST(ControlSidecarAuth, BothEndsAuthenticatedExchangeEveryType) {
  Pair p;
  p.server.Call([&](ControlSidecar& sc) {
    sc.Authenticate(p.server.accepted()[0], Keys(1, 2));
    return 0;
  });
  p.client.Call([&](ControlSidecar& sc) {
    sc.Authenticate(p.client_conn, Keys(2, 1));
    return 0;
  });
  const auto all = AllMessages();
  for (const auto& m : all) ASSERT_TRUE(p.client.Send(p.client_conn, m));
  ASSERT_TRUE(p.server.WaitFor(
      [&] { return p.server.messages_.size() == all.size(); }));
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(p.server.messages()[i].second, all[i]);
  }
  EXPECT_EQ(p.server.sc().protocol_errors(), 0u);
}

TEST(ControlSidecarAuth, UntaggedForgedReplayedAndReorderedAreRefused) {
  struct Case {
    const char* what;
    std::vector<uint8_t> bytes;
  };
  const ProbeMsg probe{.round = 3, .direction = Direction::kPush, .pass = 1};
  const StopMsg stop{.round = 3, .direction = Direction::kPush};
  std::vector<uint8_t> replay = Tagged(probe, 7, 0);
  const std::vector<uint8_t> again = Tagged(probe, 7, 0);
  replay.insert(replay.end(), again.begin(), again.end());
  std::vector<uint8_t> untagged = EncodeControl(probe);
  EncodeControl(stop, untagged);  // the first is held for its TAG till now
  std::vector<uint8_t> changed = Tagged(probe, 7, 0);
  changed[5 + 3] ^= 1;  // the round, after the MAC was made
  const Case cases[] = {
      {"untagged", untagged},
      {"wrong key", Tagged(probe, 8, 0)},
      {"out of sequence", Tagged(stop, 7, 1)},
      {"replayed", replay},
      {"changed", changed},
      {"a TAG alone", EncodeControl(TagMsg{})},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Node server;
    ASSERT_TRUE(server.sc().Listen("127.0.0.1:0", nullptr));
    server.Start();
    const int raw = RawConnect(server.sc().bound_port());
    ASSERT_TRUE(server.WaitFor([&] { return server.accepted_.size() == 1; }));
    server.Call([&](ControlSidecar& sc) {
      sc.Authenticate(server.accepted()[0], Keys(9, 7));
      return 0;
    });
    RawWrite(raw, c.bytes);
    // A further, valid pair must not be delivered either: the channel is
    // closed at the first fault.
    ControlDecoder dec;
    ControlMessage m;
    bool saw_error = false;
    while (RawReadMessage(raw, dec, &m)) {
      if (std::holds_alternative<ErrorMsg>(m)) saw_error = true;
    }
    EXPECT_TRUE(saw_error);
    ASSERT_TRUE(server.WaitFor([&] { return server.closed_.size() == 1; }));
    const size_t delivered = server.messages().size();
    // "replayed" delivers its first, genuine copy; nothing else gets in.
    EXPECT_EQ(delivered, std::string(c.what) == "replayed" ? 1u : 0u);
    EXPECT_EQ(server.sc().protocol_errors(), 1u);
    close(raw);
  }
}

TEST(ControlSidecarAuth, AGenuinePairIsDelivered) {
  Node server;
  ASSERT_TRUE(server.sc().Listen("127.0.0.1:0", nullptr));
  server.Start();
  const int raw = RawConnect(server.sc().bound_port());
  ASSERT_TRUE(server.WaitFor([&] { return server.accepted_.size() == 1; }));
  server.Call([&](ControlSidecar& sc) {
    sc.Authenticate(server.accepted()[0], Keys(9, 7));
    return 0;
  });
  std::vector<uint8_t> two = Tagged(ByeMsg{.reason = "a"}, 7, 0);
  const std::vector<uint8_t> second = Tagged(ByeMsg{.reason = "b"}, 7, 1);
  two.insert(two.end(), second.begin(), second.end());
  RawWrite(raw, two);
  ASSERT_TRUE(server.WaitFor([&] { return server.messages_.size() == 2; }));
  EXPECT_EQ(server.messages()[1].second, ControlMessage(ByeMsg{.reason = "b"}));
  // What the server sends back is tagged under its own key.
  ASSERT_TRUE(server.Send(server.accepted()[0], ByeMsg{.reason = "c"}));
  ControlDecoder dec;
  ControlMessage m1, m2;
  ASSERT_TRUE(RawReadMessage(raw, dec, &m1));
  ASSERT_TRUE(RawReadMessage(raw, dec, &m2));
  const auto* tag = std::get_if<TagMsg>(&m2);
  ASSERT_NE(tag, nullptr);
  const std::vector<uint8_t> want = Tagged(m1, 9, 0);
  ControlDecoder back;
  back.Feed(want.data(), want.size());
  ControlMessage a, b;
  ASSERT_EQ(back.Next(a), ControlDecoder::Status::kMessage);
  ASSERT_EQ(back.Next(b), ControlDecoder::Status::kMessage);
  EXPECT_EQ(std::get<TagMsg>(b), *tag);
  close(raw);
}

}  // namespace
}  // namespace dblp
