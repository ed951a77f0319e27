//! Starting engine processes and learning when they end.
//!
//! Each process gets its own session (so its own process group, and no
//! controlling terminal whose hang-up would reach it) and writes into a file,
//! never a pipe: an engine must outlive its agent. A process the agent
//! started is watched with `waitpid` (through tokio); one adopted from an
//! earlier agent is not a child, so it is watched through `/proc`.

use std::io;
use std::path::Path;
use std::time::Duration;

use llmgw_engines::{ProcessRole, ProcessSpec};
use tokio::sync::mpsc;

use crate::logfile;
use crate::statefile::ProcessRecord;

/// How a process ended, as far as the agent can know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl ExitInfo {
    pub fn describe(&self) -> String {
        match (self.code, self.signal) {
            (Some(code), _) => format!("exited with code {code}"),
            (None, Some(sig)) => format!("was killed by {}", llmgw_procfs::signal_name(sig)),
            // An adopted process is reaped by someone else.
            (None, None) => {
                "is gone (adopted from an earlier agent, so its exit status is unknown)".to_string()
            }
        }
    }
}

/// An exit notice: which process of the shard (by index) and how.
pub type ExitNotice = (usize, ExitInfo);

/// How often an adopted process is looked up in `/proc`.
const ADOPTED_POLL: Duration = Duration::from_millis(200);

pub fn role_name(role: ProcessRole) -> &'static str {
    match role {
        ProcessRole::Engine => "engine",
        ProcessRole::RayHead => "ray-head",
        ProcessRole::RayWorker => "ray-worker",
    }
}

/// Set on every process the agent starts: the path of its shard's state
/// file (unique per agent and shard), so an engine whose state file was
/// lost or torn is still found through `/proc`.
pub const SHARD_ENV: &str = "LLMGW_SHARD_STATE_FILE";

/// Starts one process of a plan in a new session, output appended to `log`,
/// and reports its exit on `exits` under `index`.
pub fn spawn(
    state_file: &Path,
    spec: &ProcessSpec,
    log: &Path,
    index: usize,
    exits: mpsc::UnboundedSender<ExitNotice>,
) -> io::Result<ProcessRecord> {
    let program = crate::validate::resolve_program(&spec.program).unwrap_or(spec.program.clone());
    let mut out = logfile::open_append(log)?;
    {
        use std::io::Write;
        writeln!(
            out,
            "[llmgw-agent] starting {}: {}",
            role_name(spec.role),
            spec.command_line()
        )?;
    }
    let err = out.try_clone()?;
    let mut command = tokio::process::Command::new(&program);
    command
        .args(&spec.args)
        .envs(&spec.env)
        .env(SHARD_ENV, state_file)
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(false);
    new_session(&mut command);
    let mut child = command.spawn()?;
    let pid = child
        .id()
        .ok_or_else(|| io::Error::other("the process ended before its pid was read"))?
        as i32;
    // Our own child: its /proc entry stays (at worst a zombie) until we reap it.
    let start_time = llmgw_procfs::stat(pid).map(|s| s.start_time).unwrap_or(0);
    tokio::spawn(async move {
        let info = match child.wait().await {
            Ok(status) => {
                use std::os::unix::process::ExitStatusExt;
                ExitInfo {
                    code: status.code(),
                    signal: status.signal(),
                }
            }
            Err(_) => ExitInfo::default(),
        };
        let _ = exits.send((index, info));
    });
    Ok(ProcessRecord {
        role: role_name(spec.role).to_string(),
        pid,
        pgid: pid,
        start_time,
        log: log.to_path_buf(),
    })
}

#[allow(unsafe_code)]
fn new_session(command: &mut tokio::process::Command) {
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed; it calls setsid(2) alone and
    // touches no memory shared with the parent.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Watches a process that is not our child until it is gone.
pub fn watch_adopted(
    record: &ProcessRecord,
    index: usize,
    exits: mpsc::UnboundedSender<ExitNotice>,
) {
    let (pid, start_time) = (record.pid, record.start_time);
    tokio::spawn(async move {
        while llmgw_procfs::is_same_process(pid, start_time) {
            if exits.is_closed() {
                return;
            }
            tokio::time::sleep(ADOPTED_POLL).await;
        }
        let _ = exits.send((index, ExitInfo::default()));
    });
}
