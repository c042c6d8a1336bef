#include "dblp/base/ipv4_endpoint.h"

#include <arpa/inet.h>

#include <algorithm>

namespace dblp {

bool ParseIpv4Endpoint(const std::string& text, bool allow_any,
                       bool allow_any_port, const std::string& example,
                       sockaddr_in* out, std::string* error) {
  auto fail = [&](const std::string& why) {
    if (error) {
      *error = "bad address '" + text + "': " + why +
               " (expected IPv4 ip:port, e.g. " + example + ")";
    }
    return false;
  };
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos) return fail("no ':port'");
  const std::string host = text.substr(0, colon);
  const std::string port_s = text.substr(colon + 1);
  if (port_s.empty() || port_s.size() > 5 ||
      !std::all_of(port_s.begin(), port_s.end(),
                   [](char c) { return c >= '0' && c <= '9'; })) {
    return fail("port '" + port_s + "' is not a number in 0..65535");
  }
  const unsigned long port = std::stoul(port_s);
  if (port > 65535) return fail("port " + port_s + " > 65535");
  if (port == 0 && !allow_any_port) return fail("port 0 cannot be sent to");
  *out = sockaddr_in{};
  out->sin_family = AF_INET;
  out->sin_port = htons(static_cast<uint16_t>(port));
  if (host.empty() || host == "*") {
    if (!allow_any) return fail("no host");
    out->sin_addr.s_addr = htonl(INADDR_ANY);
  } else if (host == "localhost") {
    out->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  } else if (inet_pton(AF_INET, host.c_str(), &out->sin_addr) != 1) {
    return fail("host '" + host + "' is not an IPv4 address");
  }
  return true;
}

std::string FormatIpv4Endpoint(const sockaddr_in& sa) {
  char ip[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
  return std::string(ip) + ":" + std::to_string(ntohs(sa.sin_port));
}

}  // namespace dblp
