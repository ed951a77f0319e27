//! "Did you mean" suggestions for misspelt keys and values.

/// The candidate closest to `word` by edit distance, when it is close enough
/// to be a plausible typo (at most a third of the word, and at least 1).
pub fn closest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).max(1);
    candidates
        .iter()
        .map(|c| (edit_distance(word, c), *c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_words_only() {
        assert_eq!(
            closest("rate_gpbs", &["rate_gbps", "name", "hcas"]),
            Some("rate_gbps")
        );
        assert_eq!(closest("colour", &["rate_gbps", "name"]), None);
        assert_eq!(closest("nme", &["name"]), Some("name"));
    }
}
