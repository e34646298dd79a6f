/* The runtime of a tvm_armq C library, and the model's C API around it.
 *
 * Read this first. A model compiled with `emit c` is one function, tvm_armq_model
 * (passes/call_sequence.py), that TVM generated with its calling convention for packed
 * functions: it takes the model's inputs, its weights and its outputs as DLTensors in an
 * array of TVMFFIAny, checks each one's rank, shape and dtype once, and calls the kernels
 * directly. What TVM's runtime would give that code, this file gives it:
 *
 *   workspace   the tensors between kernels (one arena block of tvm_armq_model) and the
 *               kernels' packing buffers. The generated code asks for them through the
 *               function pointers __TVMBackendAllocWorkspace / __TVMBackendFreeWorkspace
 *               (TVM's runtime fills them when it loads a library; here they are set
 *               statically), always freeing the last block it took first. So the blocks
 *               are carved, in that order, from one arena per context: the caller's, or
 *               one this library allocates once. ARMQ_ARENA_BYTES bounds what one run
 *               takes (clib/__init__.py sums the blocks each function asks for).
 *   errors      a failed check calls TVMFFIErrorSetRaisedFromCStrParts and returns
 *               nonzero; the message is kept per thread and copied into the context.
 *
 *   parallel    none: the library is built for one thread, its parallel loops serial; one
 *               left anyway runs as one task on the caller's thread.
 *
 * Nothing else of TVM's runtime is reached: the generated code calls no packed function by
 * name. clib/__init__.py links this file
 * with the model's object files and localizes every symbol but the API, so two models (or
 * a model and a real TVM runtime) link into one program without a clash.
 *
 * The generated description (ARMQ_DESC: the header, the tensors, the arena size, the
 * positional run function) is included below; ARMQ_API(x) names the API function x with
 * the model's prefix (model_x).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* DLPack's tensor and TVM FFI's argument slot, as laid out in dlpack.h and
 * tvm/ffi/c_api.h (the ABI TVM's generated code reads). */
typedef struct {
  int32_t device_type; /* kDLCPU = 1 */
  int32_t device_id;
} armq_device;

typedef struct {
  uint8_t code; /* kDLInt 0, kDLUInt 1, kDLFloat 2 */
  uint8_t bits;
  uint16_t lanes;
} armq_dtype;

typedef struct {
  void *data;
  armq_device device;
  int32_t ndim;
  armq_dtype dtype;
  const int64_t *shape;
  const int64_t *strides; /* NULL: compact, row-major */
  uint64_t byte_offset;
} armq_dltensor;

typedef struct {
  int32_t type_index; /* kTVMFFINone 0, kTVMFFIDLTensorPtr 7 */
  uint32_t zero_padding;
  union {
    int64_t v_int64;
    void *v_ptr;
  };
} armq_any;

enum { ARMQ_KDLCPU = 1, ARMQ_FFI_NONE = 0, ARMQ_FFI_DLTENSOR_PTR = 7 };

#include ARMQ_DESC

typedef ARMQ_API(ctx) armq_ctx;

/* tvm_armq_model's packed entry, and the weights (an assembler .incbin of their bytes) */
extern int __tvm_ffi_tvm_armq_model(void *self, const armq_any *args, int32_t num_args,
                                    armq_any *result);
extern const unsigned char armq_weights[];
/* the ISA level this CPU runs (portable.py's SELECT_SOURCE, linked in) */
extern int32_t tvm_armq_level(void);

static const char *const armq_level_names[] = {"neon", "dotprod", "i8mm"};
#define ARMQ_CTX_MAGIC 0x61726d71u /* "armq": a context model_init set up */

/* ------------------------------------------------------------------ errors */
static __thread char armq_error[sizeof(((armq_ctx *)0)->message)];

/* a, b and c (b, c may be NULL) into to[size] */
static void armq_format(char *to, size_t size, const char *a, const char *b, const char *c) {
  snprintf(to, size, "%s%s%s", a, b ? b : "", c ? c : "");
}

static void armq_say(const char *a, const char *b, const char *c) {
  armq_format(armq_error, sizeof armq_error, a, b, c);
}

void TVMFFIErrorSetRaisedFromCStrParts(const char *kind, const char **parts, int32_t n) {
  size_t used = (size_t)snprintf(armq_error, sizeof armq_error, "%s: ", kind);
  for (int32_t i = 0; i < n && used < sizeof armq_error; ++i) {
    if (parts[i] != NULL)
      used += (size_t)snprintf(armq_error + used, sizeof armq_error - used, "%s", parts[i]);
  }
}

void TVMFFIErrorSetRaisedFromCStr(const char *kind, const char *message) {
  armq_say(kind, ": ", message);
}

/* ------------------------------------------------------------------ workspace */
static __thread armq_ctx *armq_running; /* the context model_run runs on this thread */

static void *armq_alloc_workspace(int device_type, int device_id, uint64_t nbytes,
                                  int dtype_code, int dtype_bits) {
  (void)device_type, (void)device_id, (void)dtype_code, (void)dtype_bits;
  armq_ctx *ctx = armq_running;
  if (ctx == NULL) return NULL;
  if (ctx->depth == (int)(sizeof ctx->starts / sizeof ctx->starts[0])) {
    armq_say("workspace: blocks nested deeper than the context holds", NULL, NULL);
    return NULL;
  }
  size_t start = (ctx->top + ARMQ_ALIGNMENT - 1) / ARMQ_ALIGNMENT * ARMQ_ALIGNMENT;
  if (start > ctx->arena_bytes || nbytes > ctx->arena_bytes - start) {
    armq_say("workspace: the arena is exhausted (a bug: ARENA_BYTES bounds a run)", NULL,
             NULL);
    return NULL;
  }
  ctx->starts[ctx->depth] = start;
  ctx->tops[ctx->depth++] = ctx->top;
  ctx->top = start + (size_t)nbytes;
  return ctx->arena + start;
}

static int armq_free_workspace(int device_type, int device_id, void *ptr) {
  (void)device_type, (void)device_id;
  armq_ctx *ctx = armq_running;
  if (ctx == NULL || ctx->depth == 0 ||
      (unsigned char *)ptr != ctx->arena + ctx->starts[ctx->depth - 1]) {
    armq_say("workspace: a block freed out of order", NULL, NULL);
    return -1;
  }
  ctx->top = ctx->tops[--ctx->depth];
  return 0;
}

void *(*__TVMBackendAllocWorkspace)(int, int, uint64_t, int, int) = armq_alloc_workspace;
int (*__TVMBackendFreeWorkspace)(int, int, void *) = armq_free_workspace;

/* ------------------------------------------------------------------ parallel loops */
/* The library is compiled with its parallel loops serial (clib/__init__.py); a parallel
 * loop left anyway runs here as a pool of one thread runs it: one task, the caller's. */
typedef struct {
  void *sync_handle;
  int32_t num_task;
} armq_parallel_env;

typedef int (*armq_parallel_lambda)(int task_id, armq_parallel_env *env, void *closure);

static int armq_parallel_launch(armq_parallel_lambda body, void *closure, int num_task) {
  (void)num_task;
  armq_parallel_env env = {NULL, 1};
  return body(0, &env, closure);
}

static int armq_parallel_barrier(int task_id, armq_parallel_env *env) {
  (void)task_id, (void)env;
  return 0;
}

int (*__TVMBackendParallelLaunch)(armq_parallel_lambda, void *, int) = armq_parallel_launch;
int (*__TVMBackendParallelBarrier)(int, armq_parallel_env *) = armq_parallel_barrier;

/* ------------------------------------------------------------------ the API */
const char *ARMQ_API(error_name)(int code) {
  switch (code) {
    case ARMQ_UPPER(OK): return "ok";
    case ARMQ_UPPER(ERROR_NULL_ARGUMENT): return "a required pointer is NULL";
    case ARMQ_UPPER(ERROR_NOT_INITIALIZED): return "the context was not set up by init";
    case ARMQ_UPPER(ERROR_ARENA_TOO_SMALL): return "the arena is smaller than ARENA_BYTES";
    case ARMQ_UPPER(ERROR_ALIGNMENT): return "a pointer is not ALIGNMENT-byte aligned";
    case ARMQ_UPPER(ERROR_OUT_OF_MEMORY): return "the arena could not be allocated";
    case ARMQ_UPPER(ERROR_CPU): return "this CPU lacks the ISA level the library needs";
    case ARMQ_UPPER(ERROR_RUN): return "the model failed a check while running";
    default: return "unknown error code";
  }
}

const char *ARMQ_API(last_error)(const armq_ctx *ctx) {
  return ctx == NULL ? "no context" : ctx->message;
}

static int armq_fail(armq_ctx *ctx, int code, const char *a, const char *b, const char *c) {
  if (ctx != NULL) armq_format(ctx->message, sizeof ctx->message, a, b, c);
  return code;
}

const char *ARMQ_API(level)(void) {
  int32_t level = ARMQ_LEVEL_CODE >= 0 ? ARMQ_LEVEL_CODE : tvm_armq_level();
  return level >= 0 ? armq_level_names[level] : "none";
}

int ARMQ_API(init)(armq_ctx *ctx, void *arena, size_t arena_bytes) {
  if (ctx == NULL) return ARMQ_UPPER(ERROR_NULL_ARGUMENT);
  memset(ctx, 0, sizeof *ctx);
  int32_t cpu = tvm_armq_level(); /* the CPU's level, capped by TVM_ARMQ_ISA if set */
  if (cpu < 0)
    return armq_fail(ctx, ARMQ_UPPER(ERROR_CPU), "TVM_ARMQ_ISA names no level this CPU has",
                     NULL, NULL);
  if (ARMQ_LEVEL_CODE > cpu)
    return armq_fail(ctx, ARMQ_UPPER(ERROR_CPU), "built for " ARMQ_LEVEL_NAME
                     "; this CPU (or TVM_ARMQ_ISA) runs ", armq_level_names[cpu], " at most");
  if (arena == NULL) {
    if (arena_bytes != 0)
      return armq_fail(ctx, ARMQ_UPPER(ERROR_NULL_ARGUMENT),
                       "arena is NULL but arena_bytes is not 0", NULL, NULL);
    if (ARMQ_ARENA_BYTES > 0) {
      void *mem = NULL;
      if (posix_memalign(&mem, ARMQ_ALIGNMENT, ARMQ_ARENA_BYTES) != 0)
        return armq_fail(ctx, ARMQ_UPPER(ERROR_OUT_OF_MEMORY), "could not allocate the arena",
                         NULL, NULL);
      ctx->arena = mem;
      ctx->owns_arena = 1;
    }
    ctx->arena_bytes = ARMQ_ARENA_BYTES;
  } else {
    if (arena_bytes < ARMQ_ARENA_BYTES)
      return armq_fail(ctx, ARMQ_UPPER(ERROR_ARENA_TOO_SMALL),
                       "arena_bytes is below ARENA_BYTES", NULL, NULL);
    if ((uintptr_t)arena % ARMQ_ALIGNMENT != 0)
      return armq_fail(ctx, ARMQ_UPPER(ERROR_ALIGNMENT), "the arena is not aligned", NULL,
                       NULL);
    ctx->arena = arena;
    ctx->arena_bytes = arena_bytes;
  }
  ctx->magic = ARMQ_CTX_MAGIC;
  return ARMQ_UPPER(OK);
}

void ARMQ_API(release)(armq_ctx *ctx) {
  if (ctx == NULL || ctx->magic != ARMQ_CTX_MAGIC) return;
  if (ctx->owns_arena) free(ctx->arena);
  memset(ctx, 0, sizeof *ctx);
}

const ARMQ_API(tensor) *ARMQ_API(input)(int i) {
  return i >= 0 && i < ARMQ_NUM_INPUTS ? &armq_inputs[i] : NULL;
}

const ARMQ_API(tensor) *ARMQ_API(output)(int i) {
  return i >= 0 && i < ARMQ_NUM_OUTPUTS ? &armq_outputs[i] : NULL;
}

/* one tensor argument of tvm_armq_model */
static void armq_arg(armq_any *slot, armq_dltensor *t, void *data,
                     const ARMQ_API(tensor) *info, const armq_dtype *dtype) {
  t->data = data;
  t->device.device_type = ARMQ_KDLCPU;
  t->device.device_id = 0;
  t->ndim = info->rank;
  t->dtype = *dtype;
  t->shape = info->shape;
  t->strides = NULL;
  t->byte_offset = 0;
  slot->type_index = ARMQ_FFI_DLTENSOR_PTR;
  slot->zero_padding = 0;
  slot->v_ptr = t;
}

static int armq_check(armq_ctx *ctx, const void *p, const char *what, const char *name) {
  if (p == NULL)
    return armq_fail(ctx, ARMQ_UPPER(ERROR_NULL_ARGUMENT), what, name, " is NULL");
  if ((uintptr_t)p % ARMQ_ALIGNMENT != 0)
    return armq_fail(ctx, ARMQ_UPPER(ERROR_ALIGNMENT), what, name, " is not aligned");
  return ARMQ_UPPER(OK);
}

int ARMQ_API(run_arrays)(armq_ctx *ctx, const void *const *inputs, void *const *outputs) {
  if (ctx == NULL) return ARMQ_UPPER(ERROR_NULL_ARGUMENT);
  if (ctx->magic != ARMQ_CTX_MAGIC) return ARMQ_UPPER(ERROR_NOT_INITIALIZED);
  if (inputs == NULL || outputs == NULL)
    return armq_fail(ctx, ARMQ_UPPER(ERROR_NULL_ARGUMENT), "inputs or outputs is NULL", NULL,
                     NULL);
  enum { N = ARMQ_NUM_INPUTS + 1 + ARMQ_NUM_OUTPUTS };
  armq_dltensor tensors[N];
  armq_any args[N];
  static const ARMQ_API(tensor) weights_info = {"weights", "uint8", 1, {ARMQ_WEIGHT_BYTES},
                                                ARMQ_WEIGHT_BYTES, 0.0f, 0, 0};
  static const armq_dtype bytes = {1, 8, 1};
  for (int i = 0; i < ARMQ_NUM_INPUTS; ++i) {
    int rc = armq_check(ctx, inputs[i], "input ", armq_inputs[i].name);
    if (rc != ARMQ_UPPER(OK)) return rc;
    armq_arg(&args[i], &tensors[i], (void *)inputs[i], &armq_inputs[i], &armq_input_dtypes[i]);
  }
  armq_arg(&args[ARMQ_NUM_INPUTS], &tensors[ARMQ_NUM_INPUTS], (void *)armq_weights,
           &weights_info, &bytes);
  for (int k = 0; k < ARMQ_NUM_OUTPUTS; ++k) {
    int rc = armq_check(ctx, outputs[k], "output ", armq_outputs[k].name);
    if (rc != ARMQ_UPPER(OK)) return rc;
    int at = ARMQ_NUM_INPUTS + 1 + k;
    armq_arg(&args[at], &tensors[at], outputs[k], &armq_outputs[k], &armq_output_dtypes[k]);
  }
  armq_any result = {ARMQ_FFI_NONE, 0, {0}};
  armq_running = ctx;
  ctx->top = 0;
  ctx->depth = 0;
  armq_error[0] = 0;
  int rc = __tvm_ffi_tvm_armq_model(NULL, args, N, &result);
  armq_running = NULL;
  if (rc != 0) return armq_fail(ctx, ARMQ_UPPER(ERROR_RUN), armq_error, NULL, NULL);
  ctx->message[0] = 0;
  return ARMQ_UPPER(OK);
}
