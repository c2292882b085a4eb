//! Replays the fuzz inputs (`fuzz/seeds/`, `fuzz/regressions/`, and a local `fuzz/corpus/` when
//! one was generated) through the fuzz targets' own bodies, so hand-written seeds and inputs
//! that once found a bug stay checked by the normal test suite without a fuzzer. The generated
//! corpus is not in git (cargo-fuzz's own convention). See `fuzz/README.md`.

use std::path::Path;

#[path = "../../../fuzz/src/lib.rs"]
mod targets;

/// Feeds every file under `fuzz/{seeds,regressions,corpus}/<target>/` to `run`; returns how many.
fn replay(target: &str, run: fn(&[u8])) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut count = 0;
    for dir in ["seeds", "regressions", "corpus"] {
        let dir = root.join(dir).join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("read corpus dir").path();
            let data = std::fs::read(&path).expect("read corpus file");
            let outcome = std::panic::catch_unwind(|| run(&data));
            assert!(outcome.is_ok(), "{} panicked", path.display());
            count += 1;
        }
    }
    assert!(count > 0, "no corpus for {target}");
    count
}

#[test]
fn decode_corpus() {
    replay("decode", targets::decode);
}

#[test]
fn key_template_corpus() {
    replay("key_template", targets::key_template);
}

#[test]
fn config_corpus() {
    replay("config", targets::config);
}

#[test]
fn cel_corpus() {
    replay("cel", targets::cel);
}

#[test]
fn limits_corpus() {
    replay("limits", targets::limits);
}

#[test]
fn protobuf_corpus() {
    replay("protobuf", targets::protobuf);
}

#[test]
fn rlqs_report_corpus() {
    replay("rlqs_report", targets::rlqs_report);
    // The seeds are hand-encoded: one of them must read as what it was written to be.
    use prost::Message as _;
    let seed =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/rlqs_report/forged_victim.bin");
    let reports =
        envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports::decode(
            std::fs::read(seed).unwrap().as_slice(),
        )
        .unwrap();
    assert_eq!(reports.domain, "edge");
    assert_eq!(
        reports.bucket_quota_usages[0].num_requests_allowed,
        1_000_000_000_000_000
    );
}

#[test]
fn avro_corpus() {
    replay("avro", targets::avro);
}
