#include "dblp/base/sys_error.h"

#include <cerrno>
#include <cstring>

namespace dblp {

std::string ErrnoText(int err) {
  char buf[128];
  // GNU strerror_r may return a static string instead of filling buf.
  const char* s = strerror_r(err, buf, sizeof buf);
  return std::string(s) + " (errno " + std::to_string(err) + ")";
}

std::string BindFailureText(int err, std::string_view in_use,
                            std::string_view local) {
  switch (err) {
    case EADDRINUSE:
      return "address already in use (" + std::string(in_use) + ")";
    case EADDRNOTAVAIL:
      return "not an address of this host (use " + std::string(local) + ")";
    case EACCES:
      return "permission denied (ports below 1024 need root; use a higher "
             "port)";
    default:
      return "bind(): " + ErrnoText(err);
  }
}

}  // namespace dblp
