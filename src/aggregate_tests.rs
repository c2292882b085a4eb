use super::*;

#[test]
fn shard_of_is_stable() {
    assert_eq!(shard_of(b"anything", 1), 0);
    assert_eq!(shard_of(b"flow:count:a:b:c:2025080117", 16), shard_of(b"flow:count:a:b:c:2025080117", 16));
}
