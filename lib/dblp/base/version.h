// The build's version: `git describe --always --dirty` of the source tree
// at build time (meson's project version without git). --version prints it
// and every DPDK app logs it with its command line.
#pragma once

namespace dblp {

const char* Version();

}  // namespace dblp
