// The loopback provider's cuObjClient: see cuobjclient.h.
#include "cuobjclient.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>

namespace {

// The process start time in clock ticks since boot: field 22 of /proc/self/stat.
bool read_starttime(unsigned long long *out) {
  FILE *f = std::fopen("/proc/self/stat", "r");
  if (!f) return false;
  char buf[4096];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  // The command name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
  const char *p = std::strrchr(buf, ')');
  if (!p) return false;
  p += 2;  // field 3
  for (int field = 3; field < 22; ++field) {
    p = std::strchr(p, ' ');
    if (!p) return false;
    ++p;
  }
  return std::sscanf(p, "%llu", out) == 1;
}

// The first 16 hex digits of the boot id.
bool read_boot(char out[17]) {
  FILE *f = std::fopen("/proc/sys/kernel/random/boot_id", "r");
  if (!f) return false;
  char buf[64] = {0};
  bool ok = std::fgets(buf, sizeof(buf), f) != nullptr;
  std::fclose(f);
  if (!ok) return false;
  int k = 0;
  for (const char *p = buf; *p && k < 16; ++p) {
    if ((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')) out[k++] = *p;
  }
  out[k] = 0;
  return k == 16;
}

}  // namespace

cuObjClient::cuObjClient(CUObjOps_t &ops, cuObjProto_t proto)
    : _userOps(ops), _proto(proto), _nextId(1), _identityOk(false) {
  unsigned long long start = 0;
  char boot[17];
  if (read_starttime(&start) && read_boot(boot)) {
    std::snprintf(_identity, sizeof(_identity), "%016llx%s", start, boot);
    _identityOk = true;
  } else {
    _identity[0] = 0;
  }
}

cuObjClient::~cuObjClient() {
  std::lock_guard<std::mutex> g(_lock);
  for (auto &r : _regions) munlock(reinterpret_cast<void *>(r.first), r.second.size);
  _regions.clear();
}

// The loopback "device" is usable whenever this process can identify itself to the endpoint.
bool cuObjClient::isConnected() { return _identityOk; }

const cuObjClient::Region *cuObjClient::find(uintptr_t p, size_t len, uintptr_t *base) const {
  auto it = _regions.upper_bound(p);
  if (it == _regions.begin()) return nullptr;
  --it;
  if (p < it->first || len > it->second.size || p - it->first > it->second.size - len) {
    return nullptr;
  }
  if (base) *base = it->first;
  return &it->second;
}

cuObjErr_t cuObjClient::cuMemObjGetDescriptor(void *ptr, size_t size) {
  if (!ptr || size == 0 || size > CUOBJ_MAX_MEMORY_REG_SIZE) return CU_OBJ_FAIL;
  if (getMemoryType(ptr) != CUOBJ_MEMORY_SYSTEM) return CU_OBJ_FAIL;
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  if (p + size < p) return CU_OBJ_FAIL;
  std::lock_guard<std::mutex> g(_lock);
  // No overlap with an existing registration.
  auto next = _regions.lower_bound(p);
  if (next != _regions.end() && next->first < p + size) return CU_OBJ_FAIL;
  if (next != _regions.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > p) return CU_OBJ_FAIL;
  }
  // Pin it, as registering with an RDMA device does.
  if (mlock(ptr, size) != 0) return CU_OBJ_FAIL;
  _regions[p] = Region{size, _nextId++ & 0xffffff};
  return CU_OBJ_SUCCESS;
}

cuObjErr_t cuObjClient::cuMemObjPutDescriptor(void *ptr) {
  if (!ptr) return CU_OBJ_SUCCESS;
  std::lock_guard<std::mutex> g(_lock);
  auto it = _regions.find(reinterpret_cast<uintptr_t>(ptr));
  // Like the real library, a failed deregistration is not reported.
  if (it == _regions.end()) return CU_OBJ_SUCCESS;
  munlock(ptr, it->second.size);
  _regions.erase(it);
  return CU_OBJ_SUCCESS;
}

ssize_t cuObjClient::cuMemObjGetMaxRequestCallbackSize(void *ptr) {
  if (!ptr) return -1;
  std::lock_guard<std::mutex> g(_lock);
  const Region *r = find(reinterpret_cast<uintptr_t>(ptr), 1, nullptr);
  if (!r) return -1;
  return static_cast<ssize_t>(r->size);
}

cuObjErr_t cuObjClient::cuMemObjGetRDMAToken(void *ptr, size_t size, size_t buffer_offset,
                                             cuObjOpType_t op, char **desc_str_out) {
  if (!desc_str_out) return CU_OBJ_FAIL;
  *desc_str_out = nullptr;
  if (!ptr || size == 0 || size > 0xffffffffULL) return CU_OBJ_FAIL;
  if (op != CUOBJ_GET && op != CUOBJ_PUT) return CU_OBJ_FAIL;
  if (!_identityOk) return CU_OBJ_FAIL;
  uintptr_t start = reinterpret_cast<uintptr_t>(ptr);
  if (start + buffer_offset < start) return CU_OBJ_FAIL;
  uintptr_t window = start + buffer_offset;
  uint32_t id;
  {
    std::lock_guard<std::mutex> g(_lock);
    // The window must lie inside the registration that ptr belongs to.
    uintptr_t base = 0;
    const Region *r = find(start, 1, &base);
    if (!r || window < base || size > r->size || window - base > r->size - size) {
      return CU_OBJ_FAIL;
    }
    id = r->id;
  }
  char *out = static_cast<char *>(std::malloc(82));
  if (!out) return CU_OBJ_FAIL;
  int n = std::snprintf(out, 82, "%016llx:%08llx:%08x:%04x:%06x:1:%s",
                        static_cast<unsigned long long>(window),
                        static_cast<unsigned long long>(size), static_cast<unsigned>(getpid()),
                        0u, id, _identity);
  if (n != 81) {
    std::free(out);
    return CU_OBJ_FAIL;
  }
  *desc_str_out = out;
  return CU_OBJ_SUCCESS;
}

cuObjErr_t cuObjClient::cuMemObjPutRDMAToken(char *desc_str) {
  std::free(desc_str);
  return CU_OBJ_SUCCESS;
}

ssize_t cuObjClient::transfer(void *ctx, void *ptr, size_t size, bool put) {
  auto cb = put ? nullptr : _userOps.get;
  auto cbp = put ? _userOps.put : nullptr;
  if ((!put && !cb) || (put && !cbp) || !ptr || size == 0) return CU_OBJ_FAIL;
  char *desc = nullptr;
  if (cuMemObjGetRDMAToken(ptr, size, 0, put ? CUOBJ_PUT : CUOBJ_GET, &desc) != CU_OBJ_SUCCESS) {
    return CU_OBJ_FAIL;
  }
  cufileRDMAInfo_t info{1, static_cast<int>(std::strlen(desc)), desc};
  struct Handle {
    void *ctx;
  } handle{ctx};
  ssize_t r = put ? cbp(&handle, static_cast<const char *>(ptr), size, 0, &info)
                  : cb(&handle, static_cast<char *>(ptr), size, 0, &info);
  cuMemObjPutRDMAToken(desc);
  return r;
}

ssize_t cuObjClient::cuObjGet(void *ctx, void *ptr, size_t size, loff_t, loff_t) {
  return transfer(ctx, ptr, size, false);
}

ssize_t cuObjClient::cuObjPut(void *ctx, void *ptr, size_t size, loff_t, loff_t) {
  return transfer(ctx, ptr, size, true);
}

void *cuObjClient::getCtx(const void *handle) {
  return handle ? *static_cast<void *const *>(handle) : nullptr;
}

// Without CUDA, every non-null pointer is system memory (as the real library reports for host
// memory).
cuObjMemoryType_t cuObjClient::getMemoryType(const void *ptr) {
  return ptr ? CUOBJ_MEMORY_SYSTEM : CUOBJ_MEMORY_INVALID;
}
