//! The ends of a serving engine's life: death of the engine under load, and
//! shutdown on SIGTERM, each the way its persona does it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::failures::Ending;
use crate::persona::Engine;
use crate::state::{EngineState, Interrupt, Phase};

const PY: &str = "/usr/local/lib/python3.12/dist-packages";

/// What killed a running engine.
#[derive(Debug, Clone)]
pub enum Death {
    /// CUDA out of memory in the middle of serving.
    CudaOom,
    /// A peer rank of a multi-node replica went away.
    PeerLost(String),
}

/// Time for a finished response's last bytes to leave before exiting.
const FLUSH_GRACE: Duration = Duration::from_millis(50);

/// How long a dead vLLM keeps answering `/health` 503 before it exits.
const DEATH_GRACE: Duration = Duration::from_millis(500);

/// The NCCL watchdog's report when a peer disappears.
pub fn nccl_lines(rank: u64, peer: &str) -> String {
    format!(
        "[rank{rank}]:[E{}] [PG ID 2 PG GUID 3 Rank {rank}] Process group watchdog thread terminated with exception: NCCL error: remote process exited or there was a network error, NCCL version 2.27.3\nncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.\nLast error:\nsocketProgress: Connection closed by remote peer {peer}\n",
        nccl_stamp()
    )
}

fn nccl_stamp() -> String {
    let (_, mo, d, h, mi, s) = crate::logs::utc_parts(std::time::SystemTime::now());
    format!("{mo:02}{d:02} {h:02}:{mi:02}:{s:02}.000000 ProcessGroupNCCL.cpp:1895")
}

/// Marks the engine dead, fails in-flight requests, prints the tail and
/// ends the process shortly after (unless vLLM is told to stay alive).
pub fn engine_died(state: &Arc<EngineState>, death: Death) {
    if state.fatal_started.swap(true, Ordering::SeqCst) {
        return;
    }
    state.set_phase(Phase::Dead);
    let _ = state.interrupt.send(Interrupt::EngineDead);
    let log = state.log;
    let rank = state.cfg.node_rank * state.cfg.local_world();
    let cause = match &death {
        Death::CudaOom => crate::failures::Failure::CudaOom {
            tried_gib: 2.0,
            total_gib: state.cfg.knobs.gpu_memory_gb,
            free_gib: 1.21,
        }
        .exception(state.cfg.persona.engine),
        Death::PeerLost(peer) => {
            log.raw_err(&nccl_lines(rank, peer));
            "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, remote process exited or there was a network error, NCCL version 2.27.3".to_string()
        }
    };
    let ending = match state.cfg.persona.engine {
        Engine::Vllm => {
            log.core(
                "ERROR",
                "core.py:710",
                "EngineCore encountered a fatal error.",
            );
            for line in format!(
                "Traceback (most recent call last):\n  File \"{PY}/vllm/v1/engine/core.py\", line 701, in run_engine_core\n    engine_core.run_busy_loop()\n  File \"{PY}/vllm/v1/engine/core.py\", line 728, in run_busy_loop\n    self._process_engine_step()\n  File \"{PY}/vllm/v1/executor/multiproc_executor.py\", line 243, in get_response\n    raise RuntimeError(\n{cause}"
            )
            .lines()
            {
                log.core("ERROR", "core.py:710", line);
            }
            log.api(
                "ERROR",
                "async_llm.py:480",
                "AsyncLLM output_handler failed.",
            );
            log.api(
                "ERROR",
                "async_llm.py:480",
                "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.",
            );
            if state.cfg.headless {
                Ending::Signal(libc::SIGABRT)
            } else {
                Ending::Exit(1)
            }
        }
        Engine::Sglang => {
            log.sglang(
                Some(rank as u32),
                &format!(
                    "Scheduler hit an exception: Traceback (most recent call last):\n  File \"{PY}/sglang/srt/managers/scheduler.py\", line 2951, in run_scheduler_process\n    scheduler.event_loop_overlap()\n  File \"{PY}/sglang/srt/managers/scheduler.py\", line 1004, in event_loop_overlap\n    batch_result = self.run_batch(batch)\n{cause}\n"
                ),
            );
            log.sglang(
                None,
                "Received sigquit from a child process. It usually means the child failed.",
            );
            Ending::Signal(libc::SIGKILL)
        }
    };
    let keep_alive = state.cfg.persona.engine == Engine::Vllm
        && std::env::var("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH").is_ok_and(|v| v == "1");
    if keep_alive {
        return;
    }
    std::thread::spawn(move || {
        std::thread::sleep(DEATH_GRACE);
        crate::sys::finish(ending);
    });
}

/// Handles SIGTERM after startup, as the persona does; returns how to end.
/// `stop_accepting` closes the listener and ends idle keep-alive connections.
pub async fn shutdown(state: &Arc<EngineState>, stop_accepting: &watch::Sender<bool>) -> Ending {
    let log = state.log;
    let cfg = &state.cfg;
    match cfg.persona.engine {
        Engine::Vllm if !cfg.persona.has_shutdown_timeout() => {
            log.api(
                "INFO",
                "launcher.py:99",
                "Shutting down FastAPI HTTP server.",
            );
            let _ = state.interrupt.send(Interrupt::Abort);
            let _ = stop_accepting.send(true);
            log.uvicorn("Shutting down");
            wait_idle(state, Duration::from_millis(500)).await;
            log.uvicorn("Waiting for application shutdown.");
            log.uvicorn("Application shutdown complete.");
            Ending::Exit(0)
        }
        Engine::Vllm => {
            let timeout = cfg.shutdown_timeout;
            let mode = if timeout.is_zero() { "abort" } else { "drain" };
            log.api(
                "INFO",
                "launcher.py:112",
                &format!(
                    "[shutdown] API server: stopping engine client mode={mode} timeout={}s",
                    timeout.as_secs()
                ),
            );
            state.set_phase(Phase::Draining);
            let _ = stop_accepting.send(true);
            log.uvicorn("Shutting down");
            if !timeout.is_zero() {
                wait_idle(state, timeout).await;
            }
            let _ = state.interrupt.send(Interrupt::Abort);
            wait_idle(state, Duration::from_millis(500)).await;
            log.uvicorn("Waiting for application shutdown.");
            log.uvicorn("Application shutdown complete.");
            Ending::Exit(0)
        }
        Engine::Sglang => {
            log.sglang(
                None,
                "SIGTERM received. signum=None frame=None. Draining requests and shutting down...",
            );
            let unhealthy = state.phase() == Phase::Unhealthy;
            state.set_phase(Phase::Draining);
            let forced =
                std::env::var("SGL_FORCE_SHUTDOWN").is_ok_and(|v| !v.is_empty() && v != "0");
            if !unhealthy && !forced {
                let started = Instant::now();
                loop {
                    if state.busy() == 0 {
                        break;
                    }
                    // SGLang counts requests, not the sockets still flushing.
                    let remaining = state.in_flight().max(1);
                    log.sglang(
                        None,
                        &format!(
                            "Gracefully exiting... Remaining number of requests {remaining}. Remaining requests remaining_rids=[]. Elapsed {:.0} s",
                            started.elapsed().as_secs_f64()
                        ),
                    );
                    // Poll often so the exit follows the last request closely,
                    // but log only every 5 s, as SGLang does.
                    let until = Instant::now() + Duration::from_secs(5);
                    while Instant::now() < until && state.busy() > 0 {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            let _ = stop_accepting.send(true);
            tokio::time::sleep(FLUSH_GRACE).await;
            Ending::Signal(libc::SIGKILL)
        }
    }
}

/// Waits until no request is in flight, or the deadline passes.
async fn wait_idle(state: &EngineState, limit: Duration) {
    let deadline = Instant::now() + limit;
    while state.busy() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The body is dropped as its last chunk is queued; give the connection
    // a moment to put the terminating chunk on the wire.
    tokio::time::sleep(FLUSH_GRACE).await;
}
