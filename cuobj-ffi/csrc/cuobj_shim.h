/* A plain-C view of cuObject's C++ client (cuObjClient), for bindgen. The same header and the
 * same shim (cuobj_shim.cc) serve both providers: NVIDIA's libcuobjclient, and the project's
 * loopback implementation of the same class (loopback/). */
#ifndef S3RDMA_CUOBJ_SHIM_H
#define S3RDMA_CUOBJ_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct s3rdma_cuobj_client s3rdma_cuobj_client;

/* Status codes (cuObjErr_t). */
#define S3RDMA_CUOBJ_OK 0
#define S3RDMA_CUOBJ_FAIL 1

/* Token operations (cuObjOpType_t). */
#define S3RDMA_CUOBJ_GET 0
#define S3RDMA_CUOBJ_PUT 1

/* Memory types (cuObjMemoryType_t). */
#define S3RDMA_CUOBJ_MEM_SYSTEM 0
#define S3RDMA_CUOBJ_MEM_CUDA_MANAGED 1
#define S3RDMA_CUOBJ_MEM_CUDA_DEVICE 2
#define S3RDMA_CUOBJ_MEM_UNKNOWN 3
#define S3RDMA_CUOBJ_MEM_INVALID 4

/* "nvidia" or "loopback". */
const char *s3rdma_cuobj_provider(void);

/* min(CUOBJ_MAX_MEMORY_REG_SIZE, 0xFFFF0000): library 1.2+ refuses more (also without the
 * macro). */
uint64_t s3rdma_cuobj_max_registration_size(void);

/* NULL if the client cannot be constructed (any exception is caught). */
s3rdma_cuobj_client *s3rdma_cuobj_client_new(void);
void s3rdma_cuobj_client_free(s3rdma_cuobj_client *c);

/* 1 if a usable RDMA device was found, 0 otherwise. */
int s3rdma_cuobj_is_connected(s3rdma_cuobj_client *c);

/* Register (pin) [ptr, ptr+size); deregister by the same start pointer. */
int s3rdma_cuobj_register(s3rdma_cuobj_client *c, void *ptr, size_t size);
int s3rdma_cuobj_deregister(s3rdma_cuobj_client *c, void *ptr);

/* Mint a token for [ptr+buffer_offset, ptr+buffer_offset+size) of the registration starting at
 * ptr. On success *out is a library-owned string, freed by s3rdma_cuobj_put_token. */
int s3rdma_cuobj_get_token(s3rdma_cuobj_client *c, void *ptr, size_t size, size_t buffer_offset,
                           int op, char **out);
int s3rdma_cuobj_put_token(s3rdma_cuobj_client *c, char *token);

/* One of the S3RDMA_CUOBJ_MEM_* values. */
int s3rdma_cuobj_memory_type(const void *ptr);

#ifdef __cplusplus
}
#endif

#endif
