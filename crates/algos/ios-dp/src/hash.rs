//! A tiny fast hasher for the DP's bitset keys (no new dependency).
//!
//! FxHash's multiply only moves entropy upwards, so keys differing in high bits only (operators
//! late in a part) would share buckets. We use a *folded* multiply instead: the 128-bit product
//! of the running state with an odd constant, high half XOR low half, so every input bit
//! reaches every output bit.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

const K: u64 = 0x9E37_79B9_7F4A_7C15;

#[inline]
fn fold_mul(a: u64, b: u64) -> u64 {
    let m = u128::from(a).wrapping_mul(u128::from(b));
    (m as u64) ^ ((m >> 64) as u64)
}

/// Folded-multiply hasher for small integer keys.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct FoldHasher {
    h: u64,
}

impl Hasher for FoldHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut buf = [0u8; 8];
            buf[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(buf));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.h = fold_mul(self.h ^ i, K);
    }
    #[inline]
    fn write_u128(&mut self, i: u128) {
        self.write_u64(i as u64);
        self.write_u64((i >> 64) as u64);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.h
    }
}

/// A `HashMap` with [`FoldHasher`].
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FoldHasher>>;

#[cfg(test)]
mod tests {
    use std::hash::{BuildHasher, BuildHasherDefault};

    use super::*;

    #[test]
    fn high_bits_reach_low_bits() {
        let b = BuildHasherDefault::<FoldHasher>::default();
        let lo: Vec<u64> = (0..16u32)
            .map(|i| b.hash_one(1u64 << (48 + i)) & 0xff)
            .collect();
        let mut dedup = lo.clone();
        dedup.sort_unstable();
        dedup.dedup();
        assert!(dedup.len() > 10, "{lo:?}");
    }
}
