/*
 * blockcount: a qemu-user TCG plugin that counts, per region of the guest's run, how often
 * each translated block executes, and writes every counted block's instruction bytes.
 * tvm_armq/device/cycles.py builds it at device provisioning, runs guests with it, and prices
 * the blocks with llvm-mca.
 *
 * Regions. The guest names the region it is in by a system call that fails:
 * lseek(fd, REGION_TAG | r, SEEK_SET), where r < 2^32 is the region (0: not measured), on
 * fd -1 (the call fails) or on an fd of /dev/null (it succeeds: the guest raises nothing).
 * At every such call the counts since the previous call are added to the previous region,
 * so a region is any stretch of the run: one layer of a model, or all of its runs.
 *
 * Counting. By default an inline 64-bit add per block execution (cheap; the adds of guest
 * threads running at once may race, which only matters with several threads). With
 * threads=1, a callback per execution counts each guest thread (vCPU) apart instead.
 *
 * Output (out=PATH), written at exit:
 *   B <id> <vaddr hex> <instruction bytes hex>       once per block that was counted
 *   C <region> <id> <vcpu> <count>                   counts (vcpu is 0 unless threads=1)
 *
 * Only the few entry points of qemu's plugin C API (version 1, qemu >= 6) that this file
 * uses are declared here: qemu-user packages do not ship qemu-plugin.h.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
struct qemu_plugin_insn;
enum qemu_plugin_cb_flags { QEMU_PLUGIN_CB_NO_REGS };
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };

extern void qemu_plugin_register_vcpu_tb_trans_cb(
    qemu_plugin_id_t, void (*)(qemu_plugin_id_t, struct qemu_plugin_tb *));
extern void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *,
                                                     enum qemu_plugin_op, void *, uint64_t);
extern void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb *,
                                                 void (*)(unsigned int, void *),
                                                 enum qemu_plugin_cb_flags, void *);
extern void qemu_plugin_register_vcpu_syscall_cb(
    qemu_plugin_id_t, void (*)(qemu_plugin_id_t, unsigned int, int64_t, uint64_t, uint64_t,
                               uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t));
extern void qemu_plugin_register_atexit_cb(qemu_plugin_id_t,
                                           void (*)(qemu_plugin_id_t, void *), void *);
extern size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *);
extern uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb *);
extern struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *, size_t);
extern const void *qemu_plugin_insn_data(const struct qemu_plugin_insn *);
extern size_t qemu_plugin_insn_size(const struct qemu_plugin_insn *);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

#define SYS_LSEEK 62                         /* aarch64 Linux */
#define REGION_TAG 0x41524d5100000000ULL     /* "ARMQ" in the high word of the offset */
#define MAX_VCPUS 64                         /* threads=1: guest threads counted apart */

/* Counts already handed to a region: one node per (region, vcpu) a block ran in. */
typedef struct Tally {
    uint32_t region, vcpu;
    uint64_t count;
    struct Tally *next;
} Tally;

typedef struct Block {
    uint32_t id;
    uint64_t vaddr;
    size_t nbytes;
    unsigned char *bytes;
    uint64_t *count;             /* executions so far, per vCPU (one slot without threads=1) */
    uint64_t *handed;            /* of which already added to a region */
    Tally *tallies;
    struct Block *next;
} Block;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static Block *blocks;
static uint32_t n_blocks;
static uint32_t region;          /* the region the guest is in now */
static int per_thread;
static const char *out_path = "blockcount.txt";

static void on_exec(unsigned int vcpu, void *udata) {
    Block *b = udata;
    b->count[vcpu < MAX_VCPUS ? vcpu : MAX_VCPUS - 1]++;
}

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    (void)id;
    size_t n = qemu_plugin_tb_n_insns(tb), size = 0;
    for (size_t i = 0; i < n; i++) size += qemu_plugin_insn_size(qemu_plugin_tb_get_insn(tb, i));
    Block *b = calloc(1, sizeof(Block));
    b->bytes = malloc(size ? size : 1);
    b->nbytes = size;
    b->vaddr = qemu_plugin_tb_vaddr(tb);
    b->count = calloc(per_thread ? MAX_VCPUS : 1, sizeof(uint64_t));
    b->handed = calloc(per_thread ? MAX_VCPUS : 1, sizeof(uint64_t));
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        size_t s = qemu_plugin_insn_size(insn);
        memcpy(b->bytes + at, qemu_plugin_insn_data(insn), s);
        at += s;
    }
    pthread_mutex_lock(&lock);
    b->id = n_blocks++;
    b->next = blocks;
    blocks = b;
    pthread_mutex_unlock(&lock);
    if (per_thread)
        qemu_plugin_register_vcpu_tb_exec_cb(tb, on_exec, QEMU_PLUGIN_CB_NO_REGS, b);
    else
        qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, b->count, 1);
}

/* Add every block's executions since the last hand-over to the current region. */
static void hand_over(void) {
    int slots = per_thread ? MAX_VCPUS : 1;
    for (Block *b = blocks; b; b = b->next) {
        for (int v = 0; v < slots; v++) {
            uint64_t now = b->count[v], delta = now - b->handed[v];
            if (!delta) continue;
            b->handed[v] = now;
            if (!region) continue;
            Tally *t = b->tallies;
            if (!t || t->region != region || t->vcpu != (uint32_t)v) {
                for (t = b->tallies; t; t = t->next)
                    if (t->region == region && t->vcpu == (uint32_t)v) break;
                if (!t) {
                    t = calloc(1, sizeof(Tally));
                    t->region = region;
                    t->vcpu = (uint32_t)v;
                    t->next = b->tallies;
                    b->tallies = t;
                }
            }
            t->count += delta;
        }
    }
}

static void on_syscall(qemu_plugin_id_t id, unsigned int vcpu, int64_t num, uint64_t a1,
                       uint64_t a2, uint64_t a3, uint64_t a4, uint64_t a5, uint64_t a6,
                       uint64_t a7, uint64_t a8) {
    (void)id; (void)vcpu; (void)a3; (void)a4; (void)a5; (void)a6; (void)a7; (void)a8;
    if (num != SYS_LSEEK || (a2 & 0xffffffff00000000ULL) != REGION_TAG) return;
    pthread_mutex_lock(&lock);
    hand_over();
    region = (uint32_t)(a2 & 0xffffffffULL);
    pthread_mutex_unlock(&lock);
}

static void on_exit_(qemu_plugin_id_t id, void *udata) {
    (void)id; (void)udata;
    pthread_mutex_lock(&lock);
    hand_over();
    FILE *f = fopen(out_path, "w");
    if (!f) {
        fprintf(stderr, "blockcount: cannot write %s\n", out_path);
        pthread_mutex_unlock(&lock);
        return;
    }
    for (Block *b = blocks; b; b = b->next) {
        if (!b->tallies) continue;
        fprintf(f, "B %u %llx ", b->id, (unsigned long long)b->vaddr);
        for (size_t i = 0; i < b->nbytes; i++) fprintf(f, "%02x", b->bytes[i]);
        fputc('\n', f);
        for (Tally *t = b->tallies; t; t = t->next)
            fprintf(f, "C %u %u %u %llu\n", t->region, b->id, t->vcpu,
                    (unsigned long long)t->count);
    }
    fclose(f);
    pthread_mutex_unlock(&lock);
}

__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id,
                                                               const void *info, int argc,
                                                               char **argv) {
    (void)info;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "out=", 4) == 0) out_path = strdup(argv[i] + 4);
        else if (strcmp(argv[i], "threads=1") == 0) per_thread = 1;
        else {
            fprintf(stderr, "blockcount: unknown option %s (out=PATH, threads=1)\n", argv[i]);
            return -1;
        }
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    qemu_plugin_register_vcpu_syscall_cb(id, on_syscall);
    qemu_plugin_register_atexit_cb(id, on_exit_, NULL);
    return 0;
}
