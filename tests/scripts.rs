//! The Lua scripts' reply contract, against a real redis-server: every status of the flush and
//! fence scripts, parsed into the types the sink uses.

use redis::Value;
use tally::aggregate::{Delta, Unit};
use tally::sink::script::{
    apply_cmd, ApplyReply, FenceState, StateKeys, APPLY_LUA, INIT_LUA, SET_FENCE_LUA,
};
use tally_testkit::local_redis::LocalRedis;

fn keys() -> StateKeys {
    StateKeys {
        fence: "t:applied:g:t:3:0".into(),
        marker: "t:state:g:t:0".into(),
    }
}

fn unit(start: i64, end: i64, deltas: &[(&str, i64)]) -> Unit {
    let far = chrono::Utc::now().timestamp_millis() + 3_600_000;
    Unit {
        partition: 3,
        shard: 0,
        start,
        end,
        keys: deltas
            .iter()
            .map(|(k, d)| {
                (
                    k.as_bytes().into(),
                    Delta {
                        delta: *d,
                        expire_at_ms: far,
                    },
                )
            })
            .collect(),
        other: Vec::new(),
    }
}

fn apply(conn: &mut redis::Connection, sha: &str, u: &Unit) -> ApplyReply {
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
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(APPLY_LUA)
        .query(&mut conn)
        .unwrap();

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
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(APPLY_LUA)
        .query(&mut conn)
        .unwrap();
    assert_eq!(init(&mut conn, 0), FenceState::Created(0));
    let now = chrono::Utc::now().timestamp_millis();
    let mut u = unit(0, 3, &[("early", 1), ("past", 5), ("later", 2)]);
    u.keys[0].1.expire_at_ms = now + 60_000;
    u.keys[1].1.expire_at_ms = now - 1;
    u.keys[2].1.expire_at_ms = now + 120_000;
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
