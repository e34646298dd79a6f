/* Bad calls of a tvm_armq C library's API (tests/test_clib.py): each line printed is
 * "<what> <code>" (or "<what> <text>"), the code each call returned, so that the test
 * compares it with the header's enum; a crash ends the program, which the test sees.
 * Built against a model of one int8 input and one int8 output. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

static void *aligned(size_t bytes) {
  return aligned_alloc(MODEL_ALIGNMENT, (bytes / MODEL_ALIGNMENT + 1) * MODEL_ALIGNMENT);
}

int main(void) {
  int8_t *in = aligned(MODEL_INPUT0_BYTES), *out = aligned(MODEL_OUTPUT0_BYTES);
  int8_t *again = aligned(MODEL_OUTPUT0_BYTES);
  unsigned char *arena = aligned(MODEL_ARENA_BYTES + MODEL_ALIGNMENT);
  for (size_t i = 0; i < MODEL_INPUT0_BYTES; ++i) in[i] = (int8_t)(i * 37 + 11);
  model_ctx ctx;

  printf("init_null_ctx %d\n", model_init(NULL, NULL, 0));
  printf("init_null_arena_with_bytes %d\n", model_init(&ctx, NULL, 5));
  printf("init_small_arena %d\n", model_init(&ctx, arena, MODEL_ARENA_BYTES - 1));
  printf("init_misaligned_arena %d\n", model_init(&ctx, arena + 1, MODEL_ARENA_BYTES));
  printf("last_error_after_failed_init %s\n", model_last_error(&ctx));

  model_ctx never;
  memset(&never, 0, sizeof never);
  printf("run_uninitialized %d\n", model_run(&never, in, out));
  printf("run_null_ctx %d\n", model_run(NULL, in, out));

  printf("init_caller_arena %d\n", model_init(&ctx, arena, MODEL_ARENA_BYTES));
  printf("run_null_input %d\n", model_run(&ctx, NULL, out));
  printf("run_null_output %d\n", model_run(&ctx, in, NULL));
  printf("run_misaligned_input %d\n", model_run(&ctx, in + 1, out));
  printf("run_misaligned_output %d\n", model_run(&ctx, in, out + 3));
  printf("run_arrays_null %d\n", model_run_arrays(&ctx, NULL, NULL));
  printf("run_caller_arena %d\n", model_run(&ctx, in, out));
  printf("run_caller_arena_again %d\n", model_run(&ctx, in, again));
  printf("same_output %d\n", memcmp(out, again, MODEL_OUTPUT0_BYTES) == 0);
  model_release(&ctx);
  model_release(&ctx); /* twice: a no-op */
  printf("run_after_release %d\n", model_run(&ctx, in, out));

  memset(again, 0, MODEL_OUTPUT0_BYTES);
  printf("init_library_arena %d\n", model_init(&ctx, NULL, 0));
  printf("run_library_arena %d\n", model_run(&ctx, in, again));
  printf("same_output_library_arena %d\n", memcmp(out, again, MODEL_OUTPUT0_BYTES) == 0);
  model_release(&ctx);

  printf("error_name_unknown %s\n", model_error_name(999));
  printf("last_error_null %s\n", model_last_error(NULL));
  printf("input_out_of_range %d\n", model_input(MODEL_NUM_INPUTS) == NULL);
  printf("output_negative %d\n", model_output(-1) == NULL);
  printf("done 0\n");
  free(in), free(out), free(again), free(arena);
  return 0;
}
