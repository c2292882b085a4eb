//! Which topics a lane reads (`src/stream/consumer/`): several topics and topic patterns.

mod topic_patterns;
mod topics;
