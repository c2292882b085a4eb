//! The closed sets of label values. Each metric dimension is an enum, so cardinality is bounded
//! by construction, every series can be registered up front (dashboards see zeroes, not gaps),
//! and a call site cannot misspell a label.

macro_rules! labels {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The label text.
            pub fn label(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }
    };
}

labels!(
    /// Why a Redis request failed (`tally_redis_errors_total{kind}`).
    RedisErrorKind {
        /// No answer within `redis.response_timeout` (or the connect timeout).
        Timeout => "timeout",
        /// The connection was refused.
        Connect => "connect",
        /// The connection broke.
        Io => "io",
        /// Redis answered with an error, or something unexpected.
        Response => "response",
        /// Redis' maxmemory-policy may evict keys.
        EvictionPolicy => "eviction_policy",
    }
);

labels!(
    /// A consumer group rebalance (`tally_rebalances_total{kind}`).
    RebalanceKind {
        /// Partitions assigned to this process.
        Assign => "assign",
        /// Partitions taken away.
        Revoke => "revoke",
    }
);

labels!(
    /// Why Redis refused an increment (`tally_keys_rejected_total{reason}`).
    RejectReason {
        /// The stored value plus the delta overflows 64 bits.
        Overflow => "overflow",
        /// The key holds something that is not an integer.
        NotInteger => "not_integer",
    }
);

labels!(
    /// A resume point outside a partition's retained range (`tally_offset_resets_total{reason}`).
    ResetReason {
        /// Redis has applied offsets the topic does not have.
        BeyondEnd => "beyond_end",
        /// Retention deleted offsets before tally counted them.
        BeforeLogStart => "before_log_start",
        /// librdkafka reset a position it was reading.
        AutoReset => "auto_reset",
    }
);

labels!(
    /// Why a partition is not counted (`tally_partitions_halted{reason}`).
    HaltReason {
        /// Redis did not answer in time (clears by itself).
        RedisUnavailable => "redis_unavailable",
        /// Kafka did not answer in time (clears by itself).
        KafkaUnavailable => "kafka_unavailable",
        /// The applied offset is gone while the rest of the state is there.
        FenceMissing => "fence_missing",
        /// The applied offset or state marker is not an offset.
        FenceCorrupt => "fence_corrupt",
        /// Redis lost the state and `recovery.on_state_lost = "halt"`.
        StateLost => "state_lost",
        /// The applied offset lies beyond the end of the topic.
        BeyondEnd => "beyond_end",
    }
);

labels!(
    /// A request-path primitive (`tally_request_*{primitive}`).
    Primitive {
        /// `POST /v1/hit`.
        Hit => "hit",
        /// `POST /v1/limit`.
        Limit => "limit",
        /// `POST /v1/quota`.
        Quota => "quota",
        /// `POST /v1/once`.
        Once => "once",
        /// `POST /v1/unique`.
        Unique => "unique",
        /// `POST /v1/pool`.
        Pool => "pool",
    }
);

labels!(
    /// What a request-path call decided (`tally_request_decisions_total{outcome}`).
    Outcome {
        /// Admitted, counted, first, given.
        Allowed => "allowed",
        /// Denied by a limit, sold out, not first, pool empty.
        Denied => "denied",
        /// Admitted although a shadow policy denied it.
        ShadowDenied => "shadow_denied",
        /// A retried hit (idempotency key seen) or a user served before.
        Duplicate => "duplicate",
        /// Read without changing anything.
        Peek => "peek",
        /// State cleared.
        Reset => "reset",
        /// No answer: Redis failed or the input was refused.
        Error => "error",
    }
);
