//! Host topology from /sys: which CPUs belong to a NUMA node, and pinning.

use std::io;

/// Parses a Linux cpulist such as `0-3,8,10-11`.
pub fn parse_cpulist(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if b < a || b - a > 65_536 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.trim().parse().ok()?),
        }
    }
    Some(cpus)
}

/// The CPUs of NUMA node `node`, when /sys tells.
pub fn numa_node_cpus(node: u32) -> Option<Vec<usize>> {
    let text =
        std::fs::read_to_string(format!("/sys/devices/system/node/node{node}/cpulist")).ok()?;
    parse_cpulist(&text).filter(|c| !c.is_empty())
}

/// The NUMA node of a PCI network device (`/sys/class/net/<if>/device/numa_node`
/// or `/sys/class/infiniband/<dev>/device/numa_node`); `None` if unknown or -1.
pub fn numa_node_of_sysfs_device(path: &str) -> Option<u32> {
    let text = std::fs::read_to_string(format!("{path}/device/numa_node")).ok()?;
    text.trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

/// The CPUs the calling thread may run on (its affinity mask), ascending.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 = calling thread; the kernel fills `set`, of the given size.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: c < CPU_SETSIZE; `set` is a live cpu_set_t.
    Ok((0..max)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Restricts the calling thread to `cpus`.
pub fn pin_current_thread(cpus: &[usize]) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    for &c in cpus.iter().filter(|&&c| c < max) {
        // SAFETY: c < CPU_SETSIZE, checked above.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: pid 0 = calling thread; set is a valid cpu_set_t of the given size.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `pin_current_thread` sets, `allowed_cpus` reads back (in a
    /// thread of its own, so the test harness keeps its mask).
    #[test]
    fn allowed_cpus_reads_back_a_pin() {
        let got = std::thread::spawn(|| -> io::Result<(Vec<usize>, Vec<usize>)> {
            let all = allowed_cpus()?;
            let last = *all
                .last()
                .ok_or_else(|| io::Error::other("no CPU allowed"))?;
            pin_current_thread(&[last])?;
            Ok((all, allowed_cpus()?))
        })
        .join()
        .map_err(|_| "the pinning thread panicked");
        let (all, pinned) = got.unwrap().unwrap();
        assert!(!all.is_empty());
        assert!(all.windows(2).all(|w| w[0] < w[1]), "ascending: {all:?}");
        assert_eq!(pinned, all[all.len() - 1..].to_vec());
    }
}
