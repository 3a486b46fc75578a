//! Tests of the export worker's assignment of files.

use super::*;

#[test]
fn shard_files_spread_evenly_and_other_names_have_one_owner() {
    for count in 1..=4 {
        let owners: Vec<usize> = (0..12)
            .map(|i| owner(&format!("shard-{i:03}.db"), count))
            .collect();
        for w in 0..count {
            assert_eq!(owners.iter().filter(|&&o| o == w).count(), 12 / count);
        }
        assert_eq!(owner("odd.db", count), owner("odd.db", count));
        assert!(owner("odd.db", count) < count);
    }
}
