#include "dblp/latency_stats.h"
