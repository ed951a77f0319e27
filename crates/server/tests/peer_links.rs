//! Every peer keeps a connection open to every other member. Followers
//! talk only to the leader, so without it the two followers hold none to
//! each other, and after the leader dies their first pre-vote must dial
//! (TCP and an mTLS handshake) on a listener the whole fleet is dialling
//! at that moment.

use std::collections::HashSet;

use llmgw_test_kit::Cluster;

/// Socket inodes of TCP connections in state ESTABLISHED to `port` on
/// this host, from /proc/net/tcp and tcp6.
fn established_to(port: u16) -> HashSet<u64> {
    let mut inodes = HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(remote), Some(state), Some(inode)) =
                (fields.get(2), fields.get(3), fields.get(9))
            else {
                continue;
            };
            let remote_port = remote
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if remote_port == Some(port)
                && *state == "01"
                && let Ok(inode) = inode.parse()
            {
                inodes.insert(inode);
            }
        }
    }
    inodes
}

/// Socket inodes open in process `pid`.
fn sockets_of(pid: u32) -> HashSet<u64> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return HashSet::new();
    };
    fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            target
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// Whether peer `from` holds an established connection to peer `to`'s
/// gRPC port.
fn connected(cluster: &Cluster, from: u64, to: u64) -> bool {
    let Some(child) = cluster.peer(from).child.as_ref() else {
        return false;
    };
    let open = established_to(cluster.peer(to).layout.grpc.port());
    sockets_of(child.id())
        .iter()
        .any(|inode| open.contains(inode))
}

/// A follower's link to the other is lost (the other paused past the
/// HTTP/2 keep-alive, as a loaded host can stall) and comes back by
/// itself, with no election or write to make it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_reconnects_to_the_other_follower_without_an_election() {
    let cluster = Cluster::start_tls("");
    let leader = cluster.wait_leader().await;
    let followers: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    let (from, to) = (followers[0], followers[1]);
    cluster.pause(to);
    cluster
        .eventually(
            "the keep-alive closed the link to the paused follower",
            || async {
                if connected(&cluster, from, to) {
                    Err(format!("peer {from} still holds a connection to peer {to}"))
                } else {
                    Ok(())
                }
            },
        )
        .await;
    cluster.resume(to);
    cluster
        .eventually("the link between the followers open again", || async {
            if connected(&cluster, from, to) {
                Ok(())
            } else {
                Err(format!("peer {from} holds no connection to peer {to}"))
            }
        })
        .await;
    assert_eq!(
        cluster.wait_leader().await,
        leader,
        "no election was needed to reconnect"
    );
}
