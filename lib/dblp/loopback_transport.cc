#include "dblp/loopback_transport.h"
