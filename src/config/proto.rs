//! Protobuf descriptors read from a file (`decode.descriptor_file`): the one place that reads
//! them, and counts them against the node budget (`decode.max_schema_nodes`), so `tally check`
//! and the decoder agree on what a file or a registry's schema may hold.

use prost_reflect::{DescriptorPool, MessageDescriptor};

/// The message type `name` (`package.Message`, a leading `.` allowed) of the descriptor set
/// `bytes` (a serialized `FileDescriptorSet`, as `protoc --descriptor_set_out` writes it), if
/// the set holds at most `max_nodes` nodes (see [`within_budget`]).
pub fn message(
    bytes: &[u8],
    name: &str,
    max_nodes: usize,
) -> Result<MessageDescriptor, DescriptorError> {
    let pool = DescriptorPool::decode(bytes).map_err(DescriptorError::NotDescriptors)?;
    within_budget(&pool, max_nodes)?;
    let name = name.trim_start_matches('.');
    pool.get_message_by_name(name)
        .ok_or_else(|| DescriptorError::NoMessage {
            name: name.to_string(),
            known: pool
                .all_messages()
                .take(10)
                .map(|m| m.full_name().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// Why a descriptor file gives no message type.
#[derive(Debug, thiserror::Error)]
pub enum DescriptorError {
    /// Not a serialized `FileDescriptorSet`.
    #[error("not a protobuf descriptor set: {0}")]
    NotDescriptors(prost_reflect::DescriptorError),
    /// Over the node budget.
    #[error(transparent)]
    TooLarge(#[from] TooLarge),
    /// No message type of that name (the first ten it has).
    #[error("no message `{name}` in it (it has: {known})")]
    NoMessage {
        /// The name asked for.
        name: String,
        /// Message types it has, the first ten.
        known: String,
    },
}

/// A descriptor pool over the node budget.
#[derive(Debug, thiserror::Error)]
#[error("more than {max} schema nodes (messages, fields, enums, enum values and extensions): over decode.max_schema_nodes, raise it or trim the schema")]
pub struct TooLarge {
    /// The budget.
    pub max: usize,
}

/// The nodes of `pool` (every message and its fields, every enum and its values, every
/// extension, of all its files), if at most `max`: what its plans and reading may cost is
/// bounded by them.
pub fn within_budget(pool: &DescriptorPool, max: usize) -> Result<usize, TooLarge> {
    let messages = pool.all_messages().map(|m| 1 + m.fields().len());
    let enums = pool.all_enums().map(|e| 1 + e.values().len());
    let extensions = pool.all_extensions().map(|_| 1);
    let mut nodes = 0usize;
    for n in messages.chain(enums).chain(extensions) {
        nodes = nodes.saturating_add(n);
        if nodes > max {
            return Err(TooLarge { max });
        }
    }
    Ok(nodes)
}

#[cfg(test)]
#[test]
fn a_descriptor_set_over_the_node_budget_is_refused() {
    use prost::Message;
    // 3 messages of 30 fields, an enum of 3 values: 3 * 31 + 4 = 97 nodes.
    let mut text =
        String::from("syntax = \"proto3\"; package t; enum M { A = 0; B = 1; C = 2; }\n");
    for m in 0..3 {
        text += &format!("message E{m} {{");
        for f in 1..=30 {
            text += &format!(" int64 f{f} = {f};");
        }
        text += " }\n";
    }
    let dir = std::env::temp_dir().join(format!("tally-proto-budget-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("e.proto"), &text).unwrap();
    let set = protox::compile(["e.proto"], [&dir]).unwrap();
    let bytes = set.encode_to_vec();
    let _ = std::fs::remove_dir_all(&dir);
    let pool = DescriptorPool::decode(bytes.as_slice()).unwrap();
    assert_eq!(within_budget(&pool, 97).unwrap(), 97);
    assert!(message(&bytes, "t.E1", 97).is_ok());
    let e = message(&bytes, "t.E1", 96).unwrap_err();
    assert!(matches!(e, DescriptorError::TooLarge(_)), "{e:?}");
    assert!(
        e.to_string().contains("over decode.max_schema_nodes"),
        "{e}"
    );
}
