/* The CUDA runtime, loaded at run time (dlopen) with minimal declarations of our own: no
 * CUDA header or library is needed to build libddl, and a CPU-only machine runs it. Only
 * what libddl needs is resolved; every return code is checked and becomes DDL_ERR_CUDA
 * with cudaGetErrorString's text and the call that failed.
 *
 * Found by ddl_dl_search (dlsearch.c): DDL_CUDA_LIB, a copy already loaded (torch's),
 * the nvidia-cuda-runtime wheel beside libddl (nvidia/cu13/lib, nvidia/cuda_runtime/lib),
 * the conda environment, then the system's libcudart.so.{13,12,11.0}. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "ddl_internal.h"

typedef int cuda_err_t;
/* struct cudaPointerAttributes as CUDA 11-13 define it; CUDA 13 adds reserved words that
 * must be zero, older runtimes write only the first four fields. */
typedef struct {
    int type; /* 0 unregistered, 1 host (pinned), 2 device, 3 managed */
    int device;
    void *device_pointer;
    void *host_pointer;
    long reserved[8];
} cuda_ptr_attr_t;

enum { CUDA_MEMCPY_DEFAULT = 4 };

static struct {
    pthread_mutex_t lock;
    int state; /* 0 not tried, 1 loaded and a device is usable, -1 failed */
    ddl_status_t status;
    void *handle;
    char from[1024];
    char error[3072];
    int runtime_version, driver_version, devices;
    const char *(*GetErrorString_)(cuda_err_t);
    cuda_err_t (*PointerGetAttributes)(cuda_ptr_attr_t *, const void *);
    cuda_err_t (*MemcpyAsync)(void *, const void *, size_t, int, void *);
    cuda_err_t (*StreamSynchronize)(void *);
    cuda_err_t (*MallocHost)(void **, size_t);
    cuda_err_t (*FreeHost)(void *);
    cuda_err_t (*GetDeviceCount)(int *);
    cuda_err_t (*GetDevice)(int *);
    cuda_err_t (*SetDevice)(int);
    cuda_err_t (*DeviceGetPCIBusId)(char *, int, int);
    cuda_err_t (*RuntimeGetVersion)(int *);
    cuda_err_t (*DriverGetVersion)(int *);
    cuda_err_t (*GetLastError)(void);
} cu = {.lock = PTHREAD_MUTEX_INITIALIZER};

static const char *err_string(cuda_err_t e) {
    const char *s = cu.GetErrorString_ ? cu.GetErrorString_(e) : NULL;
    return s ? s : "unknown CUDA error";
}

static ddl_status_t cuda_fail(cuda_err_t e, const char *what) {
    return ddl_fail(DDL_ERR_CUDA, "%s failed: %s (CUDA error %d)", what, err_string(e), e);
}
#define CU(call, what)                                                                    \
    do {                                                                                  \
        cuda_err_t cu_rc_ = (call);                                                       \
        if (cu_rc_ != 0) return cuda_fail(cu_rc_, what);                                  \
    } while (0)

static int resolve(void **slot, const char *name) {
    dlerror();
    *slot = dlsym(cu.handle, name);
    if (*slot) return 1;
    const char *e = dlerror();
    snprintf(cu.error, sizeof cu.error, "CUDA runtime %s lacks %s: %s", cu.from, name,
             e ? e : "symbol not found");
    return 0;
}

static void load_locked(void) {
    static const char *const sonames[] = {"libcudart.so.13", "libcudart.so.12",
                                          "libcudart.so.11.0", "libcudart.so", NULL};
    static const char *const subdirs[] = {"cu13/lib", "cuda_runtime/lib", "cu12/lib", NULL};
    char tried[2800];
    cu.state = -1;
    cu.status = DDL_ERR_UNSUPPORTED;
    cu.handle = ddl_dl_search("DDL_CUDA_LIB", sonames, subdirs, tried, sizeof tried, cu.from,
                              sizeof cu.from);
    if (!cu.handle) {
        snprintf(cu.error, sizeof cu.error,
                 "CUDA runtime not found: device buffers need libcudart (set DDL_CUDA_LIB to "
                 "it, or install nvidia-cuda-runtime / cudatoolkit); tried %s",
                 tried);
        return;
    }
    void **slots[] = {(void **)&cu.GetErrorString_, (void **)&cu.PointerGetAttributes,
                      (void **)&cu.MemcpyAsync, (void **)&cu.StreamSynchronize,
                      (void **)&cu.MallocHost, (void **)&cu.FreeHost,
                      (void **)&cu.GetDeviceCount, (void **)&cu.GetDevice,
                      (void **)&cu.SetDevice, (void **)&cu.DeviceGetPCIBusId,
                      (void **)&cu.RuntimeGetVersion, (void **)&cu.DriverGetVersion,
                      (void **)&cu.GetLastError};
    const char *names[] = {"cudaGetErrorString", "cudaPointerGetAttributes", "cudaMemcpyAsync",
                           "cudaStreamSynchronize", "cudaMallocHost", "cudaFreeHost",
                           "cudaGetDeviceCount", "cudaGetDevice", "cudaSetDevice",
                           "cudaDeviceGetPCIBusId", "cudaRuntimeGetVersion",
                           "cudaDriverGetVersion", "cudaGetLastError"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!resolve(slots[i], names[i])) return;
    cuda_err_t e = cu.RuntimeGetVersion(&cu.runtime_version);
    if (e == 0) e = cu.DriverGetVersion(&cu.driver_version);
    if (e == 0) e = cu.GetDeviceCount(&cu.devices);
    if (e != 0 || cu.devices == 0) {
        snprintf(cu.error, sizeof cu.error,
                 "no usable CUDA device: the CUDA runtime %s (version %d) is there but "
                 "cudaGetDeviceCount says %s (CUDA error %d, driver version %d): a device "
                 "buffer needs a GPU and its driver",
                 cu.from, cu.runtime_version, e ? err_string(e) : "0 devices", e,
                 cu.driver_version);
        cu.GetLastError(); /* clear the sticky-free error state */
        return;
    }
    cu.state = 1;
    cu.status = DDL_SUCCESS;
}

ddl_status_t ddl_cuda_load(void) {
    if (__atomic_load_n(&cu.state, __ATOMIC_ACQUIRE) == 1) return DDL_SUCCESS;
    pthread_mutex_lock(&cu.lock);
    if (cu.state == 0) load_locked();
    ddl_status_t st = cu.status;
    char msg[sizeof cu.error];
    snprintf(msg, sizeof msg, "%s", cu.error);
    pthread_mutex_unlock(&cu.lock);
    if (st != DDL_SUCCESS) return ddl_fail(st, "%s", msg);
    return DDL_SUCCESS;
}

int ddl_cuda_loaded(void) { return __atomic_load_n(&cu.state, __ATOMIC_ACQUIRE) == 1; }

void ddl_cuda_describe(char *out, size_t n) {
    pthread_mutex_lock(&cu.lock);
    if (cu.state == 1)
        snprintf(out, n, "cuda_runtime=%s\ncuda_runtime_version=%d\ncuda_driver_version=%d\n"
                         "cuda_devices=%d\n",
                 cu.from, cu.runtime_version, cu.driver_version, cu.devices);
    else
        snprintf(out, n, "cuda_runtime=%s\ncuda_error=%s\n", cu.from[0] ? cu.from : "",
                 cu.state == 0 ? "not loaded yet" : cu.error);
    pthread_mutex_unlock(&cu.lock);
}

ddl_status_t ddl_cuda_classify(const void *p, int *is_device, int *device) {
    cuda_ptr_attr_t a;
    memset(&a, 0, sizeof a);
    cuda_err_t e = cu.PointerGetAttributes(&a, p);
    if (e != 0) {
        cu.GetLastError();
        return cuda_fail(e, "cudaPointerGetAttributes");
    }
    *is_device = a.type == 2 || a.type == 3;
    *device = a.device;
    return DDL_SUCCESS;
}

ddl_status_t ddl_cuda_copy(void *dst, const void *src, size_t bytes, void *stream) {
    if (bytes == 0 || dst == src) return DDL_SUCCESS;
    CU(cu.MemcpyAsync(dst, src, bytes, CUDA_MEMCPY_DEFAULT, stream), "cudaMemcpyAsync");
    return DDL_SUCCESS;
}

ddl_status_t ddl_cuda_sync(void *stream) {
    CU(cu.StreamSynchronize(stream), "cudaStreamSynchronize");
    return DDL_SUCCESS;
}

ddl_status_t ddl_cuda_host_alloc(void **p, size_t bytes) {
    CU(cu.MallocHost(p, bytes), "cudaMallocHost");
    return DDL_SUCCESS;
}

void ddl_cuda_host_free(void *p) {
    if (p && cu.state == 1 && cu.FreeHost(p) != 0) cu.GetLastError();
}

ddl_status_t ddl_cuda_get_device(int *dev) {
    CU(cu.GetDevice(dev), "cudaGetDevice");
    return DDL_SUCCESS;
}

ddl_status_t ddl_cuda_set_device(int dev) {
    CU(cu.SetDevice(dev), "cudaSetDevice");
    return DDL_SUCCESS;
}

ddl_status_t ddl_cuda_bus_id(int dev, char *out, int len) {
    CU(cu.DeviceGetPCIBusId(out, len, dev), "cudaDeviceGetPCIBusId");
    return DDL_SUCCESS;
}
