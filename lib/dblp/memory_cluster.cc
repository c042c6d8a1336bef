#include "dblp/memory_cluster.h"
