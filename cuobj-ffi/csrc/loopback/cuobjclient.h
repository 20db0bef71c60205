// The loopback provider: this project's own implementation of cuObject's client class
// (cuObjClient), written from NVIDIA's documented API, for hosts without libcuobjclient or an
// RDMA NIC. It pins and validates memory like the real library and mints DC v1-shaped tokens
// (81 characters, 7 lowercase hex fields) that only s3rdma's loopback endpoint understands:
//
//   <addr:16>:<size:8>:<pid:8>:<lid:4>:<reg:6>:<1>:<starttime:16><boot:16>
//
// addr and size are the transfer window (as in the real format); pid, the process start time
// (clock ticks since boot, /proc/<pid>/stat field 22) and the first 64 bits of the boot id
// identify the client process on this host, so that the endpoint can reach its memory with
// process_vm_readv/process_vm_writev and refuse a token from a recycled pid.
#ifndef S3RDMA_LOOPBACK_CUOBJCLIENT_H
#define S3RDMA_LOOPBACK_CUOBJCLIENT_H

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

typedef enum cuObjErr_enum { CU_OBJ_SUCCESS = 0, CU_OBJ_FAIL = 1 } cuObjErr_t;

typedef enum cuObjProto_enum { CUOBJ_PROTO_RDMA_DC_V1 = 1001, CUOBJ_PROTO_MAX } cuObjProto_t;

typedef enum cuObjOpType_enum { CUOBJ_GET = 0, CUOBJ_PUT = 1, CUOBJ_INVALID = 9999 } cuObjOpType_t;

typedef enum cuObjMemoryType_enum {
  CUOBJ_MEMORY_SYSTEM = 0,
  CUOBJ_MEMORY_CUDA_MANAGED = 1,
  CUOBJ_MEMORY_CUDA_DEVICE = 2,
  CUOBJ_MEMORY_UNKNOWN = 3,
  CUOBJ_MEMORY_INVALID = 4,
} cuObjMemoryType_t;

#define CUOBJ_MAX_MEMORY_REG_SIZE (4ULL * 1024 * 1024 * 1024 - 64 * 1024)
#define OBJ_RDMA_V1 "CUOBJ"

typedef struct cufileRDMAInfo {
  int version;
  int desc_len;
  const char *desc_str;
} cufileRDMAInfo_t;

typedef struct CUObjIOOps {
  ssize_t (*get)(const void *handle, char *ptr, size_t size, loff_t offset,
                 const cufileRDMAInfo_t *rdma_info);
  ssize_t (*put)(const void *handle, const char *ptr, size_t size, loff_t offset,
                 const cufileRDMAInfo_t *rdma_info);
} CUObjOps_t;

class cuObjClient {
 public:
  explicit cuObjClient(CUObjOps_t &ops, cuObjProto_t proto = CUOBJ_PROTO_RDMA_DC_V1);
  ~cuObjClient();

  bool isConnected();

  cuObjErr_t cuMemObjGetDescriptor(void *ptr, size_t size);
  cuObjErr_t cuMemObjPutDescriptor(void *ptr);
  ssize_t cuMemObjGetMaxRequestCallbackSize(void *ptr);

  cuObjErr_t cuMemObjGetRDMAToken(void *ptr, size_t size, size_t buffer_offset, cuObjOpType_t op,
                                  char **desc_str_out);
  cuObjErr_t cuMemObjPutRDMAToken(char *desc_str);

  ssize_t cuObjGet(void *ctx, void *ptr, size_t size, loff_t offset = 0, loff_t buf_offset = 0);
  ssize_t cuObjPut(void *ctx, void *ptr, size_t size, loff_t offset = 0, loff_t buf_offset = 0);

  static void *getCtx(const void *handle);
  static cuObjMemoryType_t getMemoryType(const void *ptr);

 private:
  struct Region {
    size_t size;
    uint32_t id;
  };
  // The registration containing [p, p+len), or nullptr.
  const Region *find(uintptr_t p, size_t len, uintptr_t *base) const;
  ssize_t transfer(void *ctx, void *ptr, size_t size, bool put);

  CUObjOps_t _userOps;
  cuObjProto_t _proto;
  std::mutex _lock;
  std::map<uintptr_t, Region> _regions;
  uint32_t _nextId;
  bool _identityOk;
  char _identity[33];  // starttime:16 + boot:16
};

#endif
