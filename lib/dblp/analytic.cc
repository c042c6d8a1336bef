#include "dblp/analytic.h"
