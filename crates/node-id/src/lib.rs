//! The one rule for node ids (and the one for cluster ids). `agent.yaml`, the certificates `llmgw certs`
//! issues and the registration of an agent all check it, so an id that
//! passes `llmgw config check` is never refused later.

/// A node id is 1 to 63 letters, digits, `.`, `_` or `-`, not starting
/// with `.` or `-`: it fits a DNS label, a URI path segment and a file
/// name as it is.
pub fn check_node_id(id: &str) -> Result<(), String> {
    let problem = if id.is_empty() {
        "it is empty".to_owned()
    } else if id.len() > 63 {
        format!("it is {} characters long", id.len())
    } else if let Some(bad) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        format!("it has {bad:?}")
    } else if let Some(first) = id.chars().next().filter(|c| matches!(c, '.' | '-')) {
        format!("it starts with {first:?}")
    } else {
        return Ok(());
    };
    Err(format!(
        "node id {id:?} is not valid: {problem}; use 1 to 63 letters, digits, '.', '_' or '-', \
         not starting with '.' or '-'"
    ))
}

/// A cluster id (server.yaml `cluster_id`, or made when a cluster is
/// formed) is 1 to 64 lowercase letters, digits and `-`, not starting with
/// `-` (which the agent's fencing file reads as "no cluster"): it stands
/// in a file name, a log line, a request header and a metric label as it
/// is.
pub fn check_cluster_id(id: &str) -> Result<(), String> {
    let plain = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let valid = id.len() <= 64
        && id.bytes().next().is_some_and(plain)
        && id.bytes().all(|b| plain(b) || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "cluster id {id:?} is not valid: use 1 to 64 characters of a-z, 0-9 and -, \
             starting with a letter or digit"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::{check_cluster_id, check_node_id};

    #[test]
    fn cluster_ids_are_plain_lowercase() {
        assert!(check_cluster_id("prod-eu-1").is_ok());
        for bad in ["", "-", "-a", "Prod", "a b", "x/y", &"a".repeat(65)] {
            assert!(check_cluster_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn host_names_pass() {
        for id in ["gpu-07", "gpu-07.rack2", "n_1", "A", &"a".repeat(63)] {
            assert_eq!(check_node_id(id), Ok(()), "{id}");
        }
    }

    #[test]
    fn each_refusal_names_the_problem() {
        let cases = [
            ("", "it is empty"),
            ("gpu:1", "it has ':'"),
            ("gpu 1", "it has ' '"),
            ("-gpu", "it starts with '-'"),
            (".gpu", "it starts with '.'"),
            ("gpü", "it has 'ü'"),
            ("../etc", "it has '/'"),
        ];
        for (id, says) in cases {
            let error = check_node_id(id).expect_err(id);
            assert!(
                error.contains("is not valid") && error.contains(says),
                "{id:?}: {error}"
            );
        }
        let long = "a".repeat(64);
        assert!(
            check_node_id(&long)
                .unwrap_err()
                .contains("it is 64 characters long")
        );
    }
}
