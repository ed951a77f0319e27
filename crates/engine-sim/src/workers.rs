//! One real child process per local GPU rank, titled like the engine's
//! workers (`VLLM::Worker_TP0`, `sglang::scheduler_TP0`), so that a
//! supervisor's process-group kill and orphan checks meet real processes.
//!
//! Each child holds the read end of a pipe from its parent and exits when
//! it reads end-of-file: the parent is gone, however it died. That is how
//! vLLM's workers watch their "death pipe".

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

/// The hidden argv[1] that turns the binary into a worker.
pub const WORKER_MODE: &str = "__llmgw_sim_worker";

/// Running worker children; dropping this closes their pipes.
pub struct Workers {
    children: Vec<Child>,
}

impl Workers {
    /// Starts `titles.len()` workers, each shown under its title in `ps`.
    pub fn spawn(titles: &[String]) -> std::io::Result<Self> {
        let exe = std::env::current_exe()?;
        let mut children = Vec::with_capacity(titles.len());
        for title in titles {
            let child = Command::new(&exe)
                .arg0(title)
                .arg(WORKER_MODE)
                .arg(title)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()?;
            children.push(child);
        }
        Ok(Self { children })
    }

    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// True when every worker is still alive.
    pub fn all_alive(&mut self) -> bool {
        self.children
            .iter_mut()
            .all(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        // Closing stdin ends the workers; reap them so none is left a zombie.
        for child in &mut self.children {
            drop(child.stdin.take());
        }
        for child in &mut self.children {
            let _ = child.wait();
        }
    }
}

/// The worker's whole life: wait for the parent's pipe to close.
pub fn worker_main() -> i32 {
    let mut stdin = std::io::stdin().lock();
    let mut buf = [0u8; 64];
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => return 0,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return 0,
        }
    }
}
