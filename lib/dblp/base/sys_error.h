// The texts of failed system calls, said one way by every socket owner
// (the control sidecar's TCP listener, the kernel-UDP data socket).
#pragma once

#include <string>
#include <string_view>

namespace dblp {

// "Connection refused (errno 111)".
std::string ErrnoText(int err);

// Why bind() failed with `err`, and the fix: `in_use` is what to do about
// an address already taken, `local` which addresses are this host's.
std::string BindFailureText(int err, std::string_view in_use,
                            std::string_view local);

}  // namespace dblp
