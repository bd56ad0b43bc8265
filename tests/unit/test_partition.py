from switchyard.partition import fnv1a_32, partition


def test_fnv1a_32_reference_vectors() -> None:
    # Published FNV-1a 32-bit test vectors (Fowler/Noll/Vo).
    assert fnv1a_32(b"") == 0x811C9DC5
    assert fnv1a_32(b"a") == 0xE40C292C
    assert fnv1a_32(b"foobar") == 0xBF9CF968


def test_partition_is_in_range_and_stable() -> None:
    keys = [f"session-{i}" for i in range(500)]
    parts = [partition(k, 64) for k in keys]
    assert all(0 <= p < 64 for p in parts)
    assert parts == [partition(k, 64) for k in keys]
    assert len(set(parts)) > 50  # spreads over the partitions
