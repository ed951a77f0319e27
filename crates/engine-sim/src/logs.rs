//! Log lines in each engine's own format.
//!
//! vLLM: `(APIServer pid=N) INFO MM-DD HH:MM:SS [file.py:line] message` on
//! stdout. SGLang: `[YYYY-MM-DD HH:MM:SS TP0] message` on stderr. uvicorn:
//! `INFO:     message`. Readiness detectors match these, so they are exact.

use std::io::Write;
use std::time::SystemTime;

use time::OffsetDateTime;

use crate::persona::{Engine, Persona};

/// The process a vLLM line claims to come from.
#[derive(Debug, Clone, Copy)]
pub enum Proc {
    ApiServer,
    EngineCore(u32),
    Worker(u32, u32),
}

/// Writes one persona's log lines.
#[derive(Debug, Clone, Copy)]
pub struct Logger {
    pub persona: Persona,
    pub api_pid: u32,
    pub core_pid: u32,
}

/// UTC broken down: (year, month, day, hour, minute, second).
pub fn utc_parts(time: SystemTime) -> (i64, u32, u32, u32, u32, u32) {
    let utc = OffsetDateTime::from(time);
    (
        i64::from(utc.year()),
        u32::from(u8::from(utc.month())),
        u32::from(utc.day()),
        u32::from(utc.hour()),
        u32::from(utc.minute()),
        u32::from(utc.second()),
    )
}

impl Logger {
    fn vllm_prefix(&self, proc_: Proc, level: &str, source: &str) -> String {
        let (_, mo, d, h, mi, s) = utc_parts(SystemTime::now());
        let who = match proc_ {
            Proc::ApiServer => format!("APIServer pid={}", self.api_pid),
            Proc::EngineCore(pid) => format!("EngineCore_DP0 pid={pid}"),
            Proc::Worker(rank, pid) => format!("Worker_TP{rank} pid={pid}"),
        };
        format!("({who}) {level} {mo:02}-{d:02} {h:02}:{mi:02}:{s:02} [{source}] ")
    }

    fn sglang_prefix(&self, rank: Option<u32>) -> String {
        let (y, mo, d, h, mi, s) = utc_parts(SystemTime::now());
        match rank {
            Some(r) => format!("[{y}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02} TP{r}] "),
            None => format!("[{y}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}] "),
        }
    }

    /// A vLLM log line from the API server.
    pub fn api(&self, level: &str, source: &str, message: &str) {
        self.vllm(Proc::ApiServer, level, source, message);
    }

    /// A vLLM log line from the engine core.
    pub fn core(&self, level: &str, source: &str, message: &str) {
        self.vllm(Proc::EngineCore(self.core_pid), level, source, message);
    }

    pub fn vllm(&self, proc_: Proc, level: &str, source: &str, message: &str) {
        let line = format!("{}{message}\n", self.vllm_prefix(proc_, level, source));
        write_out(&line);
    }

    /// An SGLang line; `rank` adds the `TPn` tag scheduler lines carry.
    pub fn sglang(&self, rank: Option<u32>, message: &str) {
        let line = format!("{}{message}\n", self.sglang_prefix(rank));
        write_err(&line);
    }

    /// A line from the engine's main process in its persona's format.
    pub fn info(&self, source: &str, message: &str) {
        match self.persona.engine {
            Engine::Vllm => self.api("INFO", source, message),
            Engine::Sglang => self.sglang(None, message),
        }
    }

    /// A uvicorn line; vLLM's wrapped stdout adds its process prefix.
    pub fn uvicorn(&self, message: &str) {
        match self.persona.engine {
            Engine::Vllm => write_out(&format!(
                "(APIServer pid={}) INFO:     {message}\n",
                self.api_pid
            )),
            Engine::Sglang => write_err(&format!("INFO:     {message}\n")),
        }
    }

    /// Raw lines (tracebacks) on stderr, unprefixed.
    pub fn raw_err(&self, text: &str) {
        write_err(text);
    }
}

pub fn write_out(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

pub fn write_err(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes());
    let _ = err.flush();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn utc_parts_matches_a_known_instant() {
        // 2026-12-02T15:22:40Z
        let t = UNIX_EPOCH + Duration::from_secs(1_796_224_960);
        assert_eq!(utc_parts(t), (2026, 12, 2, 15, 22, 40));
    }
}
