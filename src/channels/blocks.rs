//! The block grid: a file of `size` bytes is cut into blocks of `block_size` bytes (the last
//! one shorter). Blocks are the unit of scheduling, checking, re-sending and resuming.

/// Number of blocks of a file (0 for an empty file).
pub fn count(size: u64, block_size: u32) -> u64 {
    size.div_ceil(block_size as u64)
}

/// Offset and length of block `index`.
pub fn span(size: u64, block_size: u32, index: u64) -> (u64, u32) {
    let off = index * block_size as u64;
    let len = (size - off).min(block_size as u64) as u32;
    (off, len)
}

/// Bytes in the blocks `held` of a file of `size` bytes: a short last block counts its
/// own length (a resumed pull that held only the last byte counted a whole block).
pub fn held_bytes(size: u64, block_size: u32, held: impl IntoIterator<Item = u64>) -> u64 {
    let bs = block_size as u64;
    held.into_iter()
        .map(|index| size.saturating_sub(index.saturating_mul(bs)).min(bs))
        .sum()
}

/// The block index a frame at `offset` with `len` bytes must be, or `None` when it is not
/// exactly one block of the grid.
pub fn index_of(size: u64, block_size: u32, offset: u64, len: u32) -> Option<u64> {
    let bs = block_size as u64;
    if offset % bs != 0 || offset >= size {
        return None;
    }
    let idx = offset / bs;
    (span(size, block_size, idx).1 == len).then_some(idx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_bytes_count_a_short_last_block_as_its_length() {
        // 12,582,913 bytes in 4 MiB blocks: three whole blocks and one of 1 byte.
        let (size, bs) = (12_582_913, 4 << 20);
        assert_eq!(held_bytes(size, bs, [3]), 1);
        assert_eq!(held_bytes(size, bs, [0, 3]), (4 << 20) + 1);
        assert_eq!(held_bytes(size, bs, 0..4), size);
        assert_eq!(held_bytes(size, bs, [9]), 0, "beyond the end");
    }

    #[test]
    fn grid() {
        assert_eq!(count(0, 4), 0);
        assert_eq!(count(1, 4), 1);
        assert_eq!(count(8, 4), 2);
        assert_eq!(count(9, 4), 3);
        assert_eq!(span(9, 4, 2), (8, 1));
        assert_eq!(index_of(9, 4, 8, 1), Some(2));
        assert_eq!(index_of(9, 4, 8, 4), None);
        assert_eq!(index_of(9, 4, 2, 4), None);
        assert_eq!(index_of(9, 4, 12, 0), None);
    }
}
