//! The recovery table of `recovery.rs`, one case per row, plus its edges.

use super::*;
use FenceState::{Absent, Corrupt, Created, Existing, Missing};

const LOW: i64 = 10;
const HIGH: i64 = 100;

fn start(
    offset: i64,
    applied: &[i64],
    origin: Origin,
    gap_from: Option<i64>,
) -> Result<Start, Halt> {
    Ok(Start {
        offset,
        applied: applied.to_vec(),
        origin,
        gap_from,
    })
}

struct Case {
    name: &'static str,
    /// What the init script answered, per shard.
    redis: Vec<FenceState>,
    has_commit: bool,
    low: i64,
    high: i64,
    want: Result<Start, Halt>,
}

fn case(
    name: &'static str,
    redis: Vec<FenceState>,
    has_commit: bool,
    want: Result<Start, Halt>,
) -> Case {
    Case {
        name,
        redis,
        has_commit,
        low: LOW,
        high: HIGH,
        want,
    }
}

const REBUILD: Origin = Origin::Rebuild {
    from: LOW,
    end: HIGH,
};

/// Rows 1-4 of the table: the fence, new, state lost, partial loss.
fn rows_1_to_4() -> Vec<Case> {
    vec![
        // Row 1: the fence, any commit: start at the fence.
        case(
            "1 fence, no commit",
            vec![Existing(50)],
            false,
            start(50, &[50], Origin::Fence, None),
        ),
        case(
            "1 fence, commit",
            vec![Existing(50)],
            true,
            start(50, &[50], Origin::Fence, None),
        ),
        case(
            "1 fences of several shards: the lowest",
            vec![Existing(50), Existing(40), Existing(60)],
            true,
            start(40, &[50, 40, 60], Origin::Fence, None),
        ),
        // Row 2: no fence, no marker entry, no commit: created at `kafka.start_from`.
        case(
            "2 new, earliest",
            vec![Created(LOW)],
            false,
            start(LOW, &[LOW], Origin::New, None),
        ),
        case(
            "2 new, latest",
            vec![Created(HIGH)],
            false,
            start(HIGH, &[HIGH], Origin::New, None),
        ),
        // Row 3: state lost while Kafka has a commit: rebuild from the earliest, or halt.
        case(
            "3 state lost, rebuild",
            vec![Created(LOW)],
            true,
            start(LOW, &[LOW], REBUILD, None),
        ),
        case(
            "3 state lost, halt",
            vec![Absent],
            true,
            Err(Halt::StateLost),
        ),
        // Row 4: no fence, but the marker names the partition: partial loss.
        case(
            "4 fence missing, marker copy",
            vec![Missing {
                marker_copy: Some(42),
            }],
            true,
            Err(Halt::FenceMissing {
                shard: 0,
                marker_copy: Some(42),
            }),
        ),
        case(
            "4 fence missing on shard 1, unreadable copy",
            vec![Existing(50), Missing { marker_copy: None }],
            false,
            Err(Halt::FenceMissing {
                shard: 1,
                marker_copy: None,
            }),
        ),
    ]
}

/// Rows 5-7 of the table: corrupt, beyond the end, before the start.
fn rows_5_to_7() -> Vec<Case> {
    vec![
        // Row 5: a fence that is not a number.
        case(
            "5 corrupt",
            vec![Corrupt],
            true,
            Err(Halt::FenceCorrupt { shard: 0 }),
        ),
        case(
            "5 corrupt on shard 2",
            vec![Existing(50), Existing(50), Corrupt],
            false,
            Err(Halt::FenceCorrupt { shard: 2 }),
        ),
        // Row 6: a fence beyond the end of the topic.
        case(
            "6 beyond the end",
            vec![Existing(HIGH + 1)],
            true,
            Err(Halt::BeyondEnd {
                applied: HIGH + 1,
                high: HIGH,
            }),
        ),
        // Row 7: a fence before the start of the topic: the earliest retained, the gap reported.
        case(
            "7 before the start",
            vec![Existing(3)],
            true,
            start(LOW, &[3], Origin::Fence, Some(3)),
        ),
        case(
            "7 one shard before the start",
            vec![Existing(50), Existing(LOW - 1)],
            false,
            start(LOW, &[50, LOW - 1], Origin::Fence, Some(LOW - 1)),
        ),
    ]
}

/// Where the table's rows meet.
fn edges() -> Vec<Case> {
    vec![
        case(
            "fence == high: nothing to read, no halt",
            vec![Existing(HIGH)],
            true,
            start(HIGH, &[HIGH], Origin::Fence, None),
        ),
        case(
            "fence == low: no gap",
            vec![Existing(LOW)],
            true,
            start(LOW, &[LOW], Origin::Fence, None),
        ),
        case(
            "no shards: the earliest",
            vec![],
            true,
            start(LOW, &[], Origin::Fence, None),
        ),
        case(
            "the first shard that cannot start decides",
            vec![
                Existing(50),
                Corrupt,
                Missing {
                    marker_copy: Some(1),
                },
                Absent,
            ],
            true,
            Err(Halt::FenceCorrupt { shard: 1 }),
        ),
        case(
            "halt before beyond-end",
            vec![Existing(HIGH + 5), Absent],
            true,
            Err(Halt::StateLost),
        ),
        case(
            "one shard created while Kafka has a commit: rebuild",
            vec![Existing(LOW), Created(LOW)],
            true,
            start(LOW, &[LOW, LOW], REBUILD, None),
        ),
        Case {
            name: "empty topic, new partition",
            redis: vec![Created(0)],
            has_commit: false,
            low: 0,
            high: 0,
            want: start(0, &[0], Origin::New, None),
        },
    ]
}

#[test]
fn decide_follows_the_documented_table() {
    for c in rows_1_to_4()
        .into_iter()
        .chain(rows_5_to_7())
        .chain(edges())
    {
        assert_eq!(
            decide(&c.redis, c.has_commit, c.low, c.high),
            c.want,
            "{}",
            c.name
        );
    }
}

#[test]
fn fresh_start_picks_rows_2_and_3() {
    use OnStateLost::{Halt as OnHalt, Rebuild};
    use StartFrom::{Earliest, Latest};
    let cases = [
        // Row 2: no commit: `kafka.start_from`, whatever the recovery policy.
        (false, Rebuild, Earliest, Some(LOW)),
        (false, OnHalt, Earliest, Some(LOW)),
        (false, Rebuild, Latest, Some(HIGH)),
        (false, OnHalt, Latest, Some(HIGH)),
        // Row 3: a commit but no state: the earliest retained, or nothing (halt).
        (true, Rebuild, Earliest, Some(LOW)),
        (true, Rebuild, Latest, Some(LOW)),
        (true, OnHalt, Earliest, None),
        (true, OnHalt, Latest, None),
    ];
    for (has_commit, on_state_lost, start_from, want) in cases {
        assert_eq!(
            fresh_start(has_commit, on_state_lost, start_from, LOW, HIGH),
            want,
            "commit {has_commit}, {on_state_lost:?}, {start_from:?}"
        );
    }
}
