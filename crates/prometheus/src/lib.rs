//! Reading the Prometheus text every llmgw process and engine serves.

/// The value of `series` in Prometheus text: `series` is a metric name,
/// with or without its label set. A name without labels also matches the
/// first series of that name that has labels.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find(|line| {
            line.strip_prefix(series).is_some_and(|rest| {
                rest.starts_with(' ') || (!series.contains('{') && rest.starts_with('{'))
            })
        })?
        .rsplit(' ')
        .next()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::metric;

    #[test]
    fn a_series_is_found_by_its_name_or_its_labels_and_never_by_a_prefix() {
        let text = "# HELP llmgw_raft_is_leader whether\n\
                    llmgw_raft_is_leader 1\n\
                    llmgw_raft_snapshot_bytes_total 9\n\
                    llmgw_raft_snapshot_bytes 512\n\
                    vllm:num_requests_running{model_name=\"m\"} 2.0\n\
                    vllm:num_requests_running{model_name=\"n\"} 3.0\n";
        assert_eq!(metric(text, "llmgw_raft_is_leader"), Some(1.0));
        assert_eq!(metric(text, "llmgw_raft_snapshot_bytes"), Some(512.0));
        assert_eq!(metric(text, "vllm:num_requests_running"), Some(2.0));
        assert_eq!(
            metric(text, "vllm:num_requests_running{model_name=\"n\"}"),
            Some(3.0)
        );
        assert_eq!(metric(text, "llmgw_raft"), None);
        assert_eq!(
            metric(text, "vllm:num_requests_running{model_name=\"x\"}"),
            None
        );
    }
}
