// extern "C" shim over cuObjClient. Compiled against NVIDIA's cuobjclient.h, or against the
// loopback provider's header of the same name (loopback/cuobjclient.h). Every call catches
// exceptions: none may cross into Rust.
#include "cuobj_shim.h"

#include <cstring>
#include <new>

#include "cuobjclient.h"

#ifndef S3RDMA_CUOBJ_PROVIDER
#error "S3RDMA_CUOBJ_PROVIDER must name the provider"
#endif

#if defined(S3RDMA_CUOBJ_NVIDIA)
// The shim embeds the class by value, and the library's constructor writes all of it: a header
// edited by a third party (64 bytes, no limit macro) would let it write past the object.
static_assert(sizeof(cuObjClient) == 72,
              "cuobjclient.h declares a cuObjClient that is not the genuine 72-byte class (a header "
              "edited by a third party?): build against the header shipped with the library, in "
              "the CUDA toolkit or CUOBJ_HOME/include");
#endif

struct s3rdma_cuobj_client {
  CUObjOps_t ops;
  cuObjClient client;
  s3rdma_cuobj_client() : ops(), client(ops, CUOBJ_PROTO_RDMA_DC_V1) {}
};

extern "C" {

const char *s3rdma_cuobj_provider(void) { return S3RDMA_CUOBJ_PROVIDER; }

uint64_t s3rdma_cuobj_max_registration_size(void) {
  // Library 1.2+ refuses more than 4 GiB - 64 KiB, whatever the header says (1.0's: 4 GiB).
  const unsigned long long cap = 0xffff0000ULL;
#ifdef CUOBJ_MAX_MEMORY_REG_SIZE
  const unsigned long long lib = (unsigned long long)(CUOBJ_MAX_MEMORY_REG_SIZE);
  return lib < cap ? lib : cap;
#else
  return cap;
#endif
}

s3rdma_cuobj_client *s3rdma_cuobj_client_new(void) {
  try {
    return new s3rdma_cuobj_client();
  } catch (...) {
    return nullptr;
  }
}

void s3rdma_cuobj_client_free(s3rdma_cuobj_client *c) {
  try {
    delete c;
  } catch (...) {
  }
}

int s3rdma_cuobj_is_connected(s3rdma_cuobj_client *c) {
  if (!c) return 0;
  try {
    return c->client.isConnected() ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

int s3rdma_cuobj_register(s3rdma_cuobj_client *c, void *ptr, size_t size) {
  if (!c || !ptr || size == 0) return S3RDMA_CUOBJ_FAIL;
  try {
    return c->client.cuMemObjGetDescriptor(ptr, size) == CU_OBJ_SUCCESS ? S3RDMA_CUOBJ_OK
                                                                        : S3RDMA_CUOBJ_FAIL;
  } catch (...) {
    return S3RDMA_CUOBJ_FAIL;
  }
}

int s3rdma_cuobj_deregister(s3rdma_cuobj_client *c, void *ptr) {
  if (!c) return S3RDMA_CUOBJ_FAIL;
  try {
    return c->client.cuMemObjPutDescriptor(ptr) == CU_OBJ_SUCCESS ? S3RDMA_CUOBJ_OK
                                                                 : S3RDMA_CUOBJ_FAIL;
  } catch (...) {
    return S3RDMA_CUOBJ_FAIL;
  }
}

int s3rdma_cuobj_get_token(s3rdma_cuobj_client *c, void *ptr, size_t size, size_t buffer_offset,
                           int op, char **out) {
  if (!c || !ptr || !out || size == 0) return S3RDMA_CUOBJ_FAIL;
  if (op != S3RDMA_CUOBJ_GET && op != S3RDMA_CUOBJ_PUT) return S3RDMA_CUOBJ_FAIL;
  *out = nullptr;
  try {
    cuObjOpType_t kind = op == S3RDMA_CUOBJ_GET ? CUOBJ_GET : CUOBJ_PUT;
    char *desc = nullptr;
    if (c->client.cuMemObjGetRDMAToken(ptr, size, buffer_offset, kind, &desc) != CU_OBJ_SUCCESS ||
        !desc) {
      return S3RDMA_CUOBJ_FAIL;
    }
    *out = desc;
    return S3RDMA_CUOBJ_OK;
  } catch (...) {
    return S3RDMA_CUOBJ_FAIL;
  }
}

int s3rdma_cuobj_put_token(s3rdma_cuobj_client *c, char *token) {
  if (!c || !token) return S3RDMA_CUOBJ_FAIL;
  try {
    return c->client.cuMemObjPutRDMAToken(token) == CU_OBJ_SUCCESS ? S3RDMA_CUOBJ_OK
                                                                  : S3RDMA_CUOBJ_FAIL;
  } catch (...) {
    return S3RDMA_CUOBJ_FAIL;
  }
}

int s3rdma_cuobj_memory_type(const void *ptr) {
  try {
    switch (cuObjClient::getMemoryType(ptr)) {
      case CUOBJ_MEMORY_SYSTEM:
        return S3RDMA_CUOBJ_MEM_SYSTEM;
      case CUOBJ_MEMORY_CUDA_MANAGED:
        return S3RDMA_CUOBJ_MEM_CUDA_MANAGED;
      case CUOBJ_MEMORY_CUDA_DEVICE:
        return S3RDMA_CUOBJ_MEM_CUDA_DEVICE;
      case CUOBJ_MEMORY_UNKNOWN:
        return S3RDMA_CUOBJ_MEM_UNKNOWN;
      default:
        return S3RDMA_CUOBJ_MEM_INVALID;
    }
  } catch (...) {
    return S3RDMA_CUOBJ_MEM_INVALID;
  }
}

}  // extern "C"
