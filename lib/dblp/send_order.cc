#include "dblp/send_order.h"
