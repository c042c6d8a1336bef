// HMAC-SHA256 (OpenSSL's libcrypto) over a label and a list of parts, each
// length-prefixed so that no two lists give the same input. Used for the
// job's handshake (job_auth.h) and the control channel's tags
// (control_sidecar.h).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string_view>

#include "dblp/security/auth_bytes.h"

namespace dblp {

// Throws std::runtime_error if libcrypto fails.
AuthBytes HmacSha256(std::span<const uint8_t> key, std::string_view label,
                     std::initializer_list<std::span<const uint8_t>> parts);

}  // namespace dblp
