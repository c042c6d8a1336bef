#include "dblp/loss_model.h"
