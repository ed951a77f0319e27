//! Signals to the processes a test started, and whether they still run.

/// `signal` to process `pid`; pids 0 and 1 (which would mean "my group"
/// and init) are never signalled.
#[allow(unsafe_code)]
pub fn signal_pid(pid: i32, signal: i32) {
    if pid > 1 {
        // SAFETY: kill(2) with plain integers.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

/// `signal` to every process of group `pgid` (engines run in sessions of
/// their own, so their pid is their group).
#[allow(unsafe_code)]
pub fn signal_group(pgid: i32, signal: i32) {
    if pgid > 1 {
        // SAFETY: kill(2) with plain integers.
        unsafe {
            libc::kill(-pgid, signal);
        }
    }
}

/// Process `pid` runs: it exists and is not a zombie waiting to be
/// reaped.
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .next()?
                .to_owned();
            Some(state != "Z" && state != "X")
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_alive_until_it_is_killed_and_reaped() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let pid = i32::try_from(child.id()).unwrap();
        assert!(alive(pid));
        signal_pid(pid, libc::SIGKILL);
        child.wait().unwrap();
        assert!(!alive(pid));
    }
}
