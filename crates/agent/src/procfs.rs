//! What the supervisor needs from the kernel about processes it may not own:
//! identity (`/proc/PID/stat` start time, so a recycled pid is never taken
//! for an engine), process-group membership, and signals to a whole group.

use std::path::Path;

/// The fields of `/proc/PID/stat` the supervisor uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// `R`, `S`, `D`, `Z` (zombie), `T`, ...
    pub state: char,
    pub ppid: i32,
    pub pgrp: i32,
    pub session: i32,
    /// Clock ticks after boot at which the process started.
    pub start_time: u64,
}

impl ProcStat {
    pub fn is_zombie(&self) -> bool {
        matches!(self.state, 'Z' | 'X')
    }
}

/// Parses one `/proc/PID/stat` line. The command name is in parentheses and
/// may itself contain spaces and parentheses, so fields are counted from the
/// last `)`.
pub fn parse_stat(line: &str) -> Option<ProcStat> {
    let rest = &line[line.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); starttime is field 22.
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        session: fields.get(3)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

pub fn stat(pid: i32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// True when `pid` is a live (not zombie) process that started at
/// `start_time`: the same process, not a later one given the same pid.
pub fn is_same_process(pid: i32, start_time: u64) -> bool {
    stat(pid).is_some_and(|s| !s.is_zombie() && s.start_time == start_time)
}

/// Live processes whose process group is `pgid`.
pub fn group_members(pgid: i32) -> Vec<i32> {
    group_members_in(Path::new("/proc"), pgid)
}

fn group_members_in(proc_root: &Path, pgid: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat"))
                .ok()
                .and_then(|t| parse_stat(&t))
                .is_some_and(|s| s.pgrp == pgid && !s.is_zombie())
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

/// Sends `signal` to every process of group `pgid`; false when the group is
/// already empty.
#[allow(unsafe_code)]
pub fn signal_group(pgid: i32, signal: i32) -> bool {
    if pgid <= 1 {
        // -1 and -0 would address every process or our own group.
        return false;
    }
    // SAFETY: kill(2) takes two integers and touches no memory of ours.
    unsafe { libc::kill(-pgid, signal) == 0 }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let line = "4242 (VLLM::Worker (TP0)) S 4200 4200 4200 0 -1 4194560 1 0 0 0 3 1 0 0 20 0 3 0 987654 1000 100";
        let s = parse_stat(line).unwrap();
        assert_eq!(s.state, 'S');
        assert_eq!((s.ppid, s.pgrp, s.session), (4200, 4200, 4200));
        assert_eq!(s.start_time, 987654);
    }

    #[test]
    fn this_process_is_itself_and_not_another_start() {
        let me = std::process::id() as i32;
        let s = stat(me).unwrap();
        assert!(is_same_process(me, s.start_time));
        assert!(!is_same_process(me, s.start_time + 1));
    }

    #[test]
    fn a_group_of_one_lists_itself() {
        let me = std::process::id() as i32;
        let s = stat(me).unwrap();
        assert!(group_members(s.pgrp).contains(&me) || s.pgrp != me);
        assert!(!signal_group(1, 0), "never signals init's group");
    }
}
