#include "dblp/control.h"
