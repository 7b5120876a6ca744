//! The order of the runs: every arm × group-count cell once per repeat,
//! interleaved, the order reversed on alternate repeats (ABC, CBA, ABC, …).
//!
//! Why: the seed's own measurement ran each arm's repeats back to back and
//! was misled by order effects (a warm page cache, a server's first
//! allocations, the machine's other load drifting); interleaving spreads
//! drift over every arm and reversing cancels a linear trend.

use super::args::Arm;

/// One run of the coordinator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// Position in the schedule (0-based).
    pub index: usize,
    /// Which repeat (0-based).
    pub repeat: usize,
    /// How the stage boundaries travel.
    pub arm: Arm,
    /// Concurrent groups in flight.
    pub groups: usize,
}

/// The cells in the order of the first repeat: group counts outer, arms
/// inner, as given on the command line.
pub fn cells(arms: &[Arm], groups: &[usize]) -> Vec<(Arm, usize)> {
    groups
        .iter()
        .flat_map(|&g| arms.iter().map(move |&a| (a, g)))
        .collect()
}

/// Every run, in order.
pub fn schedule(arms: &[Arm], groups: &[usize], repeats: usize) -> Vec<Run> {
    let forward = cells(arms, groups);
    let mut runs = Vec::with_capacity(forward.len() * repeats);
    for repeat in 0..repeats {
        let order: Vec<(Arm, usize)> = if repeat % 2 == 0 {
            forward.clone()
        } else {
            forward.iter().rev().copied().collect()
        };
        for (arm, groups) in order {
            runs.push(Run {
                index: runs.len(),
                repeat,
                arm,
                groups,
            });
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use Arm::*;

    fn names(runs: &[Run]) -> Vec<String> {
        runs.iter()
            .map(|r| format!("{}{}", r.arm.name(), r.groups))
            .collect()
    }

    #[test]
    fn alternates_forward_and_reversed() {
        let runs = schedule(&[Hub, Direct, Engine], &[1, 3], 3);
        let fwd = ["hub1", "direct1", "engine1", "hub3", "direct3", "engine3"];
        let rev: Vec<&str> = fwd.iter().rev().copied().collect();
        let want: Vec<String> = fwd
            .iter()
            .chain(rev.iter())
            .chain(fwd.iter())
            .map(|s| s.to_string())
            .collect();
        assert_eq!(names(&runs), want);
        assert_eq!(runs.len(), 18);
        assert!(runs.iter().enumerate().all(|(i, r)| r.index == i));
        assert_eq!(runs[5].repeat, 0);
        assert_eq!(runs[6].repeat, 1);
        assert_eq!(runs[17].repeat, 2);
    }

    #[test]
    fn every_cell_runs_once_per_repeat() {
        let runs = schedule(&[Engine, Hub], &[2], 4);
        assert_eq!(
            names(&runs),
            [
                "engine2", "hub2", "hub2", "engine2", "engine2", "hub2", "hub2", "engine2"
            ]
        );
        for repeat in 0..4 {
            let mut in_repeat: Vec<String> = names(
                &runs
                    .iter()
                    .filter(|r| r.repeat == repeat)
                    .copied()
                    .collect::<Vec<_>>(),
            );
            in_repeat.sort();
            assert_eq!(in_repeat, ["engine2", "hub2"]);
        }
        assert!(schedule(&[Hub], &[1], 0).is_empty());
    }
}
