/* transfer-mpi-workloads: the Open MPI baseline of the issue-21 workloads.
 *
 *   mpirun -np K transfer-mpi-workloads kv|weights|moe [--key value ...]
 *       --repeats N --transport LABEL --config "MCA words" --out FILE.jsonl
 *
 * Workload options (defaults of the spec):
 *   kv:      --layers 32 --pages-per-layer 64 --page-bytes 16384 --requests 4
 *            --compute-us 500 --seed 1 --notify send|put      (np = 2)
 *   weights: --trainers 2 --inference 4 --total-bytes 268435456 --seed 1
 *            --variants put,bcast                             (np = M + N)
 *   selftest (no mpirun): the RNG and the fill pattern against the spec
 *   moe:     --tokens 1,8,32,128 --hidden 7168 --experts 256 --topk 8
 *            --seed 1 [--ranks E]                             (np = E)
 */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static const char USAGE[] =
    "usage: mpirun -np K transfer-mpi-workloads kv|weights|moe [--key value ...] "
    "--out FILE.jsonl [--repeats 5] [--transport LABEL] [--config WORDS] [--note TEXT]";

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "selftest") == 0) return selftest();
    MPI_Init(&argc, &argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char err[512] = "";
    int rc = 2;
    struct opts o;
    uint64_t repeats = 5;
    if (argc < 2) {
        snprintf(err, sizeof err, "no workload given");
    } else if (opts_parse(&o, argc - 2, argv + 2, err, sizeof err) == 0 &&
               opt_u64(&o, "repeats", 5, 1, 1000, &repeats, err, sizeof err) == 0) {
        struct run_cfg c = {
            .repeats = (int)repeats,
            .transport = opt_str(&o, "transport", "shm"),
            .mca = opt_str(&o, "config", "Open MPI defaults"),
            .note = opt_str(&o, "note", ""),
            .out = opt_str(&o, "out", NULL),
        };
        const char *w = argv[1];
        if (c.out == NULL)
            snprintf(err, sizeof err, "--out FILE.jsonl is required");
        else if (strcmp(w, "kv") == 0)
            rc = kv_main(&o, &c, err, sizeof err);
        else if (strcmp(w, "weights") == 0)
            rc = weights_main(&o, &c, err, sizeof err);
        else if (strcmp(w, "moe") == 0)
            rc = moe_main(&o, &c, err, sizeof err);
        else
            snprintf(err, sizeof err, "unknown workload `%s` (kv, weights or moe)", w);
    }
    if (rc != 0 && rank == 0) fprintf(stderr, "transfer-mpi-workloads: %s\n%s\n", err, USAGE);
    MPI_Finalize();
    return rc;
}
