// Thread-count policy for the row-parallel CPU kernels.
#include "kernels/parallel.h"

namespace arpo {
namespace kernels {

int32_t resolve_threads(int32_t requested, int64_t work_items, int64_t min_items_per_thread) {
  int64_t t = requested > 0 ? requested : static_cast<int64_t>(std::thread::hardware_concurrency());
  if (t < 1) t = 1;
  if (min_items_per_thread < 1) min_items_per_thread = 1;
  const int64_t by_work = (work_items + min_items_per_thread - 1) / min_items_per_thread;
  t = std::min(t, std::max<int64_t>(1, by_work));
  return static_cast<int32_t>(std::min<int64_t>(t, 256));
}

}  // namespace kernels
}  // namespace arpo
