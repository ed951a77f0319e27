//! Reading the Prometheus text every llmgw process and engine serves.

/// One sample line of the text format: `name{labels} value [timestamp]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    /// The label set as written, braces included; empty without labels.
    pub labels: &'a str,
    pub value: f64,
}

/// Every sample of a page, in order; comments, blank lines and lines that
/// do not parse are passed over.
pub fn samples(text: &str) -> impl Iterator<Item = Sample<'_>> {
    text.lines().filter_map(sample)
}

fn sample(line: &str) -> Option<Sample<'_>> {
    if line.starts_with('#') || line.trim().is_empty() {
        return None;
    }
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = &line[..name_end];
    // A label value may hold spaces and braces: the set ends at the last
    // closing brace, before the value.
    let (labels, rest) = if line[name_end..].starts_with('{') {
        let close = line.rfind('}')?;
        (&line[name_end..=close], &line[close + 1..])
    } else {
        ("", &line[name_end..])
    };
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// The value of `series` in Prometheus text: `series` is a metric name,
/// with or without its label set. A name without labels also matches the
/// first series of that name that has labels.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    let (name, labels) = match series.find('{') {
        Some(open) => (&series[..open], Some(&series[open..])),
        None => (series, None),
    };
    samples(text)
        .find(|s| s.name == name && labels.is_none_or(|wanted| s.labels == wanted))
        .map(|s| s.value)
}

#[cfg(test)]
mod tests {
    use super::{Sample, metric, samples};

    #[test]
    fn samples_carry_name_labels_and_value_not_the_timestamp() {
        let text = "# TYPE x gauge\n\
                    x 1.5 1700000000000\n\
                    y{a=\"b c}\",d=\"e\"} 2\n\
                    broken{ 3\n\
                    \n";
        let all: Vec<Sample<'_>> = samples(text).collect();
        assert_eq!(
            all,
            [
                Sample {
                    name: "x",
                    labels: "",
                    value: 1.5
                },
                Sample {
                    name: "y",
                    labels: "{a=\"b c}\",d=\"e\"}",
                    value: 2.0
                },
            ]
        );
        assert_eq!(metric(text, "x"), Some(1.5), "the value, not the timestamp");
    }

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
