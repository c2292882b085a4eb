//! Command-line conventions (`src/cli/`): help and exit codes, `tally lock`.

mod help;
mod lock;
