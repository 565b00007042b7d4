// DeepSpeed's "aio" settings of the NVMe tier's asynchronous I/O
// (offload/aio_engine.h), with DeepSpeed's defaults.
#ifndef MEMWALL_OFFLOAD_AIO_CONFIG_H_
#define MEMWALL_OFFLOAD_AIO_CONFIG_H_

#include <cstdint>

namespace memwall {

struct AioConfig {
  int64_t block_size = 1 << 20;  // bytes per request, a multiple of 4096
  int queue_depth = 8;           // requests in flight per thread
  int thread_count = 1;          // threads, each with its own AIO context
  bool single_submit = false;    // one request per io_submit call
  bool overlap_events = true;    // refill the queue as requests complete
};

}  // namespace memwall

#endif  // MEMWALL_OFFLOAD_AIO_CONFIG_H_
