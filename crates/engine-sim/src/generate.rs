//! Delivering a planned request at the simulated pace: queueing for a batch
//! slot, time to first token, one token per inter-token latency, streamed
//! chunk by chunk or answered whole, with the injected faults.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, watch};

use crate::knobs::{Fault, StreamCrash};
use crate::persona::Engine;
use crate::plan::{ChoicePlan, Plan};
use crate::rng::SplitMix;
use crate::state::{EngineState, Interrupt};
use crate::wire::{self, Envelope, Finish, Route, Usage};

/// Why delivery stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    ClientGone,
    Abort,
    EngineDead,
}

/// Sleeps unless the request is interrupted or its client is gone.
async fn pause(
    duration: Duration,
    interrupt: &mut watch::Receiver<Interrupt>,
    client: Option<&mpsc::Sender<Result<Bytes, Stop>>>,
) -> Result<(), Stop> {
    let check = |i: Interrupt| match i {
        Interrupt::None => Ok(()),
        Interrupt::Abort => Err(Stop::Abort),
        Interrupt::EngineDead => Err(Stop::EngineDead),
    };
    check(*interrupt.borrow())?;
    if duration.is_zero() {
        return Ok(());
    }
    let closed = async {
        match client {
            Some(tx) => tx.closed().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::time::sleep(duration) => Ok(()),
        _ = closed => Err(Stop::ClientGone),
        changed = interrupt.changed() => match changed {
            Ok(()) => check(*interrupt.borrow()),
            Err(_) => Ok(()),
        },
    }
}

fn jittered(rng: &mut SplitMix, base: Duration) -> Duration {
    if base.is_zero() {
        return base;
    }
    // +-10% so that latency histograms spread like a real engine's.
    base.mul_f64(0.9 + rng.unit() * 0.2)
}

struct Pace {
    ttft: Duration,
    itl: Duration,
    stall: bool,
    crash: Option<(StreamCrash, u64)>,
    oom_after: Option<u64>,
}

fn pace(state: &EngineState) -> Pace {
    let knobs = &state.cfg.knobs;
    let spike = knobs.faults.iter().find_map(|f| {
        if let Fault::TtftSpike(d) = f {
            Some(*d)
        } else {
            None
        }
    });
    Pace {
        ttft: knobs.ttft + spike.unwrap_or_default(),
        itl: knobs.itl.mul_f64(knobs.itl_factor()),
        stall: knobs.faults.contains(&Fault::Stall),
        crash: knobs.faults.iter().find_map(|f| match f {
            Fault::CrashMidStream { mode, after_tokens } => Some((*mode, *after_tokens)),
            _ => None,
        }),
        oom_after: knobs.faults.iter().find_map(|f| {
            if let Fault::OomAfterTokens(n) = f {
                Some(*n)
            } else {
                None
            }
        }),
    }
}

/// The prompt's prefill: only the tokens the prefix cache lacks cost
/// time, and one prefill runs at a time, so uncached prompts queue behind
/// each other. Returns the time it took, queueing included.
async fn prefill(
    state: &EngineState,
    plan: &Plan,
    interrupt: &mut watch::Receiver<Interrupt>,
    client: Option<&mpsc::Sender<Result<Bytes, Stop>>>,
) -> Result<Duration, Stop> {
    let started = Instant::now();
    let rank = state.pick_rank();
    let uncached = state.record_prefix(rank.rank, &plan.prompt_token_ids);
    let work = state
        .cfg
        .knobs
        .prefill_per_token
        .saturating_mul(u32::try_from(uncached).unwrap_or(u32::MAX));
    if work.is_zero() {
        return Ok(Duration::ZERO);
    }
    let _lane = tokio::select! {
        lane = rank.rank.prefill_lane.lock() => lane,
        stop = wait_interrupt(interrupt) => return Err(stop),
    };
    pause(work, interrupt, client).await?;
    Ok(started.elapsed())
}

/// Counts generated tokens; returns true when the OOM fault fires.
fn count_generated(state: &Arc<EngineState>, oom_after: Option<u64>, tokens: u64) -> bool {
    state
        .metrics
        .generation_tokens
        .fetch_add(tokens, Ordering::Relaxed);
    let total = state.tokens_generated.fetch_add(tokens, Ordering::Relaxed) + tokens;
    matches!(oom_after, Some(limit) if total >= limit)
}

fn record_finish(state: &EngineState, plan: &Plan) {
    for c in &plan.choices {
        let counter = if c.finish.reason == "length" {
            &state.metrics.finished_length
        } else {
            &state.metrics.finished_stop
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
    state.metrics.requests_total.fetch_add(1, Ordering::Relaxed);
}

/// Runs a non-streamed request to completion; `Ok(body)` or why it stopped.
pub async fn run_full(state: Arc<EngineState>, mut plan: Plan) -> Result<String, Stop> {
    let mut interrupt = state.interrupt.subscribe();
    let p = pace(&state);
    let start = Instant::now();
    let (mut guard, queued) = tokio::select! {
        admitted = state.admit() => admitted,
        stop = wait_interrupt(&mut interrupt) => return Err(stop),
    };
    state.metrics.queue.observe(queued.as_secs_f64());
    state
        .metrics
        .prompt_tokens
        .fetch_add(plan.prompt_tokens, Ordering::Relaxed);
    let completion = plan.completion_tokens();
    guard.add_kv(plan.prompt_tokens + completion);
    let ttft = jittered(&mut plan.rng, p.ttft);
    let prefill = prefill(&state, &plan, &mut interrupt, None).await?;
    pause(ttft, &mut interrupt, None).await?;
    state.metrics.ttft.observe((ttft + prefill).as_secs_f64());
    let longest = plan
        .choices
        .iter()
        .map(|c| c.pieces.len() as u64)
        .max()
        .unwrap_or(0);
    if p.stall {
        std::future::pending::<()>().await;
    }
    if longest > 1 {
        let decode = jittered(&mut plan.rng, p.itl * (longest as u32 - 1));
        pause(decode, &mut interrupt, None).await?;
        let per_token = decode.as_secs_f64() / (longest - 1) as f64;
        for _ in 1..longest.min(64) {
            state.metrics.itl.observe(per_token);
        }
    }
    if count_generated(&state, p.oom_after, completion) {
        crate::lifecycle::engine_died(&state, crate::lifecycle::Death::CudaOom);
        return Err(Stop::EngineDead);
    }
    state.metrics.e2e.observe(start.elapsed().as_secs_f64());
    record_finish(&state, &plan);
    drop(guard);
    let choices: Vec<(String, Finish)> = plan
        .choices
        .iter()
        .map(|c| (c.pieces.concat(), c.finish.clone()))
        .collect();
    Ok(plan.envelope.full_response(
        &choices,
        Usage {
            prompt: plan.prompt_tokens,
            completion,
        },
    ))
}

async fn wait_interrupt(interrupt: &mut watch::Receiver<Interrupt>) -> Stop {
    loop {
        match *interrupt.borrow_and_update() {
            Interrupt::Abort => return Stop::Abort,
            Interrupt::EngineDead => return Stop::EngineDead,
            Interrupt::None => {}
        }
        if interrupt.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Streams a request into `tx`, chunk by chunk at the simulated pace.
pub async fn run_stream(
    state: Arc<EngineState>,
    mut plan: Plan,
    tx: mpsc::Sender<Result<Bytes, Stop>>,
) {
    let mut interrupt = state.interrupt.subscribe();
    let outcome = stream_inner(&state, &mut plan, &tx, &mut interrupt).await;
    match outcome {
        Ok(()) => record_finish(&state, &plan),
        Err(stop) => {
            state.metrics.finished_abort.fetch_add(1, Ordering::Relaxed);
            if stop != Stop::ClientGone {
                let _ = tx.send(Err(stop)).await;
            }
        }
    }
}

async fn stream_inner(
    state: &Arc<EngineState>,
    plan: &mut Plan,
    tx: &mpsc::Sender<Result<Bytes, Stop>>,
    interrupt: &mut watch::Receiver<Interrupt>,
) -> Result<(), Stop> {
    let p = pace(state);
    let start = Instant::now();
    let (mut guard, queued) = tokio::select! {
        admitted = state.admit() => admitted,
        stop = wait_interrupt(interrupt) => return Err(stop),
        _ = tx.closed() => return Err(Stop::ClientGone),
    };
    state.metrics.queue.observe(queued.as_secs_f64());
    state
        .metrics
        .prompt_tokens
        .fetch_add(plan.prompt_tokens, Ordering::Relaxed);
    guard.add_kv(plan.prompt_tokens);
    let ttft = jittered(&mut plan.rng, p.ttft);
    let prefill = prefill(state, plan, interrupt, Some(tx)).await?;
    pause(ttft, interrupt, Some(tx)).await?;
    state.metrics.ttft.observe((ttft + prefill).as_secs_f64());
    let env = plan.envelope.clone();
    if env.route == Route::Chat {
        for i in 0..plan.choices.len() {
            send(tx, env.role_chunk(i)).await?;
        }
    }
    let longest = plan
        .choices
        .iter()
        .map(|c| c.pieces.len())
        .max()
        .unwrap_or(0);
    for step in 0..longest {
        if step > 0 {
            if p.stall {
                pause(Duration::from_secs(u64::MAX / 4), interrupt, Some(tx)).await?;
            }
            let itl = jittered(&mut plan.rng, p.itl);
            pause(itl, interrupt, Some(tx)).await?;
            state.metrics.itl.observe(itl.as_secs_f64());
        }
        if let Some((mode, after)) = p.crash
            && step as u64 >= after
        {
            return match mode {
                StreamCrash::Cut | StreamCrash::CutAfterFinish => Err(Stop::Abort),
                StreamCrash::ErrorEvent => {
                    let event = wire::stream_error_event(
                        "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                        "InternalServerError",
                        500,
                    );
                    send(tx, event).await?;
                    Ok(())
                }
            };
        }
        let emitted = send_step(tx, &env, &plan.choices, step).await?;
        guard.add_kv(emitted);
        if count_generated(state, p.oom_after, emitted) {
            crate::lifecycle::engine_died(state, crate::lifecycle::Death::CudaOom);
            return Err(Stop::EngineDead);
        }
    }
    if matches!(p.crash, Some((StreamCrash::CutAfterFinish, _))) {
        // One token's time first, so the finishing chunk is on the wire
        // before the connection closes (as when an engine dies then).
        pause(jittered(&mut plan.rng, p.itl), interrupt, Some(tx)).await?;
        return Err(Stop::Abort);
    }
    send_stream_end(tx, &env, plan).await?;
    state.metrics.e2e.observe(start.elapsed().as_secs_f64());
    Ok(())
}

async fn send(tx: &mpsc::Sender<Result<Bytes, Stop>>, text: String) -> Result<(), Stop> {
    tx.send(Ok(Bytes::from(text)))
        .await
        .map_err(|_| Stop::ClientGone)
}

/// Token `step` of every choice that has one, with the finish where it is
/// the last (vLLM in the same chunk, SGLang in one of its own); returns how
/// many tokens went out.
async fn send_step(
    tx: &mpsc::Sender<Result<Bytes, Stop>>,
    env: &Envelope,
    choices: &[ChoicePlan],
    step: usize,
) -> Result<u64, Stop> {
    let mut emitted = 0;
    for (i, choice) in choices.iter().enumerate() {
        let Some(piece) = choice.pieces.get(step) else {
            continue;
        };
        emitted += 1;
        let last = step + 1 == choice.pieces.len();
        let chunk = if last && env.engine == Engine::Vllm {
            env.content_chunk(i, piece, Some(&choice.finish))
        } else {
            env.content_chunk(i, piece, None)
        };
        send(tx, chunk).await?;
        if last && env.engine == Engine::Sglang {
            send(tx, env.finish_chunk(i, &choice.finish)).await?;
        }
    }
    Ok(emitted)
}

/// What follows the last token: the finish of choices that had no tokens,
/// the usage when asked for, and `[DONE]`.
async fn send_stream_end(
    tx: &mpsc::Sender<Result<Bytes, Stop>>,
    env: &Envelope,
    plan: &Plan,
) -> Result<(), Stop> {
    // A choice with no tokens at all still reports how it ended.
    for (i, choice) in plan
        .choices
        .iter()
        .enumerate()
        .filter(|(_, c)| c.pieces.is_empty())
    {
        match env.engine {
            Engine::Vllm => send(tx, env.content_chunk(i, "", Some(&choice.finish))).await?,
            Engine::Sglang => send(tx, env.finish_chunk(i, &choice.finish)).await?,
        }
    }
    if plan.include_usage {
        send(
            tx,
            env.usage_chunk(Usage {
                prompt: plan.prompt_tokens,
                completion: plan.completion_tokens(),
            }),
        )
        .await?;
    }
    send(tx, wire::DONE.to_string()).await
}
