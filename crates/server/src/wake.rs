//! The in-peer router's way to ask for a replica of a model scaled to
//! zero: a `WakeModel` write, forwarded to the leader like any other.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use llmgw_raft::{ControlPlane, now_ms};
use llmgw_state::Command;

/// Held requests for one model ask at most this often.
const COALESCE: Duration = Duration::from_secs(1);

pub struct PeerWaker {
    control: ControlPlane,
    last_asked: Mutex<HashMap<String, Instant>>,
}

impl PeerWaker {
    pub fn new(control: ControlPlane) -> Self {
        PeerWaker {
            control,
            last_asked: Mutex::new(HashMap::new()),
        }
    }
}

impl llmgw_router::ModelWaker for PeerWaker {
    fn wake(&self, model: &str) {
        {
            let mut asked = self.last_asked.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            if asked
                .get(model)
                .is_some_and(|at| now.duration_since(*at) < COALESCE)
            {
                return;
            }
            asked.insert(model.to_owned(), now);
        }
        let control = self.control.clone();
        let name = model.to_owned();
        tokio::spawn(async move {
            let command = Command::WakeModel {
                name: name.clone(),
                at_ms: now_ms(),
            };
            if let Err(error) = control.write(command).await {
                // The next held request asks again.
                tracing::warn!(model = %name, %error, "could not ask for a replica of a model scaled to zero");
            }
        });
    }
}
