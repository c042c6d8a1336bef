#include "dblp/clr_detector.h"
