//! The processes as a whole (`src/app/`): start, signals and drain.

mod signals;
