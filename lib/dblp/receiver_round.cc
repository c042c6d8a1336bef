#include "dblp/receiver_round.h"
