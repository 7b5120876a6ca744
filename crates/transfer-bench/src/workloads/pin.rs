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

/// `TRANSFER_WORKLOADS_SCHED=normal` keeps bound caller-driven ranks in
/// the normal scheduling class ([`no_wakeup_preemption`], for comparison).
const SCHED_ENV: &str = "TRANSFER_WORKLOADS_SCHED";

/// Whether `TRANSFER_WORKLOADS_PIN=none` asks for unbound ranks.
fn unbound() -> bool {
    std::env::var(ENV).is_ok_and(|v| v == "none")
}

/// Whether `TRANSFER_WORKLOADS_SCHED=normal` keeps the normal class.
fn normal_class() -> bool {
    std::env::var(SCHED_ENV).is_ok_and(|v| v == "normal")
}

/// The binding in words, for the records' configuration.
pub fn words() -> String {
    const BOUND: &str =
        "each bound to one CPU when they outnumber the CPUs (rank r to the r-th, round-robin)";
    if unbound() {
        "unbound".into()
    } else if normal_class() {
        BOUND.into()
    } else {
        format!("{BOUND}, caller-driven ones then in SCHED_BATCH (no wake-up preemption)")
    }
}

/// Puts the calling thread in `SCHED_BATCH`, the normal class without
/// wake-up preemption, unless `TRANSFER_WORKLOADS_SCHED=normal`. For a
/// caller-driven rank bound to a CPU it shares with another rank; returns
/// whether the class changed (an optimisation, never required).
///
/// Why: libfabric's shm provider guards each endpoint's command queue with
/// a spin lock in shared memory (`pthread_spin_lock`, held by the owner
/// while it processes commands and by every sender while it posts). A rank
/// woken from a nap preempts the rank that shares its CPU, and when that
/// rank held such a lock, whoever posts to it next spins until the
/// scheduler's slice ends, as does the woken rank itself when it posts to
/// the holder. Traced (moe E=4 T=8 combine, shm, 200 iterations, per-rank
/// timestamps): 61 iterations over 1 ms, every one a rank's posting of its
/// three writes taking 1.5-5.3 ms; `perf` put 16 % of the ranks' samples in
/// `pthread_spin_lock` (T=1). In `SCHED_BATCH` a woken rank waits for the
/// holder to give the CPU away (`workloads run --workload moe --provider
/// shm --repeats 40`, 3 interleaved rounds, normal -> batch): combine p90
/// T=8 2857-3492 -> 368-420 us, T=32 1555-5661 -> 1310-1675, T=128
/// 8465-11049 -> 6520-7506; medians within the rounds' spread; tcp
/// (worker threads, no cross-process lock) unchanged, so not applied there.
pub fn no_wakeup_preemption() -> bool {
    if normal_class() {
        return false;
    }
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler reads one sched_param from a live local;
    // pid 0 is the calling thread; SCHED_BATCH with priority 0 needs no
    // privilege. A failure leaves the class unchanged.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) == 0 }
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
    if unbound() {
        return None;
    }
    let cpus = topology::allowed_cpus().ok()?;
    if cpus.len() < 2 || world <= cpus.len() {
        return None;
    }
    let cpu = cpus[rank % cpus.len()];
    topology::pin_current_thread(&[cpu]).ok().map(|()| cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_leaves_wake_up_preemption_and_only_it() {
        if normal_class() {
            eprintln!("skipped: {SCHED_ENV}=normal keeps the normal class");
            return;
        }
        // SAFETY: sched_getscheduler(0) only reads the calling thread's class.
        let class = || unsafe { libc::sched_getscheduler(0) };
        let before = class();
        let (changed, after) = std::thread::spawn(move || (no_wakeup_preemption(), class()))
            .join()
            .unwrap_or((false, -1));
        assert!(changed, "SCHED_BATCH needs no privilege");
        assert_eq!(after, libc::SCHED_BATCH);
        assert_eq!(class(), before, "other threads keep their class");
    }
}
