//! The agent's instance id: 128 random bits, made on the first start and
//! kept in the work directory. It tells the leader that a Register comes
//! from the machine already holding the node's session (an agent restart,
//! a cut stream) or from another machine configured with the same
//! `node_id`, which the leader refuses while the first one is live.

use std::path::Path;

use rand::Rng;

use crate::durable;

const FILE: &str = "instance-id";

/// The id kept in `work_dir`, made and written there if missing. Empty when
/// it can be neither read nor written: the leader then cannot tell
/// machines apart and lets each Register take over, as before.
pub fn load_or_create(work_dir: &Path) -> String {
    let path = work_dir.join(FILE);
    if let Ok(text) = std::fs::read_to_string(&path) {
        let id = text.trim();
        if is_instance_id(id) {
            return id.to_owned();
        }
        tracing::warn!(file = %path.display(), "instance id unreadable; making a new one");
    }
    let id = format!("{:032x}", rand::rng().random::<u128>());
    match std::fs::create_dir_all(work_dir)
        .and_then(|()| durable::write(&path, id.as_bytes(), false))
    {
        Ok(()) => id,
        Err(error) => {
            tracing::warn!(file = %path.display(), %error, "cannot keep an instance id; duplicate node ids will not be detected");
            String::new()
        }
    }
}

fn is_instance_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_survives_a_restart_and_differs_between_work_dirs() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let first = load_or_create(a.path());
        assert!(is_instance_id(&first), "{first}");
        assert_eq!(load_or_create(a.path()), first);
        assert_ne!(load_or_create(b.path()), first);
        std::fs::write(a.path().join(FILE), "garbage").unwrap();
        let replaced = load_or_create(a.path());
        assert!(is_instance_id(&replaced) && replaced != first);
    }
}
