//! Seeding the configured catalog (server.yaml `catalog`) into a cluster
//! formed with `initial_cluster_state: new`.
//!
//! A new cluster refuses writes for a moment after it forms: its first
//! leader waits until a majority has answered it and it has applied its own
//! first entry. A seed written once at that moment is lost, and the cluster
//! then runs with an empty catalog for good. So the seed is retried until it
//! lands or the catalog turns out to be there already, and it is written as
//! [`Command::SeedCatalog`], which applies once per cluster and only to an
//! empty catalog: a retry after an ambiguous answer, another peer seeding
//! at the same time, or a peer restarted with the same configuration never
//! writes it twice nor over what an operator changed since.

use std::time::{Duration, Instant};

use llmgw_catalog::Catalog;
use llmgw_raft::{ControlError, ControlPlane, now_ms};
use llmgw_state::{Command, ModelSpec, SeedModel};
use rand::Rng;

/// The first pause after a failed attempt; doubled up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const MAX_PAUSE: Duration = Duration::from_secs(5);
/// A reason that does not change is logged again this often.
const REPEAT_LOG: Duration = Duration::from_secs(30);

/// What one attempt found.
enum Attempt {
    /// The catalog is seeded (now or earlier), or holds models already.
    Done,
    /// Nothing was decided; try again after a pause.
    Wait(String),
}

/// Seeds `catalog` into the cluster unless it was seeded already. Returns
/// once it has been, or once the cluster's catalog is found not to be
/// empty; retries every failure until then.
pub async fn seed_catalog(control: &ControlPlane, catalog: Catalog) {
    let names: Vec<String> = catalog.models.iter().map(|m| m.name.clone()).collect();
    let models: Vec<SeedModel> = catalog
        .models
        .into_iter()
        .map(|model| SeedModel {
            name: model.name.clone(),
            replicas: model.desired_replicas(),
            spec: ModelSpec::new(model),
        })
        .collect();
    let started = Instant::now();
    let mut logged: Option<(String, Instant)> = None;
    for attempt in 0u32.. {
        let why = match try_seed(control, &models, &names).await {
            Attempt::Done => return,
            Attempt::Wait(why) => why,
        };
        let pause = full_jitter(attempt);
        let repeat = logged
            .as_ref()
            .is_none_or(|(last, at)| *last != why || at.elapsed() >= REPEAT_LOG);
        if repeat {
            tracing::info!(
                models = ?names,
                attempts = attempt + 1,
                waited_s = started.elapsed().as_secs(),
                reason = %why,
                "seeding the configured catalog waits for a writable leader; retrying"
            );
            logged = Some((why, Instant::now()));
        }
        tokio::time::sleep(pause).await;
    }
}

async fn try_seed(control: &ControlPlane, models: &[SeedModel], names: &[String]) -> Attempt {
    // Up to date first, so a peer restarted into a seeded cluster proposes
    // nothing at all.
    if let Err(error) = control.linearizable_barrier().await {
        return Attempt::Wait(error.to_string());
    }
    let (seeded, existing) = control.read(|fleet| (fleet.catalog_seeded, fleet.models.len()));
    if seeded || existing > 0 {
        tracing::info!(
            seeded,
            models_in_catalog = existing,
            "the cluster's catalog is there already; the configured catalog is not seeded again"
        );
        return Attempt::Done;
    }
    let seed = Command::SeedCatalog {
        models: models.to_vec(),
        at_ms: now_ms(),
    };
    match control.write(seed).await {
        Ok(index) => {
            tracing::info!(models = ?names, index, "catalog seeded");
            Attempt::Done
        }
        // Another peer seeded it, or an operator wrote a model first.
        Err(ControlError::Rejected(rejection)) => {
            tracing::info!(%rejection, "the configured catalog is not seeded");
            Attempt::Done
        }
        Err(error) => Attempt::Wait(error.to_string()),
    }
}

/// Uniform in [0, min(MAX_PAUSE, FIRST_PAUSE × 2^attempt)], so peers that
/// retry together spread out.
fn full_jitter(attempt: u32) -> Duration {
    let cap = FIRST_PAUSE
        .saturating_mul(1 << attempt.min(16))
        .min(MAX_PAUSE);
    cap.mul_f64(rand::rng().random_range(0.0..=1.0))
}
