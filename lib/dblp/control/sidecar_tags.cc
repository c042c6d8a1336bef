// The control sidecar's authenticated channel: once a connection has its
// keys (after the JOIN handshake), every message goes out with a TAG (an
// HMAC over a sequence number and the message) and comes in only with
// its TAG, in sequence.
#include <span>
#include <string>

#include "dblp/control/sidecar_internal.h"
#include "dblp/security/hmac.h"

namespace dblp {

void ControlSidecar::Trust(ConnId id) {
  Conn* c = Find(id);
  if (c == nullptr || c->closing || c->fd < 0) return;
  if (!c->trusted) CountUntrusted(*c, -1);
  c->trusted = true;
}

void ControlSidecar::Authenticate(ConnId id, const ChannelKeys& keys) {
  Conn* c = Find(id);
  if (c == nullptr || c->closing || c->fd < 0) return;
  c->keys = std::make_unique<ChannelKeys>(keys);
  c->send_seq = c->recv_seq = 0;
}

namespace {

// A TAG's MAC: the direction's key over the sequence number and the
// message's canonical encoding (what was, or would have been, sent).
AuthBytes TagMac(const AuthBytes& key, uint64_t seq,
                 std::span<const uint8_t> frame) {
  uint8_t seq_be[8];
  for (int i = 0; i < 8; ++i)
    seq_be[i] = static_cast<uint8_t>(seq >> (56 - 8 * i));
  return HmacSha256(key, "dblp/4 tag", {seq_be, frame});
}

}  // namespace

void ControlSidecar::Append(Conn& c, const ControlMessage& m) {
  const size_t start = c.out.size();
  EncodeControl(m, c.out);  // leaves out unchanged if it throws
  if (c.keys) {
    try {
      const std::span<const uint8_t> frame(c.out.data() + start,
                                           c.out.size() - start);
      const TagMsg tag{c.send_seq, TagMac(c.keys->send, c.send_seq, frame)};
      EncodeControl(tag, c.out);
    } catch (...) {
      c.out.resize(start);  // never a message without its TAG
      throw;
    }
    ++c.send_seq;
  }
  messages_out_.fetch_add(1, std::memory_order_relaxed);
}

// False also if libcrypto fails: the message is not delivered.
bool ControlSidecar::TagMatches(Conn& c, const TagMsg& tag) {
  try {
    return AuthEqual(
        tag.mac, TagMac(c.keys->recv, c.recv_seq, EncodeControl(*c.untagged)));
  } catch (const std::exception& e) {
    Log(std::string("control sidecar: ") + e.what());
    return false;
  }
}

// An authenticated channel delivers a message only with its TAG, in
// sequence. Returns false (the connection is closing) on anything else.
bool ControlSidecar::CheckTag(Conn& c, ControlMessage& m, bool* deliver) {
  *deliver = false;
  const auto* tag = std::get_if<TagMsg>(&m);
  std::string why;
  if (tag == nullptr) {
    if (!c.untagged) {
      c.untagged = std::move(m);
      return true;  // its TAG comes next
    }
    why = std::string(ControlTypeName(*c.untagged)) + " without its TAG";
  } else if (!c.untagged) {
    why = "TAG without a message";
  } else if (tag->seq != c.recv_seq || !TagMatches(c, *tag)) {
    why = std::string(ControlTypeName(*c.untagged)) +
          " failed authentication (TAG " + std::to_string(tag->seq) +
          ", expected " + std::to_string(c.recv_seq) +
          "): injected, changed, replayed or reordered on the way";
  } else {
    ++c.recv_seq;
    m = std::move(*c.untagged);
    c.untagged.reset();
    *deliver = true;
    return true;
  }
  protocol_errors_.fetch_add(1, std::memory_order_relaxed);
  CloseWithError(c, kErrorCodeProtocol, "protocol error: " + why);
  return false;
}

bool ControlSidecar::IsTrusted(ConnId id) const {
  const Conn* c = Find(id);
  return c != nullptr && c->trusted;
}

}  // namespace dblp
