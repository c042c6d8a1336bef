// "ip:port" text <-> sockaddr_in, shared by the TCP control sidecar and the
// kernel UDP transport. Only IPv4 literals and "localhost": the data plane
// is IPv4, and a name lookup could block a thread on DNS.
#pragma once

#include <netinet/in.h>

#include <string>

namespace dblp {

// Parses "ip:port" (IPv4 literal, "localhost", or "*"/"" for any address
// when `allow_any`). Port 0 is accepted only with `allow_any_port`. On
// failure returns false with *error naming the problem and `example`.
bool ParseIpv4Endpoint(const std::string& text, bool allow_any,
                       bool allow_any_port, const std::string& example,
                       sockaddr_in* out, std::string* error);
std::string FormatIpv4Endpoint(const sockaddr_in& sa);

}  // namespace dblp
