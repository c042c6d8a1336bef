#include "dblp/tolerance.h"
