//! Binding each rank process to one CPU of the set it may run on, as
//! `mpirun --bind-to core` or a per-GPU launcher does.
//!
//! Why: ranks that wait by blocking (caller-driven waits, worker threads
//! between arrivals) wake one another all the time, and the scheduler
//! places a woken task next to its waker: traced on this machine (moe E=4
//! shm T=8, ftrace sched_switch, load ~6 from builds on the other core),
//! all four ranks ran on CPU 0 for whole iterations while CPU 1 ran
//! compilers at nice 10, so each rank waited for the three others' turns
//! (one rank's untimed byte checks held the core for 500 µs while two ranks
//! still timed). Open MPI's busy-polling ranks never sleep and the load
//! balancer spreads them, two per core.
//!
//! With worker threads (tcp) the whole rank is bound too, its worker and
//! callback threads with its own (`workloads run --workload moe --provider
//! tcp --repeats 20`, 4 interleaved rounds, medians, load 9.5-12.8; bound,
//! unbound, the rank's thread on one CPU and its worker on the other):
//! dispatch T=1 221/417/296 us, T=8 309/1190/494, T=32 946/2501/1062,
//! T=128 15085/15225/20871; combine T=128 35413/29593/44171 (the one row
//! where unbound won, also in an earlier run: 31804 vs 21432).

use transfer_core::topology;

/// `TRANSFER_WORKLOADS_PIN=none` leaves ranks unbound (for comparison).
const ENV: &str = "TRANSFER_WORKLOADS_PIN";

/// The binding in words, for the records' configuration.
pub fn words() -> &'static str {
    if std::env::var(ENV).is_ok_and(|v| v == "none") {
        "unbound"
    } else {
        "each bound to one CPU when they outnumber the CPUs (rank r to the r-th, round-robin)"
    }
}

/// Binds the calling thread (and the threads it starts afterwards: call it
/// before the engine exists) to the `rank`-th CPU, round-robin, of the
/// CPUs this process may use, when the job's `world` ranks outnumber those
/// CPUs. Returns that CPU, or `None` when not bound (ranks fit the CPUs,
/// fewer than two CPUs, asked not to, or the kernel refused: binding is
/// an optimisation, never required).
///
/// Only oversubscribed jobs: there the ranks must share cores and
/// wake-affinity packs them; kv's two ranks on two CPUs measured mixed
/// bound (`workloads run --workload kv --quick --provider shm`, 5
/// interleaved rounds, load ~7; unbound -> bound): ttll C=0 7626 -> 5423
/// us but kv_gbps 2.14 -> 1.68, ttll C=500 2922 -> 3699 us (a bound rank
/// cannot leave a CPU other jobs load). weights (6 ranks) gained: update
/// shm 46 -> 27 ms, tcp 62 -> 47 ms (3 rounds).
pub fn pin_rank(rank: usize, world: usize) -> Option<usize> {
    if std::env::var(ENV).is_ok_and(|v| v == "none") {
        return None;
    }
    let cpus = topology::allowed_cpus().ok()?;
    if cpus.len() < 2 || world <= cpus.len() {
        return None;
    }
    let cpu = cpus[rank % cpus.len()];
    topology::pin_current_thread(&[cpu]).ok().map(|()| cpu)
}
