//! Operator sets of one part as bitsets: `u64` for parts of at most 64 operators, `u128` up to
//! 128. The DP is generic over [`Bits`] and monomorphized for both.

use std::fmt::Debug;
use std::hash::Hash;
use std::ops::{BitAnd, BitAndAssign, BitOr, BitOrAssign, Not};

/// A set of local operator indices `0..CAP`.
pub(crate) trait Bits:
    Copy
    + Eq
    + Hash
    + Debug
    + BitAnd<Output = Self>
    + BitOr<Output = Self>
    + Not<Output = Self>
    + BitAndAssign
    + BitOrAssign
{
    /// How many indices fit.
    const CAP: usize;
    const ZERO: Self;
    /// The set `{i}` (`i < CAP`).
    fn bit(i: usize) -> Self;
    /// The set `{0, .., n - 1}` (`n <= CAP`).
    fn low(n: usize) -> Self;
    fn count(self) -> u32;
    fn is_zero(self) -> bool {
        self == Self::ZERO
    }
    /// Index of the lowest member (`CAP` when empty).
    fn lowest(self) -> usize;
    /// The set without its lowest member.
    fn without_lowest(self) -> Self;
    /// Members in increasing order.
    fn ones(self) -> Ones<Self> {
        Ones(self)
    }
    /// `self - 1` as an integer (used to walk the submasks of a mask).
    fn dec(self) -> Self;
}

/// Iterator over the members of a set, lowest first.
pub(crate) struct Ones<B>(B);

impl<B: Bits> Iterator for Ones<B> {
    type Item = usize;
    #[inline]
    fn next(&mut self) -> Option<usize> {
        if self.0.is_zero() {
            return None;
        }
        let i = self.0.lowest();
        self.0 = self.0.without_lowest();
        Some(i)
    }
}

macro_rules! impl_bits {
    ($t:ty) => {
        impl Bits for $t {
            const CAP: usize = <$t>::BITS as usize;
            const ZERO: Self = 0;
            #[inline]
            fn bit(i: usize) -> Self {
                (1 as $t) << i
            }
            #[inline]
            fn low(n: usize) -> Self {
                if n >= Self::CAP {
                    <$t>::MAX
                } else {
                    ((1 as $t) << n) - 1
                }
            }
            #[inline]
            fn count(self) -> u32 {
                self.count_ones()
            }
            #[inline]
            fn lowest(self) -> usize {
                self.trailing_zeros() as usize
            }
            #[inline]
            fn without_lowest(self) -> Self {
                self & self.wrapping_sub(1)
            }
            #[inline]
            fn dec(self) -> Self {
                self.wrapping_sub(1)
            }
        }
    };
}

impl_bits!(u64);
impl_bits!(u128);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ones_and_low() {
        let s: u128 = u128::bit(0) | u128::bit(70) | u128::bit(127);
        assert_eq!(s.ones().collect::<Vec<_>>(), vec![0, 70, 127]);
        assert_eq!(u64::low(64), u64::MAX);
        assert_eq!(u64::low(3), 7);
        assert_eq!(u64::ZERO.lowest(), 64);
        assert_eq!(s.count(), 3);
    }
}
