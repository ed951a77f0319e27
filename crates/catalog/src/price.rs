//! What a model's tokens cost: the price table money budgets and usage
//! reports are counted in.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// US dollars, held as whole micro-dollars so that sums are exact and the
/// replicated state compares equal on every peer; written and read as a
/// decimal number of dollars.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Usd {
    pub micros: u64,
}

/// The largest amount written: a trillion dollars.
const MAX_DOLLARS: f64 = 1e12;

impl Usd {
    pub const ZERO: Usd = Usd { micros: 0 };

    pub const fn from_micros(micros: u64) -> Usd {
        Usd { micros }
    }

    /// `dollars` rounded to the micro-dollar; `None` unless it is a finite
    /// amount from 0 to a trillion.
    pub fn from_dollars(dollars: f64) -> Option<Usd> {
        (dollars.is_finite() && (0.0..=MAX_DOLLARS).contains(&dollars)).then(|| Usd {
            micros: (dollars * 1e6).round() as u64,
        })
    }

    pub fn dollars(self) -> f64 {
        self.micros as f64 / 1e6
    }

    pub fn is_zero(&self) -> bool {
        self.micros == 0
    }

    pub fn saturating_add(self, other: Usd) -> Usd {
        Usd::from_micros(self.micros.saturating_add(other.micros))
    }
}

impl fmt::Display for Usd {
    /// `$12.50`; amounts with more than cents keep their micro-dollars
    /// (`$0.000375`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (whole, micros) = (self.micros / 1_000_000, self.micros % 1_000_000);
        if micros % 10_000 == 0 {
            write!(f, "${whole}.{:02}", micros / 10_000)
        } else {
            let digits = format!("{micros:06}");
            write!(f, "${whole}.{}", digits.trim_end_matches('0'))
        }
    }
}

impl Serialize for Usd {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(self.dollars())
    }
}

impl<'de> Deserialize<'de> for Usd {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let dollars = f64::deserialize(deserializer)?;
        Usd::from_dollars(dollars).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "{dollars} is not an amount of dollars from 0 to {MAX_DOLLARS}"
            ))
        })
    }
}

/// What a model's tokens cost, in dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Price {
    pub input_per_million: Usd,
    /// Prompt tokens the engine found in its prefix cache; unset: as input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_per_million: Option<Usd>,
    pub output_per_million: Usd,
}

impl Price {
    /// What these tokens cost, rounded to the micro-dollar. Cached tokens
    /// are part of the prompt, charged at the cached rate.
    pub fn cost(&self, prompt: u64, cached: u64, completion: u64) -> Usd {
        let cached = cached.min(prompt);
        let cached_rate = self
            .cached_input_per_million
            .unwrap_or(self.input_per_million);
        // tokens x micro-dollars per million tokens = micro-dollars x 1e6
        let scaled = u128::from(prompt - cached) * u128::from(self.input_per_million.micros)
            + u128::from(cached) * u128::from(cached_rate.micros)
            + u128::from(completion) * u128::from(self.output_per_million.micros);
        Usd::from_micros(u64::try_from((scaled + 500_000) / 1_000_000).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_are_exact_micro_dollars_written_as_dollars() {
        let price = Usd::from_dollars(0.15).unwrap();
        assert_eq!(price.micros, 150_000);
        assert_eq!(serde_json::to_string(&price).unwrap(), "0.15");
        assert_eq!(serde_json::from_str::<Usd>("0.15").unwrap(), price);
        assert_eq!(price.to_string(), "$0.15");
        assert_eq!(Usd::from_micros(375).to_string(), "$0.000375");
        assert_eq!(Usd::from_micros(12_500_000).to_string(), "$12.50");
        assert!(Usd::from_dollars(-1.0).is_none());
        assert!(Usd::from_dollars(f64::NAN).is_none());
        assert!(serde_json::from_str::<Usd>("-3").is_err());
    }

    #[test]
    fn cached_prompt_tokens_cost_the_cached_rate() {
        let price = Price {
            input_per_million: Usd::from_dollars(2.0).unwrap(),
            cached_input_per_million: Some(Usd::from_dollars(0.5).unwrap()),
            output_per_million: Usd::from_dollars(8.0).unwrap(),
        };
        // 1,000 prompt tokens, 600 of them cached, 500 completion tokens:
        // 400 x $2/M + 600 x $0.5/M + 500 x $8/M = $0.0008 + $0.0003 + $0.004.
        assert_eq!(price.cost(1_000, 600, 500), Usd::from_micros(5_100));
        let uncached = Price {
            cached_input_per_million: None,
            ..price
        };
        assert_eq!(uncached.cost(1_000, 600, 0), Usd::from_micros(2_000));
        // Half a micro-dollar rounds up; less rounds down.
        let cheap = Price {
            input_per_million: Usd::from_micros(1),
            cached_input_per_million: None,
            output_per_million: Usd::ZERO,
        };
        assert_eq!(cheap.cost(500_000, 0, 0), Usd::from_micros(1));
        assert_eq!(cheap.cost(499_999, 0, 0), Usd::ZERO);
    }
}
