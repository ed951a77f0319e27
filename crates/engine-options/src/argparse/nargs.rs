//! How many of the following tokens an argument takes. argparse writes the
//! command line as a pattern (`O` an option, `A` an argument, `-` the `--`
//! marker) and matches each `nargs` as a regular expression against it; the
//! same matches are computed here directly.

use crate::data::Nargs;

/// The error argparse gives when an option's values are missing.
pub fn missing_message(nargs: Nargs) -> String {
    match nargs {
        Nargs::One => "expected one argument".into(),
        Nargs::Optional => "expected at most one argument".into(),
        Nargs::OneOrMore => "expected at least one argument".into(),
        Nargs::Exactly(1) => "expected 1 argument".into(),
        Nargs::Exactly(n) => format!("expected {n} arguments"),
        Nargs::ZeroOrMore | Nargs::Rest => "expected at least one argument".into(),
    }
}

/// How many tokens an option takes from `pattern` (what follows it), or
/// `None` when its `nargs` cannot be met. Options never take `--`.
pub fn option_count(nargs: Nargs, pattern: &[u8]) -> Option<usize> {
    let args = pattern.iter().take_while(|c| **c == b'A').count();
    match nargs {
        Nargs::One => (args >= 1).then_some(1),
        Nargs::Optional => Some(args.min(1)),
        Nargs::ZeroOrMore => Some(args),
        Nargs::OneOrMore => (args >= 1).then_some(args),
        Nargs::Exactly(n) => (args >= n).then_some(n),
        Nargs::Rest => Some(pattern.len()),
    }
}

/// Whether a positional with `nargs` matches exactly `segment`
/// (`--` markers may surround its arguments).
fn positional_matches(nargs: Nargs, segment: &[u8]) -> bool {
    let options = segment.iter().filter(|c| **c == b'O').count();
    let args = segment.iter().filter(|c| **c == b'A').count();
    match nargs {
        Nargs::Rest => true,
        _ if options > 0 => false,
        Nargs::One => args == 1,
        Nargs::Optional => args <= 1,
        Nargs::ZeroOrMore => true,
        Nargs::OneOrMore => args >= 1,
        Nargs::Exactly(n) => args == n,
    }
}

/// argparse's `_match_arguments_partial`: as many positionals as can match
/// the start of `pattern`, each taking as much as it can. Returns the
/// number of tokens each of the matched positionals takes.
pub fn positional_counts(nargs: &[Nargs], pattern: &[u8]) -> Vec<usize> {
    for matched in (1..=nargs.len()).rev() {
        let mut counts = Vec::with_capacity(matched);
        if assign(&nargs[..matched], pattern, &mut counts) {
            return counts;
        }
    }
    Vec::new()
}

fn assign(nargs: &[Nargs], pattern: &[u8], counts: &mut Vec<usize>) -> bool {
    let Some((first, rest)) = nargs.split_first() else {
        return true;
    };
    for len in (0..=pattern.len()).rev() {
        if positional_matches(*first, &pattern[..len]) {
            counts.push(len);
            if assign(rest, &pattern[len..], counts) {
                return true;
            }
            counts.pop();
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_take_what_their_nargs_allow() {
        assert_eq!(option_count(Nargs::One, b"AAO"), Some(1));
        assert_eq!(option_count(Nargs::One, b"OA"), None);
        assert_eq!(option_count(Nargs::One, b"-A"), None);
        assert_eq!(option_count(Nargs::OneOrMore, b"AAO"), Some(2));
        assert_eq!(option_count(Nargs::ZeroOrMore, b""), Some(0));
        assert_eq!(option_count(Nargs::Optional, b"AA"), Some(1));
        assert_eq!(option_count(Nargs::Exactly(2), b"A"), None);
    }

    #[test]
    fn an_optional_positional_swallows_the_end_marker() {
        assert_eq!(positional_counts(&[Nargs::Optional], b"A-A"), vec![2]);
        assert_eq!(positional_counts(&[Nargs::Optional], b"O"), vec![0]);
        assert_eq!(positional_counts(&[Nargs::One], b"O"), Vec::<usize>::new());
        assert_eq!(
            positional_counts(&[Nargs::One, Nargs::ZeroOrMore], b"AAA"),
            vec![1, 2]
        );
    }
}
