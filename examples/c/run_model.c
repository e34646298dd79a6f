/* run_model: run a model that `tvm-armq compile --emit c` wrote, on the bytes of a file.
 *
 *   run_model INPUT OUTPUT
 *
 * INPUT holds the model's inputs one after the other, each as its raw bytes in the
 * model's order (MODEL_INPUT<i>_BYTES each: the header says each one's shape, dtype and
 * quantization); OUTPUT receives the outputs the same way. The level the kernels ran at
 * goes to standard error. Exit status 0, or 1 with a message.
 *
 * Build (see the Makefile): aarch64-linux-gnu-gcc -I DIR run_model.c DIR/libmodel.a
 */
#include <stdio.h>
#include <stdlib.h>

#include "model.h"

/* a buffer of the alignment the library asks of every input and output */
static void *aligned_buffer(size_t bytes) {
  size_t rounded = (bytes + MODEL_ALIGNMENT - 1) / MODEL_ALIGNMENT * MODEL_ALIGNMENT;
  return aligned_alloc(MODEL_ALIGNMENT, rounded ? rounded : MODEL_ALIGNMENT);
}

static int fail(const char *what, const char *detail) {
  fprintf(stderr, "run_model: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 3) return fail("usage: run_model INPUT OUTPUT", NULL);
  void *inputs[MODEL_NUM_INPUTS], *outputs[MODEL_NUM_OUTPUTS];

  FILE *in = fopen(argv[1], "rb");
  if (in == NULL) return fail("cannot open", argv[1]);
  for (int i = 0; i < MODEL_NUM_INPUTS; ++i) {
    size_t bytes = model_input(i)->bytes;
    inputs[i] = aligned_buffer(bytes);
    if (inputs[i] == NULL) return fail("out of memory", NULL);
    if (fread(inputs[i], 1, bytes, in) != bytes)
      return fail("the input file is shorter than the model's inputs", argv[1]);
  }
  if (fgetc(in) != EOF) return fail("the input file is longer than the model's inputs", argv[1]);
  fclose(in);
  for (int k = 0; k < MODEL_NUM_OUTPUTS; ++k) {
    outputs[k] = aligned_buffer(model_output(k)->bytes);
    if (outputs[k] == NULL) return fail("out of memory", NULL);
  }

  model_ctx ctx;
  int err = model_init(&ctx, NULL, 0); /* the library allocates its arena */
  if (err == MODEL_OK) err = model_run_arrays(&ctx, (const void *const *)inputs, outputs);
  if (err != MODEL_OK) {
    fprintf(stderr, "run_model: %s (%s)\n", model_error_name(err), model_last_error(&ctx));
    return 1;
  }
  fprintf(stderr, "ran at level %s\n", model_level());
  model_release(&ctx);

  FILE *out = fopen(argv[2], "wb");
  if (out == NULL) return fail("cannot write", argv[2]);
  for (int k = 0; k < MODEL_NUM_OUTPUTS; ++k) {
    if (fwrite(outputs[k], 1, model_output(k)->bytes, out) != model_output(k)->bytes)
      return fail("cannot write", argv[2]);
    free(outputs[k]);
  }
  for (int i = 0; i < MODEL_NUM_INPUTS; ++i) free(inputs[i]);
  return fclose(out) == 0 ? 0 : fail("cannot write", argv[2]);
}
