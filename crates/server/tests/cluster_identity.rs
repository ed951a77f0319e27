//! Which cluster is which: a cluster formed with `cluster_id` in
//! server.yaml takes that id and begins an epoch, `llmgw ctl cluster`
//! shows both, and an agent that joined another cluster is refused by the
//! leader with a message that names both.

use llmgw_dev::L40S_PCIE;
use llmgw_test_kit::Cluster;
use llmgw_test_kit::agents::Agent;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_joined_another_cluster_is_refused_naming_both() {
    let cluster = Cluster::start("cluster_id: prod-a\n");
    let leader = cluster.wait_leader().await;
    let shown = cluster
        .eventually("ctl cluster shows the id and epoch", || async {
            let out = cluster.ctl(leader).arg("cluster").output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            if text.starts_with("cluster: prod-a  epoch: ") {
                Ok(text)
            } else {
                Err(text)
            }
        })
        .await;
    assert!(!shown.contains("epoch: 0"), "{shown}");

    let mut agent = Agent::start(&cluster, "l40s-1", L40S_PCIE, 1);
    cluster
        .eventually("the agent registered", || async {
            match cluster.nodes(leader).await?.as_slice() {
                [node] if node.stream.as_ref().is_some_and(|s| s.connected) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    let fencing = agent.layout.work_dir.join("leader-term");
    let joined = std::fs::read_to_string(&fencing).unwrap();
    assert!(
        joined.trim_end().ends_with(" prod-a"),
        "the agent keeps the cluster it joined: {joined:?}"
    );

    // The same node, as if its agent had joined prod-b before.
    agent.kill();
    std::fs::write(&fencing, "9 1 5 prod-b\n").unwrap();
    agent.spawn();
    let refusal = cluster
        .wait_log(leader, &["refused a registration", "joined cluster prod-b"])
        .await;
    assert!(refusal.contains("this is cluster prod-a"), "{refusal}");
    cluster
        .eventually("the agent says why it is refused", || async {
            let log = agent.log_text();
            if log.contains("joined cluster prod-b") && log.contains("this is cluster prod-a") {
                Ok(())
            } else {
                Err("not yet".to_owned())
            }
        })
        .await;
    assert_eq!(
        std::fs::read_to_string(&fencing).unwrap(),
        "9 1 5 prod-b\n",
        "a refused agent keeps its own cluster"
    );
    agent.kill();
}
