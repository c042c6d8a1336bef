// The 32-byte values of the job's handshake and its keys: nonces and
// HMAC-SHA256 outputs (job_auth.h, hmac.h).
#pragma once

#include <array>
#include <cstdint>

namespace dblp {

using AuthBytes = std::array<uint8_t, 32>;

}  // namespace dblp
