//! Reading counters back (`src/api/query/`): point reads and ranges.

mod counts;
mod range;
