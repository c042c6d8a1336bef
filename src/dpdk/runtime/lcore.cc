#include "runtime/lcore.h"

#include "dblp/job/diagnosis.h"

namespace dblp {

std::string MeasuredHint(const DatapathCounters& c,
                         const RxLossInjector* loss) {
  return MeasuredCauses(c.mbuf_alloc_failures.load(std::memory_order_relaxed),
                        loss ? loss->dropped() : 0,
                        loss ? loss->considered() : 0);
}

}  // namespace dblp
