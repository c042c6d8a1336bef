#include "dblp/sender_round.h"
