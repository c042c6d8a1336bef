#include "eal_app.h"
