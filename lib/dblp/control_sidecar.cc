#include "dblp/control_sidecar.h"
