#include <gtest/gtest.h>
#include "dblp/udp_transport.h"
TEST(UdpSocketPort, Opens) {}
