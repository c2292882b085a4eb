//! 64-bit values come back exactly: Lua numbers are doubles (exact up to 2^53), so a script that
//! let a counter pass through one answered 2^53 + 1 as 2^53 and a value near i64::MAX as a
//! negative number. Values are set directly in Redis to reach those ranges.

use std::time::Duration;

use tally_counters::request::{Client, Counters, Hit, Quota, QuotaReply, RequestError};

use crate::support::{self, clients, Deployment};

const TWO_POW_53: i64 = 1 << 53;

/// Hits bring counters to 2^53 + 1 and to i64::MAX - 1 and answer exactly; a retry with the same
/// idempotency key answers the same value; a hit past the 64-bit range is refused and adds
/// nothing.
pub async fn hits_are_exact_across_the_64_bit_range(dep: &Deployment) {
    let client = clients(dep, 1).remove(0);
    let spec = support::counter("big", &["item"], Duration::from_secs(3600));
    let counters = Counters::new(client.clone(), vec![spec], dep.layout());
    let hit = |delta: i64, id: &str| Hit {
        delta,
        idempotency_key: (!id.is_empty()).then(|| id.to_string()),
        ..Hit::one()
    };

    counters
        .hit("big", &["a"], &hit(TWO_POW_53, ""))
        .await
        .unwrap();
    let first = counters.hit("big", &["a"], &hit(1, "a-1")).await.unwrap();
    assert_eq!((first.value, first.duplicate), (TWO_POW_53 + 1, false));
    let retry = counters.hit("big", &["a"], &hit(1, "a-1")).await.unwrap();
    assert_eq!((retry.value, retry.duplicate), (TWO_POW_53 + 1, true));
    assert_eq!(
        counters.peek("big", &["a"], None).await.unwrap(),
        TWO_POW_53 + 1
    );

    let key = counters.locate_reply("big", &["b"], None).unwrap().key;
    set(&client, &key, i64::MAX - 2).await;
    let first = counters.hit("big", &["b"], &hit(1, "b-1")).await.unwrap();
    assert_eq!((first.value, first.duplicate), (i64::MAX - 1, false));
    let retry = counters.hit("big", &["b"], &hit(1, "b-1")).await.unwrap();
    assert_eq!((retry.value, retry.duplicate), (i64::MAX - 1, true));

    let over = counters.hit("big", &["b"], &hit(2, "b-2")).await;
    assert!(
        matches!(&over, Err(RequestError::Overflow { counter, delta: 2 }) if counter == "big"),
        "{over:?}"
    );
    assert_eq!(
        counters.peek("big", &["b"], None).await.unwrap(),
        i64::MAX - 1
    );
    let key = counters.locate_reply("big", &["c"], None).unwrap().key;
    set(&client, &key, i64::MIN + 1).await;
    let under = counters.hit("big", &["c"], &hit(-2, "")).await;
    assert!(
        matches!(under, Err(RequestError::Overflow { .. })),
        "{under:?}"
    );
    assert_eq!(
        counters.peek("big", &["c"], None).await.unwrap(),
        i64::MIN + 1
    );
    // The refused hits wrote nothing under their idempotency keys: a retry is refused again.
    let again = counters.hit("big", &["b"], &hit(2, "b-2")).await;
    assert!(
        matches!(again, Err(RequestError::Overflow { .. })),
        "{again:?}"
    );
    // The directly set keys were given their window's expiry by the hits.
    counters.hit("big", &["c"], &hit(1, "")).await.unwrap();
}

/// A quota's count above 2^53 (set outside tally) is reported exactly, and a size above 2^53
/// (which the script could not compare exactly) is refused.
pub async fn quota_counts_are_exact(dep: &Deployment) {
    let client = clients(dep, 1).remove(0);
    let q = Quota::new(client.clone(), "huge", 1 << 53, false, crate::in_an_hour());
    assert_eq!(
        q.take(None).await.unwrap(),
        QuotaReply::Admitted { taken: 1 }
    );
    let key = support::keys_matching(dep, "*quota:huge:taken:*").await;
    set(&client, &key, TWO_POW_53 + 1).await;
    assert_eq!(
        q.take(None).await.unwrap(),
        QuotaReply::SoldOut {
            taken: (1 << 53) + 1
        }
    );
    let too_big = Quota::new(client, "huger", (1 << 53) + 1, false, crate::in_an_hour());
    assert!(matches!(
        too_big.take(None).await,
        Err(RequestError::Invalid(_))
    ));
}

/// `SET key value KEEPTTL` through the request-path client (routed to the key's node).
async fn set(client: &Client, key: &str, value: i64) {
    let _: () = client
        .query(redis::cmd("SET").arg(key).arg(value).arg("KEEPTTL"))
        .await
        .unwrap();
}
