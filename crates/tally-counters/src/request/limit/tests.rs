use super::{Decision, PolicyVerdict};

fn verdict(policy: &str, limit: u64, remaining: u64, reset_ms: u64) -> PolicyVerdict {
    PolicyVerdict {
        policy: policy.into(),
        allowed: true,
        remaining,
        reset_ms,
        retry_after_ms: None,
        shadow: false,
        limit,
        window_ms: 60_000,
    }
}

#[test]
fn ietf_fields_list_every_policy_in_order_with_seconds_rounded_up() {
    let d = Decision {
        admitted: true,
        policies: vec![
            verdict("burst", 10, 9, 1),
            verdict("daily", 1000, 12, 59_001),
        ],
        without_redis: false,
        now_ms: 0,
    };
    assert_eq!(
        d.headers(),
        (
            "\"burst\";q=10;w=60, \"daily\";q=1000;w=60".to_string(),
            "\"burst\";r=9;t=1, \"daily\";r=12;t=60".to_string()
        )
    );
    let none = Decision {
        policies: vec![],
        ..d
    };
    assert_eq!(none.headers(), (String::new(), String::new()));
}

#[test]
fn a_limit_reply_is_parsed_by_shape() {
    use super::{LimitReply, PolicyReply};
    use redis::Value::Int;
    let reply = redis::Value::Array(
        vec![Int(0), Int(42), Int(1), Int(3), Int(500), Int(-1)]
            .into_iter()
            .chain([Int(0), Int(-2), Int(900), Int(250)])
            .collect(),
    );
    let parsed = LimitReply::parse(&reply, 2).unwrap();
    assert_eq!(
        parsed,
        LimitReply {
            admitted: false,
            now_ms: 42,
            policies: vec![
                PolicyReply {
                    allowed: true,
                    remaining: 3,
                    reset_ms: 500,
                    retry_ms: -1
                },
                PolicyReply {
                    allowed: false,
                    remaining: -2,
                    reset_ms: 900,
                    retry_ms: 250
                },
            ],
        }
    );
    let p = crate::request::LimitPolicy {
        name: "p".into(),
        algorithm: crate::request::Algorithm::Fixed,
        limit: 10,
        window: std::time::Duration::from_secs(60),
        burst: None,
        shadow: false,
        on_redis_error: Default::default(),
        durability: None,
    };
    let denied = parsed.policies[1].verdict(&p);
    assert_eq!((denied.remaining, denied.retry_after_ms), (0, Some(250)));
    assert!(
        LimitReply::parse(&reply, 1).is_err(),
        "a reply for two policies is not one for one"
    );
}
