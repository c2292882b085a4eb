//! Protobuf descriptors read from a file (`decode.descriptor_file`): the one place that reads
//! them, so `tally check` and the decoder agree on what the file holds.

use prost_reflect::{DescriptorPool, MessageDescriptor};

/// The message type `name` (`package.Message`, a leading `.` allowed) of the descriptor set
/// `bytes` (a serialized `FileDescriptorSet`, as `protoc --descriptor_set_out` writes it).
pub fn message(bytes: &[u8], name: &str) -> Result<MessageDescriptor, String> {
    let pool =
        DescriptorPool::decode(bytes).map_err(|e| format!("not a protobuf descriptor set: {e}"))?;
    let name = name.trim_start_matches('.');
    pool.get_message_by_name(name).ok_or_else(|| {
        let known: Vec<String> = pool
            .all_messages()
            .take(10)
            .map(|m| m.full_name().to_string())
            .collect();
        format!("no message `{name}` in it (it has: {})", known.join(", "))
    })
}
