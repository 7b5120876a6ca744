//! What the transfer-bench process tests share: a child killed on every
//! exit path and a wait for it with a deadline.

use std::process::{Child, Output};
use std::time::{Duration, Instant};

/// Kills the child on every exit path (a failed assertion included).
pub struct Guard(pub Option<Child>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits for the child until `deadline` (failing the test past it) and
/// returns its output.
pub fn wait(mut g: Guard, deadline: Instant, what: &str) -> Output {
    let c = g.0.as_mut().unwrap();
    while c.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "{what} still running at the deadline"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    g.0.take().unwrap().wait_with_output().unwrap()
}
