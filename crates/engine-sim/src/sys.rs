//! The two process-level actions std cannot express: dying by a signal
//! (SGLang kills its own tree with SIGKILL; NCCL's watchdog aborts), and
//! restoring a signal's default action first so that the death is real.

use crate::failures::Ending;

/// Ends the process the way `ending` says, after flushing output.
pub fn finish(ending: Ending) -> ! {
    crate::logs::write_out("");
    crate::logs::write_err("");
    match ending {
        Ending::Exit(code) => std::process::exit(code),
        Ending::Signal(signal) => die_by_signal(signal),
    }
}

/// Re-raises `signal` with its default action so the parent sees a signal
/// death (WIFSIGNALED), as with the real engines.
#[allow(unsafe_code)]
pub fn die_by_signal(signal: i32) -> ! {
    // SAFETY: signal(2) with SIG_DFL and kill(2) on our own pid take plain
    // integers and touch no memory owned by Rust.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        libc::kill(libc::getpid(), signal);
    }
    // SIGKILL/SIGABRT/SIGTERM with default action do not return; if the
    // signal was blocked, still end with the shell's convention.
    std::process::exit(128 + signal)
}

/// Sends SIGTERM to `pid`; true when it existed.
#[allow(unsafe_code)]
pub fn terminate(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill(2) takes plain integers.
    unsafe { libc::kill(pid, libc::SIGTERM) == 0 }
}
