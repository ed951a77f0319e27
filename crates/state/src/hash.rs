//! A canonical digest of the state, for comparing peers.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::types::FleetState;

/// 64-bit FNV-1a over the canonical JSON encoding of the state. It detects
/// divergence between peers; it is not a defence against an adversary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateHash(pub u64);

impl fmt::Display for StateHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

impl FleetState {
    /// The canonical hash: equal on every peer that applied the same log.
    pub fn hash(&self) -> StateHash {
        // Streamed through the hash: the encoding of a large fleet is tens
        // of megabytes that need not exist all at once. Serializing plain
        // maps, strings and numbers cannot fail.
        let mut hasher = Fnv1a(FNV_OFFSET);
        serde_json::to_writer(&mut hasher, self).expect("fleet state serializes to JSON");
        StateHash(hasher.0)
    }
}

/// 64-bit FNV-1a of `bytes`.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hasher = Fnv1a(FNV_OFFSET);
    std::io::Write::write_all(&mut hasher, bytes).expect("hashing cannot fail");
    hasher.0
}

struct Fnv1a(u64);

impl std::io::Write for Fnv1a {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0 = bytes.iter().fold(self.0, |hash, byte| {
            (hash ^ u64::from(*byte)).wrapping_mul(FNV_PRIME)
        });
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_reference_vectors() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn hash_displays_as_sixteen_hex_digits() {
        assert_eq!(StateHash(0xab).to_string(), "00000000000000ab");
    }
}
