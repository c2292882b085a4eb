//! Configuration (`src/config/`): bad files refused with a clear message, and the reference file.

mod cli;
mod reference;
