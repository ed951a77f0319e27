//! What llmgw reads from the kernel about processes, and the signals it
//! sends them: `/proc/PID/stat` identity (the start time, so a recycled
//! pid is never taken for a process llmgw started), liveness, CPU time and
//! resident memory, process-group membership, and signals to one process
//! or a whole group; and the free space of a filesystem (`statvfs`), which
//! the control plane's disk reserve and the tests that fill a disk read.
//!
//! Pids are the kernel's `pid_t` (`i32`) throughout; [`to_pid`] converts the
//! `u32` that `std::process` hands out.

use std::path::{Path, PathBuf};

/// The fields of `/proc/PID/stat` llmgw uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// `R`, `S`, `D`, `Z` (zombie), `T`, ...
    pub state: char,
    pub ppid: i32,
    pub pgrp: i32,
    pub session: i32,
    /// Clock ticks spent in user mode.
    pub user_ticks: u64,
    /// Clock ticks spent in the kernel on the process's behalf.
    pub system_ticks: u64,
    /// Clock ticks after boot at which the process started.
    pub start_time: u64,
}

impl ProcStat {
    pub fn is_zombie(&self) -> bool {
        matches!(self.state, 'Z' | 'X')
    }
}

/// The kernel's pid for an id as `std::process` gives it (`Child::id`,
/// `std::process::id`). The kernel never hands out pids above 2^22, so
/// this always fits; 0 stands in for an impossible one, and 0 is never
/// alive and never signalled here.
pub fn to_pid(id: u32) -> i32 {
    i32::try_from(id).unwrap_or(0)
}

/// Parses one `/proc/PID/stat` line. The command name is in parentheses and
/// may itself contain spaces and parentheses, so fields are counted from the
/// last `)`.
pub fn parse_stat(line: &str) -> Option<ProcStat> {
    let rest = &line[line.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 of proc(5) (state): field N is fields[N - 3].
    let field = |n: usize| fields.get(n - 3).copied();
    Some(ProcStat {
        state: field(3)?.chars().next()?,
        ppid: field(4)?.parse().ok()?,
        pgrp: field(5)?.parse().ok()?,
        session: field(6)?.parse().ok()?,
        user_ticks: field(14)?.parse().ok()?,
        system_ticks: field(15)?.parse().ok()?,
        start_time: field(22)?.parse().ok()?,
    })
}

pub fn stat(pid: i32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// Process `pid` runs: it exists and is not a zombie waiting to be reaped.
pub fn alive(pid: i32) -> bool {
    running_state(Path::new("/proc"), pid).is_some()
}

/// True when `pid` is a live (not zombie) process that started at
/// `start_time`: the same process, not a later one given the same pid.
pub fn is_same_process(pid: i32, start_time: u64) -> bool {
    live_stat(Path::new("/proc"), pid).is_some_and(|(s, _)| s.start_time == start_time)
}

/// The state of process `pid` (`R`, `S`, `D`, ...) while any thread of it
/// runs; None when it is gone or a zombie.
fn running_state(proc_root: &Path, pid: i32) -> Option<char> {
    live_stat(proc_root, pid).map(|(_, state)| state)
}

/// Process `pid`'s stat line and its state while any thread of it runs;
/// None when it is gone or a zombie. A process whose first thread ended
/// while another runs on shows `Z` for itself, yet still holds its memory
/// and devices (a thread stuck in a driver call does exactly that after
/// SIGKILL): its state is then that of a live thread.
fn live_stat(proc_root: &Path, pid: i32) -> Option<(ProcStat, char)> {
    let dir = proc_root.join(pid.to_string());
    let read = |path: PathBuf| {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|t| parse_stat(&t))
    };
    let leader = read(dir.join("stat"))?;
    if !leader.is_zombie() {
        return Some((leader, leader.state));
    }
    let thread = std::fs::read_dir(dir.join("task"))
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&tid| tid != pid)
        .filter_map(|tid| read(dir.join("task").join(tid.to_string()).join("stat")))
        .find(|thread| !thread.is_zombie())?;
    Some((leader, thread.state))
}

/// What a process state letter means, for messages about processes that
/// would not end.
pub fn state_meaning(state: char) -> &'static str {
    match state {
        'D' => {
            "uninterruptible sleep: waiting in the kernel, often on a GPU driver or a hung filesystem"
        }
        'R' => "running",
        'S' => "sleeping",
        'T' | 't' => "stopped",
        _ => "",
    }
}

/// CPU seconds (user and system) process `pid` has used so far.
pub fn cpu_seconds(pid: i32) -> Option<f64> {
    let times = cpu_times(pid)?;
    Some(times.user_seconds + times.system_seconds)
}

/// CPU time a process has used, split by where it ran.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuTimes {
    pub user_seconds: f64,
    /// In the kernel on the process's behalf: its system calls, and on
    /// loopback also the receiving side of every packet it sends.
    pub system_seconds: f64,
}

/// CPU time process `pid` has used so far, user and system apart.
pub fn cpu_times(pid: i32) -> Option<CpuTimes> {
    let s = stat(pid)?;
    let hz = clock_ticks_per_second();
    Some(CpuTimes {
        user_seconds: s.user_ticks as f64 / hz,
        system_seconds: s.system_ticks as f64 / hz,
    })
}

/// The unit of the tick counts in `/proc/PID/stat` (`USER_HZ`).
#[allow(unsafe_code)]
fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf(3) reads a configuration value; no memory of ours.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    // 100 is USER_HZ on every Linux architecture llmgw runs on.
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// Resident memory of process `pid` in KiB (`VmRSS`); `None` for a process
/// that is gone, and for kernel threads, which have none.
pub fn rss_kib(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_rss_kib(&status)
}

fn parse_rss_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Live processes whose process group is `pgid`.
pub fn group_members(pgid: i32) -> Vec<i32> {
    group_members_with_state(pgid)
        .into_iter()
        .map(|(pid, _)| pid)
        .collect()
}

/// Live processes whose process group is `pgid`, each with its state.
pub fn group_members_with_state(pgid: i32) -> Vec<(i32, char)> {
    group_members_in(Path::new("/proc"), pgid)
}

fn group_members_in(proc_root: &Path, pgid: i32) -> Vec<(i32, char)> {
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let (stat, state) = live_stat(proc_root, pid)?;
            (stat.pgrp == pgid).then_some((pid, state))
        })
        .collect()
}

/// Process groups of live processes whose environment has `key=value`.
/// Reading another process's environment needs the same user or root,
/// which the agent is for the engines it started.
pub fn groups_tagged(key: &str, value: &str) -> Vec<i32> {
    let wanted = format!("{key}={value}");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut groups: Vec<i32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == wanted.as_bytes()))
        })
        .filter_map(|pid| stat(pid).filter(|s| !s.is_zombie()).map(|s| s.pgrp))
        .collect();
    groups.sort_unstable();
    groups.dedup();
    groups
}

/// Sends `signal` to process `pid`; false when it is gone (or not ours).
/// Pids 0 and 1 are refused: they would mean our own group and init.
pub fn signal_pid(pid: i32, signal: i32) -> bool {
    pid > 1 && kill(pid, signal)
}

/// Sends `signal` to every process of group `pgid` (engines and peers run
/// in groups of their own, so a pid that leads one is its group); false
/// when the group is already empty. Groups 0 and 1 are refused: -0 and -1
/// would address our own group and every process.
pub fn signal_group(pgid: i32, signal: i32) -> bool {
    pgid > 1 && kill(-pgid, signal)
}

/// kill(2): a positive `target` is one process, a negative one a group.
#[allow(unsafe_code)]
fn kill(target: i32, signal: i32) -> bool {
    // SAFETY: kill(2) takes two integers and touches no memory of ours.
    unsafe { libc::kill(target, signal) == 0 }
}

/// Name of a signal for messages (`SIGKILL`), or its number.
pub fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTERM => "SIGTERM",
        _ => return format!("signal {signal}"),
    };
    name.to_string()
}

/// Free bytes for unprivileged writers on the filesystem holding `dir`.
pub fn free_bytes(dir: &std::path::Path) -> std::io::Result<u64> {
    let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(std::io::Error::other)?;
    // SAFETY: statvfs(2) fills the zeroed struct we own; the path is a
    // valid NUL-terminated string for the duration of the call.
    #[allow(unsafe_code)]
    let (rc, stat) = unsafe {
        let mut stat: libc::statvfs = std::mem::zeroed();
        (libc::statvfs(path.as_ptr(), &mut stat), stat)
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> i32 {
        to_pid(std::process::id())
    }

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let line = "4242 (VLLM::Worker (TP0)) S 4200 4200 4200 0 -1 4194560 1 0 0 0 3 1 0 0 20 0 3 0 987654 1000 100";
        let s = parse_stat(line).unwrap();
        assert_eq!(s.state, 'S');
        assert_eq!((s.ppid, s.pgrp, s.session), (4200, 4200, 4200));
        assert_eq!((s.user_ticks, s.system_ticks), (3, 1));
        assert_eq!(s.start_time, 987654);
    }

    #[test]
    fn a_zombie_leader_with_a_thread_stuck_in_the_kernel_is_still_there() {
        let root = std::env::temp_dir().join(format!("llmgw-procfs-{}", me()));
        let stat_line = |pid: i32, state: char| {
            format!(
                "{pid} (engine) {state} 1 4200 4200 0 -1 0 0 0 0 0 3 1 0 0 20 0 2 0 777 1000 100"
            )
        };
        let write = |path: PathBuf, text: String| {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        // 4200 leads its group; its first thread ended, 4201 is stuck.
        write(root.join("4200/stat"), stat_line(4200, 'Z'));
        write(root.join("4200/task/4200/stat"), stat_line(4200, 'Z'));
        write(root.join("4200/task/4201/stat"), stat_line(4201, 'D'));
        // 4300: a zombie of the same group whose threads all ended.
        write(root.join("4300/stat"), stat_line(4300, 'Z'));
        write(root.join("4300/task/4300/stat"), stat_line(4300, 'Z'));
        assert_eq!(running_state(&root, 4200), Some('D'));
        assert_eq!(running_state(&root, 4300), None);
        assert_eq!(group_members_in(&root, 4200), vec![(4200, 'D')]);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_cut_stat_line_is_not_read() {
        assert_eq!(parse_stat("4242 (sleep) S 4200 4200"), None);
        assert_eq!(parse_stat("no parenthesis at all"), None);
    }

    #[test]
    fn this_process_is_itself_and_not_another_start() {
        let s = stat(me()).unwrap();
        assert!(is_same_process(me(), s.start_time));
        assert!(!is_same_process(me(), s.start_time + 1));
    }

    #[test]
    fn a_group_of_one_lists_itself() {
        let s = stat(me()).unwrap();
        assert!(group_members(s.pgrp).contains(&me()) || s.pgrp != me());
        assert!(!signal_group(1, 0), "never signals init's group");
        assert!(!signal_group(0, 0), "never signals our own group by 0");
    }

    #[test]
    fn a_child_is_alive_until_it_is_killed_and_reaped() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let child_pid = to_pid(child.id());
        assert!(alive(child_pid));
        assert!(signal_pid(child_pid, libc::SIGKILL));
        child.wait().unwrap();
        assert!(!alive(child_pid));
        assert!(!signal_pid(child_pid, 0), "a reaped pid takes no signal");
    }

    #[test]
    fn init_and_our_own_group_are_never_signalled_by_pid() {
        assert!(!signal_pid(0, 0));
        assert!(!signal_pid(1, 0));
        assert!(signal_pid(me(), 0), "signal 0 only asks whether we exist");
    }

    #[test]
    fn this_process_has_cpu_time_and_resident_memory() {
        let cpu = cpu_seconds(me()).expect("our own /proc/PID/stat");
        assert!(cpu >= 0.0, "{cpu}");
        let rss = rss_kib(me()).expect("our own VmRSS");
        assert!(rss > 0, "{rss}");
        assert_eq!(cpu_seconds(0), None);
        assert_eq!(rss_kib(0), None);
    }

    #[test]
    fn resident_memory_is_read_from_the_vmrss_line() {
        let status = "Name:\tllmgw\nVmPeak:\t  900 kB\nVmRSS:\t  12345 kB\nThreads:\t4\n";
        assert_eq!(parse_rss_kib(status), Some(12345));
        assert_eq!(parse_rss_kib("Name:\tkthreadd\nThreads:\t1\n"), None);
    }

    #[test]
    fn signals_are_named_for_messages() {
        assert_eq!(signal_name(libc::SIGKILL), "SIGKILL");
        assert_eq!(signal_name(64), "signal 64");
    }
}
