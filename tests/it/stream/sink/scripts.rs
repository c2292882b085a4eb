//! The Lua scripts' reply contract, against a real redis-server: every status of the flush and
//! fence scripts, parsed into the types the sink uses.

use redis::Value;
use tally::stream::aggregate::{Delta, FlushUnit};
use tally::stream::sink::script::{
    apply_cmd, ApplyReply, FenceState, StateKeys, APPLY_LUA, INIT_LUA, SET_FENCE_LUA,
};
use tally_testkit::local_redis::LocalRedis;

fn keys() -> StateKeys {
    StateKeys {
        fence: "t:applied:g:t:3:0".into(),
        marker: "t:state:g:t:0".into(),
    }
}

fn unit(start: i64, end: i64, deltas: &[(&str, i64)]) -> FlushUnit {
    let far = chrono::Utc::now().timestamp_millis() + 3_600_000;
    FlushUnit {
        partition: 3,
        shard: 0,
        start,
        end,
        keys: deltas
            .iter()
            .map(|(k, d)| {
                (
                    k.as_bytes(),
                    Delta {
                        delta: *d,
                        expire_at_ms: far,
                    },
                )
            })
            .collect(),
        other: Vec::new(),
        max_event_ms: None,
    }
}

fn apply(conn: &mut redis::Connection, sha: &str, u: &FlushUnit) -> ApplyReply {
    let value: Value = apply_cmd(sha, &keys(), u, false).query(conn).unwrap();
    ApplyReply::parse(&value).unwrap()
}

fn init(conn: &mut redis::Connection, fresh: i64) -> FenceState {
    let value: Value = redis::cmd("EVAL")
        .arg(INIT_LUA)
        .arg(2)
        .arg(keys().marker)
        .arg(keys().fence)
        .arg(1)
        .arg(3)
        .arg(fresh)
        .query(conn)
        .unwrap();
    match value {
        Value::Array(items) if items.len() == 1 => FenceState::parse(&items[0]).unwrap(),
        other => panic!("{other:?}"),
    }
}

/// A connection to `redis` and the SHA of `script`, loaded there.
fn connect_and_load(redis: &LocalRedis, script: &str) -> (redis::Connection, String) {
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(script)
        .query(&mut conn)
        .unwrap();
    (conn, sha)
}

fn cmd(conn: &mut redis::Connection, args: &[&str]) -> Value {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(conn).unwrap()
}

#[test]
fn flush_and_fence_scripts_keep_their_reply_contract() {
    let redis = LocalRedis::start(&[]).unwrap();
    let (mut conn, sha) = connect_and_load(&redis, APPLY_LUA);

    // Nothing at all: the state is lost (or was never there); INIT may create or refuse.
    assert_eq!(
        apply(&mut conn, &sha, &unit(0, 5, &[("k", 1)])),
        ApplyReply::StateLost
    );
    assert_eq!(init(&mut conn, -1), FenceState::Absent);
    assert_eq!(init(&mut conn, 7), FenceState::Created(7));
    assert_eq!(init(&mut conn, 0), FenceState::Existing(7));

    // Applied, retried, conflicting.
    let u = unit(7, 9, &[("k", 2), ("j", i64::MAX)]);
    let applied = ApplyReply::Applied {
        late: 0,
        overflow: 0,
        rejected: 0,
    };
    assert_eq!(apply(&mut conn, &sha, &u), applied);
    assert_eq!(apply(&mut conn, &sha, &u), ApplyReply::AlreadyApplied);
    assert_eq!(
        apply(&mut conn, &sha, &unit(8, 10, &[])),
        ApplyReply::Conflict { applied: 9 }
    );
    assert_eq!(
        cmd(&mut conn, &["HGET", "t:state:g:t:0", "3"]),
        Value::BulkString(b"9".to_vec()),
        "the marker keeps a copy of the applied offset"
    );

    // Refused increments leave their keys unchanged and are told apart.
    cmd(&mut conn, &["SET", "text", "hello"]);
    let reply = apply(
        &mut conn,
        &sha,
        &unit(9, 10, &[("j", 1), ("text", 1), ("k", 1)]),
    );
    assert_eq!(
        reply,
        ApplyReply::Applied {
            late: 0,
            overflow: 1,
            rejected: 1
        }
    );
    assert_eq!(
        cmd(&mut conn, &["GET", "k"]),
        Value::BulkString(b"3".to_vec())
    );

    // The fence alone deleted: the marker still names the partition and has its copy.
    cmd(&mut conn, &["DEL", "t:applied:g:t:3:0"]);
    let missing = ApplyReply::FenceMissing {
        marker_copy: Some(10),
    };
    assert_eq!(apply(&mut conn, &sha, &unit(10, 11, &[("k", 1)])), missing);
    assert_eq!(
        init(&mut conn, 0),
        FenceState::Missing {
            marker_copy: Some(10)
        }
    );
    assert_eq!(
        cmd(&mut conn, &["GET", "k"]),
        Value::BulkString(b"3".to_vec())
    );

    // Repaired from the copy.
    let _: Value = redis::cmd("EVAL")
        .arg(SET_FENCE_LUA)
        .arg(2)
        .arg(keys().fence)
        .arg(keys().marker)
        .arg(3)
        .arg(10)
        .arg(0)
        .query(&mut conn)
        .unwrap();
    assert_eq!(init(&mut conn, 0), FenceState::Existing(10));

    // Corrupt fence: text, then another type; a marker of another type.
    cmd(&mut conn, &["SET", "t:applied:g:t:3:0", "x"]);
    assert_eq!(
        apply(&mut conn, &sha, &unit(10, 11, &[])),
        ApplyReply::Corrupt
    );
    assert_eq!(init(&mut conn, 0), FenceState::Corrupt);
    cmd(&mut conn, &["DEL", "t:applied:g:t:3:0"]);
    cmd(&mut conn, &["RPUSH", "t:applied:g:t:3:0", "x"]);
    assert_eq!(
        apply(&mut conn, &sha, &unit(10, 11, &[])),
        ApplyReply::Corrupt
    );
    assert_eq!(init(&mut conn, 0), FenceState::Corrupt);
    cmd(&mut conn, &["DEL", "t:applied:g:t:3:0", "t:state:g:t:0"]);
    cmd(&mut conn, &["SET", "t:applied:g:t:3:0", "10"]);
    cmd(&mut conn, &["SET", "t:state:g:t:0", "x"]);
    assert_eq!(
        apply(&mut conn, &sha, &unit(10, 11, &[("k", 1)])),
        ApplyReply::Corrupt
    );
    assert_eq!(init(&mut conn, 0), FenceState::Corrupt);
    assert_eq!(
        cmd(&mut conn, &["GET", "k"]),
        Value::BulkString(b"3".to_vec())
    );

    // The marker deleted alone (or an upgrade from before markers): the fence is trusted and the
    // marker recreated.
    cmd(&mut conn, &["DEL", "t:state:g:t:0"]);
    assert_eq!(init(&mut conn, 0), FenceState::Existing(10));
    assert_eq!(apply(&mut conn, &sha, &unit(10, 11, &[("k", 1)])), applied);
    assert_eq!(
        cmd(&mut conn, &["HGET", "t:state:g:t:0", "3"]),
        Value::BulkString(b"11".to_vec())
    );
}

/// A key whose expiry passed before the script ran is skipped and counted as late, whether or not
/// the other keys of its unit are in time (the script checks each key only when the unit's
/// earliest expiry has passed); keys in time get their delta and their expiry.
#[test]
fn keys_whose_expiry_passed_are_skipped_as_late_beside_keys_in_time() {
    let redis = LocalRedis::start(&[]).unwrap();
    let (mut conn, sha) = connect_and_load(&redis, APPLY_LUA);
    assert_eq!(init(&mut conn, 0), FenceState::Created(0));
    let now = chrono::Utc::now().timestamp_millis();
    let mut u = unit(0, 3, &[("early", 1), ("past", 5), ("later", 2)]);
    let expiries = [now + 60_000, now - 1, now + 120_000];
    u.keys = u
        .keys
        .iter()
        .zip(expiries)
        .map(|((k, d), expire_at_ms)| (k, Delta { expire_at_ms, ..*d }))
        .collect();
    assert_eq!(
        apply(&mut conn, &sha, &u),
        ApplyReply::Applied {
            late: 1,
            overflow: 0,
            rejected: 0
        }
    );
    assert_eq!(cmd(&mut conn, &["EXISTS", "past"]), Value::Int(0));
    for (key, value, at) in [("early", 1, now + 60_000), ("later", 2, now + 120_000)] {
        assert_eq!(
            cmd(&mut conn, &["GET", key]),
            Value::BulkString(value.to_string().into_bytes())
        );
        assert_eq!(cmd(&mut conn, &["PEXPIRETIME", key]), Value::Int(at));
    }
    // Every key in time: nothing late, every key written.
    let u = unit(3, 4, &[("early", 1), ("later", 1)]);
    assert_eq!(
        apply(&mut conn, &sha, &u),
        ApplyReply::Applied {
            late: 0,
            overflow: 0,
            rejected: 0
        }
    );
    assert_eq!(
        cmd(&mut conn, &["GET", "early"]),
        Value::BulkString(b"2".to_vec())
    );
}

/// The merged call ([`APPLY_MERGED_LUA`]): several partitions' ranges of one shard with their
/// deltas added up, applied all together or not at all, each fence's state reported.
#[test]
fn a_merged_call_applies_every_range_or_none_and_names_each_fence() {
    use tally::stream::sink::merge::{Merged, Range};
    use tally::stream::sink::script::{apply_merged_cmd, MergedReply, APPLY_MERGED_LUA};
    let redis = LocalRedis::start(&[]).unwrap();
    let (mut conn, sha) = connect_and_load(&redis, APPLY_MERGED_LUA);
    let marker = "t:state:g:t:0";
    let fences = [
        "t:applied:g:t:3:0".to_string(),
        "t:applied:g:t:4:0".to_string(),
    ];
    let far = chrono::Utc::now().timestamp_millis() + 3_600_000;
    let call = |ranges: [(i32, i64, i64); 2], keys: &[(&str, i64)]| Merged {
        shard: 0,
        ranges: ranges
            .iter()
            .map(|&(partition, start, end)| Range {
                partition,
                start,
                end,
                max_event_ms: None,
            })
            .collect(),
        keys: keys
            .iter()
            .map(|(k, d)| {
                (
                    k.as_bytes(),
                    Delta {
                        delta: *d,
                        expire_at_ms: far,
                    },
                )
            })
            .collect(),
    };
    let mut run = |m: &Merged| -> MergedReply {
        let value: Value = apply_merged_cmd(&sha, marker, &fences, m, false)
            .query(&mut conn)
            .unwrap();
        MergedReply::parse(&value).unwrap()
    };
    let applied = MergedReply::All(ApplyReply::Applied {
        late: 0,
        overflow: 0,
        rejected: 0,
    });

    // No state at all: both fences say so, nothing written.
    let first = call([(3, 0, 5), (4, 0, 2)], &[("k", 7)]);
    assert_eq!(
        run(&first),
        MergedReply::Refused(vec![ApplyReply::StateLost, ApplyReply::StateLost])
    );
    let mut c = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    assert_eq!(cmd(&mut c, &["EXISTS", "k"]), Value::Int(0));

    // Both fences at their range's start: applied together, fences and marker copies moved.
    for f in &fences {
        cmd(&mut c, &["SET", f, "0"]);
    }
    cmd(&mut c, &["HSET", marker, "3", "0", "4", "0"]);
    assert_eq!(run(&first), applied);
    assert_eq!(
        run(&first),
        MergedReply::All(ApplyReply::AlreadyApplied),
        "a retry"
    );
    assert_eq!(cmd(&mut c, &["GET", "k"]), Value::BulkString(b"7".to_vec()));
    assert_eq!(cmd(&mut c, &["PEXPIRETIME", "k"]), Value::Int(far));
    assert_eq!(
        cmd(&mut c, &["HGET", marker, "4"]),
        Value::BulkString(b"2".to_vec())
    );

    // One fence elsewhere: nothing of the call is written, each fence's state is told.
    cmd(&mut c, &["SET", &fences[1], "9"]);
    assert_eq!(
        run(&call([(3, 5, 6), (4, 2, 12)], &[("k", 1), ("j", 1)])),
        MergedReply::Refused(vec![
            ApplyReply::NotApplied,
            ApplyReply::Conflict { applied: 9 }
        ])
    );
    assert_eq!(cmd(&mut c, &["GET", "k"]), Value::BulkString(b"7".to_vec()));
    assert_eq!(cmd(&mut c, &["EXISTS", "j"]), Value::Int(0));
    assert_eq!(
        cmd(&mut c, &["GET", &fences[0]]),
        Value::BulkString(b"5".to_vec())
    );

    // A fence gone while the marker names its partition; the other already applied.
    cmd(&mut c, &["DEL", &fences[0]]);
    assert_eq!(
        run(&call([(3, 5, 6), (4, 2, 9)], &[("k", 1)])),
        MergedReply::Refused(vec![
            ApplyReply::FenceMissing {
                marker_copy: Some(5)
            },
            ApplyReply::AlreadyApplied
        ])
    );
    assert_eq!(cmd(&mut c, &["GET", "k"]), Value::BulkString(b"7".to_vec()));
}

#[test]
fn watermarks_ride_with_the_applied_offset_in_every_flush_script() {
    use tally::stream::aggregate::{Op, Other};
    use tally::stream::sink::merge::{Merged, Range};
    use tally::stream::sink::script::{
        apply_kinds_cmd, apply_merged_cmd, APPLY_KINDS_LUA, APPLY_MERGED_LUA,
    };
    let redis = LocalRedis::start(&[]).unwrap();
    let (mut conn, sha) = connect_and_load(&redis, APPLY_LUA);
    let marker = keys().marker;
    let field = |c: &mut redis::Connection, f: &str| -> Option<i64> {
        redis::cmd("HGET").arg(&marker).arg(f).query(c).unwrap()
    };
    init(&mut conn, 0);
    let with = |start, end, t: Option<i64>| {
        let mut u = unit(start, end, &[("w", 1)]);
        u.max_event_ms = t;
        u
    };
    let applied = ApplyReply::Applied {
        late: 0,
        overflow: 0,
        rejected: 0,
    };
    // No output configured: no argument, nothing recorded (the script as before).
    assert_eq!(apply(&mut conn, &sha, &with(0, 1, None)), applied);
    assert_eq!(
        (field(&mut conn, "wm:3"), field(&mut conn, "seen:3")),
        (None, None)
    );
    assert_eq!(
        cmd(&mut conn, &["GET", "w"]),
        Value::BulkString(b"1".to_vec())
    );
    // Recorded with the offset, only ever raised; a range without events is still "seen".
    assert_eq!(apply(&mut conn, &sha, &with(1, 2, Some(5_000))), applied);
    assert_eq!(field(&mut conn, "wm:3"), Some(5_000));
    assert!(field(&mut conn, "seen:3").is_some());
    assert_eq!(apply(&mut conn, &sha, &with(2, 3, Some(4_000))), applied);
    assert_eq!(field(&mut conn, "wm:3"), Some(5_000), "never lowered");
    cmd(&mut conn, &["HDEL", &marker, "seen:3"]);
    assert_eq!(apply(&mut conn, &sha, &with(3, 4, Some(i64::MIN))), applied);
    assert_eq!(field(&mut conn, "wm:3"), Some(5_000));
    assert!(field(&mut conn, "seen:3").is_some());
    // A refused range records nothing.
    assert_eq!(
        apply(&mut conn, &sha, &with(9, 10, Some(9_000))),
        ApplyReply::Conflict { applied: 4 }
    );
    assert_eq!(field(&mut conn, "wm:3"), Some(5_000));

    // The kinds script: the watermark sits before the count of counter keys.
    let kinds_sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(APPLY_KINDS_LUA)
        .query(&mut conn)
        .unwrap();
    let mut u = with(4, 5, Some(6_000));
    u.other.push((
        b"hf".as_slice().into(),
        Other {
            op: Op::HashAdd { split: 1, delta: 2 },
            expire_at_ms: chrono::Utc::now().timestamp_millis() + 3_600_000,
        },
    ));
    let value: Value = apply_kinds_cmd(&kinds_sha, &keys(), &u, false)
        .query(&mut conn)
        .unwrap();
    assert_eq!(ApplyReply::parse(&value).unwrap(), applied);
    assert_eq!(field(&mut conn, "wm:3"), Some(6_000));
    assert_eq!(
        cmd(&mut conn, &["GET", "w"]),
        Value::BulkString(b"5".to_vec())
    );
    assert_eq!(
        cmd(&mut conn, &["HGET", "h", "f"]),
        Value::BulkString(b"2".to_vec())
    );

    // The merged script: one watermark per fence.
    let merged_sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(APPLY_MERGED_LUA)
        .query(&mut conn)
        .unwrap();
    cmd(&mut conn, &["SET", "t:applied:g:t:4:0", "0"]);
    cmd(&mut conn, &["HSET", &marker, "4", "0"]);
    let m = Merged {
        shard: 0,
        ranges: vec![
            Range {
                partition: 3,
                start: 5,
                end: 6,
                max_event_ms: Some(7_000),
            },
            Range {
                partition: 4,
                start: 0,
                end: 3,
                max_event_ms: None,
            },
        ],
        keys: unit(0, 0, &[("w", 1)]).keys,
    };
    let fences = [keys().fence, "t:applied:g:t:4:0".to_string()];
    let value: Value = apply_merged_cmd(&merged_sha, &marker, &fences, &m, false)
        .query(&mut conn)
        .unwrap();
    assert_eq!(
        tally::stream::sink::script::MergedReply::parse(&value).unwrap(),
        tally::stream::sink::script::MergedReply::All(applied)
    );
    assert_eq!(field(&mut conn, "wm:3"), Some(7_000));
    assert_eq!(field(&mut conn, "wm:4"), None, "a range without events");
    assert!(field(&mut conn, "seen:4").is_some());
    assert_eq!(
        cmd(&mut conn, &["GET", "w"]),
        Value::BulkString(b"6".to_vec())
    );
}
