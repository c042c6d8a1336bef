#include "dblp/loss_fill.h"
