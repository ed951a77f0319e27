//! What a vLLM head with `--distributed-executor-backend ray` sees of the
//! cluster: placement that waits for GPUs, and loss of a node afterwards.

use std::time::Duration;

use super::{cluster_address, query};
use crate::config::ServeConfig;
use crate::logs::Logger;

/// A vLLM head with the Ray backend: waits until the cluster holds enough
/// GPUs for TP x PP, warning every 10 s as vLLM's placement does.
pub async fn wait_for_placement(cfg: &ServeConfig, log: &Logger) {
    let world = cfg.world_size();
    let addr = cluster_address(None, None);
    let mut waited = 0u64;
    loop {
        let available = match &addr {
            Some(addr) => query(addr)
                .await
                .map(|nodes| nodes.iter().map(|n| n.2).sum::<u64>()),
            None => None,
        }
        // No cluster: ray.init() starts a local one with this node's GPUs.
        .unwrap_or(cfg.visible_gpus);
        if available >= world {
            log.api(
                "INFO",
                "ray_utils.py:345",
                &format!("Using the existing placement group with {world} bundles, {available} GPUs in the cluster."),
            );
            return;
        }
        if waited.is_multiple_of(10) {
            let specs: Vec<String> = (0..world).map(|_| "{'GPU': 1.0}".to_string()).collect();
            log.api(
                "WARNING",
                "ray_utils.py:270",
                &format!(
                    "Waiting for creating a placement group of specs for {waited} seconds. specs=[{}]. Check `ray status` and `ray list nodes` to see if you have enough resources, and make sure the IP addresses used by ray cluster are the same as VLLM_HOST_IP environment variable specified in each node if you are running on a multi-node.",
                    specs.join(", ")
                ),
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        waited += 1;
    }
}

/// After placement: reports a lost node when the cluster's GPUs fall below
/// what the replica uses.
pub fn watch_cluster(cfg: &ServeConfig) -> Option<crate::rendezvous::Membership> {
    let addr = cluster_address(None, None)?;
    let world = cfg.world_size();
    let (tx, rx) = tokio::sync::watch::channel(None);
    let keep = tx.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let gpus = query(&addr)
                .await
                .map(|n| n.iter().map(|n| n.2).sum::<u64>())
                .unwrap_or(0);
            if gpus < world {
                let _ = tx.send(Some(format!("a Ray node of {addr}")));
                return;
            }
        }
    });
    Some(crate::rendezvous::Membership::from_channel(rx, keep))
}
