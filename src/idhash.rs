//! A quick hasher for maps keyed by the broker's own ids (minted request numbers, editor ids):
//! no peer chooses those keys, so SipHash's resistance to chosen keys buys nothing there, and
//! it costs about a hundred instructions per lookup on the path of every call.

use std::hash::{BuildHasherDefault, Hasher};

/// The hasher: each word rotated in and multiplied (the Fx scheme of rustc's maps).
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

/// Builds [`IdHasher`]s, for `DashMap::with_hasher` and the like.
pub type IdHash = BuildHasherDefault<IdHasher>;

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl IdHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            // The tail's length in its last byte, so "ab" and "ab\0" differ.
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            w[7] |= 0x80 | rest.len() as u8;
            self.add(u64::from_le_bytes(w));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn minted_ids_spread_over_buckets_and_shards() {
        // Consecutive ids, as minted: distinct low bits (hashbrown's buckets) and a spread of
        // high bits (its control bytes, and DashMap's shard choice).
        let h = IdHash::default();
        let hashes: Vec<u64> = (0..1024u64).map(|n| h.hash_one(n)).collect();
        let low: std::collections::HashSet<u64> = hashes.iter().map(|x| x & 1023).collect();
        assert_eq!(low.len(), 1024);
        let top: std::collections::HashSet<u64> = hashes.iter().map(|x| x >> 57).collect();
        assert!(top.len() > 100, "{} distinct top-7-bit values", top.len());
        assert_ne!(h.hash_one("neovim-1"), h.hash_one("neovim-2"));
        assert_ne!(h.hash_one("ab"), h.hash_one("ab\0"));
    }
}
