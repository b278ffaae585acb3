//! Byte-level mutations of a seed file: bit flips, byte writes, inserted
//! and deleted runs, truncation, and little-endian 32/64-bit "interesting"
//! integers (0, 1, powers of two near the limits, all ones) written over
//! whatever is there: the counts, lengths, offsets and dims of a binary
//! header.

use proptest::prelude::*;
use proptest::sample::Index;

/// Integers that break size arithmetic: zero, one, sign and width edges,
/// and counts no file could hold.
const INTERESTING: [u64; 12] = [
    0,
    1,
    2,
    0x7f,
    0xff,
    0x8000_0000,
    0xffff_ffff,
    1 << 32,
    1 << 40,
    1 << 60,
    i64::MAX as u64,
    u64::MAX,
];

/// One edit of a byte buffer; positions are proportional to its length.
#[derive(Debug, Clone)]
pub enum Mutation {
    FlipBit(Index, u8),
    SetByte(Index, u8),
    Insert(Index, Vec<u8>),
    Delete(Index, usize),
    Truncate(Index),
    PutU32(Index, u32),
    PutU64(Index, u64),
}

fn interesting() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => proptest::sample::select(&INTERESTING[..]),
        1 => any::<u64>(),
        1 => 0u64..4096,
    ]
}

impl Arbitrary for Mutation {
    type Parameters = ();
    type Strategy = BoxedStrategy<Mutation>;

    fn arbitrary_with(_: ()) -> Self::Strategy {
        let at = any::<Index>;
        prop_oneof![
            (at(), 0u8..8).prop_map(|(i, b)| Mutation::FlipBit(i, b)),
            (at(), any::<u8>()).prop_map(|(i, v)| Mutation::SetByte(i, v)),
            (at(), proptest::collection::vec(any::<u8>(), 1..64))
                .prop_map(|(i, v)| Mutation::Insert(i, v)),
            (at(), 1usize..64).prop_map(|(i, n)| Mutation::Delete(i, n)),
            at().prop_map(Mutation::Truncate),
            (at(), interesting()).prop_map(|(i, v)| Mutation::PutU32(i, v as u32)),
            (at(), interesting()).prop_map(|(i, v)| Mutation::PutU64(i, v)),
        ]
        .boxed()
    }
}

impl Mutation {
    /// Applies the edit to `buf` (a no-op where it cannot apply, e.g. on an
    /// empty buffer).
    pub fn apply(&self, buf: &mut Vec<u8>) {
        let n = buf.len();
        let put = |buf: &mut Vec<u8>, i: &Index, bytes: &[u8]| {
            if n >= bytes.len() {
                let at = i.index(n - bytes.len() + 1);
                buf[at..at + bytes.len()].copy_from_slice(bytes);
            }
        };
        match self {
            _ if n == 0 => {
                if let Mutation::Insert(_, v) = self {
                    buf.extend_from_slice(v);
                }
            }
            Mutation::FlipBit(i, b) => buf[i.index(n)] ^= 1 << b,
            Mutation::SetByte(i, v) => buf[i.index(n)] = *v,
            Mutation::Insert(i, v) => {
                let at = i.index(n + 1);
                buf.splice(at..at, v.iter().copied());
            }
            Mutation::Delete(i, k) => {
                let at = i.index(n);
                buf.drain(at..(at + k).min(n));
            }
            Mutation::Truncate(i) => buf.truncate(i.index(n)),
            Mutation::PutU32(i, v) => put(buf, i, &v.to_le_bytes()),
            Mutation::PutU64(i, v) => put(buf, i, &v.to_le_bytes()),
        }
    }
}

/// `seed` with 0 to 7 mutations applied (shrinks to `seed` itself).
pub fn mutated(seed: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<Mutation>(), 0..8).prop_map(move |ms| {
        let mut buf = seed.clone();
        for m in &ms {
            m.apply(&mut buf);
        }
        buf
    })
}

/// One of `seeds`, mutated as by [`mutated`].
pub fn mutated_from(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    assert!(!seeds.is_empty(), "mutated_from needs a seed");
    proptest::sample::select(seeds).prop_flat_map(mutated)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    #[test]
    fn mutations_change_the_seed_and_stay_bounded() {
        let seed: Vec<u8> = (0..200).collect();
        let mut runner = TestRunner::deterministic();
        let (mut changed, mut total) = (0, 0);
        for _ in 0..200 {
            let v = mutated(seed.clone())
                .new_tree(&mut runner)
                .unwrap()
                .current();
            assert!(v.len() <= seed.len() + 8 * 64);
            changed += usize::from(v != seed);
            total += 1;
        }
        assert!(changed * 2 > total, "only {changed} of {total} mutated");
    }

    #[test]
    fn put_u64_writes_little_endian_in_bounds() {
        let mut runner = TestRunner::deterministic();
        for _ in 0..20 {
            let at = any::<Index>().new_tree(&mut runner).unwrap().current();
            let mut buf = vec![0u8; 8];
            Mutation::PutU64(at, u64::MAX).apply(&mut buf);
            assert_eq!(buf, [0xff; 8]);
            let mut short = vec![1u8; 3];
            Mutation::PutU64(at, 7).apply(&mut short);
            assert_eq!(short, [1, 1, 1]);
        }
    }
}
